"""Normalization ops where TVM's converters are wrong or missing: LayerNormalization's Mean and InvStdDev
outputs and stash_type, RMSNormalization over every axis, BatchNormalization in training mode,
LpNormalization, MeanVarianceNormalization's epsilon, LRN of half-precision inputs."""

from __future__ import annotations

from onnx import TensorProto
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from tvmsched.converters import register_converter
from tvmsched.converters.common import (
    cast,
    constant,
    dtype_of,
    normalize_axis,
    onnx_dtype,
    refuse,
    requested_outputs,
    static_shape,
)

TRAINING_BEFORE_OPSET_14 = ("tvmsched converts training mode from opset 14 only; export the model in eval "
                            "mode or at opset 14 or later")


def _to_shape(bb: relax.BlockBuilder, expr: relax.Expr, shape: tuple[int, ...]) -> relax.Expr:
    """`expr` broadcast to `shape`: Relax's fused norms take weights of exactly the normalized shape, ONNX
    weights need only broadcast to it."""
    return expr if static_shape(expr) == shape else bb.normalize(relax.op.broadcast_to(expr, shape))


@register_converter("LayerNormalization")
class LayerNormalization(OnnxOpConverter):
    """Y with TVM's fused layer_norm where only Y is asked for and computed in the input's dtype (or float16
    in float32); else by the spec's function: statistics in `stash_type`, Mean and InvStdDev shaped like X
    with the normalized axes kept as 1 (TVM's converter returns placeholders of shape () for them)."""

    @classmethod
    def _impl_v17(cls, bb, inputs, attr, params):
        data, scale, bias = inputs[0], inputs[1], inputs[2]
        shape = static_shape(data)
        axis = normalize_axis(attr.get("axis", -1), len(shape))
        axes = list(range(axis, len(shape)))
        epsilon = attr.get("epsilon", 1e-5)
        dtype, stash = dtype_of(data), onnx_dtype(attr.get("stash_type", TensorProto.FLOAT))
        # topi's layer_norm computes float16 in float32, the default stash_type
        if requested_outputs(attr) == 1 and (stash == dtype or (dtype, stash) == ("float16", "float32")):
            bias = constant(0, dtype) if bias is None else bias
            return relax.op.nn.layer_norm(data, _to_shape(bb, scale, shape[axis:]),
                                          _to_shape(bb, bias, shape[axis:]), axes, epsilon)
        data = cast(bb, data, stash)
        mean = bb.emit(relax.op.mean(data, axes, keepdims=True))
        centered = bb.emit(relax.op.subtract(data, mean))
        variance = relax.op.mean(relax.op.multiply(centered, centered), axes, keepdims=True)
        inverse_std = bb.emit(relax.op.divide(constant(1, stash), relax.op.sqrt(
            relax.op.add(variance, constant(epsilon, stash)))))
        output = relax.op.multiply(cast(bb, relax.op.multiply(centered, inverse_std), dtype), scale)
        if bias is not None:
            output = relax.op.add(output, bias)
        return relax.Tuple([output, mean, inverse_std])


@register_converter("RMSNormalization")
class RMSNormalization(OnnxOpConverter):
    """TVM's fused rms_norm, computed in `stash_type`; a normalization over every axis is done on the input
    with a leading axis of 1 added, since topi's rms_norm fails to build when it reduces every axis."""

    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        data, scale = inputs[0], inputs[1]
        shape = static_shape(data)
        axis = normalize_axis(attr.get("axis", -1), len(shape))
        dtype, stash = dtype_of(data), onnx_dtype(attr.get("stash_type", TensorProto.FLOAT))
        scale = cast(bb, _to_shape(bb, scale, shape[axis:]), stash)
        lead = 1 if axis == 0 else 0
        data = relax.op.reshape(data, (1, *shape)) if lead else data
        axes = list(range(axis + lead, len(shape) + lead))
        output = relax.op.nn.rms_norm(cast(bb, data, stash), scale, axes, attr.get("epsilon", 1e-5))
        output = cast(bb, output, dtype)
        return relax.op.reshape(output, shape) if lead else output


@register_converter("BatchNormalization")
class BatchNormalization(onnx_frontend.BatchNormalization):
    """Inference mode by TVM's converter. Training mode (opset 14+ `training_mode=1`) normalizes by the
    batch's statistics and outputs the running mean and variance updated by `momentum`; TVM's converter
    normalizes by the running statistics there. Training mode before opset 14 (a node asking for more than Y,
    or `is_test=0` before opset 7) and `spatial=0` are refused."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if not attr.get("is_test", 0):
            raise refuse("is_test=0 (training mode)", TRAINING_BEFORE_OPSET_14)
        return cls._impl_v7(bb, inputs, attr, params)

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        if attr.get("spatial", 1) != 1:
            raise refuse("spatial=0 (statistics per activation, not per channel)",
                         "export the model at opset 9 or later")
        if requested_outputs(attr) > 1:
            raise refuse("running statistics (training mode)", TRAINING_BEFORE_OPSET_14)
        return super()._impl_v15(bb, inputs, attr, params)

    @classmethod
    def _impl_v14(cls, bb, inputs, attr, params):
        if not attr.get("training_mode", 0):
            return super()._impl_v15(bb, inputs, attr, params)
        data, scale, bias, running_mean, running_var = inputs[:5]
        shape, dtype = static_shape(data), dtype_of(data)
        compute = "float32" if dtype in ("float16", "bfloat16") else dtype
        axes = [0, *range(2, len(shape))]
        data = cast(bb, data, compute)
        mean = bb.emit(relax.op.mean(data, axes, keepdims=True))
        centered = bb.emit(relax.op.subtract(data, mean))
        variance = bb.emit(relax.op.mean(relax.op.multiply(centered, centered), axes, keepdims=True))
        channel = (-1, *[1] * (len(shape) - 2))
        output = relax.op.divide(centered, relax.op.sqrt(relax.op.add(
            variance, constant(attr.get("epsilon", 1e-5), compute))))
        output = relax.op.add(relax.op.multiply(output, relax.op.reshape(cast(bb, scale, compute), channel)),
                              relax.op.reshape(cast(bb, bias, compute), channel))
        momentum = attr.get("momentum", 0.9)

        def updated(running: relax.Expr, batch: relax.Expr) -> relax.Expr:
            return cast(bb, relax.op.add(
                relax.op.multiply(cast(bb, running, compute), constant(momentum, compute)),
                relax.op.multiply(relax.op.reshape(batch, (shape[1],)), constant(1 - momentum, compute))),
                dtype_of(running))

        return relax.Tuple([cast(bb, output, dtype), updated(running_mean, mean),
                            updated(running_var, variance)])

    _impl_v15 = _impl_v14


@register_converter("LpNormalization")
class LpNormalization(OnnxOpConverter):
    """x / ||x||_p along `axis` (p 1 or 2), 0 where the norm is 0; TVM has no converter."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        data = bb.normalize(inputs[0])
        axis = normalize_axis(attr.get("axis", -1), len(static_shape(data)))
        power = attr.get("p", 2)
        if power == 1:
            norm = relax.op.sum(relax.op.abs(data), [axis], keepdims=True)
        elif power == 2:
            norm = relax.op.sqrt(relax.op.sum(relax.op.multiply(data, data), [axis], keepdims=True))
        else:
            raise refuse(f"p={power}", "the spec defines LpNormalization for p 1 and 2 only")
        norm = bb.emit(norm)
        zero = constant(0, dtype_of(data))
        return relax.op.where(relax.op.equal(norm, zero), zero, relax.op.divide(data, norm))


@register_converter("MeanVarianceNormalization")
class MeanVarianceNormalization(OnnxOpConverter):
    """(X - mean) / (std + 1e-9) over `axes`, as the spec's function body; TVM's converter omits the
    epsilon (NaN where X is constant along the axes) and takes float32 inputs only."""

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        data = inputs[0]
        dtype, rank = dtype_of(data), len(static_shape(data))
        axes = [normalize_axis(axis, rank, "axes") for axis in attr.get("axes", (0, 2, 3))]
        centered = bb.emit(relax.op.subtract(data, relax.op.mean(data, axes, keepdims=True)))
        std = relax.op.sqrt(relax.op.mean(relax.op.multiply(centered, centered), axes, keepdims=True))
        return relax.op.divide(centered, relax.op.add(std, constant(1e-9, dtype)))


@register_converter("LRN")
class LRN(onnx_frontend.LocalResponseNormalization):
    """TVM's converter, whose constants are float32 (a float16 input was refused): half-precision inputs are
    computed in float32."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        dtype = dtype_of(inputs[0])
        if dtype not in ("float16", "bfloat16"):
            return super()._impl_v13(bb, inputs, attr, params)
        return cast(bb, super()._impl_v13(bb, [cast(bb, inputs[0], "float32")], attr, params), dtype)
