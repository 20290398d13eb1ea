"""tvmsched.converters.refused: ops refused with their reason, and value-shaped ops on constants."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from single_node import check_node, node_model

import tvmsched
from tvmsched.errors import ShapeBindingError, UnsupportedOperator


def test_sequence_ops_are_refused_naming_node_and_reason():
    nodes = [helper.make_node("SplitToSequence", ["x"], ["parts"], name="split"),
             helper.make_node("ConcatFromSequence", ["parts"], ["y"], axis=0)]
    model = node_model(nodes, {"x": np.zeros((4, 2), "float32")}, 18)
    with pytest.raises(UnsupportedOperator, match=r"node 'split' \(SplitToSequence\) \(opset 18\): it works "
                                                  r"on sequences of tensors, and tvmsched compiles tensor "
                                                  r"programs with static shapes"):
        tvmsched.compile(model, target="llvm")


def test_random_ops_are_refused():
    node = helper.make_node("RandomUniformLike", ["x"], ["y"], name="noise")
    model = node_model(node, {"x": np.zeros((2,), "float32")}, 18)
    with pytest.raises(UnsupportedOperator, match="it draws random numbers"):
        tvmsched.compile(model, target="llvm")


def test_value_shaped_ops_on_constants_are_computed():
    condition = np.array([True, False, True])
    check_node(helper.make_node("Compress", ["x", "keep"], ["y"], axis=1),
               {"x": np.arange(6, dtype="float32").reshape(2, 3)}, constants={"keep": condition})
    check_node(helper.make_node("Compress", ["x", "keep"], ["y"]),
               {"x": np.arange(6, dtype="float32").reshape(2, 3)}, constants={"keep": condition})
    nodes = [helper.make_node("NonZero", ["mask"], ["where"]), helper.make_node("Add", ["where", "x"], ["y"])]
    check_node(nodes, {"x": np.zeros((1,), "int64")}, constants={"mask": np.array([[0, 3], [2, 0]])})


@pytest.mark.parametrize("op", ["NonZero", "Unique"])
def test_value_shaped_ops_on_run_time_values_are_refused(op):
    node = helper.make_node(op, ["x"], ["y"], name="data_dependent")
    model = node_model(node, {"x": np.zeros((3,), "float32")}, 18)
    with pytest.raises(UnsupportedOperator, match=r"node 'data_dependent' .*its output shape depends on "
                                                  r"its input data"):
        tvmsched.compile(model, target="llvm")


def test_optional_input_is_refused():
    optional = helper.make_value_info("x", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [2])))
    graph = helper.make_graph([helper.make_node("OptionalHasElement", ["x"], ["y"])], "g", [optional],
                              [helper.make_tensor_value_info("y", TensorProto.BOOL, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(ShapeBindingError, match="input 'x' is an optional value, not a tensor"):
        tvmsched.compile(model, target="llvm")


def test_optional_ops_on_a_tensor():
    x = np.arange(3, dtype="float32")
    check_node(helper.make_node("OptionalGetElement", ["x"], ["y"]), {"x": x}, reference="reference")
    nodes = [helper.make_node("OptionalHasElement", ["x"], ["has"]),
             helper.make_node("Not", ["has"], ["y"])]
    check_node(nodes, {"x": x}, reference="reference")
