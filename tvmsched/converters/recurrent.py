"""The recurrent ops RNN, GRU and LSTM, unrolled over their (static) sequence length: the input projection of
all steps is one matmul, each step a matmul with the recurrent weights and the cell's gates. Directions,
layouts, initial states, peepholes, clip, linear_before_reset, input_forget and per-batch sequence_lens
(forward direction) follow the ONNX spec."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from tvmsched.converters import register_converter
from tvmsched.converters.common import constant_value, dtype_of, refuse, static_shape, take, text_attribute


def _softsign(x: relax.Expr) -> relax.Expr:
    return relax.op.divide(x, relax.op.add(relax.op.abs(x), relax.const(1.0, dtype_of(x))))


# The activations of recurrent ops tvmsched converts (with ONNX's default alpha and beta).
_ACTIVATIONS = {"sigmoid": relax.op.sigmoid, "tanh": relax.op.tanh, "relu": relax.op.nn.relu,
                "softsign": _softsign}


@dataclass(frozen=True)
class Weights:
    """One direction's weights: W [gates * size, input], R [gates * size, size], the input and recurrent
    biases [gates * size] and the LSTM peepholes [3 * size] (each bias or peephole may be absent)."""

    w: relax.Expr
    r: relax.Expr
    w_bias: relax.Expr | None
    r_bias: relax.Expr | None
    peepholes: relax.Expr | None
    size: int


def _columns(value: relax.Expr, first: int, count: int, size: int) -> relax.Expr:
    """Gates first .. first + count - 1 of a [..., gates * size] value (its last axis)."""
    axis = len(static_shape(value)) - 1
    return relax.op.strided_slice(value, [axis], [first * size], [(first + count) * size])


def _rows(value: relax.Expr, first: int, count: int, size: int) -> relax.Expr:
    return relax.op.strided_slice(value, [0], [first * size], [(first + count) * size])


class _Recurrent(OnnxOpConverter):
    """What RNN, GRU and LSTM share; a subclass gives its gate count, default activations and step."""

    gates = 1
    default_activations: tuple[str, ...] = ("Tanh",)
    states = 1  # the hidden state, and the cell state of LSTM

    @classmethod
    def step(cls, bb, projected: relax.Expr, states: list[relax.Expr], weights: Weights, activations: list,
             attr: dict) -> list[relax.Expr]:
        """The next states from this step's input projection (its input bias added)."""
        raise NotImplementedError

    @classmethod
    def recurrent(cls, bb, hidden: relax.Expr, weights: Weights, first: int, count: int) -> relax.Expr:
        """hidden @ R^T for gates first .. first + count - 1, with their recurrent bias."""
        rows = _rows(weights.r, first, count, weights.size)
        value = relax.op.matmul(hidden, relax.op.permute_dims(rows, [1, 0]))
        if weights.r_bias is not None:
            value = relax.op.add(value, _rows(weights.r_bias, first, count, weights.size))
        return bb.normalize(value)

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        x, w, r, bias, lengths, initial_h = inputs[:6]
        batch_first = int(attr.get("layout", 0)) == 1
        direction = text_attribute(attr, "direction", "forward")
        if attr.get("activation_alpha") or attr.get("activation_beta"):
            raise refuse("activation_alpha/activation_beta", "tvmsched uses the activations' default "
                         "parameters only")
        x = bb.normalize(relax.op.permute_dims(x, [1, 0, 2]) if batch_first else x)
        steps, batch = static_shape(x)[:2]
        directions = 2 if direction == "bidirectional" else 1
        activations = cls._activations(attr, directions)
        valid = cls._valid_steps(lengths, steps, batch, direction)
        initial = [initial_h, *inputs[6:6 + cls.states - 1]]
        sequences, finals = [], []
        for index in range(directions):
            weights = cls._weights(bb, w, r, bias, inputs[7] if cls.states > 1 else None, index, attr)
            start = [cls._initial(bb, state, index, batch, weights.size, dtype_of(x), batch_first)
                     for state in initial]
            sequence, final = cls._direction(bb, x, weights, start, activations[index], attr,
                                             direction == "reverse" or index == 1, valid)
            sequences.append(sequence)
            finals.append(final)
        y = relax.op.stack(sequences, axis=1)  # [steps, directions, batch, hidden]
        last = [relax.op.stack([final[state] for final in finals], axis=0) for state in range(cls.states)]
        if batch_first:
            y = relax.op.permute_dims(y, [2, 0, 1, 3])
            last = [relax.op.permute_dims(state, [1, 0, 2]) for state in last]
        return relax.Tuple([y, *last])

    @classmethod
    def _activations(cls, attr: dict, directions: int) -> list[list]:
        """The activation functions of each direction."""
        given = [name.decode() if isinstance(name, bytes) else name for name in attr.get("activations", [])]
        names = [name.lower() for name in given or cls.default_activations * directions]
        unknown = sorted(set(names) - set(_ACTIVATIONS))
        if unknown:
            raise refuse(f"activations {unknown}", f"tvmsched converts {', '.join(sorted(_ACTIVATIONS))}")
        per_direction = len(cls.default_activations)
        return [[_ACTIVATIONS[name] for name in names[index * per_direction:(index + 1) * per_direction]]
                for index in range(directions)]

    @classmethod
    def _weights(cls, bb, w, r, bias, peepholes, index: int, attr: dict) -> Weights:
        def of_direction(value):
            return None if value is None else bb.normalize(take(value, index, 0))

        size = int(attr["hidden_size"])
        both = of_direction(bias)
        return Weights(of_direction(w), of_direction(r),
                       None if both is None else _rows(both, 0, cls.gates, size),
                       None if both is None else _rows(both, cls.gates, cls.gates, size),
                       of_direction(peepholes), size)

    @classmethod
    def _valid_steps(cls, lengths: relax.Expr | None, steps: int, batch: int, direction: str):
        """None where every sequence has all steps, else a bool [steps, batch, 1] of the steps each has."""
        if lengths is None:
            return None
        value = constant_value(lengths)
        if value is not None and (value == steps).all():
            return None
        if direction != "forward":
            raise refuse(f"sequence_lens with direction {direction}", "tvmsched masks the steps of shorter "
                         "sequences in the forward direction only")
        step_index = relax.const(np.arange(steps, dtype="int64").reshape(steps, 1, 1))
        return relax.op.less(step_index, relax.op.reshape(relax.op.astype(lengths, "int64"), [1, batch, 1]))

    @classmethod
    def _initial(cls, bb, state, index, batch, size, dtype, batch_first):
        if state is None:
            return bb.normalize(relax.op.zeros((batch, size), dtype))
        return bb.normalize(take(state, index, 1 if batch_first else 0))

    @classmethod
    def _direction(cls, bb, x, weights: Weights, states, activations, attr, reverse, valid):
        """The outputs [steps, batch, hidden] of one direction and its final states."""
        steps = static_shape(x)[0]
        projected = relax.op.matmul(x, relax.op.permute_dims(weights.w, [1, 0]))
        if weights.w_bias is not None:
            projected = relax.op.add(projected, weights.w_bias)
        projected = bb.emit(projected)
        outputs = [None] * steps
        for step in (reversed(range(steps)) if reverse else range(steps)):
            at_step = bb.emit(take(projected, step, 0))
            new = [bb.emit(state) for state in cls.step(bb, at_step, states, weights, activations, attr)]
            if valid is None:
                states, outputs[step] = new, new[0]
                continue
            mask = take(valid, step, 0)
            outputs[step] = bb.emit(relax.op.where(mask, new[0], relax.op.zeros_like(new[0])))
            states = [bb.emit(relax.op.where(mask, state, old)) for state, old in zip(new, states)]
        return relax.op.stack(outputs, axis=0), states


def _clip(value: relax.Expr, attr: dict) -> relax.Expr:
    """The clip attribute bounds every activation's input."""
    if "clip" not in attr:
        return value
    limit = float(attr["clip"])
    return relax.op.clip(value, -limit, limit)


@register_converter("RNN")
class RNN(_Recurrent):
    @classmethod
    def step(cls, bb, projected, states, weights, activations, attr):
        pre = relax.op.add(projected, cls.recurrent(bb, states[0], weights, 0, 1))
        return [activations[0](_clip(pre, attr))]


@register_converter("GRU")
class GRU(_Recurrent):
    """Gates z, r, h; linear_before_reset applies the reset gate after the recurrent matmul."""

    gates = 3
    default_activations = ("Sigmoid", "Tanh")

    @classmethod
    def step(cls, bb, projected, states, weights, activations, attr):
        hidden, size = states[0], weights.size
        update_reset = relax.op.add(_columns(projected, 0, 2, size), cls.recurrent(bb, hidden, weights, 0, 2))
        update_reset = bb.emit(activations[0](_clip(update_reset, attr)))
        update, reset = _columns(update_reset, 0, 1, size), _columns(update_reset, 1, 1, size)
        if int(attr.get("linear_before_reset", 0)):
            recurrent = relax.op.multiply(reset, cls.recurrent(bb, hidden, weights, 2, 1))
        else:
            recurrent = cls.recurrent(bb, relax.op.multiply(reset, hidden), weights, 2, 1)
        candidate = activations[1](_clip(relax.op.add(_columns(projected, 2, 1, size), recurrent), attr))
        keep = relax.op.subtract(relax.const(1.0, dtype_of(hidden)), update)
        return [relax.op.add(relax.op.multiply(keep, candidate), relax.op.multiply(update, hidden))]


@register_converter("LSTM")
class LSTM(_Recurrent):
    """Gates i, o, f, c; peepholes (i, o, f) on the cell state; input_forget couples f to 1 - i."""

    gates = 4
    default_activations = ("Sigmoid", "Tanh", "Tanh")
    states = 2

    @classmethod
    def step(cls, bb, projected, states, weights, activations, attr):
        (hidden, cell), size = states, weights.size
        gate, candidate, output = activations
        pre = bb.emit(relax.op.add(projected, cls.recurrent(bb, hidden, weights, 0, 4)))

        def peephole(index: int, state: relax.Expr, value: relax.Expr) -> relax.Expr:
            if weights.peepholes is None:
                return value
            return relax.op.add(value, relax.op.multiply(_rows(weights.peepholes, index, 1, size), state))

        input_gate = gate(_clip(peephole(0, cell, _columns(pre, 0, 1, size)), attr))
        if int(attr.get("input_forget", 0)):
            forget = relax.op.subtract(relax.const(1.0, dtype_of(cell)), input_gate)
        else:
            forget = gate(_clip(peephole(2, cell, _columns(pre, 2, 1, size)), attr))
        new_cell = bb.emit(relax.op.add(relax.op.multiply(forget, cell), relax.op.multiply(
            input_gate, candidate(_clip(_columns(pre, 3, 1, size), attr)))))
        output_gate = gate(_clip(peephole(1, new_cell, _columns(pre, 1, 1, size)), attr))
        return [relax.op.multiply(output_gate, output(new_cell)), new_cell]
