"""The multi-stream CUDA executors (live streams and CUDA Graph) give exactly the sequential executor's
outputs, for every zoo model and every scheduler (needs a CUDA device)."""

import numpy as np
import pytest
from test_models import SMALL_IMAGE

import tvmsched
from tvmsched import zoo
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
