"""tvmsched's LinearAttention converter against onnxruntime."""

import shutil

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import helper
from single_node import build_for_cuda, check_node, node_model

import tvmsched
from tvmsched.converters.linear_attention import MAX_UNROLLED_STEPS
from tvmsched.errors import UnsupportedOperator

RNG = np.random.default_rng(0)


def uniform(*shape, low=-1.0, dtype="float32"):
    return RNG.uniform(low, 1, shape).astype(dtype)


@pytest.mark.parametrize("rule, heads, decay, beta, past", [
    ("linear", (2, 2), None, None, False), ("gated", (2, 2), "per head", None, True),
    ("delta", (4, 2), None, "per head", False), ("gated_delta", (4, 1), "per key", "shared", True)])
def test_linear_attention(rule, heads, decay, beta, past):
    """Each rule, grouped query heads, decay per head or per key dimension, beta per head or shared."""
    (query_heads, key_heads), size, steps = heads, 4, 3
    names = ["q", "k", "v", "past" if past else "", "decay" if decay else "", "beta" if beta else ""]
    node = helper.make_node("LinearAttention", names, ["y", "present"], update_rule=rule,
                            q_num_heads=query_heads, kv_num_heads=key_heads, scale=0.5 if past else 0.0)
    inputs = {"q": uniform(2, steps, query_heads * size), "k": uniform(2, steps, key_heads * size),
              "v": uniform(2, steps, key_heads * size)}
    if past:
        inputs["past"] = uniform(2, key_heads, size, size)
    if decay:
        inputs["decay"] = -uniform(2, steps, key_heads * (size if decay == "per key" else 1), low=0.0)
    if beta:
        inputs["beta"] = uniform(2, steps, key_heads if beta == "per head" else 1, low=0.0)
    check_node(node, inputs, 27)


def test_linear_attention_longer_than_the_unrolled_limit_is_refused():
    steps = MAX_UNROLLED_STEPS + 1
    node = helper.make_node("LinearAttention", ["q", "k", "v"], ["y", "present"], update_rule="linear",
                            q_num_heads=1, kv_num_heads=1)
    model = make_model([node], [tensor(name, [1, steps, 4]) for name in "qkv"],
                       [tensor("y", [1, steps, 4]), tensor("present", [1, 1, 4, 4])], {}, 27)
    with pytest.raises(UnsupportedOperator, match=f"a sequence of {steps} steps"):
        tvmsched.compile(model, target="llvm")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to compile CUDA")
def test_one_key_head_compiles_for_cuda():
    """k v^T of one key head as a matmul over an axis of 1 failed dlight's GEMV rule."""
    node = helper.make_node("LinearAttention", ["q", "k", "v", "", "decay", "beta"], ["y", "present"],
                            q_num_heads=4, kv_num_heads=1)
    inputs = {"q": uniform(2, 2, 32), "k": uniform(2, 2, 8), "v": uniform(2, 2, 8), "decay": uniform(2, 2, 8),
              "beta": uniform(2, 2, 1)}
    build_for_cuda(node_model(node, inputs, 27))
