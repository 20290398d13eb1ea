"""Quantization ops: QuantizeLinear and DequantizeLinear per tensor, per axis and blocked,
DynamicQuantizeLinear, QLinearMatMul, QLinearConv and ConvInteger.

Quantized values are rounded half to even (`elementwise.round_half_even`), as ONNX requires: TVM's
quantize rounds with `round`, which CUDA's roundf takes half away from zero. Integer products accumulate in
int32 and are requantized in float64, where ONNX's reference computes them."""

from __future__ import annotations

import math

from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from tvmsched.converters import register_converter
from tvmsched.converters.common import dtype_of, onnx_dtype, refuse, static_shape
from tvmsched.converters.elementwise import round_half_even

_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}


def _parameter(value: relax.Expr, shape: tuple[int, ...], axis: int, block_size: int = 0) -> relax.Expr:
    """A scale or zero point shaped to broadcast against an input of `shape`: one value, one per index of
    `axis`, or (blocked) one per `block_size` indices of `axis`."""
    own = static_shape(value)
    if math.prod(own) == 1:
        return relax.op.reshape(value, [])
    if block_size:
        repeated = relax.op.repeat(value, block_size, axis)
        return relax.op.strided_slice(repeated, axes=[axis], begin=[0], end=[shape[axis]])
    if len(own) != 1 or own[0] != shape[axis]:
        raise refuse(f"a scale or zero point of shape {list(own)} for an input of shape {list(shape)} "
                     f"(axis {axis})", "ONNX takes one value, or one per index of the axis")
    return relax.op.reshape(value, [own[0] if index == axis else 1 for index in range(len(shape))])


def _saturate(bb: relax.BlockBuilder, value: relax.Expr, dtype: str) -> relax.Expr:
    """Float `value` rounded half to even, clipped to the range of the integer `dtype` and cast to it."""
    low, high = _RANGES[dtype]
    return relax.op.astype(relax.op.clip(round_half_even(bb, value), low, high), dtype)


def _integer_dtype(dtype: str, what: str) -> str:
    if dtype not in _RANGES:
        raise refuse(f"{what} {dtype}", f"tvmsched quantizes to {', '.join(_RANGES)}")
    return dtype


def _axis(attr: dict, rank: int) -> int:
    return int(attr.get("axis", 1)) % max(rank, 1)


@register_converter("QuantizeLinear")
class QuantizeLinear(onnx_frontend.OnnxOpConverter):
    """saturate(round(x / scale) + zero_point); the division in x's dtype, or in `precision` (opset 23)."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, scale, zero_point = inputs[0], inputs[1], inputs[2]
        shape = static_shape(x)
        axis, block = _axis(attr, len(shape)), int(attr.get("block_size", 0))
        declared = onnx_dtype(attr["output_dtype"]) if attr.get("output_dtype") else "uint8"
        dtype = _integer_dtype(declared if zero_point is None else dtype_of(zero_point), "quantizing to")
        precision = onnx_dtype(attr["precision"]) if attr.get("precision") else dtype_of(x)
        quotient = relax.op.divide(relax.op.astype(x, precision),
                                   relax.op.astype(_parameter(scale, shape, axis, block), precision))
        rounded = bb.normalize(relax.op.astype(quotient, "float32" if precision != "float64" else precision))
        if zero_point is not None:
            shift = relax.op.astype(_parameter(zero_point, shape, axis, block), dtype_of(rounded))
            rounded = relax.op.add(round_half_even(bb, rounded), shift)
        return _saturate(bb, rounded, dtype)


@register_converter("DequantizeLinear")
class DequantizeLinear(onnx_frontend.OnnxOpConverter):
    """(x - zero_point) * scale, computed in float32 and given the scale's dtype (or `output_dtype`)."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, scale, zero_point = inputs[0], inputs[1], inputs[2]
        if dtype_of(x) != "int32":
            _integer_dtype(dtype_of(x), "dequantizing")
        shape = static_shape(x)
        axis, block = _axis(attr, len(shape)), int(attr.get("block_size", 0))
        shifted = relax.op.astype(x, "float32")
        if zero_point is not None:
            zero = _parameter(zero_point, shape, axis, block)
            shifted = relax.op.subtract(shifted, relax.op.astype(zero, "float32"))
        scale_wide = relax.op.astype(_parameter(scale, shape, axis, block), "float32")
        product = relax.op.multiply(shifted, scale_wide)
        out = onnx_dtype(attr["output_dtype"]) if attr.get("output_dtype") else dtype_of(scale)
        return relax.op.astype(product, out)


@register_converter("DynamicQuantizeLinear")
class DynamicQuantizeLinear(onnx_frontend.OnnxOpConverter):
    """uint8 quantization over the range of x and 0; an all-zero x gets scale 1/255 (TVM's divides by 0)."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        x = inputs[0]
        dtype = dtype_of(x)
        zero = relax.const(0.0, dtype)
        high = relax.op.maximum(relax.op.max(x), zero)
        low = relax.op.minimum(relax.op.min(x), zero)
        span = relax.op.subtract(high, low)
        span = relax.op.where(relax.op.equal(span, zero), relax.const(1.0, dtype), span)
        scale = bb.normalize(relax.op.divide(span, relax.const(255.0, dtype)))
        shift = round_half_even(bb, relax.op.clip(relax.op.negative(relax.op.divide(low, scale)), 0, 255))
        quantized = relax.op.add(round_half_even(bb, relax.op.divide(x, scale)), shift)
        return relax.Tuple([_saturate(bb, quantized, "uint8"), scale, relax.op.astype(shift, "uint8")])


def _centered(value: relax.Expr, zero_point: relax.Expr | None, shape: tuple[int, ...],
              axis: int) -> relax.Expr:
    """value - zero_point in int32."""
    wide = relax.op.astype(value, "int32")
    if zero_point is None:
        return wide
    return relax.op.subtract(wide, relax.op.astype(_parameter(zero_point, shape, axis), "int32"))


def _requantize(bb, accumulated: relax.Expr, multiplier: relax.Expr, zero_point: relax.Expr | None,
                dtype: str) -> relax.Expr:
    """saturate(round(accumulated * multiplier) + zero_point), in float64."""
    value = relax.op.multiply(relax.op.astype(accumulated, "float64"), relax.op.astype(multiplier, "float64"))
    if zero_point is not None:
        value = relax.op.add(value, relax.op.astype(relax.op.reshape(zero_point, []), "float64"))
    return _saturate(bb, value, dtype)


@register_converter("QLinearMatMul")
class QLinearMatMul(onnx_frontend.OnnxOpConverter):
    """Scales and zero points per tensor, per row of a or per column of b."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = inputs[:8]
        a_shape, b_shape = static_shape(a), static_shape(b)
        if len(a_shape) < 2 or len(b_shape) < 2:
            raise refuse("QLinearMatMul of a 1-D input", "tvmsched converts matrices and batches of them")
        row, column = len(a_shape) - 2, len(b_shape) - 1
        product = relax.op.matmul(_centered(a, a_zero, a_shape, row), _centered(b, b_zero, b_shape, column),
                                  out_dtype="int32")
        scales = relax.op.multiply(_parameter(a_scale, a_shape, row), _parameter(b_scale, b_shape, column))
        multiplier = relax.op.divide(scales, relax.op.reshape(y_scale, []))
        dtype = _integer_dtype(dtype_of(a) if y_zero is None else dtype_of(y_zero), "QLinearMatMul to")
        return _requantize(bb, product, multiplier, y_zero, dtype)


def _integer_conv(bb, x: relax.Expr, x_zero: relax.Expr | None, w: relax.Expr, w_zero: relax.Expr | None,
                  bias: relax.Expr | None, attr: dict, params) -> relax.Expr:
    """The int32 convolution of the centered input and weight (zero points per tensor, the weight's also per
    output channel), by TVM's Conv converter."""
    x_shape, w_shape = static_shape(x), static_shape(w)
    if x_zero is not None and math.prod(static_shape(x_zero)) != 1:
        raise refuse("a per-channel input zero point", "ONNX defines one zero point for the input")
    centered = [_centered(x, x_zero, x_shape, 1), _centered(w, w_zero, w_shape, 0)]
    return onnx_frontend.Conv._impl_v11(bb, [bb.normalize(value) for value in centered] + [bias], dict(attr),
                                         params)


@register_converter("ConvInteger")
class ConvInteger(onnx_frontend.OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, w, x_zero, w_zero = inputs[0], inputs[1], inputs[2], inputs[3]
        return _integer_conv(bb, x, x_zero, w, w_zero, None, attr, params)


@register_converter("QLinearConv")
class QLinearConv(onnx_frontend.OnnxOpConverter):
    """Weight scales and zero points per tensor or per output channel; the bias is int32."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, bias = inputs[:9]
        accumulated = bb.normalize(_integer_conv(bb, x, x_zero, w, w_zero, bias, attr, params))
        out_shape = static_shape(accumulated)
        multiplier = relax.op.divide(relax.op.multiply(relax.op.reshape(x_scale, []),
                                                       _parameter(w_scale, out_shape, 1)),
                                     relax.op.reshape(y_scale, []))
        dtype = _integer_dtype(dtype_of(x) if y_zero is None else dtype_of(y_zero), "QLinearConv to")
        return _requantize(bb, accumulated, multiplier, y_zero, dtype)
