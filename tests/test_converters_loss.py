"""tvmsched's loss converters against onnxruntime, on one-node models."""

import shutil

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper
from single_node import build_for_cuda, check_node, node_model

import tvmsched
from tvmsched.errors import UnsupportedOperator

RNG = np.random.default_rng(0)


def scores_and_target(*shape, ignore_index=None):
    """Scores (N, C, d...) and a target (N, d...) of classes in [0, C), with some set to `ignore_index`."""
    target = RNG.integers(0, shape[1], (shape[0], *shape[2:]))
    if ignore_index is not None:
        target.flat[::3] = ignore_index
    return RNG.standard_normal(shape).astype("float32"), target.astype("int64")


@pytest.mark.parametrize("reduction, weighted, ignore_index", [
    ("none", True, -1), ("mean", True, 1), ("mean", False, 7), ("sum", False, None), ("mean", False, None)])
def test_negative_log_likelihood_loss(reduction, weighted, ignore_index):
    """Ignored targets (also outside [0, C)) count 0; 'mean' divides by the weights taken."""
    scores, target = scores_and_target(3, 5, 2, 4, ignore_index=ignore_index)
    attributes = {} if ignore_index is None else {"ignore_index": ignore_index}
    node = helper.make_node("NegativeLogLikelihoodLoss", ["input", "target", "weight"][:3 if weighted else 2],
                            ["loss"], reduction=reduction, **attributes)
    inputs = {"input": scores, "target": target}
    if weighted:
        inputs["weight"] = RNG.uniform(0.5, 2, 5).astype("float32")
    check_node(node, inputs, 22)


@pytest.mark.parametrize("outputs, reduction", [(["loss", "log_prob"], "mean"), (["loss"], "none")])
def test_softmax_cross_entropy_loss(outputs, reduction):
    scores, target = scores_and_target(2, 4, 3, ignore_index=2)
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "target", "weight"], outputs,
                            reduction=reduction, ignore_index=2)
    check_node(node, {"scores": scores, "target": target, "weight": RNG.uniform(0.5, 2, 4).astype("float32")},
               13)


def test_unknown_reduction_is_refused():
    node = helper.make_node("NegativeLogLikelihoodLoss", ["input", "target"], ["loss"], reduction="max")
    model = make_model([node], [tensor("input", [3, 5]), tensor("target", [3], TensorProto.INT64)],
                       [tensor("loss", [])], {}, opset=22)
    with pytest.raises(UnsupportedOperator, match="reduction='max'"):
        tvmsched.compile(model, target="llvm")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to compile CUDA")
def test_unweighted_mean_compiles_for_cuda():
    """Relax's mean of the whole loss failed dlight's schedules for CUDA."""
    scores, target = scores_and_target(3, 5, 2)
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "target"], ["loss"], reduction="mean")
    build_for_cuda(node_model(node, {"scores": scores, "target": target}, 13))
