"""Every zoo model, compiled through tvmsched's executor, matches onnxruntime (llvm always, under every
schedule with race-free plans; CUDA on a GPU)."""

import numpy as np
import pytest
from conftest import assert_matches, onnxruntime_outputs
from test_plan import assert_race_free

import tvmsched
from tvmsched import zoo
from tvmsched.schedule import SCHEDULERS

# Small inputs keep CPU compile and run time low; the networks are structurally the full ones.
SMALL_IMAGE = {"inception_v3": 75, "googlenet": 64, "squeezenet": 64, "randwire": 64, "nasnet": 64,
               "resnet50": 64}


def check_model(name: str, target: str, batch: int, schedules=("sequential",)) -> None:
    proto = zoo.build(name, batch=batch, image_size=SMALL_IMAGE[name])
    model = tvmsched.compile(proto, target=target)
    x = np.random.default_rng(7).standard_normal(model.inputs[0].shape).astype("float32")
    expected = onnxruntime_outputs(proto, {"input": x})
    for schedule in schedules:
        scheduled = model.reschedule(schedule, cost="analytic")
        assert_race_free(model.graph, scheduled.plan)
        assert_matches([scheduled(x)], expected)


def test_every_zoo_model_is_covered():
    assert sorted(SMALL_IMAGE) == zoo.list_models()


@pytest.mark.parametrize("name", sorted(SMALL_IMAGE))
def test_zoo_model_on_llvm_matches_onnxruntime_under_every_schedule(name):
    check_model(name, "llvm", batch=1, schedules=sorted(SCHEDULERS))


def test_batch_two_on_llvm_matches_onnxruntime():
    check_model("googlenet", "llvm", batch=2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SMALL_IMAGE))
def test_zoo_model_on_cuda_matches_onnxruntime(name):
    check_model(name, "cuda", batch=1)
