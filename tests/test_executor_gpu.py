"""The multi-stream CUDA executors (live streams and CUDA Graph) give exactly the sequential executor's
outputs, for every zoo model and every scheduler (needs a CUDA device)."""

import numpy as np
import pytest
from test_models import SMALL_IMAGE

import tvmsched
from tvmsched import zoo
from tvmsched.errors import GraphError, TargetError
from tvmsched.executor.streams import CudaGraphExecutor
from tvmsched.schedule import SCHEDULERS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", sorted(SMALL_IMAGE))
def test_multistream_executors_match_sequential(name):
    proto = zoo.build(name, batch=1, image_size=SMALL_IMAGE[name])
    reference = tvmsched.compile(proto, target="cuda", executor="sequential")
    x = np.random.default_rng(11).standard_normal(reference.inputs[0].shape).astype("float32")
    expected = reference(x)
    for schedule in sorted(SCHEDULERS):  # analytic costs: the plans differ as much, without timing stages
        for executor in ("streams", "cuda-graph"):
            model = reference.reschedule(schedule, max_streams=4, executor=executor, cost="analytic")
            for _ in range(3):  # replays must not corrupt each other
                np.testing.assert_allclose(model(x), expected, rtol=1e-6, atol=1e-6)


def test_cuda_graph_replays_follow_new_inputs(branchy_model):
    model = tvmsched.compile(branchy_model, target="cuda", batch=2, schedule="chains", max_streams=4)
    reference = tvmsched.compile(branchy_model, target="llvm", batch=2)
    rng = np.random.default_rng(12)
    for _ in range(5):
        x = rng.standard_normal((2, 3, 8, 8)).astype("float32")
        np.testing.assert_allclose(model(x), reference(x), rtol=1e-5, atol=1e-5)


def test_closed_model_releases_its_cuda_graph_and_runs_again(branchy_model):
    """close() releases the CUDA-graph executor (its streams, events, graph and buffers) on the device; a
    second close does nothing, and the next call builds a new executor with the same outputs."""
    reference = tvmsched.compile(branchy_model, target="llvm", batch=2)
    x = np.random.default_rng(14).standard_normal((2, 3, 8, 8)).astype("float32")
    with tvmsched.compile(branchy_model, target="cuda", batch=2, schedule="chains", max_streams=4,
                          executor="cuda-graph") as model:
        np.testing.assert_allclose(model(x), reference(x), rtol=1e-5, atol=1e-5)
        first = model._executor
        assert isinstance(first, CudaGraphExecutor)
        model.close()
        model.close()
        assert model._executor is None
        np.testing.assert_allclose(model(x), reference(x), rtol=1e-5, atol=1e-5)
        assert model._executor is not first
    assert model._executor is None


def test_tuned_kernels_with_workspace_on_parallel_streams_match_sequential():
    """The tuned schedules of nasnet's average pools keep scratch in global memory. Before it became planned
    workspace buffers, TVM's shared workspace pool gave parallel kernels the same scratch: greedy, opara and
    dp outputs were off on the H100 while sequential and nimble matched."""
    reference = tvmsched.compile("nasnet", target="cuda", executor="sequential")
    if not any(kernel.workspace for kernel in reference.graph.kernels):
        pytest.skip("no kernel of this GPU's build has workspace (no shipped tuning log for this GPU)")
    x = np.random.default_rng(13).standard_normal(reference.inputs[0].shape).astype("float32")
    expected = reference(x)
    for schedule in ("greedy", "opara", "dp"):
        model = reference.reschedule(schedule, executor="cuda-graph")
        for _ in range(3):
            np.testing.assert_allclose(model(x), expected, rtol=1e-6, atol=1e-6)


def test_measured_cost_times_whole_plans_and_caches_them(tmp_path, monkeypatch):
    """dp chooses between each part's stages by timing whole plans: a multi-stream plan and the same
    kernels on one stream are timed once each and then read from the cache; part of a plan is refused.
    The timed executors read the timer's constants: one built so computes the model's outputs. Closing
    the cost source twice destroys the timer's streams and events once."""
    monkeypatch.setenv("TVMSCHED_CACHE", str(tmp_path))
    proto = zoo.build("googlenet", batch=1, image_size=SMALL_IMAGE["googlenet"])
    model = tvmsched.compile(proto, target="cuda", schedule="nimble", max_streams=4)
    with model.stage_cost("measured", max_streams=4) as cost:
        order = tuple((launch.kernel, launch.stream) for launch in model.plan.launches)
        assert len({stream for _, stream in order}) > 1
        one_stream = tuple((kernel, 0) for kernel, _ in order)
        before = cost.measured
        timed = cost.order_latency(order), cost.order_latency(one_stream)
        assert min(timed) > 0 and cost.measured == before + 2
        again = cost.order_latency(order), cost.order_latency(one_stream)
        assert again == timed and cost.measured == before + 2
        with pytest.raises(GraphError, match="before its producers"):
            cost.order_latency(order[len(order) // 2:])
        assert timed[0] == pytest.approx(model.benchmark()["median_ms"], rel=0.15)  # timed as the benchmark
        timer = cost.timer
        x = np.random.default_rng(14).standard_normal(model.inputs[0].shape).astype("float32")
        with CudaGraphExecutor(model.library, model.graph, model.plan, timer.device_constants,
                               timer.device) as shared:
            np.testing.assert_array_equal(shared.run([x])[0], model(x))
    assert timer.closed
    cost.close()
    with pytest.raises(TargetError, match="was closed"):
        timer.time_stage(((0,),))


def _embedding_model(vocab: int = 30000, width: int = 64, length: int = 128):
    """BERT's first layers in small: int64 token ids gathered from an embedding table, normalized and
    projected."""
    from conftest import make_model, tensor
    from onnx import TensorProto, helper

    rng = np.random.default_rng(15)
    weights = {"table": rng.standard_normal((vocab, width)).astype("float32"),
               "scale": np.ones(width, "float32"), "bias": np.zeros(width, "float32"),
               "project": rng.standard_normal((width, width)).astype("float32") * 0.1}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["embedded"], axis=0),
             helper.make_node("LayerNormalization", ["embedded", "scale", "bias"], ["normal"], axis=-1),
             helper.make_node("MatMul", ["normal", "project"], ["out"])]
    return make_model(nodes, [tensor("ids", [1, length], TensorProto.INT64)],
                      [tensor("out", [1, length, width])], weights)


def test_models_in_one_process_beside_another_librarys_cuda_graphs(branchy_model):
    """Several models in one process, one with int64 token ids, while PyTorch holds CUDA graphs of its own.
    It once lost the CUDA context (illegal address): the CUDA-graph executor launches the plan once before
    the first inputs arrive, and the ids' buffer held whatever an earlier model's freed memory held, so the
    gather read far out of its table. Freed buffers full of 0x7f bytes make that deterministic here."""
    import tvm
    from conftest import onnxruntime_outputs

    torch = pytest.importorskip("torch")
    weight = torch.randn(256, 256, device="cuda")
    static = torch.randn(8, 256, device="cuda")
    static @ weight  # cuBLAS makes its handle outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = static @ weight
    graph.replay()

    x = np.random.default_rng(16).standard_normal((1, 3, 8, 8)).astype("float32")
    with tvmsched.compile(branchy_model, target="cuda", batch=1) as first:
        expected = tvmsched.compile(branchy_model, target="llvm", batch=1)(x)
        np.testing.assert_allclose(first(x), expected, rtol=1e-5, atol=1e-5)
        with first.reschedule("dp", max_streams=4) as scheduled:
            np.testing.assert_allclose(scheduled(x), expected, rtol=1e-5, atol=1e-5)
            assert scheduled.benchmark(warmup=2, repeat=5)["median_ms"] > 0

    poison = [tvm.runtime.tensor(np.full(size, 0x7F, "uint8"), tvm.cuda(0)) for size in (1024, 4096, 1 << 20)]
    del poison
    embedding = _embedding_model()
    ids = np.random.default_rng(17).integers(0, 30000, (1, 128)).astype("int64")
    with tvmsched.compile(embedding, target="cuda") as second:
        np.testing.assert_allclose(second(ids), onnxruntime_outputs(embedding, {"ids": ids})[0],
                                   rtol=1e-4, atol=1e-4)
    graph.replay()
    torch.cuda.synchronize()
    np.testing.assert_allclose(result.cpu().numpy(), (static @ weight).cpu().numpy(), rtol=1e-5, atol=1e-4)


def test_a_loaded_builds_first_inference_pipelined_or_not_equals_the_steady_state(tmp_path):
    """A loaded CUDA build's weights are page-locked, and its first inference, whether each kernel waits
    for its own weights alone (pipelined, the default) or for all of them, gives the steady state's outputs
    exactly (resnet50 with cuDNN where it is faster: folded batch norms)."""
    from cuda.bindings import runtime as cudart

    proto = zoo.build("resnet50", batch=1, image_size=SMALL_IMAGE["resnet50"])
    built = tvmsched.compile(proto, target="cuda", schedule="greedy", cost="analytic", kernels="vendor")
    assert any(arrays for _, arrays in built.folded_weights().values())
    built.save(tmp_path)
    x = np.random.default_rng(15).standard_normal((1, 3, 64, 64)).astype("float32")
    firsts = []
    for pipelined in (True, False):
        with tvmsched.load(tmp_path, pipelined=pipelined) as model:
            pointer = next(iter(model.constants.values())).ctypes.data
            error, attributes = cudart.cudaPointerGetAttributes(pointer)
            assert error == cudart.cudaError_t.cudaSuccess
            assert attributes.type == cudart.cudaMemoryType.cudaMemoryTypeHost  # registered with the driver
            firsts.append(model(x))
            for _ in range(3):
                np.testing.assert_array_equal(model(x), firsts[-1])
    np.testing.assert_array_equal(firsts[0], firsts[1])


def test_an_offloaded_model_frees_its_memory_and_reloads_in_one_graph(tmp_path):
    """offload() frees the weights' device memory and keeps the executor; each next run (the reload graph:
    uploads and plan) and the runs after it (the plan's graph) give the steady state's outputs exactly, for
    a loaded build (page-locked weights, cuDNN with folded batch norms) and an in-process one (its weights
    copied once into page-locked memory); the sequential executor cannot offload."""
    from cuda.bindings import runtime as cudart

    proto = zoo.build("resnet50", batch=1, image_size=SMALL_IMAGE["resnet50"])
    built = tvmsched.compile(proto, target="cuda", schedule="greedy", cost="analytic", kernels="vendor")
    built.save(tmp_path)
    weights = sum(value.nbytes for value in built.constants.values())
    rng = np.random.default_rng(16)
    xs = [rng.standard_normal((1, 3, 64, 64)).astype("float32") for _ in range(2)]
    for model in (tvmsched.load(tmp_path), built):
        with model:
            steady = [model(x) for x in xs]
            model.offload()  # makes an executor whose memory can be freed (the first one's stays pooled)
            for _ in range(2):
                for x, expected in zip(xs * 2, steady * 2):
                    np.testing.assert_array_equal(model(x), expected)
                free = cudart.cudaMemGetInfo()[1]
                model.offload()
                model.offload()  # a second call does nothing
                assert cudart.cudaMemGetInfo()[1] - free >= 0.9 * weights
    with pytest.raises(TargetError, match="use the 'cuda-graph' executor"):
        built.reschedule("sequential", executor="sequential", cost="analytic").offload()


def test_kernels_reading_their_weights_in_place_after_offload_give_the_steady_outputs(tmp_path):
    """After offload(load_plan), the next run's kernels that the plan (or a plan of every kernel with
    weights: TVM's and cuDNN's) reads in place from page-locked host memory give the steady state's outputs
    exactly, and so do the runs after it, for a loaded build and an in-process one; the measured plan
    lists every kernel in the plan's order and its model is never slower than uploading everything."""
    from dataclasses import replace

    proto = zoo.build("resnet50", batch=1, image_size=SMALL_IMAGE["resnet50"])
    built = tvmsched.compile(proto, target="cuda", schedule="greedy", cost="analytic", kernels="vendor")
    built.save(tmp_path)
    x = np.random.default_rng(17).standard_normal((1, 3, 64, 64)).astype("float32")
    for model in (tvmsched.load(tmp_path), built):
        with model:
            steady = model(x)
            plan = model.plan_load()
            assert [row.kernel for row in plan.kernels] == [launch.kernel for launch in model.plan.launches]
            assert plan.planned_ms <= plan.upload_ms and all(row.device_ms > 0 for row in plan.kernels)
            every = replace(plan, kernels=tuple(replace(row, direct=row.weight_bytes > 0)
                                                for row in plan.kernels))
            assert any(model.graph.kernels[kernel].tactic for kernel in every.direct)  # cuDNN in place too
            for load_plan in (plan, every, None, every):
                model.offload(load_plan)
                for _ in range(2):
                    np.testing.assert_array_equal(model(x), steady)
