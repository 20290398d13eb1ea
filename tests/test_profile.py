"""Profiles: one row per kernel with its work and a positive latency, a timeline with one event per kernel
whose per-stream events never overlap, a valid Chrome trace with a track per stream, and the CLI's files."""

import csv
import json
import platform
import subprocess
import sys
from types import SimpleNamespace

import pytest

import tvmsched
from tvmsched.profile import _kernel_timer


def check_profile(model, profile):
    graph = model.graph
    assert [kernel.id for kernel in profile.kernels] == [kernel.id for kernel in graph.kernels]
    for row, kernel in zip(profile.kernels, graph.kernels):
        assert (row.symbol, row.flops, row.bytes) == (kernel.symbol, kernel.flops, kernel.bytes)
        assert row.ms > 0 and row.tflops >= 0
    assert sorted(event.kernel for event in profile.timeline) == list(range(len(graph.kernels)))
    streams = {launch.kernel: launch.stream for launch in model.plan.launches}
    for stream in set(streams.values()):
        events = sorted((e for e in profile.timeline if e.stream == stream), key=lambda e: e.start_ms)
        assert all(e.start_ms < e.end_ms for e in events)
        assert all(a.end_ms <= b.start_ms + 1e-6 for a, b in zip(events, events[1:]))  # one stream: in order
    assert max(e.end_ms - e.start_ms for e in profile.timeline) <= profile.inference_ms + 1e-6
    trace = json.loads(json.dumps(profile.chrome_trace()))
    complete = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    tracks = {event["tid"] for event in trace["traceEvents"] if event["ph"] == "M"}
    assert len(complete) == len(graph.kernels) and tracks == set(streams.values())
    assert all(event["tid"] == streams[event["args"]["kernel"]] and event["ts"] >= 0 for event in complete)


@pytest.mark.parametrize("schedule", ["sequential", "greedy"])
def test_profile_on_llvm(branchy_model, schedule):
    model = tvmsched.compile(branchy_model, target="llvm", batch=1, schedule=schedule, cost="analytic")
    assert schedule == "sequential" or model.plan.num_streams > 1
    profile = model.profile(repeat=3)
    check_profile(model, profile)
    busy = sum(event.end_ms - event.start_ms for event in profile.timeline)
    assert busy <= profile.inference_ms + 1e-6  # the CPU runs kernels one at a time
    assert all(kernel.roofline_pct is None and not kernel.tuned for kernel in profile.kernels)


def test_profile_command_writes_tables_trace_and_pictures(branchy_model, tmp_path):
    path = tmp_path / "branchy.onnx"
    path.write_bytes(branchy_model.SerializeToString())
    out = tmp_path / "profile"
    result = subprocess.run([sys.executable, "-m", "tvmsched", "profile", str(path), "-o", str(out),
                             "--target", "llvm", "--batch", "1", "--schedule", "greedy", "--cost", "analytic",
                             "--repeat", "3"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert f"cpu-{platform.machine()}" in result.stdout and "wrote kernels.csv" in result.stderr
    rows = list(csv.DictReader((out / "kernels.csv").open()))
    data = json.loads((out / "profile.json").read_text())
    assert len(rows) == len(data["kernels"]) == len(data["timeline"]) > 0
    assert [float(row["ms"]) for row in rows] == sorted((float(row["ms"]) for row in rows), reverse=True)
    assert len([e for e in json.loads((out / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]) \
        == len(rows)
    for picture in ("timeline.png", "schedule.png"):
        assert (out / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (out / "schedule.svg").read_text()


def test_the_kernel_timer_on_a_gpu_closes_its_stage_timer(branchy_model, fake_cuda):
    """On the CPU over a stand-in cudart (tests/fakecuda.py), with the model passing for a CUDA build."""
    model = tvmsched.compile(branchy_model, target="llvm", batch=1)
    cuda_build = SimpleNamespace(library=model.library, graph=model.graph, plan=model.plan,
                                 folded=model.folded,
                                 meta=SimpleNamespace(target=SimpleNamespace(kind="cuda")))
    with _kernel_timer(cuda_build, model.executor) as time_kernel:
        assert time_kernel(0, 20) == pytest.approx(1.0 / 2 / 10)  # 1 ms (the stand-in's) per 2 replays of 10
        assert fake_cuda.live and fake_cuda.made["graph_exec"] == 1
    assert fake_cuda.made == fake_cuda.destroyed and not fake_cuda.refused


@pytest.mark.gpu
def test_profile_on_cuda(branchy_model):
    model = tvmsched.compile(branchy_model, target="cuda", batch=1, schedule="greedy", cost="analytic")
    profile = model.profile(repeat=20)
    check_profile(model, profile)
