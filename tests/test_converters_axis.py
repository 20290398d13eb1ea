"""tvmsched.converters.axis: CumSum, CumProd, ReverseSequence and CenterCropPad against onnxruntime."""

import numpy as np
import pytest
from onnx import helper
from single_node import check_node

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("op, opset", [("CumSum", 14), ("CumProd", 26)])
@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis, dtype", [(1, "float32"), (-3, "int32")])
def test_cumulative(op, opset, exclusive, reverse, axis, dtype):
    x = RNG.uniform(0.5, 1.5, (3, 5, 2)).astype(dtype) if dtype == "float32" else \
        RNG.integers(-3, 4, (3, 5, 2)).astype(dtype)
    node = helper.make_node(op, ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    check_node(node, {"x": x}, opset=opset, constants={"axis": np.array(axis, "int64")})


@pytest.mark.parametrize("time_axis, batch_axis", [(0, 1), (1, 0)])
def test_reverse_sequence(time_axis, batch_axis):
    x = RNG.standard_normal((4, 4, 3)).astype("float32")
    lengths = np.array([4, 1, 3, 2], "int64")
    node = helper.make_node("ReverseSequence", ["x", "lengths"], ["y"], time_axis=time_axis,
                            batch_axis=batch_axis)
    check_node(node, {"x": x, "lengths": lengths}, opset=10)


@pytest.mark.parametrize("shape, axes", [([4, 3, 9], None), ([7, 2], [1, 2]), ([8], [-2])])
def test_center_crop_pad(shape, axes):
    x = RNG.standard_normal((4, 5, 6)).astype("float32")
    attributes = {} if axes is None else {"axes": axes}
    node = helper.make_node("CenterCropPad", ["x", "shape"], ["y"], **attributes)
    check_node(node, {"x": x}, constants={"shape": np.array(shape, "int64")})
