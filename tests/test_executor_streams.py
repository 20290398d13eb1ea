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
    assert fake_cuda.made["graph_exec"] == 0  # the CUDA graph is captured at the second inference


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
        for _ in range(2):  # every run of the call then makes the same calls: weights uploaded, plan captured
            executor.run([np.zeros(model.inputs[0].shape, "float32")])
        executor.finish_uploads()
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
    def uploads() -> int:
        return sum(entry[0] == "copy" for entry in fake_cuda.log)

    with make("stage-timer", model) as timer:
        assert uploads() == len(model.constants) == 3
        assert timer.time_order(plan_order(model), warmup=1, repeat=3) == 1.0
        assert uploads() == 3
        # an executor given the timer's device tensors reads them, and computes what the model computes
        executor = StreamsExecutor(model.library, model.graph, model.plan, timer.device_constants, tvm.cpu())
        with executor:
            assert all(executor.buffers[name] is timer.buffers[name] for name in model.constants)
            np.testing.assert_array_equal(executor.run([x])[0], expected)
        assert uploads() == 3
    assert_released(fake_cuda)


def test_the_cuda_graph_warm_up_runs_on_zero_inputs_whatever_memory_it_gets(fake_cuda, monkeypatch):
    """The CUDA-graph executor may launch the plan before any input arrives (a trace, a benchmark); token ids
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
        executor.launch()  # the first inference, issued live, before any input was given
        warm_up = executor.buffers[model.graph.outputs[0].name].numpy()
        np.testing.assert_array_equal(warm_up, np.repeat(table[:1], 4, axis=0))


def _copied_before(fake, executor, event) -> set[str]:
    """The constants whose copies the log shows before `event` was recorded on the copy stream."""
    names = {buffer.data_ptr(): name for name, buffer in executor.buffers.items()}
    copied = set()
    for entry in fake.log:
        if entry[0] == "record" and entry[1] == event:
            return copied
        if entry[0] == "copy" and entry[3] == executor.copy_stream and entry[1] in names:
            copied.add(names[entry[1]])
    raise AssertionError("the event was never recorded")


@pytest.mark.parametrize("kind", ["streams", "cuda-graph"])
def test_the_first_inference_waits_for_each_kernels_own_weights_alone(fake_cuda, model, kind):
    """Pipelined (the default): every weight is copied on the copy stream in the plan's order, an event
    after each kernel's; the first inference waits for a kernel's event on the kernel's stream just before
    issuing it, and later inferences wait for none. The outputs are the model's."""
    x = np.random.default_rng(5).standard_normal(model.inputs[0].shape).astype("float32")
    expected = model(x)
    with make(kind, model) as executor:
        uploads = dict(executor.uploads)
        reading = {launch.kernel for launch in model.plan.launches
                   if any(tensor.kind == "constant" for tensor in model.graph.kernels[launch.kernel].inputs)}
        assert set(uploads) == reading and len(reading) > 1
        for kernel, event in uploads.items():  # each event follows the copies of what its kernel reads
            read = {tensor.name for tensor in model.graph.kernels[kernel].inputs if tensor.kind == "constant"}
            assert read <= _copied_before(fake_cuda, executor, event)
        first_copies = [_copied_before(fake_cuda, executor, uploads[launch.kernel])
                        for launch in model.plan.launches if launch.kernel in uploads]
        assert first_copies[0] < first_copies[-1]  # the first kernel does not wait for every weight
        start = len(fake_cuda.log)
        np.testing.assert_array_equal(executor.run([x])[0], expected)
        waits = [entry for entry in fake_cuda.log[start:] if entry[0] == "wait"]
        streams = {launch.kernel: executor.streams[launch.stream] for launch in model.plan.launches}
        assert {("wait", streams[kernel], event) for kernel, event in uploads.items()} <= set(waits)
        start = len(fake_cuda.log)
        for _ in range(2):
            np.testing.assert_array_equal(executor.run([x])[0], expected)
        events = set(uploads.values())
        assert not [entry for entry in fake_cuda.log[start:] if entry[0] == "wait" and entry[2] in events]
    assert_released(fake_cuda)


def test_not_pipelined_every_weight_is_on_the_device_before_the_first_inference(fake_cuda, model):
    x = np.random.default_rng(6).standard_normal(model.inputs[0].shape).astype("float32")
    with CudaGraphExecutor(model.library, model.graph, model.plan, model.constants, tvm.cpu(),
                           pipelined=False) as executor:
        assert not executor.uploads and not executor.sources  # the copy stream was waited for
        assert sum(entry[0] == "copy" for entry in fake_cuda.log) == len(model.constants)
        np.testing.assert_array_equal(executor.run([x])[0], model(x))



def test_a_kernel_whose_weights_an_earlier_kernel_uploaded_still_waits_for_them(fake_cuda):
    """Two kernels on two streams, unordered, read one constant, copied with the first one's weights: the
    second waits for an upload event too (it was issued with no wait at all)."""
    from conftest import make_model
    from conftest import tensor as value
    from onnx import helper

    from tvmsched.plan import make_plan

    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((8, 3, 3, 3)).astype("float32"),
               "c": rng.standard_normal((1, 3, 1, 1)).astype("float32")}
    nodes = [helper.make_node("Mul", ["input", "c"], ["m"]),
             helper.make_node("Conv", ["m", "w"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ra"]),
             helper.make_node("Add", ["input", "c"], ["s"]),
             helper.make_node("Sigmoid", ["s"], ["sb"])]
    proto = make_model(nodes, [value("input", [1, 3, 8, 8])],
                       [value("ra", [1, 8, 8, 8]), value("sb", [1, 3, 8, 8])], weights)
    model = tvmsched.compile(proto, target="llvm", batch=1)
    readers = {}
    for kernel in model.graph.kernels:
        for name in {tensor.name for tensor in kernel.inputs if tensor.kind == "constant"}:
            readers.setdefault(name, []).append(kernel.id)
    first, second = next(kernels for kernels in readers.values() if len(kernels) == 2)
    rest = [kernel.id for kernel in model.graph.kernels if kernel.id not in (first, second)]
    plan = make_plan(model.graph, [(first, 0), *((kernel, 0) for kernel in rest), (second, 1)], "manual")
    assert not plan.launches[-1].waits
    x = rng.standard_normal((1, 3, 8, 8)).astype("float32")
    with StreamsExecutor(model.library, model.graph, plan, model.constants, tvm.cpu()) as executor:
        uploads = dict(executor.uploads)
        assert second in uploads and _copied_before(fake_cuda, executor, uploads[second]) >= {
            tensor.name for tensor in model.graph.kernels[second].inputs if tensor.kind == "constant"}
        start = len(fake_cuda.log)
        for got, want in zip(executor.run([x]), model(x)):
            np.testing.assert_array_equal(got, want)
        assert ("wait", executor.streams[1], uploads[second]) in fake_cuda.log[start:]
