"""The CUDA executors own their streams, events and graphs: each is destroyed exactly once, when a
constructor or a timed call fails at any of its CUDA calls and when the executor is closed (also twice); a
closed executor refuses to run; the plan timer's timed executors share its constants. Run on the CPU over
a stand-in cudart (tests/fakecuda.py); tests/test_executor_gpu.py runs the paths that succeed on a GPU."""

import numpy as np
import pytest
import tvm

import tvmsched
from tvmsched.errors import TargetError
from tvmsched.executor.streams import CudaGraphExecutor, StageTimer, StreamsExecutor

EXECUTORS = {"streams": StreamsExecutor, "cuda-graph": CudaGraphExecutor,
             "stage-timer": lambda *args: StageTimer(*args, max_groups=3)}


@pytest.fixture
def model(branchy_model):
    model = tvmsched.compile(branchy_model, target="llvm", batch=1, schedule="greedy", cost="analytic")
    assert model.plan.num_streams > 1 and any(launch.waits for launch in model.plan.launches)
    return model


def make(kind: str, model):
    return EXECUTORS[kind](model.library, model.graph, model.plan, model.constants, tvm.cpu())


def plan_order(model) -> tuple[tuple[int, int], ...]:
    return tuple((launch.kernel, launch.stream) for launch in model.plan.launches)


def assert_released(fake, live: dict[int, str] | None = None) -> None:
    """Only the handles `live` are left; no handle was destroyed twice or used once destroyed."""
    assert fake.live == (live or {}) and not fake.refused


def fail_each_call(fake, action) -> int:
    """Run `action`, then again once per CUDA call it made with that call failing; returns the count."""
    start = fake.calls
    action()
    calls = fake.calls - start
    for failing in range(calls):
        fake.fail_at = fake.calls + failing
        with pytest.raises(TargetError, match="cudaErrorUnknown"):
            action()
    fake.fail_at = None
    return calls


@pytest.mark.parametrize("kind", sorted(EXECUTORS))
def test_a_constructor_failing_at_any_call_destroys_what_it_made(fake_cuda, model, kind):
    def construct():
        try:
            make(kind, model).close()  # when no call fails
        finally:
            assert_released(fake_cuda)

    assert fail_each_call(fake_cuda, construct) >= 5  # 2 streams and 3 events, for the streams executor
    assert fake_cuda.made["stream"] > 2 and fake_cuda.made == fake_cuda.destroyed
    assert (fake_cuda.made["graph_exec"] > 0) == (kind == "cuda-graph")


@pytest.mark.parametrize("kind", sorted(EXECUTORS))
def test_close_destroys_each_handle_once_and_a_closed_executor_refuses_to_run(fake_cuda, model, kind):
    executor = make(kind, model)
    assert fake_cuda.live
    executor.close()
    assert_released(fake_cuda)
    executor.close()
    with executor:  # leaving the block closes it once more
        pass
    assert_released(fake_cuda)
    x = np.zeros(model.inputs[0].shape, "float32")
    for use in (lambda: executor.run([x]), lambda: executor.time_launches(1), executor.trace):
        with pytest.raises(TargetError, match="executor was closed; create a new one"):
            use()
    assert_released(fake_cuda)  # the timing events made before the refusal are destroyed


TIMED = {"streams trace": ("streams", lambda executor, model: executor.trace()),
         "cuda-graph trace": ("cuda-graph", lambda executor, model: executor.trace()),
         "cuda-graph time_launches": ("cuda-graph", lambda executor, model: executor.time_launches(2)),
         "timer time_stage": ("stage-timer", lambda executor, model: executor.time_stage(((0, 2), (1,)))),
         "timer time_order": ("stage-timer",
                              lambda executor, model: executor.time_order(plan_order(model), 1, 2))}


@pytest.mark.parametrize("timed", sorted(TIMED))
def test_a_timed_call_failing_at_any_call_destroys_its_own_graphs_and_events(fake_cuda, model, timed):
    kind, call = TIMED[timed]
    with make(kind, model) as executor:
        owned = dict(fake_cuda.live)

        def call_and_check():
            try:
                call(executor, model)
            finally:
                assert_released(fake_cuda, owned)

        assert fail_each_call(fake_cuda, call_and_check) > 3
        assert sum(fake_cuda.made.values()) > len(owned)  # the call made graphs or events of its own
    assert_released(fake_cuda)


def test_time_order_shares_the_timers_constants_instead_of_uploading_them(fake_cuda, model, monkeypatch):
    x = np.random.default_rng(3).standard_normal(model.inputs[0].shape).astype("float32")
    expected = model(x)
    uploads, upload = [], tvm.runtime.tensor

    def counted_upload(*args, **kwargs):
        uploads.append(args[0])
        return upload(*args, **kwargs)

    monkeypatch.setattr(tvm.runtime, "tensor", counted_upload)
    with make("stage-timer", model) as timer:
        assert len(uploads) == len(model.constants) == 3
        assert timer.time_order(plan_order(model), warmup=1, repeat=3) == 1.0
        assert len(uploads) == 3
        # an executor given the timer's device tensors reads them, and computes what the model computes
        executor = StreamsExecutor(model.library, model.graph, model.plan, timer.device_constants, tvm.cpu())
        with executor:
            assert all(executor.buffers[name] is timer.buffers[name] for name in model.constants)
            np.testing.assert_array_equal(executor.run([x])[0], expected)
        assert len(uploads) == 3
    assert_released(fake_cuda)


def test_the_cuda_graph_warm_up_runs_on_zero_inputs_whatever_memory_it_gets(fake_cuda, monkeypatch):
    """The CUDA-graph executor launches the plan once while it is made, before any input arrives; token ids
    taken from recycled device memory sent a gather out of its table and lost the CUDA context. Here the
    allocator hands back int64 memory holding 5s: the warm-up must still gather row 0."""
    from conftest import make_model, tensor
    from onnx import TensorProto, helper

    table = np.arange(24, dtype="float32").reshape(8, 3)
    proto = make_model([helper.make_node("Gather", ["table", "ids"], ["out"], axis=0)],
                       [tensor("ids", [4], TensorProto.INT64)], [tensor("out", [4, 3])], {"table": table})
    model = tvmsched.compile(proto, target="llvm")
    empty = tvm.runtime.empty

    def recycled(shape, dtype="float32", device=None):
        made = empty(shape, dtype, device)
        if dtype == "int64":
            made.copyfrom(np.full(shape, 5, "int64"))
        return made

    monkeypatch.setattr(tvm.runtime, "empty", recycled)
    with CudaGraphExecutor(model.library, model.graph, model.plan, model.constants, tvm.cpu()) as executor:
        warm_up = executor.buffers[model.graph.outputs[0].name].numpy()
        np.testing.assert_array_equal(warm_up, np.repeat(table[:1], 4, axis=0))
