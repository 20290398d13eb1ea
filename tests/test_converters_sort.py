"""TopK (tvmsched/converters/sort.py): ONNX's order with ties by index, both directions, any axis."""

import numpy as np
import pytest
from conftest import make_model, onnxruntime_outputs, tensor
from onnx import TensorProto, helper

import tvmsched


def _top_k_model(shape, k: int, **attributes):
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], **attributes)
    out = [k if axis == attributes.get("axis", -1) % len(shape) else dim for axis, dim in enumerate(shape)]
    return make_model([node], [tensor("x", shape)], [tensor("values", out),
                                                     tensor("indices", out, TensorProto.INT64)],
                      {"k": np.array([k])})


@pytest.mark.parametrize("attributes", [{"axis": 1}, {"axis": 0, "largest": 0}, {"axis": -1, "largest": 0}])
def test_top_k_matches_onnxruntime_with_ties(attributes):
    x = np.array([[3, 1, 3, 2, 1], [0, 0, 5, 5, 0], [2, 2, 2, 2, 2]], "float32")
    model = _top_k_model([3, 5], 2, **attributes)
    values, indices = tvmsched.compile(model, target="llvm").run({"x": x})
    expected_values, expected_indices = onnxruntime_outputs(model, {"x": x})
    np.testing.assert_array_equal(values, expected_values)
    np.testing.assert_array_equal(indices, expected_indices)


def test_nan_is_the_largest_and_indices_stay_in_range():
    x = np.array([[1.0, np.nan, 3.0, np.nan]], "float32")
    values, indices = tvmsched.compile(_top_k_model([1, 4], 3), target="llvm").run({"x": x})
    assert indices.tolist() == [[1, 3, 2]]
    np.testing.assert_array_equal(values, [[np.nan, np.nan, 3.0]])


def test_top_k_builds_for_cuda():
    """The kernels are plain tensor expressions: dlight schedules them for the GPU too (cross-compiled)."""
    model = tvmsched.compile(_top_k_model([8, 1000], 5, axis=1), target="cuda", tuned=False)
    assert len(model.graph.kernels) == 2
