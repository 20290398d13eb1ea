"""Pictures for people: a profile's timeline (one track per stream) and a plan's schedule drawn as the
kernel DAG laid out by stage and stream. PNG or SVG, chosen by the file's suffix (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

from tvmsched.graph import KernelGraph
from tvmsched.plan import ExecutionPlan
from tvmsched.profile import Profile

HEAVY = {"conv2d", "matmul", "dense"}  # op kinds drawn dark in timelines


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def timeline(profile: Profile, path: str | Path) -> Path:
    """Each stream a horizontal track; each kernel a bar from its start to its end (ms), convolutions and
    matrix products dark, everything else light."""
    plt = _pyplot()
    kinds = {kernel.id: kernel.op_kinds for kernel in profile.kernels}
    origin = min(event.start_ms for event in profile.timeline)
    streams = sorted({event.stream for event in profile.timeline})
    figure, axes = plt.subplots(figsize=(12, 1 + 0.5 * len(streams)))
    for row, stream in enumerate(streams):
        events = [event for event in profile.timeline if event.stream == stream]
        colors = ["#1f4e79" if HEAVY & set(kinds[event.kernel]) else "#9dc3e6" for event in events]
        axes.broken_barh([(event.start_ms - origin, event.end_ms - event.start_ms) for event in events],
                         (row - 0.4, 0.8), facecolors=colors, edgecolor="white", linewidth=0.3)
    axes.set_yticks(range(len(streams)), [f"stream {stream}" for stream in streams])
    axes.invert_yaxis()
    axes.set_xlabel("ms")
    axes.set_title(f"{profile.schedule} on {profile.device}: traced inference {profile.inference_ms:.3f} ms "
                   f"(without timing events {profile.benchmark_ms:.3f} ms; kernels alone "
                   f"{profile.kernel_ms:.3f} ms)")
    return _save(figure, path, plt)


def schedule(graph: KernelGraph, plan: ExecutionPlan, path: str | Path) -> Path:
    """The kernel DAG with each kernel at (its stage, its stream), edges for data dependencies; plans
    without stages are laid out by dependency depth."""
    plt = _pyplot()
    streams = {launch.kernel: launch.stream for launch in plan.launches}
    column = _columns(graph, plan)
    rows: dict[tuple[int, int], int] = {}
    position = {}
    for launch in plan.launches:
        slot = (column[launch.kernel], launch.stream)
        position[launch.kernel] = (slot[0], launch.stream + 0.25 * rows.get(slot, 0))
        rows[slot] = rows.get(slot, 0) + 1
    width = max(column.values()) + 1
    figure, axes = plt.subplots(figsize=(min(60, 2 + 0.35 * width), 1.5 + 0.9 * plan.num_streams))
    for kernel in graph.kernels:
        for producer in graph.dependencies(kernel.id):
            (x0, y0), (x1, y1) = position[producer], position[kernel.id]
            axes.annotate("", (x1, y1), (x0, y0), arrowprops={"arrowstyle": "-|>", "color": "#888888",
                                                                "linewidth": 0.5, "shrinkA": 4, "shrinkB": 4})
    colors = plt.get_cmap("tab10")
    for kernel_id, (x, y) in position.items():
        axes.scatter(x, y, s=60, color=colors(streams[kernel_id] % 10), zorder=3)
        axes.annotate(str(kernel_id), (x, y), fontsize=5, ha="center", va="center", zorder=4, color="white")
    axes.set_yticks(range(plan.num_streams), [f"stream {stream}" for stream in range(plan.num_streams)])
    axes.invert_yaxis()
    axes.set_xlabel("stage" if plan.schedule.get("stages") else "dependency depth")
    axes.set_title(f"{plan.scheduler}: {len(graph.kernels)} kernels, {plan.num_streams} streams, {width} "
                   f"{'stages' if plan.schedule.get('stages') else 'levels'}")
    return _save(figure, path, plt)


def _columns(graph: KernelGraph, plan: ExecutionPlan) -> dict[int, int]:
    """Each kernel's stage, or its depth (longest path from the inputs) for plans without stages."""
    stages = plan.schedule.get("stages")
    if stages:
        return {kernel: index for index, stage in enumerate(stages) for group in stage for kernel in group}
    depth: dict[int, int] = {}
    for kernel in graph.kernels:  # ids are topological
        depth[kernel.id] = 1 + max((depth[p] for p in graph.dependencies(kernel.id)), default=-1)
    return depth


def _save(figure, path: str | Path, plt) -> Path:
    path = Path(path)
    figure.tight_layout()
    figure.savefig(path, dpi=150)
    plt.close(figure)
    return path
