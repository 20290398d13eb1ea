"""fp16, NHWC and merged convolutions on the GPU (needs a CUDA device): each computes what the model computes,
in every multi-stream executor, with TVM's kernels and with the vendor tactics selection may choose."""

import numpy as np
import pytest
from conftest import onnxruntime_outputs
from test_precision import TOLERANCE, mobile_block, relative_error
from test_tactics_select import network

import tvmsched

pytestmark = pytest.mark.gpu

REWRITES = {"fp16": dict(precision="fp16"), "nhwc": dict(layout="nhwc"), "merge": dict(merge="all"),
            "merge_auto": dict(merge="auto"), "all": dict(precision="fp16", layout="nhwc", merge="all")}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TVMSCHED_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("kernels", ["tvm", "auto"])
@pytest.mark.parametrize("rewrite", sorted(REWRITES))
@pytest.mark.parametrize("make", [network, mobile_block], ids=["network", "mobile"])
def test_rewritten_builds_match_onnxruntime_on_cuda(make, rewrite, kernels):
    proto = make()
    x = np.random.default_rng(7).standard_normal((2, 3, 8, 8)).astype("float32")
    [expected] = onnxruntime_outputs(proto, {"input": x})
    tolerance = TOLERANCE if "precision" in REWRITES[rewrite] else 1e-5
    model = tvmsched.compile(proto, target="cuda", batch=2, kernels=kernels, **REWRITES[rewrite])
    for schedule in ("sequential", "dp"):
        for executor in ("streams", "cuda-graph"):
            rescheduled = model.reschedule(schedule, max_streams=4, executor=executor)
            for _ in range(2):
                assert relative_error(rescheduled(x), expected) <= tolerance


def test_merge_auto_times_each_group_on_the_gpu():
    from test_merge import assert_two_choices_made, random_inputs, two_groups

    proto = two_groups()
    model = tvmsched.compile(proto, target="cuda", merge="auto", schedule="dp")
    choices = assert_two_choices_made(model.meta)
    # the merged candidates: dp's choice, each group's own and every group merged
    assert bool(model.meta.merge_check) == any(choice.merged or choice.merged_ms < choice.members_ms
                                               for choice in choices)
    inputs = random_inputs(proto)
    [expected] = onnxruntime_outputs(proto, inputs)
    assert relative_error(model.reschedule("dp")(inputs), expected) <= 1e-5


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("merge", ["all", "auto"])
def test_merged_products_match_onnxruntime_on_cuda(merge, precision):
    from test_merge import random_inputs
    from test_merge_products import attention_and_convolutions

    proto = attention_and_convolutions()
    inputs = random_inputs(proto)
    expected = onnxruntime_outputs(proto, inputs)
    model = tvmsched.compile(proto, target="cuda", merge=merge, precision=precision, schedule="dp")
    if merge == "all":
        assert model.meta.merged_matmuls == (3,) and model.meta.merged_convolutions == (2,)
    else:
        assert [choice.kind for choice in model.meta.merge_choices] == ["conv2d", "matmul"]
    tolerance = TOLERANCE if precision == "fp16" else 1e-5
    for schedule in ("sequential", "dp"):
        outputs = model.reschedule(schedule)(inputs)
        assert len(outputs) == len(expected)
        assert all(relative_error(got, want) <= tolerance for got, want in zip(outputs, expected))
