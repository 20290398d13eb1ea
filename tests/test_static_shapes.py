"""Import-time refusal of a node whose output shape is not static, naming the node, what its shape depends
on and the fix; models with static shapes import as before."""

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper

import tvmsched
from tvmsched.errors import ConstantInputRequired, UnsupportedOperator

node = helper.make_node
FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def refusal(model) -> str:
    with pytest.raises(UnsupportedOperator) as caught:
        tvmsched.compile(model, target="llvm")
    message = str(caught.value)
    assert "\n" not in message and "tvmsched compiles static shapes only" in message
    return message


@pytest.mark.parametrize("nodes, inputs, output, counted", [
    ([node("Unique", ["x"], ["y"], name="uniq")], [tensor("x", [6])], tensor("y", ["n"]),
     "the number of distinct values"),
    ([node("NonZero", ["x"], ["y"], name="nz")], [tensor("x", [2, 3])], tensor("y", [2, "n"], INT64),
     "the number of nonzero elements"),
    # TVM's converter pads this output to a static shape: refused by the op's definition
    ([node("NonMaxSuppression", ["boxes", "scores"], ["y"], name="nms")],
     [tensor("boxes", [1, 6, 4]), tensor("scores", [1, 1, 6])], tensor("y", ["n", 3], INT64),
     "the number of boxes it selects"),
    ([node("Greater", ["x", "zero"], ["keep"]), node("Compress", ["x", "keep"], ["y"], axis=0, name="comp")],
     [tensor("x", [4])], tensor("y", ["n"]), "the number of true conditions"),
])
def test_a_shape_set_by_the_data_is_refused_naming_the_node(nodes, inputs, output, counted):
    model = make_model(nodes, inputs, [output], {"zero": np.zeros((), "float32")})
    message = refusal(model)
    assert message.startswith(f"node '{nodes[-1].name}' ({nodes[-1].op_type}) (opset 18): its output shape "
                              f"depends on its input data ({counted})")
    assert message.endswith("replace it in the exporter (e.g. by a fixed-size variant) or compute it outside "
                            "the model")


@pytest.mark.parametrize("nodes, inputs, output, name, value, expected", [
    ([node("Cast", ["mask"], ["m"], to=BOOL), node("NonZero", ["m"], ["y"], name="n")],
     [tensor("mask", [4], INT64)], tensor("y", [1, "n"], INT64), "mask", np.array([0, 3, 0, 1]), [[1, 3]]),
    ([node("Unique", ["ids"], ["y"], name="n")], [tensor("ids", [5], INT64)], tensor("y", ["n"], INT64),
     "ids", np.array([4, 1, 4, 2, 1]), [1, 2, 4]),
])
def test_a_shape_set_by_a_graph_inputs_value_names_the_input_to_bind(nodes, inputs, output, name, value,
                                                                     expected):
    """Binding the value the refusal names (as `constant_inputs`) makes the shapes static."""
    model = make_model(nodes + [node("Identity", ["x"], ["x_copy"])], inputs + [tensor("x", [2])],
                       [output, tensor("x_copy", [2])], {})
    with pytest.raises(ConstantInputRequired) as caught:
        tvmsched.compile(model, target="llvm")
    assert caught.value.inputs == (name,)
    assert str(caught.value) == (
        f"node 'n' ({nodes[-1].op_type}) (opset 18): its output shape depends on the value of graph input "
        f"'{name}', and tvmsched compiles static shapes only; bind it with --constant-input {name}=FILE.npy "
        f"(constant_inputs= in Python)")
    compiled = tvmsched.compile(model, target="llvm", constant_inputs={name: value})
    np.testing.assert_array_equal(compiled(np.zeros(2, "float32"))[0], expected)


def test_a_shape_computed_from_shapes_left_unfolded(monkeypatch):
    """Shape computations are folded before the import (`fold`); one left unfolded is refused by name."""
    from tvmsched import frontend
    from tvmsched.fold import FoldedModel

    monkeypatch.setattr(frontend, "fold_shapes", lambda proto, shapes, constants: FoldedModel(proto, ()))
    nodes = [node("Shape", ["x"], ["shape"]), node("Gather", ["shape", "zero"], ["length"], axis=0),
             node("Range", ["zero", "length", "one"], ["steps"], name="steps"),
             node("Cast", ["steps"], ["float_steps"], to=FLOAT), node("Add", ["x", "float_steps"], ["y"])]
    model = make_model(nodes, [tensor("x", [5])], [tensor("y", [5])],
                       {"zero": np.array(0, "int64"), "one": np.array(1, "int64")})
    assert "node 'steps' (Range) (opset 18): its output shape is computed from constants and other shapes " \
           "only, but they were not folded" in refusal(model)


def test_integer_inputs_of_static_shape_are_not_refused():
    """An integer graph input that only indexes (Gather) leaves every shape static."""
    model = make_model([node("Gather", ["table", "ids"], ["y"], axis=0)], [tensor("ids", [3], INT64)],
                       [tensor("y", [3, 4])], {"table": np.arange(20, dtype="float32").reshape(5, 4)})
    compiled = tvmsched.compile(model, target="llvm")
    np.testing.assert_array_equal(compiled(np.array([4, 0, 2])), np.arange(20).reshape(5, 4)[[4, 0, 2]])
