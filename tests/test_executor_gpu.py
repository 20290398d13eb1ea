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
    for schedule in sorted(SCHEDULERS):
        for executor in ("streams", "cuda-graph"):
            model = reference.reschedule(schedule, max_streams=4, executor=executor)
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
    with model.cost_model("measured", max_streams=4) as cost:
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
