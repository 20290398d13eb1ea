"""Ops tvmsched refuses, each with its reason: tvmsched compiles a model into a fixed set of tensor kernels
over static shapes, so sequences, optionals, loops, strings, random draws and outputs whose shape depends on
the input values have no equivalent. (TVM's importer converts some of them into programs tvmsched cannot
run, or crashes on them.)"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from tvmsched.converters import register_converter
from tvmsched.converters.common import constant_value, take
from tvmsched.errors import UnsupportedOperator

_STATIC = "tvmsched compiles tensor programs with static shapes"


class _Refused(onnx_frontend.OnnxOpConverter):
    reason = ""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        raise UnsupportedOperator(f"{cls.reason}; replace it in the exporter")


def _refuse(reason: str, *op_types: str) -> None:
    for op_type in op_types:
        register_converter(op_type)(type(op_type, (_Refused,), {"reason": reason}))


_refuse(f"it works on sequences of tensors, and {_STATIC} (tensors in, tensors out)", "SequenceAt",
        "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert", "SequenceLength",
        "SequenceMap", "SplitToSequence", "ConcatFromSequence")
_refuse(f"it makes an optional value, and {_STATIC} (tensors in, tensors out)", "Optional")
_refuse(f"its body runs a number of times known at run time, and {_STATIC}", "Loop", "Scan")
_refuse(f"it processes text, and {_STATIC} of numbers", "StringConcat", "StringSplit", "StringNormalizer",
        "RegexFullMatch")
_refuse("it counts the n-grams of token sequences, which tvmsched does not convert", "TfIdfVectorizer")
_refuse(f"it decodes encoded image bytes, and {_STATIC} of numbers", "ImageDecoder")
_refuse("it draws random numbers, and tvmsched compiles deterministic inference programs", "RandomNormal",
        "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial")


@register_converter("NonZero")
class NonZero(onnx_frontend.OnnxOpConverter):
    """A constant where its input is one; else TVM's, whose output shape the import then refuses
    (`static_shapes`: it depends on the data)."""

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        value = constant_value(inputs[0])
        if value is None:
            return onnx_frontend.NonZero._impl_v9(bb, inputs, attr, params)
        return relax.const(np.array(np.nonzero(value), "int64"), "int64")


@register_converter("Compress")
class Compress(onnx_frontend.OnnxOpConverter):
    """A gather of the selected indices where the condition is a constant; else TVM's, whose output shape
    the import then refuses (`static_shapes`: it depends on the data)."""

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        data, condition = inputs[0], constant_value(inputs[1])
        if condition is None:
            return onnx_frontend.Compress._impl_v11(bb, inputs, attr, params)
        if "axis" not in attr:
            data, axis = relax.op.reshape(data, [-1]), 0
        else:
            axis = int(attr["axis"])
        return take(data, np.nonzero(condition)[0], axis)


@register_converter("OptionalGetElement")
class OptionalGetElement(onnx_frontend.OnnxOpConverter):
    """Of a tensor, the tensor itself (an optional value never gets here: Optional and optional inputs are
    refused)."""

    @classmethod
    def _impl_v15(cls, bb, inputs, attr, params):
        return inputs[0]


@register_converter("OptionalHasElement")
class OptionalHasElement(onnx_frontend.OnnxOpConverter):
    """Of a tensor, true; of no input, false."""

    @classmethod
    def _impl_v15(cls, bb, inputs, attr, params):
        return relax.const(inputs[0] is not None, "bool")
