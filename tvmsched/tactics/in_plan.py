"""Concurrency-aware tactics: a kernel's implementation chosen for the stage it runs in.

Selection (`tactics.select`) times each kernel alone, where a vendor plan that fills the GPU wins. In a
stage of dp's plan a kernel runs beside other branches, and TVM's function, which may leave SMs free for
them, can make the stage faster although it is slower alone. After dp has chosen its plan, each kernel that
a vendor plan runs in a stage of several groups is tried with TVM's function instead (a kernel with a
tactic keeps TVM's workspace, `Kernel.tvm_workspace`, so either can run): the whole plan, in dp's issue
order, is timed as the benchmark times it (`StageCost.order_latency`), and each change that makes it faster
by more than `MARGIN` is kept, one kernel after another. A kernel whose TVM function alone (selection's
measurement) takes at least as long as its whole stage is not tried: beside other groups a kernel runs no
faster than alone, so its stage could not get faster (a heuristic for the whole plan, whose stages may
overlap; on the H100 the choice kept none of 511 kernels tried). The plan records the kernels kept
(`ExecutionPlan.tvm_kernels`); the graph keeps its tactics, so another schedule of the same build starts
from selection's choice again.
"""

from __future__ import annotations

from dataclasses import replace

from tvmsched.cost.base import StageCost
from tvmsched.graph import KernelGraph
from tvmsched.plan import ExecutionPlan

MARGIN = 0.01  # a change is kept where the whole plan times this much faster: less is the timer's spread


Stage = tuple[tuple[int, ...], ...]  # a stage's groups of kernels


def concurrent_kernels(graph: KernelGraph, plan: ExecutionPlan) -> list[tuple[int, Stage]]:
    """The kernels a vendor plan runs in stages of several groups of `plan` (its scheduler's stages), each
    with its stage's groups."""
    stages = [tuple(tuple(group) for group in stage) for stage in plan.schedule.get("stages") or []]
    return [(kernel, stage) for stage in stages if len(stage) > 1 for group in stage for kernel in group
            if graph.kernels[kernel].tactic is not None]


def choose_in_plan(graph: KernelGraph, plan: ExecutionPlan, cost: StageCost,
                   tvm_ms: dict[int, float]) -> ExecutionPlan:
    """`plan` with TVM's function for the kernels of `concurrent_kernels` whose change makes the whole plan
    faster by `cost` (by more than `MARGIN`), its schedule recording how many were tried, how many were not
    because their TVM function alone (`tvm_ms`, by kernel, where measured) takes at least their stage's
    time, and which were kept (`tvm_in_stage`), and the plan's time before and after (`in_plan_ms`); `plan`
    itself where no kernel is a candidate or `cost` times no whole plan (the analytic cost)."""
    order = tuple((launch.kernel, launch.stream) for launch in plan.launches)
    candidates = concurrent_kernels(graph, plan)
    best_ms = cost.order_latency(order) if candidates else None
    if best_ms is None:
        return plan
    tried = [kernel for kernel, stage in candidates
             if kernel not in tvm_ms or tvm_ms[kernel] < cost.stage_latency(stage)]
    before_ms, kept = best_ms, ()
    for kernel in tried:
        variant_ms = cost.order_latency(order, kept + (kernel,))
        if variant_ms is not None and variant_ms < best_ms * (1 - MARGIN):
            best_ms, kept = variant_ms, kept + (kernel,)
    record = {"tried": len(tried), "slower_alone": len(candidates) - len(tried), "kept": list(kept)}
    schedule = {**plan.schedule, "tvm_in_stage": record, "in_plan_ms": [before_ms, best_ms]}
    return replace(plan, schedule=schedule, tvm_kernels=kept)
