"""The CostModel interface and its registry."""

from __future__ import annotations

from abc import ABC, abstractmethod

from tvmsched.errors import TvmschedError
from tvmsched.graph import KernelGraph
from tvmsched.registry import registrar

COST_MODELS: dict[str, type[CostModel]] = {}


register_cost_model = registrar(COST_MODELS)  # class decorator: @register_cost_model("name")


def create_cost_model(name: str, graph: KernelGraph, **options) -> CostModel:
    if name not in COST_MODELS:
        raise TvmschedError(f"unknown cost source '{name}'; available: {', '.join(sorted(COST_MODELS))}")
    return COST_MODELS[name](graph, **options)


class CostModel(ABC):
    """Latency in milliseconds of stages of one graph: `groups` run concurrently, each in order.

    A cost source may hold device resources: `close` it, or use it as a context manager.
    """

    name = "cost"

    def __init__(self, graph: KernelGraph):
        self.graph = graph
        self.measured = 0  # stages and orders run on the device so far (a computed model runs none)

    def close(self) -> None:  # noqa: B027  (not abstract: a computed model holds nothing to release)
        """Release what the source holds."""

    def __enter__(self) -> CostModel:
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
