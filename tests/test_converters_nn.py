"""tvmsched.converters.nn: one-node models against onnxruntime / onnx's reference."""

import numpy as np
import pytest
from onnx import helper
from single_node import check_node, node_model

import tvmsched
from tvmsched.errors import UnsupportedOperator

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("attributes", [
    {"strides": [3, 2], "output_shape": [10, 8]},
    {"strides": [2, 2], "output_shape": [9, 10], "pads": [5, 5, 5, 5]},
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"strides": [2, 1], "auto_pad": "SAME_LOWER"},
    {"strides": [2, 1], "pads": [1, 0, 0, 1], "output_padding": [1, 0], "dilations": [1, 2]}])
def test_conv_transpose_padding(attributes):
    x = RNG.standard_normal((1, 3, 4, 5)).astype("float32")
    kernel = attributes.get("kernel_shape", [3, 3])
    weight = RNG.standard_normal((3, 2, *kernel)).astype("float32")
    bias = RNG.standard_normal(2).astype("float32")
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attributes)
    check_node(node, {"x": x}, constants={"w": weight, "b": bias}, rtol=1e-4, atol=1e-5)


def test_conv_transpose_output_shape_grown_past_the_stride_is_refused():
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", strides=[2, 2],
                            output_shape=[9, 9])
    model = node_model(node, {"x": np.zeros((1, 1, 3, 3), "float32")}, 18,
                       {"w": np.ones((1, 1, 2, 2), "float32")})
    with pytest.raises(UnsupportedOperator, match=r"node 'up' \(ConvTranspose\) \(opset 18\): output_shape "
                                                  r"\[9, 9\] is not supported"):
        tvmsched.compile(model, target="llvm")


def test_conv_transpose_same_padding_with_a_wide_stride_is_refused():
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", strides=[3, 3],
                            auto_pad="SAME_LOWER")
    model = node_model(node, {"x": np.zeros((1, 1, 2, 2), "float32")}, 18,
                       {"w": np.ones((1, 1, 1, 1), "float32")})
    with pytest.raises(UnsupportedOperator, match=r"node 'up' \(ConvTranspose\) \(opset 18\): auto_pad "
                                                  r"SAME_LOWER with strides \[3, 3\] wider than the kernel"):
        tvmsched.compile(model, target="llvm")


def test_dropout_mask_before_opset_12_is_refused():
    node = helper.make_node("Dropout", ["x"], ["y", "mask"])
    model = node_model(node, {"x": np.zeros((2,), "float32")}, 10)
    with pytest.raises(UnsupportedOperator, match="the mask output before opset 12"):
        tvmsched.compile(model, target="llvm")


@pytest.mark.parametrize("opset, outputs", [(7, ["y"]), (13, ["y", "mask"]), (13, ["y"])])
def test_dropout_is_identity_with_a_true_mask(opset, outputs):
    x = RNG.standard_normal((2, 3)).astype("float32")
    if opset < 12:
        check_node(helper.make_node("Dropout", ["x"], outputs, ratio=0.3), {"x": x}, opset=opset)
    else:
        check_node(helper.make_node("Dropout", ["x", "ratio"], outputs), {"x": x}, opset=opset,
                   constants={"ratio": np.array(0.3, "float32")})


def test_dropout_in_training_mode():
    x = RNG.standard_normal((2, 3)).astype("float32")
    node = helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"], name="drop")
    check_node(node, {"x": x}, constants={"ratio": np.array(0.0, "float32"), "training": np.array(True)})
    model = node_model(node, {"x": x}, 18, {"ratio": np.array(0.5, "float32"), "training": np.array(True)})
    with pytest.raises(UnsupportedOperator, match=r"node 'drop' \(Dropout\).*dropout is random"):
        tvmsched.compile(model, target="llvm")


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_modes(mode):
    x = RNG.standard_normal((1, 2, 4, 6)).astype("float32")
    check_node(helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2, mode=mode), {"x": x}, opset=28)


@pytest.mark.parametrize("attributes", [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 3], "strides": [2, 1], "auto_pad": "SAME_UPPER", "storage_order": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 2], "ceil_mode": 1}])
def test_max_pool_indices(attributes):
    x = RNG.standard_normal((2, 3, 7, 6)).astype("float32")
    x[0, 0, :2, :2] = 1.0  # ties: the first maximum in scan order wins
    check_node(helper.make_node("MaxPool", ["x"], ["y", "indices"], **attributes), {"x": x})


def test_max_pool_indices_one_dimensional():
    x = RNG.standard_normal((1, 2, 9)).astype("float32")
    check_node(helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[3], strides=[2]), {"x": x})


def test_roi_align_max_mode_is_refused():
    node = helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], mode="max", name="roi")
    model = node_model(node, {"x": np.zeros((1, 1, 4, 4), "float32"), "rois": np.zeros((1, 4), "float32"),
                              "batch": np.zeros((1,), "int64")}, 16)
    with pytest.raises(UnsupportedOperator, match=r"node 'roi' \(RoiAlign\) \(opset 16\): mode 'max'"):
        tvmsched.compile(model, target="llvm")


@pytest.mark.parametrize("kernel, past, activation, dtype", [(3, True, "silu", "float32"),
                                                             (4, False, "none", "float16"),
                                                             (1, False, "swish", "float32")])
def test_causal_conv_with_state(kernel, past, activation, dtype):
    x = RNG.standard_normal((2, 3, 5)).astype(dtype)
    constants = {"w": RNG.standard_normal((3, 1, kernel)).astype(dtype),
                 "b": RNG.standard_normal(3).astype(dtype)}
    inputs = {"x": x, **({"past": RNG.standard_normal((2, 3, kernel - 1)).astype(dtype)} if past else {})}
    node = helper.make_node("CausalConvWithState", ["x", "w", "b", "past" if past else ""], ["y", "state"],
                            activation=activation)
    tolerance = 2e-3 if dtype == "float16" else 1e-5
    check_node(node, inputs, opset=27, constants=constants, reference="reference", rtol=tolerance,
               atol=tolerance)


@pytest.mark.parametrize("attributes", [{}, {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}])
def test_col2im(attributes):
    image, block = np.array([6, 5], "int64"), np.array([2, 3], "int64")
    strides, dilations = attributes.get("strides", [1, 1]), attributes.get("dilations", [1, 1])
    pads = attributes.get("pads", [0, 0, 0, 0])
    count = [(image[axis] + pads[axis] + pads[2 + axis] - dilations[axis] * (block[axis] - 1) - 1)
             // strides[axis] + 1 for axis in range(2)]
    x = RNG.standard_normal((2, 2 * 6, int(np.prod(count)))).astype("float32")
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], **attributes)
    check_node(node, {"x": x}, constants={"image": image, "block": block})


@pytest.mark.parametrize("attributes, masked", [
    ({}, False),
    ({"group": 2, "offset_group": 2, "pads": [1, 0, 1, 1], "strides": [2, 1], "dilations": [1, 2]}, True)])
def test_deform_conv(attributes, masked):
    x = RNG.standard_normal((2, 4, 7, 6)).astype("float32")
    groups, offset_groups = attributes.get("group", 1), attributes.get("offset_group", 1)
    strides, dilations = attributes.get("strides", [1, 1]), attributes.get("dilations", [1, 1])
    pads = attributes.get("pads", [0, 0, 0, 0])
    out = [(size + pads[axis] + pads[axis + 2] - dilations[axis] * 2 - 1) // strides[axis] + 1
           for axis, size in enumerate((7, 6))]
    inputs = {"x": x, "offset": 1.5 * RNG.standard_normal((2, offset_groups * 18, *out)).astype("float32")}
    if masked:
        inputs["mask"] = RNG.uniform(0, 1, (2, offset_groups * 9, *out)).astype("float32")
    constants = {"w": RNG.standard_normal((6, 4 // groups, 3, 3)).astype("float32"),
                 "b": RNG.standard_normal(6).astype("float32")}
    node = helper.make_node("DeformConv", ["x", "w", "offset", "b", "mask" if masked else ""], ["y"],
                            kernel_shape=[3, 3], **attributes)
    check_node(node, inputs, opset=19, constants=constants, rtol=1e-4, atol=1e-4)
