"""Elementwise ops where TVM's converter is wrong (BitShift out of range, IsInf's detect flags, Mod of floats
with fmod=0, Mish's precision, Pow of mixed or integer dtypes, Round on CUDA, activations of float16),
missing (Swish, Celu, BitCast, EyeLike), or out of reach of TVM's mixed-precision pass (Clip, HardSigmoid,
HardSwish: TE calls or clip bounds the pass cannot carry float16 through)."""

from __future__ import annotations

import numpy as np
from tvm import relax, te, tirx, topi
from tvm.relax.frontend.onnx import onnx_frontend
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter
from tvm.runtime import DataType, DataTypeCode

from tvmsched.converters import register_converter
from tvmsched.converters.common import dtype_of, onnx_dtype, refuse, static_shape, text_attribute
from tvmsched.frontend import COMPUTED_DTYPES


def _const(value, like: relax.Expr) -> relax.Expr:
    return relax.const(value, dtype_of(like))


def _is_float(dtype: str) -> bool:
    return DataType(dtype).type_code in (DataTypeCode.FLOAT, DataTypeCode.BFLOAT)


@register_converter("BitShift")
class BitShift(OnnxOpConverter):
    """A shift amount outside [0, bits) gives 0, or -1 for a right shift of a negative value (opset 28 defines
    what C leaves undefined; the hardware would mask the amount)."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        x, amount = inputs
        left = text_attribute(attr, "direction", "") == "LEFT"
        bits = DataType(dtype_of(x)).bits
        in_range = relax.op.logical_and(relax.op.greater_equal(amount, _const(0, amount)),
                                        relax.op.less(amount, _const(bits, amount)))
        shift = relax.op.left_shift if left else relax.op.right_shift
        shifted = shift(x, relax.op.where(in_range, amount, _const(0, amount)))
        zero = _const(0, x)
        if left or DataType(dtype_of(x)).type_code == DataTypeCode.UINT:
            return relax.op.where(in_range, shifted, zero)
        fill = relax.op.where(relax.op.less(x, zero), _const(-1, x), zero)
        return relax.op.where(in_range, shifted, fill)


@register_converter("Clip")
class Clip(OnnxOpConverter):
    """Clip as Relax `maximum` and `minimum`: TVM's converter emits them as TE calls, which TVM's mixed
    precision pass cannot carry float16 through (--precision fp16 failed on any model with a ReLU6). A NaN
    bound is no bound, as in ONNX and onnxruntime."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        bounds = [attr.get(name) for name in ("min", "max")]
        return cls._clip(bb, x, *(None if bound is None else _const(float(bound), x) for bound in bounds))

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        return cls._clip(bb, inputs[0], *(list(inputs[1:3]) + [None, None])[:2])

    @classmethod
    def _clip(cls, bb, x, low, high):
        result = x
        for bound, limit, unbounded in ((low, relax.op.maximum, -np.inf), (high, relax.op.minimum, np.inf)):
            if bound is None:
                continue
            if _is_float(dtype_of(bound)):
                bound = bb.emit(relax.op.where(relax.op.isnan(bound), _const(unbounded, bound), bound))
            result = bb.emit(limit(result, bound))
        return result


def _clamp(bb, x: relax.Expr, low: float, high: float) -> relax.Expr:
    """x bounded to [low, high] by Relax maximum and minimum (see Clip)."""
    return bb.emit(relax.op.minimum(bb.emit(relax.op.maximum(x, _const(low, x))), _const(high, x)))


@register_converter("HardSigmoid")
class HardSigmoid(OnnxOpConverter):
    """max(0, min(1, alpha x + beta)), as TVM's converter computes it, bounded as Clip is."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        scaled = bb.emit(relax.op.add(relax.op.multiply(_const(float(attr.get("alpha", 0.2)), x), x),
                                      _const(float(attr.get("beta", 0.5)), x)))
        return _clamp(bb, scaled, 0, 1)


@register_converter("HardSwish")
class HardSwish(OnnxOpConverter):
    """x * min(max(x + 3, 0), 6) / 6, as TVM's converter computes it, bounded as Clip is."""

    @classmethod
    def _impl_v14(cls, bb, inputs, attr, params):
        x = inputs[0]
        gate = _clamp(bb, bb.emit(relax.op.add(x, _const(3, x))), 0, 6)
        return relax.op.multiply(x, relax.op.divide(gate, _const(6, x)))


@register_converter("IsInf")
class IsInf(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x = inputs[0]
        negative, positive = attr.get("detect_negative", 1), attr.get("detect_positive", 1)
        infinite = relax.op.isinf(x)
        if negative and positive:
            return infinite
        if not (negative or positive):
            return relax.op.zeros(x.ty.shape, "bool")
        side = relax.op.less if negative else relax.op.greater
        return relax.op.logical_and(infinite, side(x, _const(0, x)))


@register_converter("Mod")
class Mod(OnnxOpConverter):
    """fmod=0 on floats is Python's modulo: TVM's floor_mod computes x - floor(x / y) * y, which is NaN for an
    infinite divisor (3 mod inf is 3) and loses precision; here it is derived from the exact truncated
    modulo (LLVM's frem, fmod)."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, y = inputs
        dtype = dtype_of(x)
        if not _is_float(dtype):
            return (relax.op.mod if attr.get("fmod", 0) else relax.op.floor_mod)(x, y)
        if DataType(dtype).bits < 32:  # CUDA has no 16-bit frem; NumPy computes float16 in float32 too
            wide = [relax.op.astype(value, "float32") for value in (x, y)]
            return relax.op.astype(cls._impl_v10(bb, [bb.normalize(value) for value in wide], attr, params),
                                   dtype)
        remainder = bb.emit(relax.op.mod(x, y))
        if attr.get("fmod", 0):
            return remainder
        zero = _const(0.0, x)
        # Python's result takes the divisor's sign: a non-zero remainder of the other sign moves by y, a zero
        # one is a zero of y's sign.
        other_sign = relax.op.logical_xor(relax.op.less(remainder, zero), relax.op.less(y, zero))
        moved = relax.op.where(relax.op.logical_and(relax.op.not_equal(remainder, zero), other_sign),
                               relax.op.add(remainder, y), remainder)
        signed_zero = relax.op.where(relax.op.less(y, zero), _const(-0.0, x), zero)
        return relax.op.where(relax.op.equal(remainder, zero), signed_zero, moved)


class _FloatMap(OnnxOpConverter):
    """An elementwise function of one float tensor, written in TE and evaluated in float32 for narrower floats
    (TVM's converters build float32 constants that float16 inputs reject, or lose precision)."""

    @classmethod
    def function(cls, value, dtype: str, attr: dict):
        raise NotImplementedError

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        dtype = dtype_of(inputs[0])
        wide = "float32" if DataType(dtype).bits < 32 else dtype

        def compute(data):
            return te.compute(data.shape, lambda *index: cls.function(
                data(*index).astype(wide), wide, attr).astype(dtype), name=cls.__name__.lower())
        return bb.emit_te(compute, inputs[0])


def _softplus(value, dtype: str):
    """max(x, 0) + log1p(exp(-|x|)): log(1 + exp(-|x|)) loses the small term (relative error 1e-3 at -10)."""
    return tirx.max(value, tirx.const(0, dtype)) + tirx.log1p(tirx.exp(-tirx.abs(value)))


def _exp_linear(value, dtype: str, alpha: float):
    """x for x > 0, else alpha * (exp(x) - 1)."""
    return tirx.Select(value > tirx.const(0, dtype), value,
                       tirx.const(alpha, dtype) * (tirx.exp(value) - tirx.const(1, dtype)))


@register_converter("Softplus")
class Softplus(_FloatMap):
    @classmethod
    def function(cls, value, dtype, attr):
        return _softplus(value, dtype)


@register_converter("Mish")
class Mish(_FloatMap):
    """x * tanh(softplus(x)), with tanh(s) = s - s**3 / 3 for |s| < 4e-3: TVM's LLVM tanh is a rational
    approximation whose relative error there reaches 1e-3 (1e-2 at 1e-6), which Mish of x < -9 shows."""

    @classmethod
    def function(cls, value, dtype, attr):
        softplus = _softplus(value, dtype)
        small = tirx.abs(softplus) < tirx.const(4e-3, dtype)
        series = softplus - softplus * softplus * softplus / tirx.const(3, dtype)
        return value * tirx.Select(small, series, tirx.tanh(softplus))


@register_converter("Elu")
class Elu(_FloatMap):
    @classmethod
    def function(cls, value, dtype, attr):
        return _exp_linear(value, dtype, float(attr.get("alpha", 1.0)))


@register_converter("Selu")
class Selu(_FloatMap):
    @classmethod
    def function(cls, value, dtype, attr):
        alpha = float(attr.get("alpha", 1.67326319217681884765625))
        gamma = float(attr.get("gamma", 1.05070102214813232421875))
        return tirx.const(gamma, dtype) * _exp_linear(value, dtype, alpha)


@register_converter("Celu")
class Celu(_FloatMap):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)), which is alpha * elu(x / alpha)."""

    @classmethod
    def function(cls, value, dtype, attr):
        alpha = tirx.const(float(attr.get("alpha", 1.0)), dtype)
        return tirx.Select(value > tirx.const(0, dtype), value,
                           alpha * (tirx.exp(value / alpha) - tirx.const(1, dtype)))


@register_converter("ThresholdedRelu")
class ThresholdedRelu(_FloatMap):
    @classmethod
    def function(cls, value, dtype, attr):
        alpha = tirx.const(float(attr.get("alpha", 1.0)), dtype)
        return tirx.Select(value > alpha, value, tirx.const(0, dtype))


@register_converter("Swish")
class Swish(_FloatMap):
    """x * sigmoid(alpha * x)."""

    @classmethod
    def function(cls, value, dtype, attr):
        return value * tirx.sigmoid(tirx.const(float(attr.get("alpha", 1.0)), dtype) * value)


def round_half_even(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
    """x rounded half to even by `nearbyint`: TVM's `round` is CUDA's roundf there, half away from zero."""
    def compute(data):
        return te.compute(data.shape, lambda *index: tirx.nearbyint(data(*index)), name="round_half_even")
    return bb.emit_te(compute, bb.emit(x))


@register_converter("Round")
class Round(OnnxOpConverter):
    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        return round_half_even(bb, inputs[0])


@register_converter("Pow")
class Pow(OnnxOpConverter):
    """The result has the base's dtype (ONNX lets the exponent's differ). A float base takes the exponent in
    its own dtype; an integer base is raised in float64 (exact to 2**53) and cast back, as NumPy promotes."""

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        base, exponent = inputs
        dtype = dtype_of(base)
        if _is_float(dtype):
            return relax.op.power(base, relax.op.astype(exponent, dtype))
        wide = relax.op.power(relax.op.astype(base, "float64"), relax.op.astype(exponent, "float64"))
        return relax.op.astype(wide, dtype)


@register_converter("BitCast")
class BitCast(OnnxOpConverter):
    @classmethod
    def _impl_v26(cls, bb, inputs, attr, params):
        x = inputs[0]
        source, target = dtype_of(x), onnx_dtype(attr["to"])
        if "bool" in (source, target) or DataType(source).bits != DataType(target).bits:
            raise refuse(f"BitCast from {source} to {target}",
                         "tvmsched reinterprets between numeric dtypes of one bit width only")
        return bb.emit_te(topi.reinterpret, x, target)


@register_converter("EyeLike")
class EyeLike(OnnxOpConverter):
    """A constant: the input gives only the (static) shape."""

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        x = inputs[0]
        shape = static_shape(x)
        if len(shape) != 2:
            raise refuse(f"EyeLike of a rank-{len(shape)} input", "ONNX defines it for 2-D inputs only")
        dtype = onnx_dtype(attr["dtype"]) if "dtype" in attr else dtype_of(x)
        return relax.const(np.eye(*shape, k=int(attr.get("k", 0)), dtype=dtype), dtype)


class _Pairwise:
    """Sum, Mean, Min and Max of several inputs folded pairwise, with broadcasting: one elementwise kernel.
    TVM's converter broadcasts every input to the full shape, stacks them and reduces the new axis, which
    copies each input and is a reduction that dlight's GEMV rule fails on (CUDA)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return cls._impl_dynamic(bb, inputs)


@register_converter("Sum")
class Sum(_Pairwise, onnx_frontend.Sum):
    pass


@register_converter("Mean")
class Mean(_Pairwise, onnx_frontend.Mean):
    pass


@register_converter("Min")
class Min(_Pairwise, onnx_frontend.Min):
    pass


@register_converter("Max")
class Max(_Pairwise, onnx_frontend.Max):
    pass


def _tensor_dtype(expr: relax.Expr) -> str | None:
    """The element type of a tensor; None for a shape or a prim value (TVM keeps shape arithmetic so)."""
    return dtype_of(expr) if isinstance(getattr(expr, "ty", None), relax.TensorType) else None


class _CastChecked:
    """Refuses a Cast whose source or target element type TVM cannot compute with."""

    @classmethod
    def check(cls, source: relax.Expr, target: str) -> None:
        for dtype in (_tensor_dtype(source), target):
            if dtype is not None and dtype not in COMPUTED_DTYPES:
                raise refuse(f"a cast from {_tensor_dtype(source) or 'a shape'} to {target}",
                             f"TVM cannot compute with {dtype} (tvmsched computes with "
                             f"{', '.join(sorted(COMPUTED_DTYPES))})")


@register_converter("Cast")
class Cast(_CastChecked, onnx_frontend.Cast):
    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        cls.check(inputs[0], onnx_dtype(attr["to"]))
        return super()._impl_v13(bb, inputs, attr, params)


@register_converter("CastLike")
class CastLike(_CastChecked, onnx_frontend.CastLike):
    @classmethod
    def _impl_v15(cls, bb, inputs, attr, params):
        cls.check(inputs[0], _tensor_dtype(inputs[1]) or "int64")
        return super()._impl_v15(bb, inputs, attr, params)
