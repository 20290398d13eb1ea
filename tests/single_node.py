"""One-node ONNX models for the converter tests: built from a node (or a short chain) and its input arrays,
compiled by tvmsched for llvm, and checked against onnxruntime or onnx's reference evaluator."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

import tvmsched


def node_model(node: onnx.NodeProto | list[onnx.NodeProto], inputs: dict[str, np.ndarray], opset: int,
               constants: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A model of `node` (or of nodes whose last gives the outputs) whose graph inputs are `inputs` and
    initializers `constants`; output types inferred."""
    nodes = node if isinstance(node, list) else [node]
    node = nodes[-1]
    graph = helper.make_graph(
        nodes, node.op_type,
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
         for name, value in inputs.items()],
        [onnx.ValueInfoProto(name=name) for name in node.output if name],
        [numpy_helper.from_array(value, name) for name, value in (constants or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def expected_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray], reference: str) -> list:
    if reference == "onnxruntime":
        import onnxruntime

        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, inputs)
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, inputs)


def check_node(node: onnx.NodeProto | list[onnx.NodeProto], inputs: dict[str, np.ndarray], opset: int = 18,
               constants: dict[str, np.ndarray] | None = None, reference: str = "onnxruntime",
               rtol: float = 1e-5, atol: float = 1e-6) -> list[np.ndarray]:
    """Compile the one-node model, run it on `inputs`, and assert every output has the reference's dtype and
    shape and agrees within rtol/atol (NaNs equal). Returns tvmsched's outputs."""
    model = node_model(node, inputs, opset, constants)
    actual = tvmsched.compile(model, target="llvm").run(inputs)
    expected = expected_outputs(model, inputs, reference)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        want = np.asarray(want)
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    return actual


def build_for_cuda(model: onnx.ModelProto) -> None:
    """Cross-compile the model's kernels for CUDA (dlight schedules the ones without tuning records)."""
    from tvmsched import frontend
    from tvmsched.codegen import build_library
    from tvmsched.lower import kernel_module, lower
    from tvmsched.target import resolve_target

    lowered = lower(frontend.to_relax(model, frontend.bind_input_shapes(model)))
    build_library(kernel_module(lowered), resolve_target("cuda"))
