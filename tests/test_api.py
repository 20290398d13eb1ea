"""tvmsched.compile / CompiledModel on llvm: outputs vs onnxruntime, input checking, save and load, close."""

import json
import os
import platform
import threading

import numpy as np
import pytest
import tvm
from conftest import assert_matches, make_model, onnxruntime_outputs, tensor
from onnx import helper

import tvmsched
from tvmsched.api import ARTIFACTS
from tvmsched.cost.analytic import CPU, AnalyticCost
from tvmsched.cost.measured import MeasuredCost, cache_key
from tvmsched.errors import ArtifactError, InputError, TargetError
from tvmsched.executor.streams import StageTimer
from tvmsched.schedule import SCHEDULERS


def test_branchy_model_matches_onnxruntime(branchy_model):
    model = tvmsched.compile(branchy_model, target="llvm", batch=2)
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype("float32")
    assert_matches([model(x)], onnxruntime_outputs(branchy_model, {"input": x}))
    assert model.inputs[0].shape == (2, 3, 8, 8)
    assert model.outputs[0].name == "output"


def test_two_inputs_two_outputs_by_name_and_position(two_io_model):
    model = tvmsched.compile(two_io_model)
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((2, 4)).astype("float32"),
             "y": rng.standard_normal((2, 6)).astype("float32")}
    expected = onnxruntime_outputs(two_io_model, feeds)
    assert_matches(model(feeds), expected)
    assert_matches(model(feeds["x"], feeds["y"]), expected)
    assert_matches(model(**feeds), expected)


@pytest.mark.parametrize("feeds, message", [
    ({"x": np.zeros((2, 4), "float32")}, "missing: y"),
    ({"x": np.zeros((2, 4), "float32"), "y": np.zeros((2, 6), "float32"), "z": 1}, "unknown: z"),
    ({"x": np.zeros((3, 4), "float32"), "y": np.zeros((2, 6), "float32")}, "must have shape 2x4, got 3x4"),
    ({"x": np.zeros((2, 4), "float64"), "y": np.zeros((2, 6), "float32")}, "must be float32, got float64"),
])
def test_wrong_inputs_raise_clear_errors(two_io_model, feeds, message):
    model = tvmsched.compile(two_io_model)
    with pytest.raises(InputError, match=message):
        model(feeds)


def test_wrong_number_of_positional_inputs(two_io_model):
    model = tvmsched.compile(two_io_model)
    with pytest.raises(InputError, match="takes 2 inputs"):
        model(np.zeros((2, 4), "float32"))


def test_save_and_load_round_trip(branchy_model, tmp_path):
    model = tvmsched.compile(branchy_model, batch=1)
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype("float32")
    model.save(tmp_path / "build")
    loaded = tvmsched.load(tmp_path / "build")
    assert loaded.graph == model.graph
    assert loaded.plan == model.plan
    assert loaded.meta == model.meta and len(model.meta.kernels_hash) == 16
    np.testing.assert_array_equal(loaded(x), model(x))
    model.save(tmp_path / "build")  # over the files `loaded` uses: replaced, never rewritten in place
    np.testing.assert_array_equal(loaded(x), model(x))
    assert sorted(path.name for path in (tmp_path / "build").iterdir()) == sorted(ARTIFACTS)


def test_load_refuses_missing_corrupt_and_foreign_builds(branchy_model, tmp_path):
    with pytest.raises(ArtifactError, match="not a tvmsched build"):
        tvmsched.load(tmp_path)
    build = tvmsched.compile(branchy_model, batch=1).save(tmp_path / "build")
    meta = (build / "meta.json").read_text()
    (build / "meta.json").write_text(meta.replace('"tvm_version": "', '"tvm_version": "0.1-'))
    with pytest.raises(ArtifactError, match="built with TVM 0.1-"):
        tvmsched.load(build)
    assert tvmsched.load(build, force=True).graph.kernels
    local_cpu = tvmsched.target.resolve_target("llvm").config["mcpu"]
    (build / "meta.json").write_text(meta.replace(f'"mcpu": "{local_cpu}"', '"mcpu": "other-cpu"'))
    with pytest.raises(ArtifactError, match=f"built for the CPU 'other-cpu', whose instructions this CPU "
                                            f"\\('{local_cpu}'\\) may lack; rebuild it here"):
        tvmsched.load(build)
    assert tvmsched.load(build, force=True).graph.kernels
    plan = (build / "plan.json").read_text()
    (build / "plan.json").write_text(plan.replace(f'"target": "{json.loads(meta)["target"]["key"]}"',
                                                  '"target": "nvidia-h100-sm90a"'))
    with pytest.raises(ArtifactError, match="holds a plan made for nvidia-h100-sm90a beside a library built "
                                            "for llvm-"):
        tvmsched.load(build, force=True)
    (build / "plan.json").write_text(plan)
    (build / "meta.json").write_text(meta[: len(meta) // 2])
    with pytest.raises(ArtifactError, match="meta.json' is corrupt"):
        tvmsched.load(build)
    (build / "meta.json").write_text(meta)
    library = (build / "model.so").read_bytes()
    (build / "model.so").unlink()  # a new file: truncating the one the loaded model maps would SIGBUS
    (build / "model.so").write_bytes(library[: len(library) // 3])
    with pytest.raises(ArtifactError, match="model.so' is corrupt"):
        tvmsched.load(build)


@pytest.mark.parametrize("process", ["this", "another"])
def test_a_load_reads_no_unchanged_file_for_its_digest_but_a_changed_one(branchy_model, tmp_path, monkeypatch,
                                                                         process):
    """The save remembered its files' digests, in this process and in the cache for another (stood in for
    by forgetting this process's): no load reads them, until one byte changes, its times put back."""
    from tvmsched import digests

    monkeypatch.setenv("TVMSCHED_CACHE", str(tmp_path / "cache"))
    read = []
    monkeypatch.setattr(digests, "sha256",
                        lambda path, digest=digests.sha256: read.append(path.name) or digest(path))
    build = tvmsched.compile(branchy_model, batch=1).save(tmp_path / "build")
    read.clear()
    if process == "another":
        monkeypatch.setattr(digests.REMEMBERED, "known", {})
    tvmsched.load(build)
    tvmsched.load(build)
    assert read == []
    status = (build / "weights.bin").stat()
    with open(build / "weights.bin", "r+b") as file:  # the same size and inode, another byte
        first = file.read(1)
        file.seek(0)
        file.write(bytes([first[0] ^ 1]))
    os.utime(build / "weights.bin", ns=(status.st_atime_ns, status.st_mtime_ns))  # as `cp -p` leaves it
    with pytest.raises(ArtifactError, match="weights.bin' is corrupt or was replaced"):
        tvmsched.load(build)
    assert "weights.bin" in read


@pytest.mark.skipif(tvm.cuda(0).exist, reason="needs a machine without a CUDA device")
def test_a_cuda_build_without_a_cuda_device_is_refused_before_its_library_is_loaded(branchy_model, tmp_path):
    build = tvmsched.compile(branchy_model, target="nvidia/nvidia-h100", batch=1).save(tmp_path / "build")
    with pytest.raises(TargetError, match=r"was built for CUDA \(nvidia-h100-sm90a\) and no CUDA device is "
                                          r"present; rebuild with --target llvm"):
        tvmsched.load(build)


def test_concurrent_calls_give_each_caller_its_own_result(branchy_model):
    model = tvmsched.compile(branchy_model, batch=1)
    rng = np.random.default_rng(4)
    inputs = [rng.standard_normal((1, 3, 8, 8)).astype("float32") for _ in range(4)]
    expected = [model(x) for x in inputs]
    results = {}

    def worker(index):
        for _ in range(20):
            results.setdefault(index, []).append(model(inputs[index]))

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index, outputs in results.items():
        for output in outputs:
            np.testing.assert_array_equal(output, expected[index])


def test_a_cpu_build_is_ready_when_compiled_or_loaded(branchy_model, tmp_path, monkeypatch):
    """Its executor is made by compile and load: the first call makes none."""
    from tvmsched import api

    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype("float32")
    compiled = tvmsched.compile(branchy_model, target="llvm", batch=1)
    loaded = tvmsched.load(compiled.save(tmp_path / "build"))

    def no_executor(*args, **kwargs):
        raise AssertionError("the first call made an executor")
    monkeypatch.setattr(api, "create_executor", no_executor)
    np.testing.assert_array_equal(loaded(x), compiled(x))
    compiled.close()  # and a later call makes a new one
    with pytest.raises(AssertionError, match="made an executor"):
        compiled(x)
    monkeypatch.undo()
    # another executor by name stays lazy: one that needs a GPU fails at a call, not in a build that saves it
    streams = tvmsched.compile(branchy_model, target="llvm", batch=1, executor="streams")
    assert streams.save(tmp_path / "streams").is_dir() and streams._executor is None


def test_benchmark_reports_positive_times(branchy_model):
    result = tvmsched.compile(branchy_model, target="llvm", batch=1).benchmark(warmup=1, repeat=3)
    assert 0 < result["min_ms"] <= result["median_ms"] <= result["max_ms"]
    assert result["device"].startswith("cpu")


@pytest.mark.parametrize("schedule", sorted(SCHEDULERS))
def test_every_schedule_gives_the_sequential_outputs(branchy_model, schedule):
    x = np.random.default_rng(6).standard_normal((1, 3, 8, 8)).astype("float32")
    sequential = tvmsched.compile(branchy_model, target="llvm", batch=1)
    model = tvmsched.compile(branchy_model, target="llvm", batch=1, schedule=schedule, max_streams=3)
    assert model.plan.scheduler == schedule
    np.testing.assert_array_equal(model(x), sequential(x))
    np.testing.assert_array_equal(sequential.reschedule(schedule, max_streams=3)(x), sequential(x))


def test_reschedule_closes_its_plan_timer_also_when_the_search_is_interrupted(branchy_model, fake_cuda,
                                                                             tmp_path, monkeypatch):
    """dp's search with measured costs, its plan timer on the CPU over a stand-in cudart: every stream,
    event and graph the timer and its timed plans made is destroyed once, and the measurements saved."""
    model = tvmsched.compile(branchy_model, target="llvm", batch=1)
    caches = iter(tmp_path / f"costs{index}.json" for index in range(2))
    key = cache_key(model.graph, model.plan.context, model.meta.kernels_hash)

    def measured_cost(name, max_streams):  # what stage_cost makes on a GPU
        return MeasuredCost.on_device(model.library, model.graph, model.plan, model.constants, tvm.cpu(),
                                      model.meta.kernels_hash, max_streams, next(caches))

    monkeypatch.setattr(model, "stage_cost", measured_cost)
    assert model.reschedule("dp", max_streams=3).plan.schedule["plan_ms"] == 1.0  # timed by the stand-in
    assert fake_cuda.made["graph_exec"] > 1 and fake_cuda.made == fake_cuda.destroyed
    assert json.loads((tmp_path / "costs0.json").read_text())[key]

    def interrupted(timer, order, **options):
        raise KeyboardInterrupt  # Ctrl-C while dp times whole plans

    monkeypatch.setattr(StageTimer, "time_order", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model.reschedule("dp", max_streams=3)
    assert fake_cuda.made == fake_cuda.destroyed and not fake_cuda.refused
    assert json.loads((tmp_path / "costs1.json").read_text())[key]  # the stages timed before


def fake_cuda_model(branchy_model, executor: str) -> tvmsched.CompiledModel:
    """The model built for llvm, run by `executor` over the stand-in cudart (the `fake_cuda` fixture)."""
    model = tvmsched.compile(branchy_model, target="llvm", batch=1, schedule="greedy", cost="analytic",
                             executor=executor)
    assert model.plan.num_streams > 1
    return model


@pytest.mark.parametrize("executor", ["streams", "cuda-graph"])
def test_close_destroys_the_executors_handles_and_the_next_call_makes_a_new_one(branchy_model, fake_cuda,
                                                                                executor):
    model = fake_cuda_model(branchy_model, executor)
    x = np.random.default_rng(7).standard_normal((1, 3, 8, 8)).astype("float32")
    model.close()  # before any call: there is no executor to close (one chosen by name is made at a call)
    assert not fake_cuda.made
    model(x)
    model(x)  # the second inference captures the CUDA graph
    made = +fake_cuda.made
    assert made["stream"] > 1 and (made["graph_exec"] == 1) == (executor == "cuda-graph")
    model.close()
    assert fake_cuda.destroyed == made and not fake_cuda.live
    model.close()  # does nothing
    assert fake_cuda.made == made == fake_cuda.destroyed
    with model as entered:  # a closed model runs on a new executor, which leaving the block closes
        output = entered(x)
        assert entered is model and fake_cuda.live
    assert fake_cuda.made == fake_cuda.destroyed and fake_cuda.made["stream"] == 2 * made["stream"]
    assert not fake_cuda.live and not fake_cuda.refused
    if executor == "streams":  # the stand-in's graph launches run no kernels
        np.testing.assert_array_equal(output, tvmsched.compile(branchy_model, target="llvm", batch=1)(x))


def test_close_waits_for_a_call_in_progress(branchy_model, fake_cuda):
    model = fake_cuda_model(branchy_model, "streams")
    x = np.random.default_rng(7).standard_normal((1, 3, 8, 8)).astype("float32")
    expected = model(x)
    started, finish = threading.Event(), threading.Event()
    launch = model.executor.launch

    def slow_launch():
        started.set()
        finish.wait(10)
        launch()

    model.executor.launch = slow_launch
    results = []
    call = threading.Thread(target=lambda: results.append(model(x)))
    close = threading.Thread(target=model.close)
    call.start()
    started.wait(10)
    close.start()
    close.join(0.2)
    assert close.is_alive() and fake_cuda.live  # the call holds the model's lock
    finish.set()
    call.join()
    close.join()
    np.testing.assert_array_equal(results[0], expected)
    assert fake_cuda.made == fake_cuda.destroyed and not fake_cuda.refused


def test_exclusive_use_of_the_executor_holds_off_calls_from_other_threads(branchy_model):
    model = tvmsched.compile(branchy_model, target="llvm", batch=1)
    x = np.random.default_rng(8).standard_normal((1, 3, 8, 8)).astype("float32")
    results = []
    with model.exclusive() as executor:
        assert executor is model.executor
        call = threading.Thread(target=lambda: results.append(model(x)))
        call.start()
        call.join(0.2)
        assert call.is_alive() and not results
    call.join()
    np.testing.assert_array_equal(results[0], model(x))


def test_load_refuses_another_batch(branchy_model, tmp_path):
    build = tvmsched.compile(branchy_model, target="llvm", batch=2).save(tmp_path / "build")
    assert tvmsched.load(build, batch=2).inputs[0].shape[0] == 2
    with pytest.raises(ArtifactError, match="built for batch 2, not 16; rebuild with --batch 16"):
        tvmsched.load(build, batch=16)


def test_plan_records_what_it_was_made_for(branchy_model):
    model = tvmsched.compile(branchy_model, target="llvm", batch=2)
    device = f"cpu-{platform.machine()}"
    assert model.plan.context == {"target": model.meta.target.key, "device": device, "batch": 2}
    assert model.plan.memory.activation_bytes > 0


def test_dp_on_the_cpu_models_the_cpu_which_gains_nothing_from_concurrency(branchy_model):
    model = tvmsched.compile(branchy_model, target="llvm", batch=2, schedule="dp")
    with model.stage_cost() as cost:
        assert isinstance(cost, AnalyticCost) and cost.device == CPU
    assert model.plan.schedule["modeled_ms"] == pytest.approx(sum(alone for alone, _ in cost.alone))


@pytest.fixture
def pooled_branches():
    """Two average pools (padded cells not counted: scratch in global memory on llvm) on parallel branches."""
    rng = np.random.default_rng(8)
    weights = {"w": rng.standard_normal((4, 4, 1, 1)).astype("float32")}
    pool = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 0}
    nodes = [helper.make_node("AveragePool", ["input"], ["a"], **pool),
             helper.make_node("Conv", ["input", "w"], ["c"]),
             helper.make_node("AveragePool", ["c"], ["b"], strides=[2, 2], **pool),
             helper.make_node("Relu", ["b"], ["r"]),
             helper.make_node("Flatten", ["a"], ["fa"]),
             helper.make_node("Flatten", ["r"], ["fr"]),
             helper.make_node("Concat", ["fa", "fr"], ["output"], axis=1)]
    return make_model(nodes, [tensor("input", [1, 4, 9, 9])], [tensor("output", [1, 4 * 81 + 4 * 25])],
                      weights)


def test_workspace_of_concurrent_kernels_gets_buffers_of_their_own(pooled_branches, tmp_path):
    """Kernels with scratch memory on parallel streams must not share it (as TVM's workspace pool would)."""
    model = tvmsched.compile(pooled_branches, target="llvm", schedule="chains", max_streams=4)
    pools = [kernel for kernel in model.graph.kernels if "pool" in kernel.symbol]
    assert len(pools) == 2 and all(kernel.workspace for kernel in pools)
    stream = {launch.kernel: launch.stream for launch in model.plan.launches}
    assert stream[pools[0].id] != stream[pools[1].id]
    buffers = [{model.plan.memory.tensor_buffers[tensor.name] for tensor in kernel.workspace}
               for kernel in pools]
    assert not buffers[0] & buffers[1]
    x = np.random.default_rng(9).standard_normal((1, 4, 9, 9)).astype("float32")
    assert_matches([model(x)], onnxruntime_outputs(pooled_branches, {"input": x}))
    loaded = tvmsched.load(model.save(tmp_path / "build"))
    assert loaded.graph == model.graph
    np.testing.assert_array_equal(loaded(x), model(x))


def test_constant_inputs_are_bound_at_build_time_and_recorded(runtime_axes_model, tmp_path):
    axes = np.array([1])
    model = tvmsched.compile(runtime_axes_model, target="llvm", constant_inputs={"axes": axes})
    x = np.random.default_rng(6).standard_normal((3, 4)).astype("float32")
    assert [spec.name for spec in model.inputs] == ["x"]
    assert_matches([model(x)], onnxruntime_outputs(runtime_axes_model, {"x": x, "axes": axes}))
    with pytest.raises(InputError, match="'axes' was bound to a value when the model was built"):
        model({"x": x, "axes": axes})
    build = model.save(tmp_path / "build")
    (recorded,) = json.loads((build / "meta.json").read_text())["constant_inputs"]
    assert {key: recorded[key] for key in ("name", "shape", "dtype")} == {"name": "axes", "shape": [1],
                                                                          "dtype": "int64"}
    np.testing.assert_array_equal(tvmsched.load(build, constant_inputs={"axes": axes})(x), model(x))
    with pytest.raises(ArtifactError, match="another value of input 'axes'.*--constant-input axes="):
        tvmsched.load(build, constant_inputs={"axes": np.array([0])})
    with pytest.raises(ArtifactError, match="with input 'x' as an input, not bound"):
        tvmsched.load(build, constant_inputs={"x": x})


def test_scalar_inputs_and_outputs_keep_their_shape(tmp_path):
    nodes = [helper.make_node("Mul", ["a", "b"], ["y"]),
             helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0)]
    model = make_model(nodes, [tensor("a", []), tensor("b", [3])], [tensor("y", [3]), tensor("total", [])],
                       {})
    feeds = {"a": np.array(2.0, "float32"), "b": np.arange(3, dtype="float32")}
    compiled = tvmsched.compile(model, target="llvm")
    outputs = compiled.run(feeds)
    assert [output.shape for output in outputs] == [(3,), ()]
    assert_matches(outputs, onnxruntime_outputs(model, feeds))
    loaded = tvmsched.load(compiled.save(tmp_path / "build"))
    assert loaded.inputs[0].shape == () and loaded.outputs[1].shape == ()
    assert loaded.run(feeds)[1].shape == ()


def test_only_the_cuda_graph_executor_offloads(branchy_model):
    """offload() keeps CUDA graphs: a CPU build's sequential executor refuses it, naming the executor to
    use, and so does an executor made offloadable that cannot be (tests/test_executor_gpu.py runs it)."""
    from tvmsched.executor import create_executor

    model = tvmsched.compile(branchy_model, target="llvm", batch=2)
    with pytest.raises(TargetError, match="use the 'cuda-graph' executor, not 'sequential'"):
        model.offload()
    with pytest.raises(TargetError, match="'sequential' executor cannot release its memory"):
        create_executor("sequential", model.library, model.graph, model.plan, model.constants, tvm.cpu(),
                        offloadable=True)
