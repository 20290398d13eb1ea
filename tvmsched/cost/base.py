"""The StageCost interface and its registry."""

from __future__ import annotations

from abc import ABC, abstractmethod

from tvmsched.errors import TvmschedError
from tvmsched.graph import KernelGraph
from tvmsched.registry import registrar

STAGE_COSTS: dict[str, type[StageCost]] = {}


register_stage_cost = registrar(STAGE_COSTS)  # class decorator: @register_stage_cost("name")


def create_stage_cost(name: str, graph: KernelGraph, **options) -> StageCost:
    if name not in STAGE_COSTS:
        raise TvmschedError(f"unknown cost source '{name}'; available: {', '.join(sorted(STAGE_COSTS))}")
    return STAGE_COSTS[name](graph, **options)


class StageCost(ABC):
    """Latency in milliseconds of stages of one graph: `groups` run concurrently, each in order.

    A cost source may hold device resources: `close` it, or use it as a context manager.
    """

    name = "cost"

    def __init__(self, graph: KernelGraph):
        self.graph = graph
        self.measured = 0  # stages and orders run on the device so far (a computed model runs none)

    def close(self) -> None:  # noqa: B027  (not abstract: a computed model holds nothing to release)
        """Release what the source holds."""

    def __enter__(self) -> StageCost:
        return self

    def __exit__(self, *error) -> None:
        self.close()

    @abstractmethod
    def stage_latency(self, groups: tuple[tuple[int, ...], ...]) -> float:
        """Milliseconds from the stage's start until its last kernel completes."""

    def order_latency(self, order: tuple[tuple[int, int], ...], tvm_kernels: tuple[int, ...] = ()
                      ) -> float | None:
        """Milliseconds of (kernel, stream) launches in this order run as the executor runs them: event
        waits between streams, no barrier between stages, `tvm_kernels` running TVM's function instead of
        their tactic; None where the source times stages only."""
        return None

    def kernel_latency(self, kernel: int) -> float:
        """Milliseconds of one kernel running alone."""
        return self.stage_latency(((kernel,),))
