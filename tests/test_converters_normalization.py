"""tvmsched's normalization converters against onnxruntime, on one-node models."""

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import helper
from single_node import check_node

import tvmsched
from tvmsched.errors import UnsupportedOperator

RNG = np.random.default_rng(0)


def normal(*shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("axis, outputs, bias", [(1, ["y"], True), (-2, ["y", "mean", "inv_std"], False),
                                                 (0, ["y", "mean", "inv_std"], True)])
def test_layer_normalization(axis, outputs, bias):
    """Y alone (TVM's fused layer_norm) and with Mean and InvStdDev, shaped like X with the normalized axes
    kept as 1."""
    node = helper.make_node("LayerNormalization", ["x", "w", "b"][:3 if bias else 2], outputs, axis=axis,
                            epsilon=1e-3)
    x = normal(2, 3, 5) * 3 + 1
    normalized = x.shape[axis:]
    weights = {"w": normal(*normalized), **({"b": normal(*normalized)} if bias else {})}
    actual = check_node(node, {"x": x}, 17, weights)
    if len(outputs) == 3:
        assert actual[1].shape == x.shape[:axis % 3] + (1,) * len(normalized)


@pytest.mark.parametrize("outputs", [["y"], ["y", "mean"]])
def test_layer_normalization_float16_stashes_float32(outputs):
    node = helper.make_node("LayerNormalization", ["x", "w", "b"], outputs, axis=-1)
    check_node(node, {"x": normal(2, 4, 8, dtype="float16"), "w": normal(8, dtype="float16"),
                      "b": normal(8, dtype="float16")}, 17, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("axis", [0, -1])
def test_rms_normalization(axis):
    """Over every axis too (where topi's rms_norm fails to build)."""
    node = helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=axis, epsilon=1e-2)
    x = normal(2, 3, 4)
    check_node(node, {"x": x, "w": normal(*x.shape[axis:])}, 23)


def test_batch_normalization_training_mode_outputs_running_statistics():
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                            ["y", "running_mean", "running_var"], training_mode=1, momentum=0.7)
    inputs = {"x": normal(2, 3, 4, 5) * 2 + 1, "scale": normal(3), "bias": normal(3), "mean": normal(3),
              "var": np.abs(normal(3))}
    check_node(node, inputs, 15)


def test_batch_normalization_inference_mode():
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"])
    check_node(node, {"x": normal(2, 3, 4), "scale": normal(3), "bias": normal(3), "mean": normal(3),
                      "var": np.abs(normal(3))}, 15)


def test_batch_normalization_training_before_opset_14_is_refused():
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                            ["y", "running_mean", "running_var", "saved_mean", "saved_var"], name="bn")
    weights = {"scale": normal(3), "bias": normal(3), "mean": normal(3), "var": np.abs(normal(3))}
    outputs = [tensor("y", [2, 3, 4]), *(tensor(name, [3]) for name in node.output[1:])]
    model = make_model([node], [tensor("x", [2, 3, 4])], outputs, weights, opset=9)
    with pytest.raises(UnsupportedOperator, match=r"node 'bn' \(BatchNormalization\) \(opset 9\): running "
                                                  r"statistics \(training mode\) is not supported"):
        tvmsched.compile(model, target="llvm")


@pytest.mark.parametrize("p, axis", [(1, 0), (2, -1)])
def test_lp_normalization(p, axis):
    """A zero norm gives 0."""
    x = normal(3, 4)
    x[:, 1] = 0
    x[2] = 0
    check_node(helper.make_node("LpNormalization", ["x"], ["y"], p=p, axis=axis), {"x": x}, 22)


def test_lp_normalization_other_p_is_refused():
    with pytest.raises(UnsupportedOperator, match="p=3"):
        check_node(helper.make_node("LpNormalization", ["x"], ["y"], p=3), {"x": normal(3, 4)}, 22)


def test_mean_variance_normalization_of_a_constant_channel_is_zero():
    """As the spec's function body (std + 1e-9) computes it; onnxruntime gives NaN there."""
    x = normal(2, 3, 4, 4)
    x[:, 1] = 5.0
    check_node(helper.make_node("MeanVarianceNormalization", ["x"], ["y"]), {"x": x}, 9, reference="onnx")
    check_node(helper.make_node("MeanVarianceNormalization", ["x"], ["y"], axes=[1]), {"x": x}, 9)


def test_lrn_of_float16():
    x = normal(2, 4, 5, 5, dtype="float16")
    check_node(helper.make_node("LRN", ["x"], ["y"], size=3, alpha=0.5, beta=0.6, bias=2.0), {"x": x}, 13,
               rtol=2e-3, atol=1e-3)
