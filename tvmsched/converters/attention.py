"""The attention ops of the default domain, which TVM's importer lacks (its "Attention" converts Microsoft's
contrib op): Attention (opset 23+) and RotaryEmbedding."""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from tvmsched.converters import register_converter
from tvmsched.converters.common import (
    cast,
    constant,
    dtype_of,
    onnx_dtype,
    refuse,
    requested_outputs,
    static_shape,
)


def split_heads(bb: relax.BlockBuilder, tensor: relax.Expr, heads: int) -> relax.Expr:
    """(batch, sequence, heads * size) -> (batch, heads, sequence, size)."""
    batch, length, hidden = static_shape(tensor)
    if hidden % heads:
        raise refuse(f"a hidden size of {hidden}", f"it does not split into {heads} heads; check the "
                                                    f"q_num_heads and kv_num_heads attributes")
    return bb.emit(relax.op.permute_dims(relax.op.reshape(tensor, (batch, length, heads, hidden // heads)),
                                         [0, 2, 1, 3]))


def merge_heads(tensor: relax.Expr) -> relax.Expr:
    """(batch, heads, sequence, size) -> (batch, sequence, heads * size)."""
    batch, heads, length, size = static_shape(tensor)
    return relax.op.reshape(relax.op.permute_dims(tensor, [0, 2, 1, 3]), (batch, length, heads * size))


@register_converter("Attention")
class Attention(OnnxOpConverter):
    """softmax(Q K^T * scale [softcapped] + bias) V, the bias from attn_mask (boolean: -inf where False; or
    added as is, its last axis padded with -inf to the keys), is_causal, left/right_window_size and
    nonpad_kv_seqlen, with the causal frontier offset by the past keys or nonpad_kv_seqlen - q_len; a
    query row whose bias is -inf everywhere gives zeros. Optional outputs: the present key and value (past
    concatenated with K, V) and qk_matmul_output as qk_matmul_output_mode says (0: Q K^T scaled, as the
    spec and its function body say, not softcapped as onnx's reference evaluator has it)."""

    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        dtype, three_d = dtype_of(inputs[0]), len(static_shape(inputs[0])) == 3
        # In the input's precision as the spec's function body (but for softmax_precision), half-precision
        # products accumulated in float32.
        accumulate = "float32" if dtype in ("float16", "bfloat16") else dtype
        query, key, value, present, past_length = cls._heads(bb, inputs, attr)
        batch, heads, query_length, head_size = static_shape(query)
        root = constant(np.sqrt(attr.get("scale", 1 / np.sqrt(head_size))), dtype)
        raw = bb.emit(cast(bb, relax.op.matmul(relax.op.multiply(query, root), relax.op.permute_dims(
            relax.op.multiply(key, root), [0, 1, 3, 2]), out_dtype=accumulate), dtype))
        scores = raw
        if attr.get("softcap", 0.0) > 0:
            cap = constant(attr["softcap"], dtype)
            scores = bb.emit(relax.op.multiply(relax.op.tanh(relax.op.divide(scores, cap)), cap))
        bias = cls._bias(bb, inputs[3], inputs[6], attr, dtype, (batch, query_length, static_shape(key)[2]),
                         past_length)
        biased = scores if bias is None else bb.emit(relax.op.add(scores, bias))
        precision = onnx_dtype(attr["softmax_precision"]) if "softmax_precision" in attr else dtype
        probabilities = cls._softmax(bb, biased, bias, precision, dtype)
        output = bb.emit(cast(bb, relax.op.matmul(probabilities, value, out_dtype=accumulate), dtype))
        outputs = [merge_heads(output) if three_d else output, *present]
        if requested_outputs(attr) > 3:
            mode = attr.get("qk_matmul_output_mode", 0)
            if mode not in (0, 1, 2, 3):
                raise refuse(f"qk_matmul_output_mode={mode}", "the spec defines modes 0 to 3")
            outputs.append(cast(bb, [raw, scores, biased, probabilities][mode], dtype))
        return relax.Tuple(outputs) if requested_outputs(attr) > 1 else outputs[0]

    @staticmethod
    def _heads(bb: relax.BlockBuilder, inputs, attr: dict) -> tuple:
        """Q, K and V as (batch, heads, sequence, size), K and V after the past ones and repeated for each
        query head of their group; the present key and value; the past's length."""
        query, key, value, past_key, past_value, nonpad = (inputs[index] for index in (0, 1, 2, 4, 5, 6))
        if len(static_shape(query)) == 3:
            if "q_num_heads" not in attr or "kv_num_heads" not in attr:
                raise refuse("3D Q, K and V without q_num_heads and kv_num_heads",
                             "their heads cannot be told apart; add both attributes")
            query = split_heads(bb, query, attr["q_num_heads"])
            key = split_heads(bb, key, attr["kv_num_heads"])
            value = split_heads(bb, value, attr["kv_num_heads"])
        for name, tensor in (("q_num_heads", query), ("kv_num_heads", key)):
            count = static_shape(tensor)[1]
            if attr.get(name, count) != count:
                raise refuse(f"{name}={attr[name]}", f"it contradicts the {count} heads of the 4D inputs; "
                                                     f"leave it out")
        if (past_key is None) != (past_value is None):
            raise refuse("past_key without past_value (or the reverse)", "the spec requires both")
        if nonpad is not None and past_key is not None:
            raise refuse("nonpad_kv_seqlen with past_key and past_value", "the spec forbids combining them")
        if past_key is not None:
            key = bb.emit(relax.op.concat([past_key, key], axis=2))
            value = bb.emit(relax.op.concat([past_value, value], axis=2))
        present = [key, value]
        heads, key_heads = static_shape(query)[1], static_shape(key)[1]
        if heads != key_heads:
            if heads % key_heads:
                raise refuse(f"{heads} query heads over {key_heads} key heads",
                             "the query heads must be a multiple of the key heads")
            key = relax.op.repeat(key, heads // key_heads, axis=1)
            value = relax.op.repeat(value, heads // key_heads, axis=1)
        return query, key, value, present, 0 if past_key is None else static_shape(past_key)[2]

    @staticmethod
    def _softmax(bb: relax.BlockBuilder, biased: relax.Expr, bias: relax.Expr | None, precision: str,
                 dtype: str) -> relax.Expr:
        """softmax in `precision` over the keys, 0 in a row whose bias is -inf everywhere (softmax makes it
        NaN), cast to `dtype`."""
        probabilities = relax.op.nn.softmax(cast(bb, biased, precision), axis=-1)
        if bias is not None:
            # Counted, since Relax's max starts from the lowest finite value, not -inf.
            allowed = relax.op.astype(relax.op.greater(bias, constant(-np.inf, dtype_of(bias))), "int32")
            masked = relax.op.equal(relax.op.sum(allowed, axis=-1, keepdims=True), constant(0, "int32"))
            probabilities = relax.op.where(masked, constant(0, precision), probabilities)
        return bb.emit(cast(bb, probabilities, dtype))

    @staticmethod
    def _bias(bb: relax.BlockBuilder, mask: relax.Expr | None, nonpad: relax.Expr | None, attr: dict,
              dtype: str, shape: tuple[int, int, int], past_length: int) -> relax.Expr | None:
        """What is added to the scores (broadcast to (batch, heads, q_len, kv_len)), or None."""
        batch, query_length, key_length = shape
        minus_infinity, zero = constant(-np.inf, dtype), constant(0, dtype)
        parts = []
        if mask is not None:
            if dtype_of(mask) == "bool":
                mask = relax.op.where(mask, zero, minus_infinity)
            mask = bb.normalize(cast(bb, mask, dtype))
            short = key_length - static_shape(mask)[-1]
            if short > 0:
                padding = constant(np.full((*static_shape(mask)[:-1], short), -np.inf), dtype)
                mask = relax.op.concat([mask, padding], axis=-1)
            parts.append(mask)
        left, right = attr.get("left_window_size", -1), attr.get("right_window_size", -1)
        if attr.get("is_causal", 0) or left >= 0 or right >= 0 or nonpad is not None:
            # The absolute position of query i is i + offset; key j is allowed where
            # j <= position (causal), position - left <= j <= position + right, and j < nonpad_kv_seqlen.
            rows = constant(np.arange(query_length).reshape(query_length, 1), "int64")
            keys = constant(np.arange(key_length), "int64")
            if nonpad is None:
                offset = constant(past_length, "int64")
            else:
                nonpad = bb.normalize(relax.op.reshape(cast(bb, nonpad, "int64"), (batch, 1, 1, 1)))
                offset = relax.op.subtract(nonpad, constant(query_length, "int64"))
            distance = bb.emit(relax.op.subtract(relax.op.add(rows, offset), keys))  # position - j
            conditions = []
            if attr.get("is_causal", 0):
                conditions.append(relax.op.greater_equal(distance, constant(0, "int64")))
            if left >= 0:
                conditions.append(relax.op.less_equal(distance, constant(left, "int64")))
            if right >= 0:
                conditions.append(relax.op.greater_equal(distance, constant(-right, "int64")))
            if nonpad is not None:
                conditions.append(relax.op.less(keys, nonpad))
            allowed = conditions[0]
            for condition in conditions[1:]:
                allowed = relax.op.logical_and(allowed, condition)
            parts.append(relax.op.where(allowed, zero, minus_infinity))
        if not parts:
            return None
        return bb.emit(parts[0] if len(parts) == 1 else relax.op.add(parts[0], parts[1]))


@register_converter("RotaryEmbedding")
class RotaryEmbedding(OnnxOpConverter):
    """Rotates the first `rotary_embedding_dim` features of each head (all where 0) by the angles whose
    cos and sin the caches hold (indexed by position_ids, else one per batch and position), pairing
    feature i with i + dim/2, or 2i with 2i + 1 where `interleaved`; the rest pass through."""

    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        data, cos, sin, positions = inputs[0], inputs[1], inputs[2], inputs[3]
        three_d = len(static_shape(data)) == 3
        if three_d:
            if not attr.get("num_heads"):
                raise refuse("a 3D input without num_heads", "its heads cannot be told apart; add the "
                                                                "attribute")
            data = split_heads(bb, data, attr["num_heads"])
        batch, heads, length, head_size = static_shape(data)
        rotated = attr.get("rotary_embedding_dim", 0) or head_size
        if positions is not None:
            cos = relax.op.take(cos, positions, axis=0, mode="clip")
            sin = relax.op.take(sin, positions, axis=0, mode="clip")
        # (batch, sequence, rotated / 2) against (batch, heads, sequence, rotated / 2)
        cos, sin = (bb.emit(relax.op.expand_dims(cache, 1)) for cache in (cos, sin))
        interleaved = attr.get("interleaved", 0)
        starts, stride, end = ((0, 1), 2, rotated) if interleaved else ((0, rotated // 2), 1, rotated // 2)
        first, second = (bb.emit(relax.op.strided_slice(data, [3], [start], [start + end], [stride]))
                         for start in starts)
        real = relax.op.subtract(relax.op.multiply(cos, first), relax.op.multiply(sin, second))
        imaginary = relax.op.add(relax.op.multiply(sin, first), relax.op.multiply(cos, second))
        if interleaved:
            pairs = relax.op.stack([real, imaginary], axis=-1)
            output = relax.op.reshape(pairs, (batch, heads, length, rotated))
        else:
            output = relax.op.concat([real, imaginary], axis=-1)
        if rotated < head_size:
            unrotated = relax.op.strided_slice(data, [3], [rotated], [head_size])
            output = relax.op.concat([output, unrotated], axis=-1)
        return merge_heads(bb.emit(output)) if three_d else output
