"""Lowering: calls whose shapes are only known at run time are left alone by the constant folding."""

import numpy as np
import pytest
import tvm
from conftest import make_model, onnxruntime_outputs, tensor
from onnx import TensorProto, helper

import tvmsched
from tvmsched import fold
from tvmsched.importer import import_model
from tvmsched.lower import is_call_tir, lower


def test_a_call_of_run_time_shape_is_not_folded(monkeypatch):
    """Range over bounds given at run time: TVM computes its length, then calls a kernel without tensor
    arguments whose output shape is a symbolic variable (fold_constant_calls took it for a constant and
    failed on int() of that variable). The import refuses such a node (`static_shapes`): not here."""
    import tvmsched.importer

    monkeypatch.setattr(tvmsched.importer, "check_static_output", lambda *args: None)
    node = helper.make_node("Range", ["start", "limit", "delta"], ["y"])
    names = ("start", "limit", "delta")
    model = make_model([node], [tensor(name, [], TensorProto.FLOAT) for name in names],
                       [tensor("y", ["n"])], {})
    module = import_model(fold.fold_shapes(model, dict.fromkeys(names, ()), {}), dict.fromkeys(names, []),
                          dict.fromkeys(names, "float32"), 18)
    main = lower(module).module["main"]
    shapes = [binding.value.ty.shape.values for block in main.body.blocks for binding in block.bindings
              if is_call_tir(binding.value)]
    assert any(not isinstance(dim, tvm.tirx.IntImm) for shape in shapes for dim in shape)


@pytest.mark.parametrize("index", [1, -1])
def test_a_gather_at_a_constant_index_is_a_slice_that_fuses(index):
    """ViT picks its query, key and value out of one tensor with Gather at constant indices: each is a
    slice fused with the transpose after it (TVM's take read the index from a buffer and ran as a kernel
    of its own), and computes what onnxruntime does, a negative index counting from the end."""
    nodes = [helper.make_node("Gather", ["input", "index"], ["picked"], axis=1),
             helper.make_node("Transpose", ["picked"], ["t"], perm=[1, 0]),
             helper.make_node("Relu", ["t"], ["output"])]
    model = make_model(nodes, [tensor("input", [4, 3, 5])], [tensor("output", [5, 4])],
                       {"index": np.array(index)})
    compiled = tvmsched.compile(model, target="llvm")
    assert [kernel.op_kinds for kernel in compiled.graph.kernels] == [("take", "transpose", "relu")]
    x = np.random.default_rng(15).standard_normal((4, 3, 5)).astype("float32")
    np.testing.assert_array_equal(compiled(x), onnxruntime_outputs(model, {"input": x})[0])
