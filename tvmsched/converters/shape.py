"""Reshape and Split where a size is 0. Relax's reshape reads a 0 in the new shape as "keep the input's
dim", so a Reshape with allowzero (a 0 is a 0) became a shape computed at run time; Relax's split needs
increasing split points, so parts of size 0 failed. Tensors with a dim of 0 have no elements: such a result
is an empty constant of its shape, and the other parts of a Split are slices."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend
from tvm.relax.frontend.onnx.onnx_frontend import get_constant

from tvmsched.converters import register_converter


def _constant_values(expr, params) -> list[int] | None:
    """The values of a constant 1-D input, else None."""
    constant = get_constant(expr, params) if expr is not None else None
    return constant.value.numpy().tolist() if isinstance(constant, tvm.ir.GenericConst) else None


def _empty(shape: list[int], dtype: str) -> relax.Expr:
    return relax.const(np.zeros(shape, dtype), dtype)


@register_converter("Reshape")
class Reshape(onnx_frontend.Reshape):
    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        shape = _constant_values(inputs[1], params)
        if attr.get("allowzero", 0) and shape is not None and 0 in shape:
            data = inputs[0]  # allowzero with a 0 and no -1 (ONNX forbids both): no elements in or out
            return _empty(shape, str(data.ty.dtype))
        return super()._impl_v13(bb, inputs, attr, params)


@register_converter("Split")
class Split(onnx_frontend.Split):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return cls._split(bb, inputs, attr, params, attr.get("split"), super()._impl_v1)

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        return cls._split(bb, inputs, attr, params, _constant_values(inputs[1], params), super()._impl_v13)

    @classmethod
    def _split(cls, bb, inputs, attr, params, sizes, convert):
        if not sizes or all(sizes):
            return convert(bb, inputs, attr, params)
        data = inputs[0]
        dims = [int(dim) for dim in data.ty.shape.values]
        axis = attr.get("axis", 0) % len(dims)
        parts, begin = [], 0
        for size in sizes:
            shape = dims[:axis] + [size] + dims[axis + 1:]
            parts.append(_empty(shape, str(data.ty.dtype)) if size == 0 else bb.normalize(
                relax.op.strided_slice(data, [axis], [begin], [begin + size])))
            begin += size
        return relax.Tuple(parts)
