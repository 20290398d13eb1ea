"""tvmsched's attention converters against onnxruntime, on one-node models."""

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import helper
from single_node import check_node

import tvmsched
from tvmsched.errors import UnsupportedOperator

RNG = np.random.default_rng(0)


def uniform(*shape, dtype="float32"):
    return RNG.uniform(-1, 1, shape).astype(dtype)


@pytest.mark.parametrize("attributes", [{}, {"scale": 0.3, "softcap": 2.0, "qk_matmul_output_mode": 0},
                                        {"softcap": 2.0, "qk_matmul_output_mode": 1}])
def test_attention_4d(attributes):
    """Scaled, softcapped, with the QK output of modes 0 (not softcapped, unlike in onnx's reference
    evaluator) and 1."""
    node = helper.make_node("Attention", ["q", "k", "v"], ["y", "", "", "qk"], **attributes)
    check_node(node, {"q": uniform(2, 3, 4, 8), "k": uniform(2, 3, 6, 8), "v": uniform(2, 3, 6, 5)}, 23)


def test_attention_causal_padded_mask_and_biased_scores():
    """A float mask shorter than the keys is padded with -inf; the QK output of mode 2 has -inf where the
    causal mask is (onnxruntime has the lowest float there, and requires a mask as long as the keys)."""
    node = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y", "", "", "qk"], is_causal=1,
                            qk_matmul_output_mode=2)
    check_node(node, {"q": uniform(2, 3, 4, 8), "k": uniform(2, 3, 6, 8), "v": uniform(2, 3, 6, 5),
                      "mask": uniform(2, 1, 4, 5)}, 23, reference="onnx")


def test_attention_3d_grouped_query_with_past_and_float_mask():
    """Heads split from 3D inputs, 6 query heads over 2 key heads, the past concatenated into the present
    outputs."""
    node = helper.make_node("Attention", ["q", "k", "v", "mask", "past_key", "past_value"],
                            ["y", "present_key", "present_value"], q_num_heads=6, kv_num_heads=2, is_causal=1)
    inputs = {"q": uniform(2, 3, 24), "k": uniform(2, 3, 8), "v": uniform(2, 3, 10), "mask": uniform(3, 8),
              "past_key": uniform(2, 2, 5, 4), "past_value": uniform(2, 2, 5, 5)}
    check_node(node, inputs, 24)


def test_attention_boolean_mask_fully_masked_row_is_zero():
    node = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y", "", "", "qk"],
                            qk_matmul_output_mode=3, softmax_precision=11)
    mask = np.array([[True, False, True], [False, False, False]])
    y, probabilities = check_node(node, {"q": uniform(1, 2, 2, 4), "k": uniform(1, 2, 3, 4),
                                         "v": uniform(1, 2, 3, 4), "mask": mask}, 24)
    assert not y[:, :, 1].any() and not probabilities[:, :, 1].any()


def test_attention_nonpad_kv_seqlen_offsets_the_causal_frontier():
    node = helper.make_node("Attention", ["q", "k", "v", "", "", "", "nonpad"], ["y"], is_causal=1)
    check_node(node, {"q": uniform(2, 4, 2, 8), "k": uniform(2, 2, 6, 8), "v": uniform(2, 2, 6, 8),
                      "nonpad": np.array([6, 3], "int64")}, 24)


@pytest.mark.parametrize("left, right", [(2, -1), (1, 2)])
def test_attention_sliding_window(left, right):
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], left_window_size=left,
                            right_window_size=right, is_causal=int(right < 0))
    check_node(node, {"q": uniform(1, 2, 5, 4), "k": uniform(1, 2, 5, 4), "v": uniform(1, 2, 5, 4)}, 25)


def test_attention_float16():
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)
    check_node(node, {"q": uniform(2, 2, 4, 8, dtype="float16"), "k": uniform(2, 2, 6, 8, dtype="float16"),
                      "v": uniform(2, 2, 6, 8, dtype="float16")}, 23, rtol=5e-3, atol=1e-3)


def test_attention_4d_with_contradicting_head_count_is_refused():
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=4, kv_num_heads=2)
    inputs = [tensor(name, [1, 2, 3, 8]) for name in "qkv"]
    model = make_model([node], inputs, [tensor("y", [1, 2, 3, 8])], {}, 23)
    with pytest.raises(UnsupportedOperator, match="q_num_heads=4 is not supported: it contradicts the 2 "):
        tvmsched.compile(model, target="llvm")


def test_attention_3d_without_head_counts_is_refused():
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], name="attention")
    model = make_model([node], [tensor(name, [1, 2, 8]) for name in "qkv"], [tensor("y", [1, 2, 8])], {}, 23)
    with pytest.raises(UnsupportedOperator, match=r"node 'attention' \(Attention\) \(opset 23\): 3D Q, K "
                                                  r"and V without q_num_heads and kv_num_heads is not "):
        tvmsched.compile(model, target="llvm")


@pytest.mark.parametrize("interleaved, rotated, positions", [(0, 0, True), (1, 4, True), (1, 0, False),
                                                             (0, 4, False)])
def test_rotary_embedding(interleaved, rotated, positions):
    """Halves or interleaved pairs, of all or the first `rotated` features, with caches indexed by position
    ids or given per batch and position."""
    names = ["x", "cos", "sin", "positions"][:4 if positions else 3]
    node = helper.make_node("RotaryEmbedding", names, ["y"], interleaved=interleaved,
                            rotary_embedding_dim=rotated)
    half = (rotated or 8) // 2
    cache_shape = (10, half) if positions else (2, 3, half)
    inputs = {"x": uniform(2, 4, 3, 8), "cos": uniform(*cache_shape), "sin": uniform(*cache_shape)}
    if positions:
        inputs["positions"] = RNG.integers(0, 10, (2, 3)).astype("int64")
    check_node(node, inputs, 23)


def test_rotary_embedding_3d():
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "positions"], ["y"], num_heads=4)
    check_node(node, {"x": uniform(2, 3, 32), "cos": uniform(10, 4), "sin": uniform(10, 4),
                      "positions": RNG.integers(0, 10, (2, 3)).astype("int64")}, 23)
