"""Measurement: the arithmetic of each timing (median over rounds of the mean of back-to-back replays, one
time per inference, the benchmark's statistics after its warm-up), that every CUDA handle a timing makes is
destroyed, and that the benchmark, the stage timer and the profile's kernel timer all time through
`tvmsched.measure`. CUDA runs on the CPU over a stand-in cudart (tests/fakecuda.py)."""

import gc
import itertools
import time
from contextlib import ExitStack

import numpy as np
import pytest
import tvm

import tvmsched
from tvmsched import cuda, measure
from tvmsched.executor.streams import CudaGraphExecutor, StageTimer


def test_time_captured_is_the_median_over_rounds_of_the_mean_of_replays(fake_cuda):
    issued = []
    with ExitStack() as owner:
        stream = cuda.stream(owner)
        fake_cuda.elapsed = iter([8.0, 4.0, 40.0])  # the rounds' totals: means 2, 1 and 10
        assert measure.time_captured(stream, lambda: issued.append(1), replays=4, rounds=3) == 2.0
        assert issued == [1] and fake_cuda.launched == 1 + 3 * 4  # captured once; one upload replay
        assert fake_cuda.made["graph_exec"] == 1 and fake_cuda.made["event"] == 2
        assert set(fake_cuda.live.values()) == {"stream"}  # the graph and the events are destroyed
        fake_cuda.elapsed = iter([3.0, 1.0, 2.0, 4.0])
        assert measure.time_captured(stream, lambda: None, replays=1, rounds=4) == 2.5
    assert fake_cuda.made == fake_cuda.destroyed and not fake_cuda.refused


def test_event_times_time_each_call_alone(fake_cuda):
    issued = []
    with ExitStack() as owner:
        stream = cuda.stream(owner)
        fake_cuda.elapsed = iter([3.0, 1.0, 2.0])
        assert measure.event_times(stream, lambda: issued.append(1), 3) == [3.0, 1.0, 2.0]
    assert issued == [1, 1, 1] and fake_cuda.made == fake_cuda.destroyed and not fake_cuda.refused


def test_host_times_are_milliseconds_of_each_call(monkeypatch):
    clock = iter([1.0, 1.002, 5.0, 5.0005])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    calls = []
    assert measure.host_times(lambda: calls.append(1), 2) == pytest.approx([2.0, 0.5])
    assert calls == [1, 1]


class Launches:
    """A stand-in executor whose inferences take the given milliseconds in turn (on the host clock too, where
    a test gives it one)."""

    def __init__(self, times, clock=None):
        self.times = iter(times)
        self.timed = []
        self.clock = clock

    def time_launches(self, repeat: int) -> list[float]:
        self.timed.append(repeat)
        times = [next(self.times) for _ in range(repeat)]
        if self.clock is not None:
            self.clock[0] += sum(times) / 1e3
        return times


def test_the_benchmark_drops_its_warm_up_and_reports_the_median_min_and_max():
    executor = Launches([100.0, 100.0, 3.0, 1.0, 2.0, 10.0])
    assert measure.benchmark(executor, warmup=2, repeat=4) == {
        "median_ms": 2.5, "min_ms": 1.0, "max_ms": 10.0, "repeat": 4, "warmup": 2}
    assert executor.timed == [1, 1, 4]  # the first inference sets the pace


@pytest.mark.parametrize("ms, warmup, repeat",
                         [(31.25, 10, 48), (125.0, 5, 12), (1500.0, 1, 3), (0.1, 10, 200)])
def test_a_benchmark_without_repeat_fits_its_budget(monkeypatch, ms, warmup, repeat):
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    executor = Launches(itertools.repeat(ms), clock)
    reports = []
    result = measure.benchmark(executor, warmup=10, budget_s=2.0,
                               progress=lambda done, total: reports.append((done, total)))
    # a quarter of the budget for the warm-up, the rest for the timed inferences, 3 to 200 of them
    assert (result["warmup"], result["repeat"]) == (warmup, repeat)
    assert sum(executor.timed) == warmup + repeat
    assert reports == [(min(done, repeat), repeat) for done in range(10, repeat + 10, 10)]
    assert measure.benchmark(Launches(itertools.repeat(ms), clock), warmup=1, repeat=4)["repeat"] == 4


@pytest.fixture
def calls(monkeypatch):
    """The names of the `measure` functions called, in order."""
    called = []
    for name in ("benchmark", "host_times", "event_times", "time_captured"):
        function = getattr(measure, name)

        def spy(*args, _name=name, _function=function, **kwargs):
            called.append(_name)
            return _function(*args, **kwargs)
        monkeypatch.setattr(measure, name, spy)
    return called


def test_the_benchmark_times_through_measure(branchy_model, calls):
    result = tvmsched.compile(branchy_model, target="llvm", batch=1).benchmark(warmup=1, repeat=3)
    assert calls == ["benchmark", "host_times", "host_times"] and result["repeat"] == 3


def test_the_cuda_executors_and_the_stage_timer_time_through_measure(branchy_model, fake_cuda, calls):
    model = tvmsched.compile(branchy_model, target="llvm", batch=1, schedule="greedy", cost="analytic")
    with CudaGraphExecutor(model.library, model.graph, model.plan, model.constants, tvm.cpu()) as executor:
        assert executor.time_launches(2) == [1.0, 1.0] and calls == ["event_times"]
    calls.clear()
    with StageTimer(model.library, model.graph, model.plan, model.constants, tvm.cpu(), 2) as timer:
        assert timer.time_stage(((0,), (1,)), replays=4) == 0.25 and calls == ["time_captured"]
        order = tuple((launch.kernel, launch.stream) for launch in model.plan.launches)
        assert timer.time_order(order, warmup=1, repeat=3) == 1.0
        assert calls == ["time_captured", "benchmark", "event_times", "event_times"]
    assert fake_cuda.made == fake_cuda.destroyed and not fake_cuda.refused


def test_the_profiles_kernel_timer_times_through_measure(branchy_model, calls):
    model = tvmsched.compile(branchy_model, target="llvm", batch=1)
    profile = model.profile(repeat=3)
    kernels = len(model.graph.kernels)
    assert calls == ["benchmark"] + ["host_times"] * (3 + kernels)  # warm-up: a first inference, then 9
    assert all(np.isfinite(kernel.ms) and kernel.ms > 0 for kernel in profile.kernels)


def test_the_profiles_kernel_timer_on_a_gpu_times_captured_kernels(branchy_model, fake_cuda, calls):
    from types import SimpleNamespace

    from tvmsched.profile import _kernel_timer

    model = tvmsched.compile(branchy_model, target="llvm", batch=1)
    cuda_build = SimpleNamespace(library=model.library, graph=model.graph, plan=model.plan,
                                 folded=model.folded,
                                 meta=SimpleNamespace(target=SimpleNamespace(kind="cuda")))
    with model.exclusive() as executor, _kernel_timer(cuda_build, executor) as time_kernel:
        fake_cuda.elapsed = iter([30.0, 10.0, 20.0, 50.0, 40.0])  # five rounds of 3 replays of 10 copies
        assert time_kernel(1, 30) == pytest.approx(30.0 / 3 / 10)
    assert calls == ["time_captured"] and fake_cuda.launched == 1 + 5 * 3


def test_no_garbage_is_collected_while_capturing(fake_cuda):
    """A collection mid-capture runs finalizers that free device memory, illegal in a capture (TVM aborted
    on the H100): the collector is held off while issuing, and back on after, also when issuing raised."""
    states = []

    def failing():
        states.append(gc.isenabled())
        raise RuntimeError("issue failed")

    with ExitStack() as owner:
        stream = cuda.stream(owner)
        cuda.capture(owner, stream, lambda: states.append(gc.isenabled()))
        with pytest.raises(RuntimeError, match="issue failed"):
            cuda.capture(owner, stream, failing)
    assert states == [False, False] and gc.isenabled()
