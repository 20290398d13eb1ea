"""tvmsched.converters.elementwise and .constant: one-node models against onnxruntime / onnx's reference."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from single_node import check_node, node_model

import tvmsched
from tvmsched.errors import UnsupportedOperator

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", ["int32", "int8", "uint16"])
def test_bitshift_out_of_range_amounts(direction, dtype):
    info = np.iinfo(dtype)
    x = np.array([-8, 4, -1, 5, 3, -128, 7], "int64").clip(info.min, info.max).astype(dtype)
    amount = np.array([info.bits, -1, info.bits + 8, 2, info.bits - 1, 3, 0], "int64")
    amount = amount.clip(info.min, info.max).astype(dtype)
    node = helper.make_node("BitShift", ["x", "y"], ["z"], direction=direction)
    check_node(node, {"x": x, "y": amount}, opset=28)


@pytest.mark.parametrize("negative, positive", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_isinf_detect_flags(negative, positive):
    x = np.array([-1.5, np.nan, np.inf, -np.inf, 0.0, 3.0], "float32")
    node = helper.make_node("IsInf", ["x"], ["y"], detect_negative=negative, detect_positive=positive)
    check_node(node, {"x": x})


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32"])
def test_mod_edge_cases(fmod, dtype):
    if dtype == "int32":
        x, y = np.array([-7, 7, -7, 7, 0], dtype), np.array([3, -3, -3, 3, 5], dtype)
    else:
        large = 1e4 if dtype == "float16" else 1e10
        x = np.array([0, -0.0, -3, 3, -1, 1, np.inf, 1, np.nan, 5.5, -5.5, large], dtype)
        y = np.array([-2, 2, np.inf, np.inf, -np.inf, -np.inf, 2, 0, 2, -2, 2, 3], dtype)
    node = helper.make_node("Mod", ["x", "y"], ["z"], fmod=fmod)
    check_node(node, {"x": x, "y": y}, opset=28, reference="reference")


@pytest.mark.parametrize("op, attributes, dtype", [
    ("Mish", {}, "float32"), ("Mish", {}, "float16"), ("Softplus", {}, "float32"),
    ("Elu", {"alpha": 0.7}, "float32"), ("Elu", {}, "float16"), ("Selu", {}, "float32"),
    ("Celu", {"alpha": 2.0}, "float32"), ("Celu", {}, "float16"),
    ("ThresholdedRelu", {"alpha": 0.5}, "float64"), ("Swish", {"alpha": 1.5}, "float32")])
def test_float_activations(op, attributes, dtype):
    x = np.concatenate([np.linspace(-12, 12, 97), [-30.0, 30.0]]).astype(dtype)
    node = helper.make_node(op, ["x"], ["y"], **attributes)
    tolerance = 1e-3 if dtype == "float16" else 1e-6
    check_node(node, {"x": x}, opset=24, reference="reference", rtol=tolerance, atol=1e-7)


@pytest.mark.parametrize("base, exponent", [("float32", "float32"), ("float32", "int64"),
                                            ("int32", "float32"), ("int64", "int64"), ("int32", "int32")])
def test_pow_dtypes(base, exponent):
    x = np.array([1, 2, 3, -2, 5], base)
    y = np.array([3, 2, 0, 3, 1], exponent) if "int" in exponent else np.array([3, 0.5, 0, 3, 1.5], exponent)
    node = helper.make_node("Pow", ["x", "y"], ["z"])
    check_node(node, {"x": x, "y": y}, opset=15, reference="reference")


def test_bitcast_and_eyelike():
    x = RNG.standard_normal((3, 4)).astype("float32")
    check_node(helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT32), {"x": x}, opset=26,
               reference="reference")
    for attributes in ({"k": 1}, {"k": -2, "dtype": TensorProto.INT64}):
        check_node(helper.make_node("EyeLike", ["x"], ["y"], **attributes), {"x": x})


def test_bitcast_of_bool_is_refused():
    node = helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.UINT8, name="bits")
    model = node_model(node, {"x": np.zeros((2,), "bool")}, 26)
    with pytest.raises(UnsupportedOperator, match=r"node 'bits' \(BitCast\) \(opset 26\): BitCast from "
                                                  r"bool to uint8 is not supported"):
        tvmsched.compile(model, target="llvm")


@pytest.mark.parametrize("to", [TensorProto.FLOAT8E4M3FN, TensorProto.INT4, TensorProto.FLOAT4E2M1])
def test_cast_to_narrow_types_is_refused(to):
    model = node_model(helper.make_node("Cast", ["x"], ["y"], to=to), {"x": np.zeros((2,), "float32")}, 23)
    with pytest.raises(UnsupportedOperator, match="TVM cannot compute with"):
        tvmsched.compile(model, target="llvm")


def test_cast_between_computed_types():
    x = np.array([0.5, -1.25, 3e4, 7.0], "float32")
    for to in (TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16, TensorProto.INT32):
        check_node(helper.make_node("Cast", ["x"], ["y"], to=to), {"x": x}, reference="reference")


@pytest.mark.parametrize("attributes, dtype", [
    ({"value_float": 2.5}, "float32"), ({"value_floats": [1.0, -2.0]}, "float32"),
    ({"value_int": 3}, "int64"), ({"value_ints": [4, 5]}, "int64"),
    ({"value": numpy_helper.from_array(np.array([[1, 2]], "int8"))}, "int8")])
def test_constant_attribute_forms(attributes, dtype):
    nodes = [helper.make_node("Constant", [], ["c"], **attributes),
             helper.make_node("Add", ["c", "x"], ["y"])]
    check_node(nodes, {"x": np.zeros((1,), dtype)})


def test_string_constant_is_refused():
    nodes = [helper.make_node("Identity", ["x"], ["y"]),  # an unused Constant would be folded away
             helper.make_node("Constant", [], ["c"], value_string="text", name="words")]
    model = node_model(nodes, {"x": np.zeros((1,), "float32")}, 18)
    with pytest.raises(UnsupportedOperator, match=r"node 'words' \(Constant\).*string"):
        tvmsched.compile(model, target="llvm")


@pytest.mark.parametrize("op", ["Sum", "Mean", "Min", "Max"])
def test_variadic_ops_broadcast_pairwise(op):
    inputs = {"a": RNG.standard_normal((2, 1, 4)).astype("float32"),
              "b": RNG.standard_normal((3, 1)).astype("float32"),
              "c": RNG.standard_normal(4).astype("float32")}
    check_node(helper.make_node(op, list(inputs), ["y"]), inputs)
