"""Frontend errors: missing/corrupt files, unsupported ops, unbound dims, no inputs, bad shape flags."""

import numpy as np
import onnx
import pytest
from conftest import make_model, tensor
from onnx import helper
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

import tvmsched
from tvmsched import frontend
from tvmsched.converters import CONVERTERS
from tvmsched.errors import ModelLoadError, ShapeBindingError, UnknownModel, UnsupportedOperator


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        frontend.load_model(tmp_path / "nope.onnx")


def test_corrupt_file(tmp_path, branchy_model):
    path = tmp_path / "broken.onnx"
    path.write_bytes(branchy_model.SerializeToString()[:100])
    with pytest.raises(ModelLoadError, match="not a readable ONNX model"):
        frontend.load_model(path)


def test_empty_file_and_a_protobuf_without_a_graph(tmp_path, branchy_model):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"empty.onnx' is not an ONNX model \(it is empty\); re-export"):
        frontend.load_model(path)
    path.write_bytes(branchy_model.graph.node[0].SerializeToString())  # parses as a model with no graph
    with pytest.raises(ModelLoadError, match=r"is not an ONNX model \(it holds no graph\)"):
        frontend.load_model(path)


def test_invalid_graph_is_reported():
    node = helper.make_node("Relu", ["undefined_tensor"], ["output"])
    graph = helper.make_graph([node], "g", [tensor("input", [1])], [tensor("output", [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelLoadError, match="invalid"):
        frontend.load_model(model)


def test_unsupported_operator_names_node_and_op():
    nodes = [helper.make_node("Relu", ["input"], ["hidden"]),
             helper.make_node("DFT", ["hidden"], ["output"], name="dft_7")]
    model = make_model(nodes, [tensor("input", [1, 4])], [tensor("output", [1, 4])], {})
    with pytest.raises(UnsupportedOperator, match="node 'dft_7' uses 'DFT' .opset 18."):
        tvmsched.compile(model)


def test_custom_domain_operator_is_unsupported():
    node = helper.make_node("FusedThing", ["input"], ["output"], domain="com.example", name="n0")
    graph = helper.make_graph([node], "g", [tensor("input", [2])], [tensor("output", [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOperator, match="from domain com.example .opset 1."):
        frontend.check_operators(model)
    # a model of that domain only is refused by its node too, not for lacking the default domain's opset
    del model.opset_import[0]
    with pytest.raises(UnsupportedOperator, match="node 'n0' uses 'FusedThing' from domain com.example"):
        tvmsched.compile(model)


def test_operator_of_another_domain_only_is_named_with_its_domain():
    """A model importing ai.onnx.ml alone gets the op's name and domain, not a missing-opset error."""
    node = helper.make_node("Binarizer", ["input"], ["output"], domain="ai.onnx.ml", name="bin")
    graph = helper.make_graph([node], "g", [tensor("input", [2])], [tensor("output", [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 3)])
    with pytest.raises(UnsupportedOperator, match=r"node 'bin' uses 'Binarizer' from domain ai.onnx.ml "
                                                  r"\(opset 3\); tvmsched converts the default ONNX domain"):
        tvmsched.compile(model, target="llvm")


@pytest.mark.parametrize("value, error, message", [
    (helper.make_tensor_sequence_value_info("input", onnx.TensorProto.FLOAT, [2]), ShapeBindingError,
     "is a sequence value, not a tensor"),
    (helper.make_tensor_value_info("input", onnx.TensorProto.STRING, [2]), UnsupportedOperator,
     "holds strings"),
    (helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT8E4M3FN, [2]), UnsupportedOperator,
     "holds float8_e4m3fn")])
def test_inputs_that_are_not_numeric_tensors_are_refused(value, error, message):
    graph = helper.make_graph([helper.make_node("Identity", ["input"], ["output"])], "g", [value],
                              [helper.make_tensor_value_info("output", onnx.TensorProto.UNDEFINED, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(error, match=f"input 'input' {message}"):
        frontend.bind_input_shapes(model)


def test_model_without_inputs():
    value = np.ones((2,), "float32")
    node = helper.make_node("Constant", [], ["output"], value=onnx.numpy_helper.from_array(value))
    model = make_model([node], [], [tensor("output", [2])], {})
    with pytest.raises(ModelLoadError, match="no inputs"):
        tvmsched.compile(model)


def test_unbound_dynamic_dims(branchy_model):
    with pytest.raises(ShapeBindingError, match="dynamic dim 0 .*--batch N"):
        frontend.bind_input_shapes(branchy_model)
    node = helper.make_node("Relu", ["input"], ["output"])
    model = make_model([node], [tensor("input", [1, "height"])], [tensor("output", [1, "height"])], {})
    with pytest.raises(ShapeBindingError, match="dynamic dim 1 .*--input-shape input:NxN"):
        frontend.bind_input_shapes(model, batch=1)


def test_shape_binding_by_batch_and_by_name(branchy_model):
    assert frontend.bind_input_shapes(branchy_model, batch=4)[0].shape == (4, 3, 8, 8)
    specs = frontend.bind_input_shapes(branchy_model, input_shapes={"input": (2, 3, 16, 16)})
    assert specs == [frontend.TensorSpec("input", (2, 3, 16, 16), "float32")]
    with pytest.raises(ShapeBindingError, match="model's inputs are input"):
        frontend.bind_input_shapes(branchy_model, input_shapes={"image": (1, 3, 8, 8)})
    with pytest.raises(ShapeBindingError, match="rank 4"):
        frontend.bind_input_shapes(branchy_model, input_shapes={"input": (1, 3)})
    with pytest.raises(ShapeBindingError, match="positive"):
        frontend.bind_input_shapes(branchy_model, batch=0)


def test_a_binding_that_does_not_fit_a_fixed_dim_is_refused_as_the_binding(branchy_model):
    """The model fixes 3 channels; bound to 4, its first convolution cannot be imported: the error names
    the binding and the dims the model fixes first, not only an operator to replace in the exporter."""
    model = onnx.load_from_string(branchy_model.SerializeToString())
    for dim, value in zip(model.graph.input[0].type.tensor_type.shape.dim, (1, 3, 8, 8)):
        dim.dim_value = value
    inputs = frontend.bind_input_shapes(model, input_shapes={"input": (1, 4, 8, 8)})
    fixed = r"\(Conv\).* with input 'input' bound to 1x4x8x8 where the model fixes 1x3x8x8: .*; bind the dims"
    with pytest.raises(UnsupportedOperator, match=fixed):
        frontend.to_relax(model, inputs)
    wider = frontend.bind_input_shapes(model, input_shapes={"input": (2, 3, 16, 16)})
    assert frontend.to_relax(model, wider)["main"]  # other fixed dims that fit still import


@pytest.mark.parametrize("text, expected", [("input:1x3x224x224", ("input", (1, 3, 224, 224))),
                                            ("a:b:2X5", ("a:b", (2, 5)))])
def test_parse_input_shape(text, expected):
    assert frontend.parse_input_shape(text) == expected


@pytest.mark.parametrize("text", ["input", "input:", "input:1xfoo", ":1x2", "input:0x3"])
def test_parse_input_shape_rejects(text):
    with pytest.raises(ShapeBindingError, match="NAME:1x3x224x224"):
        frontend.parse_input_shape(text)


def test_unknown_model_name():
    with pytest.raises(UnknownModel, match="neither a file nor a zoo model"):
        tvmsched.compile("not_a_model")


def test_importer_failure_names_the_node_and_leaves_no_warning(capfd, monkeypatch):
    """A converter that fails (one that raises, standing in for any of TVM's) is refused naming the node."""
    class Failing(OnnxOpConverter):
        @classmethod
        def _impl_v1(cls, bb, inputs, attr, params):
            raise ValueError("Only constant axes currently supported")

    monkeypatch.setitem(CONVERTERS, "ReduceSum", Failing)
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum_3")
    model = make_model([node], [tensor("x", [3, 4])], [tensor("y", [3])], {"axes": np.array([1])})
    with pytest.raises(UnsupportedOperator, match=r"node 'sum_3' \(ReduceSum\) \(opset 18\) cannot be "
                                                  r"imported: Only constant axes"):
        tvmsched.compile(model, target="llvm")
    import gc
    gc.collect()
    captured = capfd.readouterr()
    assert "Error converting" not in captured.out and "BlockBuilder" not in captured.err


@pytest.mark.parametrize("constants, shapes, message", [
    ({"bias": np.zeros(3, "float32")}, {}, "--constant-input names bias, but the model's inputs are x, axes"),
    ({"axes": np.array([1], "int32")}, {}, "value given for input 'axes' is int32, but the input is int64; "
                                           "convert it with .astype"),
    ({"axes": np.array([1, 0])}, {}, "value given for input 'axes' has shape 2, but the input's dims are 1"),
    ({"axes": np.array([1])}, {"axes": (1,)}, "input 'axes' is given both a shape .* and a value"),
])
def test_constant_input_binding_errors(runtime_axes_model, constants, shapes, message):
    with pytest.raises(ShapeBindingError, match=message):
        frontend.bind_input_shapes(runtime_axes_model, input_shapes=shapes, constant_inputs=constants)
    assert frontend.bind_input_shapes(runtime_axes_model, constant_inputs={"axes": np.array([1])}) == [
        frontend.TensorSpec("x", (3, 4), "float32")]


def test_a_sequence_input_is_refused_by_name():
    sequence = helper.make_tensor_sequence_value_info("items", onnx.TensorProto.FLOAT, [2])
    node = helper.make_node("SequenceAt", ["items", "position"], ["output"])
    model = make_model([node], [sequence], [tensor("output", [2])], {"position": np.array(0)})
    with pytest.raises(ShapeBindingError, match="input 'items' is a sequence value, not a tensor"):
        frontend.bind_input_shapes(model)


def test_scalar_and_empty_dims_are_static():
    node = helper.make_node("Add", ["scalar", "empty"], ["output"])
    model = make_model([node], [tensor("scalar", []), tensor("empty", [2, 0])], [tensor("output", [2, 0])],
                       {})
    assert [spec.shape for spec in frontend.bind_input_shapes(model)] == [(), (2, 0)]
