"""Softmax and LogSoftmax with a float16 input's sum accumulated in float32, as numpy (onnx's reference)
and onnxruntime do: topi's float16 softmax sums in float16, and on rows of attention scores it was 1-2 ulp
off onnx's expected outputs. Other dtypes use Relax's softmax as TVM's converters do."""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter, _legacy_softmax_prepare

from tvmsched.converters import register_converter
from tvmsched.converters.common import cast, dtype_of


def _shifted_exponentials(bb: relax.BlockBuilder, data: relax.Expr, axis: int) -> tuple:
    """x - max(x) along `axis`, and the sum of its exponentials accumulated in float32."""
    shifted = bb.emit(relax.op.subtract(data, relax.op.max(data, axis=axis, keepdims=True)))
    exponentials = bb.emit(relax.op.exp(shifted))
    return shifted, exponentials, relax.op.sum(cast(bb, exponentials, "float32"), axis=axis, keepdims=True)


def softmax(bb: relax.BlockBuilder, data: relax.Expr, axis: int) -> relax.Expr:
    data = bb.normalize(data)
    if dtype_of(data) != "float16":
        return relax.op.nn.softmax(data, axis=axis)
    _, exponentials, total = _shifted_exponentials(bb, data, axis)
    return relax.op.divide(exponentials, cast(bb, total, "float16"))


def log_softmax(bb: relax.BlockBuilder, data: relax.Expr, axis: int) -> relax.Expr:
    data = bb.normalize(data)
    if dtype_of(data) != "float16":
        return relax.op.nn.log_softmax(data, axis=axis)
    shifted, _, total = _shifted_exponentials(bb, data, axis)
    return relax.op.subtract(shifted, cast(bb, relax.op.log(total), "float16"))


class _Softmax(OnnxOpConverter):
    """Before opset 13 over the dims from `axis` (default 1) on, flattened; since, along `axis` (default
    -1). Subclasses name the `function`."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        flattened, shape = _legacy_softmax_prepare(inputs[0], attr.get("axis", 1), cls.__name__)
        return relax.op.reshape(cls.function(bb, flattened, -1), shape)

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        return cls.function(bb, inputs[0], attr.get("axis", -1))


@register_converter("Softmax")
class Softmax(_Softmax):
    function = staticmethod(softmax)


@register_converter("LogSoftmax")
class LogSoftmax(_Softmax):
    function = staticmethod(log_softmax)
