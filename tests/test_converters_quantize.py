"""tvmsched.converters.quantize (and Round): one-node models against onnxruntime / onnx's reference."""

import numpy as np
import pytest
from onnx import helper
from single_node import check_node, node_model

from tvmsched import frontend

RNG = np.random.default_rng(0)
TIES = np.array([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5], [3.0, 250.5, -300.0, 7.25, 0.0, 126.5]], "float32")


@pytest.mark.parametrize("scale, zero_point, attributes, opset", [
    (np.array(1.0, "float32"), np.array(3, "uint8"), {}, 13),
    (np.array(1.0, "float32"), None, {}, 13),
    (np.array([1.0, 0.5], "float32"), np.array([0, -4], "int8"), {"axis": 0}, 13),
    (np.array([[1.0, 2.0, 0.5], [0.25, 1.0, 4.0]], "float32"), np.array([[1, 2, 3], [4, 5, 6]], "int16"),
     {"axis": 1, "block_size": 2}, 21)])
def test_quantize_linear_rounds_half_to_even(scale, zero_point, attributes, opset):
    constants = {"scale": scale} if zero_point is None else {"scale": scale, "zero": zero_point}
    node = helper.make_node("QuantizeLinear", ["x", *constants], ["y"], **attributes)
    check_node(node, {"x": TIES}, opset=opset, constants=constants, reference="reference")


@pytest.mark.parametrize("dtype, scale, zero_point, attributes, opset", [
    ("uint8", np.array(0.5, "float32"), np.array(128, "uint8"), {}, 19),
    ("int8", np.array([0.5, 2.0], "float16"), np.array([1, -2], "int8"), {"axis": 0}, 19),
    ("int32", np.array(0.1, "float32"), None, {}, 19),
    ("int8", np.array([[0.5, 2.0, 1.0], [1.0, 3.0, 0.25]], "float32"), None, {"axis": 1, "block_size": 2},
     21)])
def test_dequantize_linear(dtype, scale, zero_point, attributes, opset):
    info = np.iinfo(dtype)
    x = RNG.integers(max(info.min, -1000), min(info.max, 1000), (2, 6)).astype(dtype)
    constants = {"scale": scale} if zero_point is None else {"scale": scale, "zero": zero_point}
    node = helper.make_node("DequantizeLinear", ["x", *constants], ["y"], **attributes)
    check_node(node, {"x": x}, opset=opset, constants=constants, reference="reference")


@pytest.mark.parametrize("x", [TIES, np.zeros((2, 3), "float32"), np.abs(TIES)])
def test_dynamic_quantize_linear(x):
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zero"])
    check_node(node, {"x": x}, opset=11, reference="reference")


@pytest.mark.parametrize("node, constants", [
    (helper.make_node("Round", ["x"], ["y"]), {}),
    (helper.make_node("QuantizeLinear", ["x", "scale"], ["y"]), {"scale": np.array(1.0, "float32")})])
def test_rounding_is_half_to_even_on_every_target(node, constants):
    """TVM's round would be CUDA's roundf (half away from zero), so the kernels must call nearbyint."""
    check_node(node, {"x": TIES}, constants=constants)
    model = node_model(node, {"x": TIES}, 18, constants)
    script = frontend.to_relax(model, frontend.bind_input_shapes(model)).script()
    assert "T.nearbyint" in script and "T.round" not in script


@pytest.mark.parametrize("dtype, per_column, batch", [("uint8", False, []), ("int8", True, []),
                                                     ("uint8", False, [2])])
def test_qlinear_matmul(dtype, per_column, batch):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, (*batch, 3, 4)).astype(dtype)
    b = RNG.integers(info.min, info.max, (4, 5)).astype(dtype)
    b_shape = (5,) if per_column else ()
    constants = {"a_scale": np.array(0.02, "float32"), "a_zero": np.array(3, dtype),
                 "b_scale": RNG.uniform(0.01, 0.03, b_shape).astype("float32"),
                 "b_zero": np.full(b_shape, 2, dtype), "y_scale": np.array(0.3, "float32"),
                 "y_zero": np.array(5, dtype)}
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "y_scale",
                                              "y_zero"], ["y"])
    check_node(node, {"a": a, "b": b}, opset=21, constants=constants)


@pytest.mark.parametrize("attributes", [{}, {"pads": [1, 1, 1, 1], "strides": [2, 1]},
                                        {"auto_pad": "SAME_UPPER", "group": 2}])
def test_qlinear_conv_and_conv_integer(attributes):
    x = RNG.integers(0, 255, (1, 4, 6, 5)).astype("uint8")
    w = RNG.integers(-127, 127, (6, 4 // attributes.get("group", 1), 3, 3)).astype("int8")
    constants = {"x_scale": np.array(0.05, "float32"), "x_zero": np.array(120, "uint8"), "w": w,
                 "w_scale": RNG.uniform(0.001, 0.01, 6).astype("float32"), "w_zero": np.zeros(6, "int8"),
                 "y_scale": np.array(0.2, "float32"), "y_zero": np.array(100, "uint8"),
                 "bias": RNG.integers(-1000, 1000, 6).astype("int32")}
    # onnx's reference, not onnxruntime: on x86 CPUs without VNNI, onnxruntime's u8 x s8 kernels add pairs
    # of products in int16 and saturate (measured: off by up to 39 on an AMD EPYC, onnxruntime 1.32)
    node = helper.make_node("QLinearConv", ["x", *constants], ["y"], **attributes)
    check_node(node, {"x": x}, opset=10, constants=constants, reference="reference")
    node = helper.make_node("ConvInteger", ["x", "w", "x_zero"], ["y"], **attributes)
    check_node(node, {"x": x}, opset=10, constants={"w": w, "x_zero": constants["x_zero"]},
               reference="reference")
