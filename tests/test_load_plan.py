"""Direct host access after `offload()`: the load planner (`tvmsched.load_plan`) against its model, and
the offloadable executor's kernels reading their weights in place, its reload graph's order, its waits and
its timings, on the CPU over stand-ins for cuda-python's runtime and driver
(tests/test_executor_gpu.py runs them on a GPU)."""

import json

import numpy as np
import pytest
import tvm

import tvmsched
from tvmsched.errors import ArtifactError
from tvmsched.executor import streams
from tvmsched.executor.streams import CudaGraphExecutor
from tvmsched.load_plan import MIN_GAIN_MS, KernelLoad, LoadPlan, first_inference_ms, plan_load, table


def row(kernel: int, copy_ms: float, device_ms: float, direct_ms: float, nbytes: int = 1 << 20):
    return KernelLoad(kernel, f"k{kernel}", nbytes if copy_ms else 0, copy_ms, device_ms, direct_ms)


def test_the_model_runs_copies_in_order_and_kernels_after_their_copy_or_in_place():
    rows = [row(0, 2.0, 0.1, 0.3), row(1, 1.0, 0.5, 4.0), row(2, 0.0, 0.2, 0.2)]
    assert first_inference_ms(rows, frozenset()) == pytest.approx(3.0 + 0.5 + 0.2)  # waits for both copies
    # kernel 0 in place holds the link for 0.3 - 0.1 ms while kernel 1's copy is under way
    assert first_inference_ms(rows, frozenset({0})) == pytest.approx(max(0.3, 1.0 + 0.2) + 0.5 + 0.2)
    assert first_inference_ms(rows, frozenset({0, 1})) == pytest.approx(0.3 + 4.0 + 0.2)  # no copy to delay
    assert first_inference_ms(rows, frozenset({1})) == pytest.approx(2.0 + 0.1 + 4.0 + 0.2)  # copies done


def test_a_large_copy_read_little_is_read_in_place_and_a_slow_kernel_in_place_is_not():
    """BERT's case: the first kernel waits for a large table it reads a few rows of."""
    rows = [row(0, 1.8, 0.01, 0.03, 94 << 20), row(1, 0.1, 0.05, 2.0), row(2, 0.0, 0.02, 0.02),
            row(3, 0.2, 0.05, 1.5), row(4, 0.05, 0.01, 0.1)]  # 4 reads all of its weights: slower than a copy
    plan = plan_load("gpu", "abc", rows)
    assert plan.direct == {0}
    assert plan.upload_ms == pytest.approx(first_inference_ms(rows, frozenset()), abs=1e-4)
    assert plan.planned_ms == pytest.approx(first_inference_ms(rows, frozenset({0})), abs=1e-4)
    assert plan.planned_ms < plan.upload_ms
    header, *lines = table(plan)
    assert header[0] == "kernel" and [line[0] for line in lines] == ["0", "1", "3", "4"]  # with weights
    assert [line[-1] for line in lines] == ["in place", "upload", "upload", "upload"]


@pytest.mark.parametrize("seed", range(40))
def test_the_plan_is_what_the_model_says_never_worse_than_none_or_all_and_no_single_change_helps(seed):
    rng = np.random.default_rng(seed)
    rows = [row(kernel, float(rng.choice([0.0, rng.uniform(0.01, 2.0)])), float(rng.uniform(0.01, 0.5)),
                float(rng.uniform(0.01, 2.0))) for kernel in range(7)]
    plan = plan_load("gpu", "abc", rows)
    direct = plan.direct
    with_weights = {r.kernel for r in rows if r.weight_bytes}
    assert direct <= with_weights
    assert plan.planned_ms == pytest.approx(first_inference_ms(rows, direct), abs=1e-4)
    assert plan.planned_ms <= plan.upload_ms + 1e-4
    assert plan.planned_ms <= first_inference_ms(rows, frozenset(with_weights)) + 1e-4
    for kernel in with_weights:
        assert first_inference_ms(rows, direct ^ {kernel}) >= plan.planned_ms - MIN_GAIN_MS


def test_a_load_plan_round_trips_through_json_and_another_schema_is_refused():
    plan = plan_load("NVIDIA H100", "abc", [row(0, 1.0, 0.1, 0.2), row(1, 0.0, 0.1, 0.1)])
    assert LoadPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    with pytest.raises(ArtifactError, match="plan again with tvmsched plan-load"):
        LoadPlan.from_json({**plan.to_json(), "schema": 0})


@pytest.fixture
def model(branchy_model):
    return tvmsched.compile(branchy_model, target="llvm", batch=1, schedule="greedy", cost="analytic")


def offloadable(model) -> CudaGraphExecutor:
    return CudaGraphExecutor(model.library, model.graph, model.plan, model.constants, tvm.cpu(),
                             offloadable=True)


def weight_readers(model) -> dict[str, list[int]]:
    readers: dict[str, list[int]] = {}
    for kernel in model.graph.kernels:
        for name in dict.fromkeys(tensor.name for tensor in kernel.inputs if tensor.kind == "constant"):
            readers.setdefault(name, []).append(kernel.id)
    return readers


def test_kernels_reading_in_place_compute_from_the_page_locked_host_copies_alone(fake_cuda, fake_driver,
                                                                                 model):
    """With every weight on the "device" zeroed, the plan issued with the in-place launchers still gives
    the model's outputs (and with the executor's own launchers does not)."""
    x = np.random.default_rng(1).standard_normal(model.inputs[0].shape).astype("float32")
    expected = model(x)
    readers = weight_readers(model)
    with offloadable(model) as executor:
        np.testing.assert_array_equal(executor.run([x])[0], expected)
        reading = frozenset(kernel for kernels in readers.values() for kernel in kernels)
        in_place = executor._direct_launchers(reading)
        assert set(in_place) == reading and len(reading) > 1
        for name in readers:
            executor.buffers[name].copyfrom(np.zeros(executor.buffers[name].shape, "float32"))
        output = executor.buffers[model.graph.outputs[0].name]
        executor.issue(launchers={**executor.launchers, **in_place})
        np.testing.assert_array_equal(output.numpy(), expected)
        executor.issue()
        assert not np.allclose(output.numpy(), expected)


def test_the_reload_graph_copies_the_weights_read_in_place_last_and_those_kernels_wait_for_none(
        fake_cuda, fake_driver, model):
    x = np.random.default_rng(2).standard_normal(model.inputs[0].shape).astype("float32")
    expected = model(x)
    readers = weight_readers(model)
    alone = next(kernels[0] for kernels in readers.values() if len(kernels) == 1)
    with offloadable(model) as executor:
        executor.run([x])
        executor.offload()  # the reload graph with every weight uploaded: one copy each
        start = len(fake_cuda.log)
        direct = frozenset({alone})
        executor.offload(direct)  # already offloaded: maps back, captures this reload graph, releases
        entries = [entry for entry in fake_cuda.log[start:] if entry[1:] and executor.copy_stream in entry]
        copies = [entry[1] for entry in entries if entry[0] == "copy"]
        read = executor._read_pointers(model.graph.kernels[alone])
        deferred = [pointer for pointer in copies if pointer in read]
        assert deferred and copies[-len(deferred):] == deferred and len(copies) == len(model.constants)
        waiting = [uploads for uploads in executor.upload_order if uploads.waits and uploads.kernel != alone]
        records = [entry for entry in entries if entry[0] == "record"]
        assert len(records) == len(waiting) + 2  # each waiting kernel's event, all but the last, the end
        assert set(executor.reload_execs) == {frozenset(), direct}
        np.testing.assert_array_equal(executor.run([x])[0], expected)


def test_load_timings_give_each_kernels_weight_bytes_in_plan_order_and_their_share_of_the_copy_time(
        fake_cuda, fake_driver, model, monkeypatch):
    monkeypatch.setattr(streams, "L2_FLUSH_BYTES", 4096)
    readers = weight_readers(model)
    with offloadable(model) as executor:
        rows = executor.load_timings()
    assert [r.kernel for r in rows] == [launch.kernel for launch in model.plan.launches]
    first = {name: kernels[0] for name, kernels in readers.items()}
    for r in rows:
        assert r.weight_bytes == sum(model.constants[name].nbytes for name, kernel in first.items()
                                     if kernel == r.kernel)
    assert sum(r.copy_ms for r in rows) == pytest.approx(1.0, abs=1e-3)  # the stand-in's elapsed time
    plan = plan_load("cpu", model.graph.hash, rows)
    with pytest.raises(ArtifactError, match="plan again"):
        model.offload(LoadPlan(plan.device, "another", plan.kernels, 0.0, 0.0))


def test_a_constant_output_is_never_read_in_place_and_the_first_result_waits_for_its_copy(fake_cuda,
                                                                                          fake_driver):
    """`run` reads a constant output: it stays among the copies the first result waits for, also where
    the one kernel reading it reads in place."""
    from conftest import make_model
    from conftest import tensor as value
    from onnx import helper

    w = np.arange(4, dtype="float32").reshape(1, 4) + 1
    proto = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [value("x", [1, 4])],
                       [value("y", [1, 4]), value("w", [1, 4])], {"w": w})
    model = tvmsched.compile(proto, target="llvm", batch=1)
    with offloadable(model) as executor:
        executor.run([np.zeros((1, 4), "float32")])
        (name,) = [tensor.name for tensor in model.graph.outputs if tensor.kind == "constant"]
        pointer = executor.buffers[name].data_ptr()
        assert executor._weight_readers()[pointer] == {0, -1}
        start = len(fake_cuda.log)
        executor.offload(frozenset({0}))
        log = fake_cuda.log[start:]
        main = executor.streams[0]
        needed, _ = [entry[2] for entry in log if entry[0] == "wait" and entry[1] == main][-2:]
        recorded = log.index(("record", needed, executor.copy_stream))
        assert max(i for i, entry in enumerate(log) if entry[0] == "copy" and entry[1] == pointer) < recorded
        np.testing.assert_array_equal(executor.run([np.ones((1, 4), "float32")])[1], w)


def test_synchronize_waits_for_everything_after_a_second_launch_and_close_for_the_last_copies(
        fake_cuda, fake_driver, model):
    x = np.zeros(model.inputs[0].shape, "float32")
    calls = []

    def recording(name: str, call):
        def recorded(*args):
            calls.append(name)
            return call(*args)
        return recorded
    for name in ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaFreeHost", "cudaGraphExecDestroy"):
        setattr(fake_cuda, name, recording(name, getattr(fake_cuda, name)))
    first = model.graph.kernels[0].id
    executor = offloadable(model)
    executor.run([x])
    executor.offload(frozenset({first}))
    calls.clear()
    executor.launch()  # the reload graph: its first result alone is waited for
    executor.synchronize()
    assert calls == ["cudaEventSynchronize"]
    executor.offload(frozenset({first}))
    calls.clear()
    executor.launch()
    executor.launch()  # the plan's graph after it: waited for whole
    executor.synchronize()
    assert "cudaStreamSynchronize" in calls
    executor.offload(frozenset({first}))
    executor.launch()
    executor.synchronize()
    calls.clear()
    executor.close()  # the last copies first, then their sources and graphs
    assert calls[0] == "cudaStreamSynchronize" and "cudaFreeHost" in calls
