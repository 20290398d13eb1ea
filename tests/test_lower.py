"""Lowering: calls whose shapes are only known at run time are left alone by the constant folding."""

import tvm
from conftest import make_model, tensor
from onnx import TensorProto, helper

from tvmsched import fold
from tvmsched.importer import import_model
from tvmsched.lower import is_call_tir, lower


def test_a_call_of_run_time_shape_is_not_folded():
    """Range over bounds given at run time: TVM computes its length, then calls a kernel without tensor
    arguments whose output shape is a symbolic variable (fold_constant_calls took it for a constant and
    failed on int() of that variable)."""
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
