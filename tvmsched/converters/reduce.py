"""ReduceMax and ReduceMin with the identities ONNX gives them. TVM's reductions start from the dtype's
finite extreme, so the max of a row of -inf (an attention row that is all masked) is -3.4e38, not -inf, and
so is the max of an empty set; and they have no extreme of bool. Here a float reduction starts from -inf
(+inf for min), a bool one is an or (an and)."""

from __future__ import annotations

import tvm
from tvm import te
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter, get_constant

from tvmsched.converters import register_converter


def _extreme(data: te.Tensor, axes: list[int], keepdims: bool, largest: bool) -> te.Tensor:
    """The max (or min) of `data` over `axes`, starting from -inf (+inf) for floats (which is also the
    result over an empty set: a reduction of extent 0 is computed as that constant, since TVM's kernel
    for it leaves its output unwritten)."""
    dtype = str(data.dtype)
    identity = _identity(dtype, largest)
    operator = (tvm.tirx.Or if largest else tvm.tirx.And) if dtype == "bool" else (
        tvm.tirx.max if largest else tvm.tirx.min)
    reducer = te.comm_reducer(lambda first, second: operator(first, second),
                              lambda value_type: tvm.tirx.const(identity, value_type))
    reduced = {axis: te.reduce_axis((0, data.shape[axis]), f"k{axis}") for axis in axes}
    shape = [1 if axis in reduced else dim for axis, dim in enumerate(data.shape)
             if keepdims or axis not in reduced]
    if any(int(data.shape[axis]) == 0 for axis in axes):
        return te.compute(shape, lambda *indices: tvm.tirx.const(identity, dtype), name="empty_extreme")

    def element(*indices):
        outer, index = iter(indices), []
        for axis in range(len(data.shape)):
            if axis in reduced:
                index.append(reduced[axis])
                if keepdims:
                    next(outer)  # the reduced axis kept with size 1
            else:
                index.append(next(outer))
        return reducer(data[tuple(index)], axis=list(reduced.values()))

    return te.compute(shape, element, name="max" if largest else "min")


def _identity(dtype: str, largest: bool):
    """Where a max (min) starts: -inf (+inf) for floats, false (true) for bool, else the dtype's extreme."""
    if dtype == "bool":
        return not largest
    if dtype.startswith(("float", "bfloat")):
        return float("-inf") if largest else float("inf")
    return (tvm.tirx.min_value if largest else tvm.tirx.max_value)(dtype).value


class _Extreme(OnnxOpConverter):
    largest = True

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return cls._reduce(bb, inputs[0], attr.get("axes"), attr.get("keepdims", 1), False)

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        axes = None
        if inputs[1] is not None:
            constant = get_constant(inputs[1], params)
            if not isinstance(constant, tvm.ir.GenericConst):
                raise ValueError("Only constant axes currently supported")
            axes = constant.value.numpy().tolist()
        return cls._reduce(bb, inputs[0], axes, attr.get("keepdims", 1),
                           attr.get("noop_with_empty_axes", 0))

    @classmethod
    def _reduce(cls, bb, data, axes, keepdims: int, noop_with_empty_axes: int):
        rank = data.ty.ndim
        if (not axes and noop_with_empty_axes) or rank == 0:
            return data
        axes = sorted({axis % rank for axis in axes}) if axes else list(range(rank))
        return bb.emit_te(_extreme, data, axes, bool(keepdims), cls.largest)


@register_converter("ReduceMax")
class ReduceMax(_Extreme):
    largest = True


@register_converter("ReduceMin")
class ReduceMin(_Extreme):
    largest = False
