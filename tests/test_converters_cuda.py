"""The kernels of tvmsched's converters cross-compile for CUDA: dlight's schedules fail on some shapes of
computation (an argmax reducer over pairs, a reduction over a handful of taps, a 16-bit frem, a width-1
convolution), which the converters avoid. Needs nvcc, not a GPU."""

import shutil

import numpy as np
import pytest
from onnx import helper
from single_node import build_for_cuda, node_model

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to compile CUDA")
RNG = np.random.default_rng(0)
X = RNG.standard_normal((1, 2, 6, 5)).astype("float32")

CASES = {
    "maxpool_indices": (helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 3], strides=[2, 1],
                                         auto_pad="SAME_UPPER", storage_order=1),
                        {"x": RNG.standard_normal((2, 3, 7, 6)).astype("float32")}, 18, {}),
    "resize_cubic": (helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="cubic"),
                     {"x": RNG.standard_normal((1, 1, 4, 4)).astype("float32")}, 19,
                     {"sizes": np.array([1, 1, 9, 10], "int64")}),
    "mod_float16": (helper.make_node("Mod", ["x", "y"], ["z"], fmod=1), {"x": X.astype("float16"),
                                                                          "y": X.astype("float16")}, 13, {}),
    "causal_conv_width_1": (helper.make_node("CausalConvWithState", ["x", "w"], ["y", "state"]),
                            {"x": X[0]}, 27, {"w": np.ones((6, 1, 1), "float32")}),
    "conv_transpose_output_shape": (helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[3, 2],
                                                     output_shape=[10, 8]),
                                    {"x": RNG.standard_normal((1, 1, 3, 3)).astype("float32")}, 18,
                                    {"w": np.ones((1, 2, 3, 3), "float32")}),
    "cumprod": (helper.make_node("CumProd", ["x", "axis"], ["y"], reverse=1), {"x": X}, 26,
                {"axis": np.array(2, "int64")}),
    "lstm": (helper.make_node("LSTM", ["x", "w", "r"], ["y", "h"], hidden_size=3), {"x": X[0]}, 14,
             {"w": np.ones((1, 12, 5), "float32"), "r": np.ones((1, 12, 3), "float32")}),
    "quantize": (helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"]), {"x": X}, 13,
                 {"s": np.array(0.1, "float32"), "z": np.array(3, "int8")}),
    "deform_conv": (helper.make_node("DeformConv", ["x", "w", "offset"], ["y"]),
                    {"x": X, "offset": RNG.standard_normal((1, 8, 5, 4)).astype("float32")}, 19,
                    {"w": np.ones((3, 2, 2, 2), "float32")}),
    "col2im": (helper.make_node("Col2Im", ["x", "image", "block"], ["y"]),
               {"x": RNG.standard_normal((1, 8, 20)).astype("float32")}, 18,
               {"image": np.array([5, 6], "int64"), "block": np.array([2, 2], "int64")}),
    "mish": (helper.make_node("Mish", ["x"], ["y"]), {"x": X}, 18, {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_converter_kernels_compile_for_cuda(name):
    node, inputs, opset, constants = CASES[name]
    build_for_cuda(node_model(node, inputs, opset, constants))
