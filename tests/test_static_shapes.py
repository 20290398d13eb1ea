"""Import-time refusal of a node whose output shape is not static, naming the node, what its shape depends
on and the fix; models with static shapes import as before."""

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper

import tvmsched
from tvmsched.errors import UnsupportedOperator

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


@pytest.mark.parametrize("nodes, inputs, named", [
    ([node("Compress", ["x", "keep"], ["y"], axis=0, name="n")],
     [tensor("x", [4]), tensor("keep", [4], BOOL)], ["keep"]),
    ([node("Cast", ["mask"], ["m"], to=BOOL), node("NonZero", ["m"], ["y"], name="n")],
     [tensor("mask", [4], INT64)], ["mask"]),
    ([node("Tile", ["x", "repeats"], ["y"], name="n")], [tensor("x", [2]), tensor("repeats", [1], INT64)],
     ["repeats"]),
    ([node("Slice", ["x", "starts", "ends"], ["y"], name="n")],
     [tensor("x", [8]), tensor("starts", [1], INT64), tensor("ends", [1], INT64)], ["ends", "starts"]),
    ([node("Range", ["start", "limit", "delta"], ["y"], name="n")],  # float operands set its length
     [tensor("start", []), tensor("limit", []), tensor("delta", [])], ["delta", "limit", "start"]),
])
def test_a_shape_set_by_a_graph_inputs_value_names_the_input_to_bind(nodes, inputs, named):
    dtype = INT64 if nodes[-1].op_type == "NonZero" else FLOAT
    message = refusal(make_model(nodes, inputs, [tensor("y", ["n"] * (2 if dtype == INT64 else 1), dtype)],
                                 {}))
    values = "the value of graph input" if len(named) == 1 else "the values of graph inputs"
    assert f"(opset 18): its output shape depends on {values} {', '.join(repr(n) for n in named)}," in message
    assert message.endswith(f"({' '.join(f'--constant-input {n}=FILE.npy' for n in named)})")


def test_a_shape_computed_from_shapes_that_the_importer_left_unfolded():
    nodes = [node("Shape", ["x"], ["shape"]), node("Gather", ["shape", "zero"], ["length"], axis=0),
             node("Range", ["zero", "length", "one"], ["steps"], name="steps"),
             node("Cast", ["steps"], ["float_steps"], to=FLOAT), node("Add", ["x", "float_steps"], ["y"])]
    model = make_model(nodes, [tensor("x", [5])], [tensor("y", [5])],
                       {"zero": np.array(0, "int64"), "one": np.array(1, "int64")})
    assert "node 'steps' (Range) (opset 18): its output shape is computed from constants and other shapes " \
           "only" in refusal(model)


def test_integer_inputs_of_static_shape_are_not_refused():
    """An integer graph input that only indexes (Gather) leaves every shape static."""
    model = make_model([node("Gather", ["table", "ids"], ["y"], axis=0)], [tensor("ids", [3], INT64)],
                       [tensor("y", [3, 4])], {"table": np.arange(20, dtype="float32").reshape(5, 4)})
    compiled = tvmsched.compile(model, target="llvm")
    np.testing.assert_array_equal(compiled(np.array([4, 0, 2])), np.arange(20).reshape(5, 4)[[4, 0, 2]])
