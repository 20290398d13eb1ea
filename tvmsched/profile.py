"""Where the time goes: each kernel's latency with its work and share of the device's roofline, and one
inference's timeline with a track per stream (a Chrome trace that opens in Perfetto).

Kernel latencies are taken in isolation through `tvmsched.measure`: on GPU, the kernel captured ten times
into a small CUDA Graph, `repeat` kernels' worth of replays timed with CUDA events, median of five rounds;
on CPU, the host clock, median of `repeat`. The timeline is one inference by the
model's executor with a timing event before and after each kernel on its stream: for `cuda-graph`, the
plan's graph captured again with those events as nodes and replayed, so it shows the overlap the schedule
achieves, plus a little event overhead; for `streams`, the same launches issued live from Python.
"""

from __future__ import annotations

import csv
import json
import statistics
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from tvmsched import measure
from tvmsched.cost.analytic import GPU_PEAKS
from tvmsched.executor.base import TraceEvent


@dataclass(frozen=True)
class KernelProfile:
    id: int
    symbol: str
    op_kinds: tuple[str, ...]
    inputs: str  # shapes, e.g. "1x64x56x56 64x64x3x3"
    output: str
    flops: int
    bytes: int
    ms: float
    tuned: bool
    implementation: str  # "tvm", or the vendor library whose plan runs the kernel
    stream: int
    roofline_pct: float | None  # the roofline's lower bound on latency as a share of the measured latency

    @property
    def tflops(self) -> float:
        return self.flops / self.ms / 1e9

    @property
    def gbps(self) -> float:
        return self.bytes / self.ms / 1e6


@dataclass
class Profile:
    device: str
    target: str
    schedule: str
    kernels: list[KernelProfile]
    timeline: list[TraceEvent]
    repeat: int
    benchmark_ms: float  # median latency of an inference without timing events (CompiledModel.benchmark)

    @property
    def kernel_ms(self) -> float:
        """The sum of the kernels' isolated latencies."""
        return sum(kernel.ms for kernel in self.kernels)

    @property
    def inference_ms(self) -> float:
        """The span of the timeline: first kernel start to last kernel end."""
        return max(event.end_ms for event in self.timeline) - min(event.start_ms for event in self.timeline)

    def by_time(self) -> list[KernelProfile]:
        return sorted(self.kernels, key=lambda kernel: kernel.ms, reverse=True)

    def to_json(self) -> dict:
        rows = [{**asdict(kernel), "op_kinds": list(kernel.op_kinds), "tflops": kernel.tflops,
                 "gbps": kernel.gbps} for kernel in self.kernels]
        return {"device": self.device, "target": self.target, "schedule": self.schedule,
                "repeat": self.repeat, "kernel_ms": self.kernel_ms, "inference_ms": self.inference_ms,
                "benchmark_ms": self.benchmark_ms,
                "kernels": rows,
                "timeline": [asdict(event) for event in self.timeline]}

    def chrome_trace(self) -> dict:
        """Chrome trace events: one complete event per kernel (µs), one named track per stream."""
        names = {kernel.id: kernel for kernel in self.kernels}
        origin = min(event.start_ms for event in self.timeline)
        streams = sorted({event.stream for event in self.timeline})
        events = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": stream,
                   "args": {"name": f"stream {stream}"}} for stream in streams]
        events += [{"ph": "X", "name": names[event.kernel].symbol, "cat": "kernel", "pid": 0,
                    "tid": event.stream, "ts": (event.start_ms - origin) * 1e3,
                    "dur": (event.end_ms - event.start_ms) * 1e3,
                    "args": {"kernel": event.kernel, "op_kinds": list(names[event.kernel].op_kinds),
                             "flops": names[event.kernel].flops, "bytes": names[event.kernel].bytes}}
                   for event in self.timeline]
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"device": self.device, "schedule": self.schedule}}

    def save(self, directory: str | Path) -> list[Path]:
        """Write kernels.csv, profile.json and trace.json into `directory`; returns their paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        table = directory / "kernels.csv"
        with table.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["id", "symbol", "op_kinds", "inputs", "output", "flops", "bytes", "ms", "tflops",
                             "gbps", "roofline_pct", "tuned", "implementation", "stream"])
            for kernel in self.by_time():
                writer.writerow([kernel.id, kernel.symbol, "+".join(kernel.op_kinds), kernel.inputs,
                                 kernel.output, kernel.flops, kernel.bytes, f"{kernel.ms:.6f}",
                                 f"{kernel.tflops:.4f}", f"{kernel.gbps:.2f}",
                                 "" if kernel.roofline_pct is None else f"{kernel.roofline_pct:.1f}",
                                 int(kernel.tuned), kernel.implementation, kernel.stream])
        data, trace = directory / "profile.json", directory / "trace.json"
        data.write_text(json.dumps(self.to_json(), indent=1))
        trace.write_text(json.dumps(self.chrome_trace()))
        return [table, data, trace]


def profile(model, repeat: int = 50) -> Profile:
    """Profile a CompiledModel on its device (see the module's docstring)."""
    from tvmsched.target import device_name

    spec = model.meta.target
    benchmark_ms = model.benchmark(repeat=repeat)["median_ms"]
    with model.exclusive() as executor:
        timeline = executor.trace()
        with _kernel_timer(model, executor) as timer:
            latencies = {kernel.id: timer(kernel.id, repeat) for kernel in model.graph.kernels}
    name = device_name(spec)
    peaks = next((peak for key, peak in GPU_PEAKS.items() if key in name), None)
    streams = {launch.kernel: launch.stream for launch in model.plan.launches}
    tuned = set(model.meta.tuned_kernels)
    kernels = []
    for kernel in model.graph.kernels:
        ms = latencies[kernel.id]
        bound = max(kernel.flops / peaks[0], kernel.bytes / peaks[1]) * 1e3 if peaks else None
        shapes = [" ".join(_dims(t.shape) for t in side) for side in (kernel.inputs, kernel.outputs)]
        implementation = kernel.implementation_in(model.plan.tvm_kernels)
        kernels.append(KernelProfile(kernel.id, kernel.symbol, kernel.op_kinds, *shapes, kernel.flops,
                                     kernel.bytes, ms, kernel.symbol in tuned and implementation == "tvm",
                                     implementation, streams[kernel.id],
                                     None if bound is None else 100 * bound / ms))
    return Profile(name, spec.key, model.plan.scheduler, kernels, timeline, repeat, benchmark_ms)


@contextmanager
def _kernel_timer(model, executor):
    """Yields a function (kernel id, repeat) -> median milliseconds of that kernel run alone: on a GPU by a
    stage timer on the constants of the model's `executor`, closed when the block is left; else in the
    executor's buffers by the host clock."""
    if model.meta.target.kind == "cuda":
        from tvmsched.executor.streams import StageTimer

        copies = 10  # per captured graph, so the graph launch is amortized
        with StageTimer(model.library, model.graph, model.plan, executor.device_constants, executor.device,
                        max_groups=1, folded=model.folded) as timer:  # the model's constants, on the device
            # (the executor's only: a vendor plan's folded weights replace the constants they were made from)
            yield lambda kernel, repeat: timer.time_stage(((kernel,) * copies,), rounds=5,
                                                          replays=max(1, repeat // copies)) / copies
        return

    def time_kernel(kernel: int, repeat: int) -> float:
        launcher = executor.launchers[kernel]
        launcher(None)

        def call() -> None:
            launcher(None)
            executor.device.sync()
        return statistics.median(measure.host_times(call, repeat))
    yield time_kernel


def _dims(shape) -> str:
    return "x".join(map(str, shape)) or "scalar"
