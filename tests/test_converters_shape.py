"""Reshape with allowzero and Split with parts of size 0 (tvmsched/converters/shape.py)."""

import numpy as np
from conftest import make_model, onnxruntime_outputs, tensor
from onnx import helper

import tvmsched


def test_reshape_with_allowzero_keeps_a_zero():
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=1)
    model = make_model([node], [tensor("x", [0, 3, 4])], [tensor("y", [3, 4, 0])],
                       {"shape": np.array([3, 4, 0])})
    x = np.zeros((0, 3, 4), "float32")
    got = tvmsched.compile(model, target="llvm")(x)
    assert got.shape == (3, 4, 0) == onnxruntime_outputs(model, {"x": x})[0].shape


def test_split_with_parts_of_size_zero():
    node = helper.make_node("Split", ["x", "split"], ["a", "b", "c"], axis=1)
    model = make_model([node], [tensor("x", [2, 5])], [tensor(name, [2, "n"]) for name in "abc"],
                       {"split": np.array([2, 0, 3])})
    x = np.arange(10, dtype="float32").reshape(2, 5)
    outputs = tvmsched.compile(model, target="llvm").run({"x": x})
    assert [output.shape for output in outputs] == [(2, 2), (2, 0), (2, 3)]
    for got, expected in zip(outputs, onnxruntime_outputs(model, {"x": x})):
        np.testing.assert_array_equal(got, expected)
