"""IOS's greedy baseline: each stage takes every kernel whose inputs are ready, one group per kernel
(kernels beyond max_streams share streams round-robin)."""

from tvmsched.cost import StageCost
from tvmsched.graph import KernelGraph
from tvmsched.schedule.base import (
    DEFAULT_STREAM_MAPPING,
    STREAM_MAPPING_FLAG,
    Schedule,
    Scheduler,
    Stage,
    check_stream_mapping,
    register_scheduler,
)


@register_scheduler("greedy")
class GreedyScheduler(Scheduler):
    flags = (STREAM_MAPPING_FLAG,)

    def __init__(self, max_streams: int = 8, stream_mapping: str = DEFAULT_STREAM_MAPPING):
        super().__init__(max_streams)
        self.stream_mapping = check_stream_mapping(stream_mapping)

    def schedule(self, graph: KernelGraph, cost: StageCost) -> Schedule:
        stages = self.stages(graph, [kernel.id for kernel in graph.kernels])
        return Schedule.from_stages(stages, {"modeled_ms": sum(cost.stage_latency(s.groups) for s in stages)},
                                    graph, self.stream_mapping)

    def stages(self, graph: KernelGraph, kernels: list[int]) -> list[Stage]:
        """Greedy stages of `kernels` (a set closed under producers, given the kernels before it ran)."""
        return [self.stage(wave) for wave in ready_waves(graph, kernels)]

    def stage(self, kernels: list[int]) -> Stage:
        groups = [kernels[start::self.max_streams] for start in range(min(self.max_streams, len(kernels)))]
        return Stage(tuple(tuple(group) for group in groups))


def ready_waves(graph: KernelGraph, kernels: list[int]) -> list[list[int]]:
    """`kernels` in waves: each wave is every kernel whose producers among `kernels` are in earlier waves."""
    members = set(kernels)
    done: set[int] = set()
    remaining = list(kernels)
    waves = []
    while remaining:
        wave = [kernel for kernel in remaining if graph.dependencies(kernel) & members <= done]
        waves.append(wave)
        done.update(wave)
        remaining = [kernel for kernel in remaining if kernel not in done]
    return waves
