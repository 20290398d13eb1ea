"""Window kernels under the GPU's window rule (needs a CUDA device): pools and depthwise convolutions, with
their epilogues, on TVM's kernels, compute what onnxruntime computes, in float32 and in float16 NHWC."""

import numpy as np
import pytest
from conftest import make_model, onnxruntime_outputs, tensor
from onnx import helper
from test_precision import TOLERANCE, relative_error

import tvmsched

pytestmark = pytest.mark.gpu


def windows():
    """A depthwise 7x7 convolution with bias and relu, an average pool that does not count the padding (its
    divisor varies at the edges), a strided max pool, and a depthwise 3x3 convolution with SiLU (its
    output read twice)."""
    rng = np.random.default_rng(12)
    weights = {"w7": rng.standard_normal((16, 1, 7, 7)).astype("float32") / 7,
               "b7": rng.standard_normal(16).astype("float32"),
               "w3": rng.standard_normal((16, 1, 3, 3)).astype("float32") / 3}
    nodes = [helper.make_node("Conv", ["input", "w7", "b7"], ["c7"], group=16, pads=[3, 3, 3, 3]),
             helper.make_node("Relu", ["c7"], ["r"]),
             helper.make_node("AveragePool", ["r"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              count_include_pad=0),
             helper.make_node("MaxPool", ["a"], ["m"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["m", "w3"], ["c3"], group=16, pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c3"], ["s"]), helper.make_node("Mul", ["c3", "s"], ["output"])]
    return make_model(nodes, [tensor("input", [4, 16, 20, 20])], [tensor("output", [4, 16, 10, 10])], weights)


@pytest.mark.parametrize("precision, layout", [("fp32", "nchw"), ("fp16", "nhwc")])
def test_window_kernels_match_onnxruntime_on_cuda(precision, layout):
    proto = windows()
    x = np.random.default_rng(13).standard_normal((4, 16, 20, 20)).astype("float32")
    [expected] = onnxruntime_outputs(proto, {"input": x})
    model = tvmsched.compile(proto, target="cuda", kernels="tvm", precision=precision, layout=layout)
    assert relative_error(model(x), expected) <= (1e-5 if precision == "fp32" else TOLERANCE)
