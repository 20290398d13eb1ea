"""ReduceMax / ReduceMin (tvmsched/converters/reduce.py): -inf and +inf rows, empty sets, bool inputs."""

import numpy as np
import pytest
from conftest import make_model, onnxruntime_outputs, tensor
from onnx import TensorProto, helper

import tvmsched


@pytest.mark.parametrize("op, fill", [("ReduceMax", -np.inf), ("ReduceMin", np.inf)])
def test_rows_of_infinities_and_empty_sets(op, fill):
    """An all-masked attention row (all -inf) has max -inf; TVM's reduction started from -3.4e38."""
    x = np.array([[fill, fill, fill], [1.0, -2.0, 3.0]], "float32")
    model = make_model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)], [tensor("x", [2, 3])],
                       [tensor("y", [2])], {"axes": np.array([1])})
    got = tvmsched.compile(model, target="llvm")(x)
    np.testing.assert_array_equal(got, onnxruntime_outputs(model, {"x": x})[0])
    assert got[0] == fill
    empty = make_model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)], [tensor("x", [2, 0, 4])],
                       [tensor("y", [2, 1, 4])], {"axes": np.array([1])})
    got = tvmsched.compile(empty, target="llvm")(np.zeros((2, 0, 4), "float32"))
    np.testing.assert_array_equal(got, np.full((2, 1, 4), fill, "float32"))


@pytest.mark.parametrize("op, reference", [("ReduceMax", np.any), ("ReduceMin", np.all)])
def test_bool_inputs(op, reference):
    x = np.array([[True, False, True], [False, False, False], [True, True, True]])
    model = make_model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)],
                       [tensor("x", [3, 3], TensorProto.BOOL)], [tensor("y", [3, 1], TensorProto.BOOL)],
                       {"axes": np.array([-1])}, opset=20)
    got = tvmsched.compile(model, target="llvm")(x)
    np.testing.assert_array_equal(got, reference(x, axis=-1, keepdims=True))
    np.testing.assert_array_equal(got, onnxruntime_outputs(model, {"x": x})[0])


def test_axes_attribute_and_all_axes():
    """Opset 13 (axes as an attribute) and no axes at all (every axis reduced)."""
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype("float32")
    nodes = [helper.make_node("ReduceMax", ["x"], ["by_axes"], axes=[0, 2], keepdims=0),
             helper.make_node("ReduceMin", ["x"], ["overall"])]
    outputs = [tensor("by_axes", [3]), tensor("overall", [1, 1, 1])]
    model = make_model(nodes, [tensor("x", [2, 3, 4])], outputs, {}, opset=13)
    by_axes, overall = tvmsched.compile(model, target="llvm").run({"x": x})
    np.testing.assert_array_equal(by_axes, x.max(axis=(0, 2)))
    np.testing.assert_array_equal(overall, x.min(keepdims=True))
