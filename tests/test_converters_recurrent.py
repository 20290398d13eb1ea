"""tvmsched.converters.recurrent: RNN, GRU and LSTM against onnxruntime."""

import numpy as np
import pytest
from onnx import helper
from single_node import check_node, node_model

import tvmsched
from tvmsched.errors import UnsupportedOperator

RNG = np.random.default_rng(0)
STEPS, BATCH, INPUT, HIDDEN = 4, 3, 5, 6
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def weights(op: str, directions: int, peepholes: bool = False) -> dict:
    gates = GATES[op]
    values = {"W": RNG.standard_normal((directions, gates * HIDDEN, INPUT)),
              "R": RNG.standard_normal((directions, gates * HIDDEN, HIDDEN)),
              "B": RNG.standard_normal((directions, 2 * gates * HIDDEN)),
              "initial_h": RNG.standard_normal((directions, BATCH, HIDDEN))}
    if op == "LSTM":
        values["initial_c"] = RNG.standard_normal((directions, BATCH, HIDDEN))
    if peepholes:
        values["P"] = RNG.standard_normal((directions, 3 * HIDDEN))
    return {name: (0.4 * value).astype("float32") for name, value in values.items()}


@pytest.mark.parametrize("op, attributes", [
    ("RNN", {"direction": "bidirectional", "activations": ["Relu", "Tanh"]}),
    ("GRU", {"direction": "reverse"}),
    ("GRU", {"direction": "bidirectional", "linear_before_reset": 1, "clip": 1.5}),
    ("LSTM", {"direction": "bidirectional"}),
    ("LSTM", {"direction": "forward", "input_forget": 1, "clip": 2.0, "peepholes": True})])
def test_recurrent(op, attributes):
    attributes = dict(attributes)
    directions = 2 if attributes.get("direction") == "bidirectional" else 1
    constants = weights(op, directions, attributes.pop("peepholes", False))
    x = RNG.standard_normal((STEPS, BATCH, INPUT)).astype("float32")
    names = ["x", "W", "R", "B", "", "initial_h", *(["initial_c"] if op == "LSTM" else []),
             *(["P"] if "P" in constants else [])]
    outputs = ["y", "y_h", *(["y_c"] if op == "LSTM" else [])]
    node = helper.make_node(op, names, outputs, hidden_size=HIDDEN, **attributes)
    check_node(node, {"x": x}, opset=14, constants=constants, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_sequence_lengths_mask_the_forward_steps(op):
    x = RNG.standard_normal((STEPS, BATCH, INPUT)).astype("float32")
    lengths = np.array([4, 2, 1], "int32")
    constants = {name: value for name, value in weights(op, 1).items() if name in ("W", "R", "B")}
    node = helper.make_node(op, ["x", "W", "R", "B", "lengths"], ["y", "y_h"], hidden_size=HIDDEN)
    check_node(node, {"x": x, "lengths": lengths}, opset=14, constants=constants, rtol=1e-4, atol=1e-5)


def test_sequence_lengths_of_a_reverse_direction_are_refused():
    constants = {name: value for name, value in weights("GRU", 1).items() if name in ("W", "R")}
    node = helper.make_node("GRU", ["x", "W", "R", "", "lengths"], ["y"], hidden_size=HIDDEN,
                            direction="reverse", name="gru")
    model = node_model(node, {"x": np.zeros((STEPS, BATCH, INPUT), "float32"),
                              "lengths": np.ones(BATCH, "int32")}, 14, constants)
    with pytest.raises(UnsupportedOperator, match=r"node 'gru' \(GRU\) \(opset 14\): sequence_lens with "
                                                  r"direction reverse"):
        tvmsched.compile(model, target="llvm")
