"""The zoo's ONNX builders: deterministic per seed, valid ONNX with the documented input and output, batch
symbolic or fixed, and the papers' structure (parallel branches) where the schedulers need it."""

import onnx
import pytest

from tvmsched import zoo
from tvmsched.errors import UnknownModel


def dims(value: onnx.ValueInfoProto) -> list:
    return [dim.dim_value or dim.dim_param for dim in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize("name", zoo.list_models())
def test_models_are_valid_deterministic_and_seeded(name):
    model = zoo.build(name, batch=2, image_size=64)
    onnx.checker.check_model(model, full_check=True)
    assert model.SerializeToString() == zoo.build(name, batch=2, image_size=64).SerializeToString()
    assert model.SerializeToString() != zoo.build(name, batch=2, image_size=64, seed=1).SerializeToString()
    (graph_input,), (graph_output,) = model.graph.input, model.graph.output
    assert (graph_input.name, dims(graph_input)) == ("input", [2, 3, 64, 64])
    assert (graph_output.name, dims(graph_output)) == ("output", [2, 1000])


def test_batch_is_symbolic_unless_given_and_classes_configurable():
    model = zoo.build("squeezenet", image_size=64, num_classes=10)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert model.graph.output[0].type.tensor_type.shape.dim[1].dim_value == 10


@pytest.mark.parametrize("name, branches", [("googlenet", 4), ("inception_v3", 4), ("squeezenet", 2)])
def test_inception_and_fire_modules_concatenate_parallel_branches(name, branches):
    concats = [node for node in zoo.build(name, image_size=64).graph.node if node.op_type == "Concat"]
    assert concats and max(len(node.input) for node in concats) >= branches


def test_unknown_model_names_the_available_ones():
    with pytest.raises(UnknownModel, match="no zoo model 'alexnet'; available: googlenet, inception_v3"):
        zoo.build("alexnet")


def test_export_writes_a_loadable_file(tmp_path):
    path = zoo.export("resnet50", tmp_path / "nested" / "r.onnx", batch=1, image_size=32)
    assert onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
