"""Row reductions under the GPU's rows rule (needs a CUDA device): a channels-last layer norm over 96
channels and a softmax over rows of 197 compute what onnxruntime computes, in float32 and float16."""

import numpy as np
import pytest
from conftest import make_model, onnxruntime_outputs, tensor
from onnx import helper
from test_precision import TOLERANCE, relative_error

import tvmsched

pytestmark = pytest.mark.gpu


def rows():
    rng = np.random.default_rng(20)
    weights = {"g": rng.uniform(0.5, 1.5, 96).astype("float32"),
               "b": rng.standard_normal(96).astype("float32"),
               "w": rng.standard_normal((96, 197)).astype("float32") / 10}
    nodes = [helper.make_node("LayerNormalization", ["input", "g", "b"], ["n"], axis=-1, epsilon=1e-6),
             helper.make_node("MatMul", ["n", "w"], ["m"]),
             helper.make_node("Softmax", ["m"], ["output"], axis=-1)]
    return make_model(nodes, [tensor("input", [4, 28, 28, 96])], [tensor("output", [4, 28, 28, 197])],
                      weights)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_row_reductions_match_onnxruntime_on_cuda(precision):
    proto = rows()
    x = np.random.default_rng(21).standard_normal((4, 28, 28, 96)).astype("float32")
    [expected] = onnxruntime_outputs(proto, {"input": x})
    model = tvmsched.compile(proto, target="cuda", kernels="tvm", precision=precision)
    assert relative_error(model(x), expected) <= (1e-5 if precision == "fp32" else TOLERANCE)
