"""The measured cost source: stage latencies timed on the GPU by a `StageTimer` (which times through
`tvmsched.measure`), cached on disk.

A stage is timed once per (graph hash, target, batch, scheduled kernels, timer version, stage signature):
the cache file keeps every measurement, so a second build of the same model on the same GPU measures
nothing. The cache is written atomically when the cost source is closed, also after an interrupted search;
closing also releases the timer's streams and events.
"""

from __future__ import annotations

from pathlib import Path

from tvmsched.cache import cache_path as named_cache_path
from tvmsched.cache import merge_into_cache, read_section
from tvmsched.cost.base import StageCost, register_stage_cost
from tvmsched.executor.streams import StageTimer
from tvmsched.graph import KernelGraph
from tvmsched.plan import ExecutionPlan


def default_cache_path() -> Path:
    """stage_costs.json in tvmsched's cache directory (`tvmsched.cache`)."""
    return named_cache_path("stage_costs.json")


def cache_key(graph: KernelGraph, context: dict, kernels_hash: str) -> str:
    """What the measurements of a build are cached under: its graph, target and batch (`context`, the plan's)
    and its scheduled kernels (tuned and default kernels time differently), and the timer's version (what a
    timing includes)."""
    return (f"{graph.hash}/{context['target']}/batch{context['batch']}/kernels{kernels_hash}"
            f"/timer{StageTimer.version}")


@register_stage_cost("measured")
class MeasuredCost(StageCost):
    """`timer.time_stage(groups)` or `timer.time_order(order)` on a cache miss; `key` names what the
    measurements hold for (`cache_key`). `on_device` makes one with its timer and key."""

    def __init__(self, graph: KernelGraph, timer, key: str, cache_path: Path | None = None):
        super().__init__(graph)
        self.timer = timer
        self.key = key
        self.cache_path = cache_path or default_cache_path()
        self.entries = read_section(self.cache_path, key)
        self.hits = 0

    @classmethod
    def on_device(cls, library, graph: KernelGraph, plan: ExecutionPlan, constants: dict, device,
                  kernels_hash: str, max_groups: int = 8, cache_path: Path | None = None) -> MeasuredCost:
        """The source for a build on `device`: a stage timer of its own (stages of up to `max_groups`
        groups) over the build's `library` and `constants`, and the `cache_key` of its graph, its `plan`'s
        target and batch and its scheduled kernels (`kernels_hash`)."""
        timer = StageTimer(library, graph, plan, constants, device, max_groups=max_groups)
        return cls(graph, timer, cache_key(graph, plan.context, kernels_hash), cache_path)

    def stage_latency(self, groups: tuple[tuple[int, ...], ...]) -> float:
        signature = "|".join(sorted(",".join(map(str, group)) for group in groups))
        return self._cached(signature, lambda: self.timer.time_stage(groups))

    def order_latency(self, order: tuple[tuple[int, int], ...], tvm_kernels: tuple[int, ...] = ()) -> float:
        signature = "order:" + ",".join(f"{kernel}@{stream}" for kernel, stream in order)
        if tvm_kernels:
            signature += "/tvm:" + ",".join(map(str, sorted(tvm_kernels)))
        return self._cached(signature, lambda: self.timer.time_order(order, tvm_kernels=tvm_kernels))

    def _cached(self, signature: str, measure) -> float:
        """The cached latency under `signature`, else `measure()`'s (saved every 200 measurements)."""
        if signature in self.entries:
            self.hits += 1
        else:
            self.entries[signature] = measure()
            self.measured += 1
            if self.measured % 200 == 0:
                self.save()
        return self.entries[signature]

    def close(self) -> None:
        """Save the measurements and close the timer."""
        try:
            self.save()
        finally:
            self.timer.close()

    def save(self) -> None:
        """Merge this graph's measurements into the cache file."""
        merge_into_cache(self.cache_path, self.key, self.entries)
