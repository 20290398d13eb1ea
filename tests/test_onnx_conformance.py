"""The ONNX conformance runner (experiments/onnx_conformance.py): a case refused because an input's value
decides a shape is built again with those inputs bound, and such passes are counted apart."""

from types import SimpleNamespace

import numpy as np
from conftest import make_model, tensor
from onnx import helper

from experiments.onnx_conformance import run_tvmsched, summarize


def _case(model, inputs: list[np.ndarray], outputs: list[np.ndarray]):
    return SimpleNamespace(model=model, data_sets=[(inputs, outputs)], rtol=1e-5, atol=1e-6)


def test_a_case_whose_input_decides_a_shape_is_built_with_it_bound(runtime_axes_model):
    model = runtime_axes_model
    x = np.arange(12, dtype="float32").reshape(3, 4)
    row = run_tvmsched(_case(model, [x, np.array([1])], [x.sum(axis=1)]))
    assert row == {"tvmsched": "pass", "constant_inputs": ["axes"]}
    assert run_tvmsched(_case(model, [x, np.array([1])], [x.sum(axis=1) + 1]))["tvmsched"] == "wrong"

    relu = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [3, 4])], [tensor("y", [3, 4])],
                      {})
    assert run_tvmsched(_case(relu, [x - 5], [np.maximum(x - 5, 0)])) == {"tvmsched": "pass"}

    rows = [{"case": name, "op": "ReduceSum", "float32": True, "onnxruntime": "pass", **result}
            for name, result in (("a", row), ("b", {"tvmsched": "pass"}), ("c", {"tvmsched": "refused"}))]
    counts = summarize(rows)["all"]
    assert counts["tvmsched_pass"] == 2 and counts["passed_with_constant_inputs"] == 1
