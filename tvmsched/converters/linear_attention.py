"""LinearAttention (opset 27; Gated DeltaNet and its relatives), which TVM's importer lacks: a recurrence
over the sequence that also outputs the state the next step takes."""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from tvmsched.converters import register_converter
from tvmsched.converters.attention import merge_heads, split_heads
from tvmsched.converters.common import cast, constant, dtype_of, refuse, static_shape, text_attribute

# LinearAttention's recurrence is unrolled, a few ops per time step: longer sequences would make graphs
# (and compile times) that grow without bound.
MAX_UNROLLED_STEPS = 64


@register_converter("LinearAttention")
class LinearAttention(OnnxOpConverter):
    """The recurrence of `update_rule` run step by step (unrolled, at most MAX_UNROLLED_STEPS) in float32
    over a state per key head (past_state, else zeros): decayed by exp(decay) ('gated', 'gated_delta'), the
    value corrected to beta * (v - S^T k) ('delta', 'gated_delta'), k v^T added; each query head reads its
    group's state, scaled. Outputs the (B, T, H_q * d_v) output and the present state."""

    RULES = ("linear", "gated", "delta", "gated_delta")

    @classmethod
    def _impl_v27(cls, bb, inputs, attr, params):
        query, key, value, past, decay, beta = (inputs[index] for index in range(6))
        gated, delta = cls._rule(attr, decay, beta)
        heads, key_heads = attr.get("q_num_heads", 0), attr.get("kv_num_heads", 0)
        if not heads or not key_heads or heads % key_heads:
            raise refuse(f"q_num_heads={heads} with kv_num_heads={key_heads}",
                         "both are required, the first a positive multiple of the second")
        dtype, state_dtype = dtype_of(query), dtype_of(query if past is None else past)
        batch, steps, _ = static_shape(query)
        if steps > MAX_UNROLLED_STEPS:
            raise refuse(f"a sequence of {steps} steps",
                         f"tvmsched unrolls the recurrence, at most {MAX_UNROLLED_STEPS} steps; run the "
                         f"prefill in chunks")
        query, key, value = (cast(bb, split_heads(bb, tensor, count), "float32")
                             for tensor, count in ((query, heads), (key, key_heads), (value, key_heads)))
        key_size, value_size = static_shape(key)[3], static_shape(value)[3]
        gates = rates = None
        if gated:
            gates = cls._per_head(bb, decay, key_heads, (key_heads * key_size, key_heads), "decay")
        if delta:
            rates = cls._per_head(bb, beta, key_heads, (key_heads, 1), "beta")
        zeros = np.zeros((batch, key_heads, key_size, value_size))
        state = constant(zeros, "float32") if past is None else cast(bb, past, "float32")
        scale = constant(attr.get("scale", 0.0) or 1 / np.sqrt(key_size), "float32")
        outputs = []
        for step in range(steps):
            state = cls._step(bb, state, *(_at(tensor, step) for tensor in (key, value, gates, rates)))
            shared = state if heads == key_heads else relax.op.repeat(state, heads // key_heads, axis=1)
            outputs.append(relax.op.multiply(relax.op.matmul(_at(query, step), shared), scale))
        output = bb.emit(relax.op.concat(outputs, axis=2))
        return relax.Tuple([cast(bb, merge_heads(output), dtype), cast(bb, state, state_dtype)])

    @staticmethod
    def _step(bb: relax.BlockBuilder, state: relax.Expr, key: relax.Expr, value: relax.Expr,
              gate: relax.Expr | None, rate: relax.Expr | None) -> relax.Expr:
        """The state after one step: (B, H, d_k, d_v) from k (B, H, 1, d_k), v (B, H, 1, d_v), the decay
        (B, H, 1, d_k or 1) and beta (B, H or 1, 1, 1) of that step."""
        key = bb.emit(key)
        if gate is not None:  # exp(g) scales the state's rows
            state = relax.op.multiply(state, relax.op.permute_dims(relax.op.exp(gate), [0, 1, 3, 2]))
        state = bb.emit(state)
        if rate is not None:
            value = relax.op.multiply(rate, relax.op.subtract(value, relax.op.matmul(key, state)))
        # k v^T by broadcasting: as a matmul over an axis of 1, dlight's GEMV rule fails on it for CUDA
        outer = relax.op.multiply(relax.op.permute_dims(key, [0, 1, 3, 2]), value)
        return bb.emit(relax.op.add(state, outer))

    @classmethod
    def _rule(cls, attr: dict, decay: relax.Expr | None, beta: relax.Expr | None) -> tuple[bool, bool]:
        """Whether `update_rule` gates (decays the state) and whether it corrects by the delta rule."""
        rule = text_attribute(attr, "update_rule", "gated_delta")
        if rule not in cls.RULES:
            raise refuse(f"update_rule='{rule}'", f"the spec defines {', '.join(cls.RULES)} only")
        gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
        if gated != (decay is not None) or delta != (beta is not None):
            raise refuse(f"update_rule='{rule}' with these inputs",
                         f"it takes {'a' if gated else 'no'} decay input and {'a' if delta else 'no'} beta "
                         f"input")
        return gated, delta

    @staticmethod
    def _per_head(bb: relax.BlockBuilder, tensor: relax.Expr, key_heads: int, widths: tuple[int, int],
                  name: str) -> relax.Expr:
        """A (B, T, width) input as (B, H, T, width / H) in float32, for the widths the spec allows (H
        heads of d_k or 1 values for decay; H heads or 1 shared value for beta)."""
        width = static_shape(tensor)[2]
        if width not in widths:
            raise refuse(f"{name} of last dimension {width}",
                         f"the spec allows {' or '.join(map(str, widths))} here")
        return cast(bb, split_heads(bb, tensor, key_heads if width != 1 else 1), "float32")


def _at(tensor: relax.Expr | None, step: int) -> relax.Expr | None:
    """(B, H, T, n) -> (B, H, 1, n) at time `step` (None for an absent input)."""
    return None if tensor is None else relax.op.strided_slice(tensor, [2], [step], [step + 1])
