"""The sequential schedule: topological order on one stream, the baseline of every speedup."""

from tvmsched.graph import KernelGraph
from tvmsched.schedule.base import Scheduler, register_scheduler


@register_scheduler("sequential")
class SequentialScheduler(Scheduler):
    def order(self, graph: KernelGraph) -> list[tuple[int, int]]:
        return [(kernel.id, 0) for kernel in graph.kernels]
