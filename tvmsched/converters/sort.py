"""TopK as plain tensor expressions. TVM's importer emits `relax.topk`, which its lowering does not legalize,
and TVM's topk kernels are a CPU library call or CUDA-only code. Here each element's rank along the axis is
the number of elements that come before it in ONNX's order (larger first, or smaller first; equal values
by index; NaN counts as the largest, as in PyTorch), and output p is the element of rank p: the same
kernels on every target, O(n²) per row, which suits the small k and rows of models' TopK heads; the values
are gathered at those indices."""

from __future__ import annotations

import tvm
from tvm import relax, te
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter, get_constant

from tvmsched.converters import register_converter


def _top_indices(data: te.Tensor, k: int, axis: int, largest: bool) -> te.Tensor:
    """The indices of the k first elements along `axis` in ONNX's order."""
    length = data.shape[axis]
    floating = str(data.dtype).startswith(("float", "bfloat"))

    def at(indices, position, tensor=data):
        """`tensor` at `indices` with the axis' index replaced by `position`."""
        return tensor[tuple(position if dim == axis else index for dim, index in enumerate(indices))]

    def greater(first, second):
        if floating:
            return tvm.tirx.Or(tvm.tirx.And(tvm.tirx.isnan(first), tvm.tirx.Not(tvm.tirx.isnan(second))),
                               first > second)
        return first > second

    def equal(first, second):
        if floating:
            return tvm.tirx.Or(first == second, tvm.tirx.And(tvm.tirx.isnan(first), tvm.tirx.isnan(second)))
        return first == second

    def before(indices, other):
        """Whether element `other` comes before element `indices[axis]` along the axis."""
        mine, theirs = at(indices, indices[axis]), at(indices, other)
        ahead = greater(theirs, mine) if largest else greater(mine, theirs)
        return tvm.tirx.Or(ahead, tvm.tirx.And(equal(theirs, mine), other < indices[axis]))

    other = te.reduce_axis((0, length), "other")
    rank = te.compute(data.shape, lambda *indices: te.sum(before(indices, other).astype("int64"), axis=other),
                      name="rank")
    shape = [k if dim == axis else extent for dim, extent in enumerate(data.shape)]
    element = te.reduce_axis((0, length), "element")

    def index_of_rank(*indices):
        position = tvm.tirx.Select(at(indices, element, rank) == indices[axis], element.var.astype("int64"),
                                   tvm.tirx.const(0, "int64"))
        return te.sum(position, axis=element)

    return te.compute(shape, index_of_rank, name="top_indices")


@register_converter("TopK")
class TopK(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return cls._convert(bb, inputs[0], attr.get("k", 1), attr)

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        k = get_constant(inputs[1], params)
        if not isinstance(k, tvm.ir.GenericConst):
            raise ValueError("TopK k must be a constant")
        return cls._convert(bb, inputs[0], int(k.value.numpy().item()), attr)

    @classmethod
    def _convert(cls, bb, data, k: int, attr: dict):
        dims = [int(dim) for dim in data.ty.shape.values]
        axis = attr.get("axis", -1) % len(dims)
        if not 0 <= k <= dims[axis]:
            raise ValueError(f"TopK k={k} is outside 0..{dims[axis]}, the length of axis {axis}")
        indices = bb.emit_te(_top_indices, data, k, axis, bool(attr.get("largest", 1)))
        # a kernel of its own: schedules refuse a kernel that reads back an output it writes
        return relax.Tuple([bb.normalize(relax.op.gather_elements(data, indices, axis)), indices])
