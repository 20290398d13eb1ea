"""Kernel tactics on the CPU, over a numpy stand-in library (tests/vendor_standin.py) and the stand-in cudart:
each recognized kernel's VendorOp computes what TVM's kernel computes; selection takes the fastest plan
whose output matches TVM's, keeps TVM where it is faster, caches its timings; the executors launch the
chosen plans on their streams with workspaces from the memory plan; builds save, load and refuse another
library version. tests/test_tactics_gpu.py runs cuDNN itself."""

import threading
from dataclasses import replace

import numpy as np
import onnx
import pytest
import tvm
from conftest import make_model, onnxruntime_outputs, tensor
from onnx import helper
from test_plan import assert_race_free
from vendor_standin import WORKSPACE, StandIn, compute

import tvmsched
from tvmsched import measure
from tvmsched.api import CompiledModel, plan_schedule
from tvmsched.cost.analytic import AnalyticCost
from tvmsched.errors import ArtifactError, GraphError, TargetError, UsageError
from tvmsched.executor.sequential import SequentialExecutor
from tvmsched.executor.streams import StageTimer, StreamsExecutor
from tvmsched.schedule import create_scheduler
from tvmsched.tactics import in_plan, library, select, tail
from tvmsched.tactics.library import Candidate
from tvmsched.tactics.tail import split_point
from tvmsched.tactics.vendor_op import Conv2d, EpilogueOp, VendorOp

RNG = np.random.default_rng(0)


def network() -> onnx.ModelProto:
    """A small CNN with the epilogues recognition knows: conv + batch norm + relu, a depthwise conv + clip,
    a residual add, a sigmoid, a conv + bias + relu, branches, a pool and a Gemm + bias + GELU (erf's)."""
    rng = np.random.default_rng(1)

    def weight(*shape):
        return rng.standard_normal(shape).astype("float32") * 0.3

    weights = {"w0": weight(8, 3, 3, 3), "gamma": weight(8) + 1, "beta": weight(8), "mean": weight(8),
               "var": np.abs(weight(8)) + 0.5, "w1": weight(8, 1, 3, 3), "b1": weight(8),
               "w2": weight(8, 8, 1, 1), "b2": weight(8), "w3": weight(8, 8, 1, 1),
               "w4": weight(8, 8, 1, 1), "b4": weight(8),
               "fc": weight(8, 5), "fc_b": weight(5),
               "low": np.array(0, "float32"), "high": np.array(6, "float32"),
               "root2": np.array(np.sqrt(2), "float32"), "one": np.array(1, "float32"),
               "half": np.array(0.5, "float32")}
    nodes = [helper.make_node("Conv", ["input", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c0", "gamma", "beta", "mean", "var"], ["n0"]),
             helper.make_node("Relu", ["n0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], group=8),
             helper.make_node("Clip", ["c1", "low", "high"], ["k1"]),
             helper.make_node("Conv", ["k1", "w2", "b2"], ["c2"]),
             helper.make_node("Add", ["c2", "r0"], ["a2"]),
             helper.make_node("Conv", ["r0", "w3"], ["c3"]),
             helper.make_node("Sigmoid", ["c3"], ["s3"]),
             helper.make_node("Conv", ["k1", "w4", "b4"], ["c4"]),
             helper.make_node("Relu", ["c4"], ["r4"]),
             helper.make_node("Mul", ["a2", "s3"], ["m"]),
             helper.make_node("Add", ["m", "r4"], ["m4"]),
             helper.make_node("GlobalAveragePool", ["m4"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fc_b"], ["g"]),
             helper.make_node("Div", ["g", "root2"], ["g1"]), helper.make_node("Erf", ["g1"], ["g2"]),
             helper.make_node("Add", ["g2", "one"], ["g3"]), helper.make_node("Mul", ["g", "g3"], ["g4"]),
             helper.make_node("Mul", ["g4", "half"], ["output"])]
    return make_model(nodes, [tensor("input", [2, 3, 8, 8])], [tensor("output", [2, 5])], weights)


@pytest.fixture(autouse=True)
def _as_on_a_gpu(gpu_rewrites):
    """This module's llvm builds stand in for GPU builds."""


@pytest.fixture
def standin(monkeypatch):
    """The stand-in library as the one installed vendor library, with the plans and times a test sets:
    `times[plan]` is a plan's milliseconds, `times["tvm"]` TVM's function's."""
    monkeypatch.setattr(library, "LIBRARIES", {"standin": StandIn})
    monkeypatch.setattr(select, "LIBRARIES", library.LIBRARIES)
    monkeypatch.setattr(StandIn, "launched", [])
    monkeypatch.setattr(StandIn, "plans", ("exact",))
    monkeypatch.setattr(StandIn, "opened", 0)
    monkeypatch.setattr(library, "_SHARED", {})
    times = {"tvm": 2.0, "exact": 1.0, "off": 0.5, "fails": 0.1}

    def time_captured(stream, issue, replays, rounds):
        before = len(StandIn.launched)
        issue()
        plans = {launch[0] for launch in StandIn.launched[before:]} or {"tvm"}
        [plan] = plans
        return times[plan] * select.COPIES
    monkeypatch.setattr(measure, "time_captured", time_captured)
    return times


@pytest.fixture
def model():
    return tvmsched.compile(network(), target="llvm", batch=2)


def choose(model, mode: str, cache, make_timer=None):
    def timer():
        return StageTimer(model.library, model.graph, model.plan, model.constants, tvm.cpu(), max_groups=1)
    return select.select_tactics(model.graph, mode, make_timer or timer, "cpu-test", model.meta.kernels_hash,
                                 model.constants, cache=cache)


@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-5), ("fp16", 2e-3)])
def test_every_recognized_kernel_computes_its_vendor_op(fake_cuda, precision, tolerance):
    model = tvmsched.compile(network(), target="llvm", batch=2, precision=precision)
    recognized = [kernel for kernel in model.graph.kernels if kernel.vendor_op is not None]
    kinds = {"bias", "multiply", "relu", "clip", "residual", "sigmoid", "gelu"}
    assert {op.kind for kernel in recognized for op in kernel.vendor_op.epilogue} >= \
        kinds | ({"subtract"} if precision == "fp32" else set())
    assert any(kernel.vendor_op.anchor.__class__.__name__ == "Matmul" for kernel in recognized)
    with StageTimer(model.library, model.graph, model.plan, model.constants, tvm.cpu()) as timer:
        for kernel in recognized:
            arguments = [timer.buffers[tensor.name].numpy() for tensor in kernel.inputs + kernel.outputs]
            expected = arguments[kernel.vendor_op.output]
            np.testing.assert_allclose(compute(kernel.vendor_op, arguments), expected, rtol=10 * tolerance,
                                       atol=tolerance, err_msg=kernel.vendor_op.name)


def test_selection_takes_the_fastest_plan_whose_output_matches(fake_cuda, standin, model, monkeypatch,
                                                               tmp_path):
    monkeypatch.setattr(StandIn, "plans", ("fails", "off", "exact"))
    selection = choose(model, "auto", tmp_path / "tactics.json")
    recognized = [kernel.id for kernel in model.graph.kernels if kernel.vendor_op is not None]
    chosen = {kernel.id: kernel.tactic for kernel in selection.graph.kernels if kernel.tactic}
    assert sorted(chosen) == recognized
    assert {(tactic.library, tactic.version, tactic.plan, tactic.workspace)
            for tactic in chosen.values()} == {("standin", "1.0", "exact", WORKSPACE)}
    assert selection.timings == {kernel: (2.0, 1.0) for kernel in recognized}
    assert selection.graph.implementations() == {"tvm": len(model.graph.kernels) - len(recognized),
                                                 "standin": len(recognized)}
    for kernel in selection.graph.kernels:
        if kernel.tactic:
            # the tactic's workspace follows TVM's, which the kernel keeps
            tvm_workspace = model.graph.kernels[kernel.id].workspace
            assert kernel.workspace[:len(tvm_workspace)] == kernel.tvm_workspace == tvm_workspace
            assert [(tensor.shape, tensor.dtype) for tensor in kernel.workspace[len(tvm_workspace):]] == [
                ((WORKSPACE,), "uint8")]


def test_tvm_kept_where_faster_unless_vendor_is_asked(fake_cuda, standin, model, tmp_path):
    standin["tvm"] = 0.5
    assert choose(model, "auto", tmp_path / "auto.json").graph == model.graph
    vendor = choose(model, "vendor", tmp_path / "vendor.json")
    assert vendor.graph.implementations()["standin"] == len(vendor.timings) > 0
    assert set(vendor.timings.values()) == {(None, 1.0)}  # TVM's function is not timed under vendor
    assert choose(model, "tvm", tmp_path / "tvm.json").graph == model.graph


def test_a_second_selection_measures_nothing(fake_cuda, standin, model, tmp_path):
    first = choose(model, "auto", tmp_path / "tactics.json")

    def no_timer():
        raise AssertionError("a cached selection made a timer")
    assert choose(model, "auto", tmp_path / "tactics.json", make_timer=no_timer).graph == first.graph
    # another library version is another implementation: timed again
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StandIn, "version", staticmethod(lambda: "2.0"))
        with pytest.raises(AssertionError, match="made a timer"):
            choose(model, "auto", tmp_path / "tactics.json", make_timer=no_timer)


def test_vendor_without_a_library_or_a_gpu_is_refused(model, tmp_path, monkeypatch):
    monkeypatch.setattr(select, "installed", lambda: {})
    with pytest.raises(TargetError, match="install the GPU extra"):
        choose(model, "vendor", tmp_path / "tactics.json")
    assert choose(model, "auto", tmp_path / "tactics.json").graph == model.graph
    with pytest.raises(UsageError, match="unknown kernel choice 'fast'"):
        choose(model, "fast", tmp_path / "tactics.json")
    for kernels, error in (("vendor", "needs a CUDA target"), ("fast", "unknown kernel choice")):
        with pytest.raises((TargetError, UsageError), match=error):  # before anything is compiled
            tvmsched.compile(network(), target="llvm", batch=2, kernels=kernels,
                             progress=lambda stage: pytest.fail(f"started {stage}"))


def with_tactics(model, tmp_path, schedule: str = "greedy") -> CompiledModel:
    """`model` with every recognized kernel on the stand-in's plan, scheduled by `schedule` (2 streams)."""
    graph = choose(model, "vendor", tmp_path / "tactics.json").graph
    plan = plan_schedule(graph, create_scheduler(schedule, max_streams=2), AnalyticCost(graph),
                         model.plan.context)
    return CompiledModel(model.library, graph, plan, model.constants, model.meta)


def test_executors_launch_the_chosen_plans_on_their_streams(fake_cuda, standin, model, tmp_path):
    scheduled = with_tactics(model, tmp_path)
    assert scheduled.plan.num_streams == 2
    assert_race_free(scheduled.graph, scheduled.plan)  # the plans' workspaces are buffers like any other
    x = RNG.standard_normal((2, 3, 8, 8)).astype("float32")
    [expected] = onnxruntime_outputs(network(), {"input": x})
    vendor = sum(kernel.tactic is not None for kernel in scheduled.graph.kernels)
    for executor in (SequentialExecutor, StreamsExecutor):
        StandIn.launched.clear()
        with executor(model.library, scheduled.graph, scheduled.plan, model.constants, tvm.cpu()) as running:
            [actual] = running.run([x])
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
        assert len(StandIn.launched) == vendor
        assert {workspace for _, _, workspace, _ in StandIn.launched} == {WORKSPACE}
        # the batch norm after the first convolution reaches the library folded into its weights and a bias
        assert "conv2d+bias" in {name for _, _, _, name in StandIn.launched}
        assert not any("subtract" in name for _, _, _, name in StandIn.launched)
        streams = {stream for _, stream, _, _ in StandIn.launched}
        assert streams == ({None} if executor is SequentialExecutor else set(running.streams))
    assert StandIn.opened == 1  # selection and every executor use the process's instance


def test_weights_are_folded_once_per_model_and_the_first_inference_waits_for_the_folded_ones(
        fake_cuda, standin, model, tmp_path, monkeypatch):
    """A vendor plan's folded weights are folded for the model's first executor only: its next one (after
    `close`) and a rescheduled model's take them from the model. The first inference waits for the folded
    weights of a kernel, not for the weights its plan no longer reads, which are copied after every
    kernel's."""
    from tvmsched.executor import base

    folds, fold = [], base.vendor_call
    monkeypatch.setattr(base, "vendor_call",
                        lambda kernel, *args: folds.append(kernel.id) or fold(kernel, *args))
    scheduled = with_tactics(model, tmp_path).with_meta(model.meta)
    scheduled.executor_name = "streams"
    folds.clear()  # selection's own
    x = RNG.standard_normal((2, 3, 8, 8)).astype("float32")
    [expected] = onnxruntime_outputs(network(), {"input": x})
    with scheduled.exclusive() as executor:
        uploads = dict(executor.uploads)
    np.testing.assert_allclose(scheduled(x), expected, rtol=1e-4, atol=1e-5)
    vendor = {kernel.id for kernel in scheduled.graph.kernels if kernel.tactic is not None}
    assert sorted(folds) == sorted(vendor) and len(vendor) > 1
    unfolded = {kernel.inputs[kernel.vendor_op.weight].name for kernel in scheduled.graph.kernels
                if kernel.id in vendor and len(executor.vendor_arguments[kernel.id]) > len(kernel.inputs) + 1}
    assert unfolded and not unfolded & set(executor.buffers)  # replaced by folded weights: never uploaded
    for kernel in vendor:  # the first inference waits for the kernel's folded weights
        folded = {buffer.data_ptr() for buffer in executor.vendor_arguments[kernel][len(
            scheduled.graph.kernels[kernel].inputs) + 1:]}
        copied = set()
        for entry in fake_cuda.log:
            if entry[0] == "record" and entry[1] == uploads[kernel]:
                break
            copied |= {entry[1]} if entry[0] == "copy" else set()
        assert folded <= copied
    scheduled.close()
    np.testing.assert_allclose(scheduled(x), expected, rtol=1e-4, atol=1e-5)
    rescheduled = scheduled.reschedule("sequential", cost="analytic", executor="streams")
    np.testing.assert_allclose(rescheduled(x), expected, rtol=1e-4, atol=1e-5)
    assert sorted(folds) == sorted(vendor)


def test_the_profiles_kernel_timer_reads_the_models_folded_weights(fake_cuda, standin, model, tmp_path):
    """On a GPU the profile times kernels in a stage timer on the executor's device constants, which lack
    the constants that folded weights replace: it takes the model's folded weights (it refolded from the
    missing constants and raised KeyError)."""
    from tvmsched import profile

    scheduled = with_tactics(model, tmp_path)
    scheduled.executor_name = "streams"
    target = replace(scheduled.meta.target, kind="cuda")
    scheduled(RNG.standard_normal((2, 3, 8, 8)).astype("float32"))
    as_gpu = scheduled.with_meta(replace(scheduled.meta, target=target))  # the same folds
    folded = next(kernel.id for kernel in as_gpu.graph.kernels if kernel.tactic is not None
                  and len(as_gpu.folded[kernel.id, kernel.tactic.split][1]))
    with scheduled.exclusive() as executor, profile._kernel_timer(as_gpu, executor) as time_kernel:
        assert time_kernel(folded, 10) > 0


def test_a_timers_whole_plan_timings_reuse_its_folded_weights(fake_cuda, standin, model, tmp_path,
                                                             monkeypatch):
    """`StageTimer.time_order` runs executors on the timer's device constants and folded weights: nothing
    is folded again (each call refolded every vendor kernel, reading its weights back from the device), and
    a timer given another executor's constants, which lack those that folded weights replace, works."""
    from tvmsched.executor import base

    scheduled = with_tactics(model, tmp_path)
    scheduled.executor_name = "streams"
    scheduled(RNG.standard_normal((2, 3, 8, 8)).astype("float32"))
    monkeypatch.setattr(base, "vendor_call", None)
    order = tuple((launch.kernel, launch.stream) for launch in scheduled.plan.launches)
    with scheduled.exclusive() as executor:
        with StageTimer(model.library, scheduled.graph, scheduled.plan, executor.device_constants,
                        executor.device, max_groups=2, folded=scheduled.folded) as timer:
            assert timer.time_order(order, warmup=1, repeat=2) > 0


def test_a_library_is_opened_once_per_thread(standin):
    """Selection and every executor of a thread share one instance; another thread opens its own."""
    first = library.shared_library(StandIn)
    assert library.shared_library(StandIn) is first
    others = []
    thread = threading.Thread(target=lambda: others.append(library.shared_library(StandIn)))
    thread.start()
    thread.join()
    assert others[0] is not first and StandIn.opened == 2


def test_a_library_opened_in_the_background_is_the_callers_and_a_failure_is_tried_again(standin,
                                                                                        monkeypatch):
    """`open_in_background` makes the calling thread's instance on another thread; the caller's first use
    waits for it. A library that failed to open raises at its use, and the next use opens it again."""
    release, threads = threading.Event(), []

    def opened_later(self):
        release.wait(5)
        threads.append(threading.current_thread())
        StandIn.opened += 1
    monkeypatch.setattr(StandIn, "__init__", opened_later)
    library.open_in_background(["standin", "not-registered"])
    assert StandIn.opened == 0  # still opening
    release.set()
    instance = library.shared_library(StandIn)
    assert library.shared_library(StandIn) is instance and StandIn.opened == 1
    assert threads[0] is not threading.current_thread()

    def fails(self):
        raise RuntimeError("no handle")
    monkeypatch.setattr(library, "_SHARED", {})
    monkeypatch.setattr(StandIn, "__init__", fails)
    library.open_in_background(["standin"])
    with pytest.raises(RuntimeError, match="no handle"):
        library.shared_library(StandIn)
    monkeypatch.setattr(StandIn, "__init__", opened_later)
    assert isinstance(library.shared_library(StandIn), StandIn) and StandIn.opened == 2

    def no_thread(self):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(library, "_SHARED", {})
    monkeypatch.setattr(library.threading.Thread, "start", no_thread)
    library.open_in_background(["standin"])  # the first use opens it then, in the caller's thread
    assert isinstance(library.shared_library(StandIn), StandIn) and threads[-1] is threading.current_thread()


def test_a_build_with_tactics_saves_loads_and_refuses_another_version(fake_cuda, standin, model, tmp_path,
                                                                      monkeypatch):
    scheduled = with_tactics(model, tmp_path, "sequential")
    x = RNG.standard_normal((2, 3, 8, 8)).astype("float32")
    expected = scheduled(x)
    monkeypatch.setattr(library, "_SHARED", {})  # as in a fresh process: load opens the library
    loaded = tvmsched.load(scheduled.save(tmp_path / "build"))
    assert list(library._SHARED) == [(StandIn, threading.get_ident())]  # load started opening it
    assert loaded.graph == scheduled.graph and loaded.graph.hash != model.graph.hash
    # the folded weights were saved with the build: loading and running it folds nothing
    assert set(loaded.folded) == set(scheduled.folded_weights())
    assert any(arrays for _, arrays in loaded.folded.values())
    for key, (vendor_op, arrays) in loaded.folded.items():
        assert vendor_op == scheduled.folded[key][0]
        for got, want in zip(arrays, scheduled.folded[key][1], strict=True):
            np.testing.assert_array_equal(got, want)
    from tvmsched.executor import base
    StandIn.launched.clear()
    with monkeypatch.context() as patch:
        patch.setattr(base, "vendor_call", None)
        np.testing.assert_array_equal(tvmsched.load(tmp_path / "build")(x), expected)
    assert StandIn.launched and StandIn.opened == 2  # selection's, then load's for its executor
    monkeypatch.setattr(StandIn, "version", staticmethod(lambda: "2.0"))
    with pytest.raises(ArtifactError, match="chose its standin plans with version 1.0, this is 2.0"):
        tvmsched.load(tmp_path / "build")(x)
    monkeypatch.setattr(library, "LIBRARIES", {})
    with pytest.raises(TargetError, match="rebuild with --kernels tvm"):
        tvmsched.load(tmp_path / "build")(x)


@pytest.mark.parametrize("precision, tolerance, workspace", [("fp32", 1e-5, WORKSPACE), ("fp16", 2e-3, 0)])
def test_split_tactics_run_the_plan_then_tvms_tail(fake_cuda, standin, monkeypatch, tmp_path, precision,
                                                    tolerance, workspace):
    """Where the library declines a kernel's epilogue, it computes the anchor and bias into the kernel's
    intermediate tensor and TVM's tail function the rest (a clip, a residual add, a sigmoid, erf's GELU);
    the intermediate follows the plan's workspace, where the plan needs one."""
    declined = {"clip", "residual", "sigmoid", "gelu"}

    def candidates(self, vendor_op, limit):
        return [] if declined & {op.kind for op in vendor_op.epilogue} else [Candidate("exact", workspace)]
    monkeypatch.setattr(StandIn, "candidates", candidates)
    monkeypatch.setattr(tail, "wanted", lambda kernels, spec: True)  # as on a GPU with a library
    model = tvmsched.compile(network(), target="llvm", batch=2, precision=precision)
    selection = choose(model, "vendor", tmp_path / "tactics.json")
    recognized = [kernel for kernel in selection.graph.kernels if kernel.vendor_op is not None]
    assert all(kernel.tactic for kernel in recognized)  # whole where the library takes it, else split
    split = [kernel for kernel in recognized if kernel.tactic.split is not None]
    assert {op.kind for kernel in split for op in kernel.vendor_op.epilogue[kernel.tactic.split:]} >= declined
    assert selection.graph.implementations()["standin+tvm"] == len(split)
    for kernel in split:  # the intermediate follows the plan's workspace, in the head's dtype, after TVM's
        tactic_workspace = kernel.workspace[len(kernel.tvm_workspace):]
        assert [(tensor.shape, tensor.dtype) for tensor in tactic_workspace] == [((workspace,), "uint8")] * (
            workspace > 0) + [(kernel.outputs[0].shape, kernel.vendor_op.head(kernel.tactic.split).out_dtype)]
    plan = plan_schedule(selection.graph, create_scheduler("greedy", max_streams=2),
                         AnalyticCost(selection.graph), model.plan.context)
    assert_race_free(selection.graph, plan)
    scheduled = CompiledModel(model.library, selection.graph, plan, model.constants, model.meta)
    x = RNG.standard_normal((2, 3, 8, 8)).astype("float32")
    [expected] = onnxruntime_outputs(network(), {"input": x})
    for executor in (SequentialExecutor, StreamsExecutor):
        with executor(model.library, scheduled.graph, scheduled.plan, model.constants, tvm.cpu()) as running:
            [actual] = running.run([x])
        np.testing.assert_allclose(actual, expected, rtol=100 * tolerance, atol=10 * tolerance)
    loaded = tvmsched.load(scheduled.save(tmp_path / "build"))
    np.testing.assert_array_equal(loaded(x), scheduled(x))


def test_the_vendor_op_from_shapes_alone_is_the_one_folded_from_the_values(model):
    """`vendor_op_of` (selection's op, no weight read or folded) equals `vendor_call`'s op,
    whole and as a split's head, on every recognized kernel, one of them a folded batch norm."""
    from tvmsched.tactics.affine import vendor_call, vendor_op_of

    recognized = [kernel for kernel in model.graph.kernels if kernel.vendor_op is not None]
    folded = 0
    for kernel in recognized:
        for split in {None, split_point(kernel.vendor_op)}:
            op, arrays = vendor_call(kernel, model.constants.__getitem__, split)
            assert vendor_op_of(kernel, split) == op
            folded += bool(arrays)
    assert len(recognized) >= 5 and folded >= 1


def test_split_point_leaves_the_library_its_bias_and_the_tail_the_rest():
    def vendor_op(*kinds):
        epilogue = tuple(EpilogueOp(kind, "float16" if kind == "cast" else "float32", 2 if kind in (
            "bias", "residual", "multiply") else None, 1 if kind in ("bias", "multiply") else None)
                         for kind in kinds)
        anchor = Conv2d("NCHW", (1, 8, 4, 4), (8, 8, 1, 1), (1, 8, 4, 4), (1, 1), (0, 0, 0, 0), (1, 1), 1,
                        "float32", "float32")
        return VendorOp(anchor, 0, 1, epilogue, 3)
    assert split_point(vendor_op("bias", "relu")) is None  # every library fuses it
    assert split_point(vendor_op("bias")) is None
    assert split_point(vendor_op("multiply", "bias", "residual", "relu")) == 2
    assert split_point(vendor_op("sigmoid")) == 0
    assert split_point(vendor_op("cast", "bias", "silu")) == 2
    assert vendor_op("bias", "silu").head(1) == vendor_op("bias")


def test_a_tactic_without_a_split_is_written_as_before():
    """So that graphs with tactics hash as they did, and builds saved before splits keep their plans."""
    whole = library.Tactic("cudnn", "91900", "engine", 64)
    assert whole.to_json() == {"schema": 1, "library": "cudnn", "version": "91900", "plan": "engine",
                               "workspace": 64}
    split = library.Tactic("cudnn", "91900", "engine", 64, split=1)
    for tactic in (whole, split):
        assert library.Tactic.from_json(tactic.to_json()) == tactic


def test_tuning_reads_what_builds_measured_of_the_vendor_plans(fake_cuda, standin, model, tmp_path):
    cache = tmp_path / "tactics.json"
    assert select.vendor_latencies([model.graph], "cpu-test", cache) == {}
    choose(model, "auto", cache)
    recognized = {kernel.workload for kernel in model.graph.kernels if kernel.vendor_op is not None}
    assert select.vendor_latencies([model.graph], "cpu-test", cache) == dict.fromkeys(
        recognized, 1.0)  # the stand-in's plan, timed at 1 ms
    assert select.vendor_latencies([model.graph], "another-gpu", cache) == {}


class PlanTimes:
    """A stand-in cost: whole plans take 10 ms, less 1 for each kernel of `faster` that runs TVM's function,
    and every stage 5 ms; records the whole plans it was asked."""

    def __init__(self, faster: set[int]):
        self.faster, self.asked = faster, []

    def stage_latency(self, groups):
        return 5.0

    def order_latency(self, order, tvm_kernels=()):
        self.asked.append(tuple(tvm_kernels))
        return 10.0 - len(self.faster & set(tvm_kernels))


def test_dp_runs_tvms_function_where_the_whole_plan_is_faster_so(fake_cuda, standin, model, tmp_path):
    """Concurrency-aware tactics: a vendor kernel in a stage of several groups is tried with TVM's function
    (the kernel keeps TVM's workspace), and kept so where the whole plan times faster; the plan records it,
    the executors run it, a save and a load keep it."""
    scheduled = with_tactics(model, tmp_path)
    candidates = [kernel for kernel, _ in in_plan.concurrent_kernels(scheduled.graph, scheduled.plan)]
    assert len(candidates) > 1 and all(scheduled.graph.kernels[kernel].tactic for kernel in candidates)
    assert in_plan.choose_in_plan(scheduled.graph, scheduled.plan, AnalyticCost(scheduled.graph), {}) is \
        scheduled.plan  # a cost that times no whole plan changes nothing
    chosen = candidates[-1]
    cost = PlanTimes({chosen})
    plan = in_plan.choose_in_plan(scheduled.graph, scheduled.plan, cost, {})
    assert plan.tvm_kernels == (chosen,) and len(cost.asked) == len(candidates) + 1
    assert plan.schedule["tvm_in_stage"] == {"tried": len(candidates), "slower_alone": 0, "kept": [chosen]}
    assert plan.schedule["in_plan_ms"] == [10.0, 9.0]
    # a kernel whose TVM function alone takes its whole stage's 5 ms or more is not tried
    cost = PlanTimes({chosen})
    slow = {kernel: 5.0 for kernel in candidates[:-1]}
    assert in_plan.choose_in_plan(scheduled.graph, scheduled.plan, cost, {**slow, chosen: 4.9}).tvm_kernels \
        == (chosen,)
    assert cost.asked == [(), (chosen,)]
    cost = PlanTimes({chosen})
    skipped = in_plan.choose_in_plan(scheduled.graph, scheduled.plan, cost, {**slow, chosen: 5.0})
    assert skipped.tvm_kernels == () and cost.asked == [()]
    assert skipped.schedule["tvm_in_stage"] == {"tried": 0, "slower_alone": len(candidates), "kept": []}
    plan.validate(scheduled.graph)
    assert_race_free(scheduled.graph, plan)
    counts, planned = scheduled.graph.implementations(), scheduled.graph.implementations(plan.tvm_kernels)
    assert (planned["tvm"], planned["standin"]) == (counts["tvm"] + 1, counts["standin"] - 1)
    x = RNG.standard_normal((2, 3, 8, 8)).astype("float32")
    [expected] = onnxruntime_outputs(network(), {"input": x})
    vendor = sum(kernel.tactic is not None for kernel in scheduled.graph.kernels)
    for executor in (SequentialExecutor, StreamsExecutor):
        StandIn.launched.clear()
        with executor(model.library, scheduled.graph, plan, model.constants, tvm.cpu()) as running:
            [actual] = running.run([x])
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
        assert len(StandIn.launched) == vendor - 1  # the chosen kernel ran TVM's function
    built = CompiledModel(model.library, scheduled.graph, plan, model.constants, model.meta)
    loaded = tvmsched.load(built.save(tmp_path / "in_plan"))
    assert loaded.plan.tvm_kernels == (chosen,)
    np.testing.assert_allclose(loaded(x), expected, rtol=1e-4, atol=1e-5)


def test_a_kernel_with_a_tactic_keeps_tvms_workspace_before_the_tactics(model):
    """So that either implementation can run: TVM's scratch first (its names and positions as before), the
    tactic's after it; older graphs, whose tactic kernels had the tactic's workspace alone, are refused."""
    from tvmsched.graph import KernelGraph
    from tvmsched.plan import make_plan

    [kernel] = [kernel for kernel in model.graph.kernels if kernel.vendor_op is not None][:1]
    graph = model.graph.with_workspace({kernel.symbol: (((4,), "float32"),)})
    tactic = library.Tactic("standin", "1.0", "exact", WORKSPACE, split=tail.split_point(kernel.vendor_op))
    chosen = graph.with_tactics({kernel.id: tactic}).kernels[kernel.id]
    outputs = len(kernel.outputs)
    assert [(tensor.name, tensor.index) for tensor in chosen.workspace][:2] == [
        (f"k{kernel.id}.workspace0", outputs), (f"k{kernel.id}.workspace1", outputs + 1)]
    assert chosen.tvm_workspace == graph.kernels[kernel.id].workspace
    assert [tensor.shape for tensor in chosen.workspace[1:2]] == [(WORKSPACE,)]
    data = graph.with_tactics({kernel.id: tactic}).to_json()
    with pytest.raises(GraphError, match="schema 3 is not 4; rebuild"):
        KernelGraph.from_json({**data, "schema": 3})
    assert KernelGraph.from_json({**model.graph.to_json(), "schema": 3}) == model.graph  # no tactics: loads
    plan = make_plan(model.graph, [(k.id, 0) for k in model.graph.kernels], "sequential")
    for names, error in (((kernel.id,), "which have none"), ((len(model.graph.kernels),), "not each once"),
                         ((-1,), "not each once")):
        with pytest.raises(GraphError, match=error):
            replace(plan, tvm_kernels=names).validate(model.graph)
