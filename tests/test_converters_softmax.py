"""Softmax and LogSoftmax (TVM's importer; tvmsched's legalization on float16, `lower.FLOAT32_INSIDE`): a
float16 row's exponentials and sum in float32."""

import numpy as np
import pytest
from onnx import helper
from single_node import check_node

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_float16_over_long_rows_matches_onnxruntime(op):
    """4096 terms summed in float16 drift by several ulp; summed in float32 they do not."""
    x = RNG.uniform(-2, 2, (2, 4096)).astype("float16")
    check_node(helper.make_node(op, ["x"], ["y"], axis=-1), {"x": x}, 13, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_before_opset_13_over_the_flattened_trailing_axes(op):
    x = RNG.standard_normal((2, 3, 4)).astype("float32")
    check_node(helper.make_node(op, ["x"], ["y"], axis=1), {"x": x}, 11)
    check_node(helper.make_node(op, ["x"], ["y"], axis=1), {"x": x.astype("float16")}, 11, rtol=1e-3,
               atol=1e-4)
