"""ONNX → Relax: TVM's Relax ONNX importer, with tvmsched's converters (`tvmsched.converters`) taking
precedence over TVM's, and every failure reported as one error naming the ONNX node, its op and the fix."""

from __future__ import annotations

import contextlib
import io

import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter, _get_convert_map

from tvmsched.converters import CONVERTERS
from tvmsched.errors import TvmschedError, UnsupportedOperator
from tvmsched.fold import FoldedModel
from tvmsched.static_shapes import check_static_output


def supported_ops() -> set[str]:
    """The ONNX ops (default domain) the importer converts."""
    return {*_get_convert_map(), *CONVERTERS, "If", "Constant"}


def describe_node(node: onnx.NodeProto, index: int) -> str:
    """How errors name a node: its name if it has one, else its position, with its op."""
    return f"node '{node.name or f'#{index}'}' ({node.op_type})"


class _Importer(ONNXGraphImporter):
    """TVM's importer, converting with `CONVERTERS` first, remembering the node being converted, and
    refusing a node whose output shape is not static (`static_shapes`); the graph's large weights are read
    from the model they belong to (`FoldedModel.weights`), not copied."""

    def __init__(self, graph: onnx.GraphProto, *args, weights: tuple[onnx.TensorProto, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.graph = graph
        self.node: onnx.NodeProto | None = None
        self.weights = weights

    def _parse_graph_initializers(self, graph) -> None:
        super()._parse_graph_initializers(graph)
        for tensor in self.weights:
            self._nodes[tensor.name] = relax.const(self._parse_array(tensor))

    def where(self, opset: int) -> str:
        """The node being converted, as errors name it."""
        if self.node is None:
            return "the graph"
        index = next((index for index, other in enumerate(self.graph.node) if other == self.node), -1)
        return f"{describe_node(self.node, index)} (opset {opset})"

    def _parse_value_proto(self, value_proto):
        if isinstance(value_proto, onnx.NodeProto):  # called once per node, before it is converted
            self.node = value_proto
        return super()._parse_value_proto(value_proto)

    def _check_for_unsupported_ops(self, graph) -> None:
        """Done by `frontend.check_operators`, which knows tvmsched's converters too."""

    def _convert_operator(self, op_name: str, inputs, attrs: dict, opset: int):
        converter = CONVERTERS.get(op_name)
        if converter is None:
            expr = super()._convert_operator(op_name, inputs, attrs, opset)
        else:
            try:
                expr = converter.get_converter(opset)(self.bb, inputs, attrs, [self._nodes, self._params])
            except UnsupportedOperator as error:  # a converter's refusal says why; name the node it refuses
                raise UnsupportedOperator(f"{self.where(opset)}: {error}") from error
            expr = self.bb.normalize(expr) if isinstance(expr, relax.Expr) else expr
        if self.node is not None:
            check_static_output(self.node, expr, self.graph, self._nodes, self._input_names,
                                lambda: self.where(opset))
        return expr


def import_model(model: FoldedModel, shapes: dict[str, list[int]], dtypes: dict[str, str],
                 opset: int, rebound: str = "") -> tvm.IRModule:
    """The Relax module of `model` with its inputs bound to `shapes` and `dtypes`, weights as constants.
    `rebound` says which inputs are bound to other dims than the model fixes: a node that then fails is
    refused naming that binding first, not only as an operator to replace."""
    proto = model.proto
    importer = _Importer(proto.graph, shapes, dtypes, keep_params_in_input=False, weights=model.weights)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # TVM prints each failing node's inputs
            return importer.from_onnx(proto.graph, opset)
    except Exception as error:  # the importer raises TVMError, ValueError, AssertionError, KeyError, ...
        _end_open_blocks(importer.bb)
        if isinstance(error, TvmschedError):
            raise
        text = str(error).strip()
        message = text.splitlines()[-1] if text else type(error).__name__
        fix = "replace it in the exporter or decompose it into supported ops"
        if rebound:  # the likelier cause, but an operator may fail whatever the dims
            fix = f"bind the dims the model fixes (if it fails with those too, {fix})"
        raise UnsupportedOperator(f"{importer.where(opset)} cannot be imported"
                                  f"{f' with {rebound}' if rebound else ''}: {message}; {fix}") from error


def _end_open_blocks(builder: relax.BlockBuilder) -> None:
    """End the blocks a failed import left open (TVM warns on stderr about each builder destroyed so)."""
    with contextlib.suppress(tvm.error.InternalError):
        while True:
            builder._end_block()
