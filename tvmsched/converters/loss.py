"""The loss ops, which TVM's importer lacks: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (the
negative log-likelihood of a log_softmax over the class axis 1)."""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from tvmsched.converters import register_converter
from tvmsched.converters.common import constant, dtype_of, refuse, static_shape, text_attribute


def negative_log_likelihood(bb: relax.BlockBuilder, log_prob: relax.Expr, target: relax.Expr,
                            weight: relax.Expr | None, attr: dict) -> relax.Expr:
    """-log_prob[n, target[n, d...], d...] weighted by weight[target], 0 where target is `ignore_index`,
    reduced as `reduction` says ('mean' divides by the sum of the weights taken)."""
    reduction = text_attribute(attr, "reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise refuse(f"reduction='{reduction}'", "the spec defines 'none', 'sum' and 'mean' only")
    dtype = dtype_of(log_prob)
    ignored = None
    if "ignore_index" in attr:
        ignored = bb.emit(relax.op.equal(target, constant(attr["ignore_index"], dtype_of(target))))
        # An ignored target may lie outside [0, C): read class 0 there, then weigh it 0.
        target = bb.emit(relax.op.where(ignored, constant(0, dtype_of(target)), target))
    picked = relax.op.gather_elements(log_prob, relax.op.expand_dims(target, 1), axis=1)
    loss = relax.op.negative(relax.op.squeeze(picked, [1]))
    weights = None if weight is None else relax.op.take(weight, target, axis=0, mode="clip")
    if ignored is not None:
        kept = constant(1, dtype) if weights is None else weights
        weights = relax.op.where(ignored, constant(0, dtype), kept)
    if weights is not None:
        weights = bb.emit(weights)
        loss = relax.op.multiply(loss, weights)
    if reduction == "none":
        return loss
    total = relax.op.sum(loss)
    if reduction == "sum":
        return total
    # A sum divided by a count rather than Relax's mean, whose kernel dlight fails to schedule for CUDA.
    count = constant(np.prod(static_shape(target)), dtype) if weights is None else relax.op.sum(weights)
    return relax.op.divide(total, count)


@register_converter("NegativeLogLikelihoodLoss")
class NegativeLogLikelihoodLoss(OnnxOpConverter):
    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        return negative_log_likelihood(bb, inputs[0], inputs[1], inputs[2], attr)


@register_converter("SoftmaxCrossEntropyLoss")
class SoftmaxCrossEntropyLoss(OnnxOpConverter):
    """Outputs the loss and, where the node asks for it, the log-probabilities."""

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        log_prob = bb.emit(relax.op.nn.log_softmax(inputs[0], axis=1))
        return relax.Tuple([negative_log_likelihood(bb, log_prob, inputs[1], inputs[2], attr), log_prob])
