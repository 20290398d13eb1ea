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


def supported_ops() -> set[str]:
    """The ONNX ops (default domain) the importer converts."""
    return {*_get_convert_map(), *CONVERTERS, "If", "Constant"}


def describe_node(node: onnx.NodeProto, index: int) -> str:
    """How errors name a node: its name if it has one, else its position, with its op."""
    return f"node '{node.name or f'#{index}'}' ({node.op_type})"


class _Importer(ONNXGraphImporter):
    """TVM's importer, converting with `CONVERTERS` first and remembering the node being converted; the
    graph's large weights are read from the model they belong to (`FoldedModel.weights`), not copied."""

    def __init__(self, *args, weights: tuple[onnx.TensorProto, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.node: onnx.NodeProto | None = None
        self.weights = weights

    def _parse_graph_initializers(self, graph) -> None:
        super()._parse_graph_initializers(graph)
        for tensor in self.weights:
            self._nodes[tensor.name] = relax.const(self._parse_array(tensor))

    def _parse_value_proto(self, value_proto):
        if isinstance(value_proto, onnx.NodeProto):  # called once per node, before it is converted
            self.node = value_proto
        return super()._parse_value_proto(value_proto)

    def _check_for_unsupported_ops(self, graph) -> None:
        """Done by `frontend.check_operators`, which knows tvmsched's converters too."""

    def _convert_operator(self, op_name: str, inputs, attrs: dict, opset: int):
        converter = CONVERTERS.get(op_name)
        if converter is None:
            return super()._convert_operator(op_name, inputs, attrs, opset)
        expr = converter.get_converter(opset)(self.bb, inputs, attrs, [self._nodes, self._params])
        return self.bb.normalize(expr) if isinstance(expr, relax.Expr) else expr


def import_model(model: FoldedModel, shapes: dict[str, list[int]], dtypes: dict[str, str],
                 opset: int) -> tvm.IRModule:
    """The Relax module of `model` with its inputs bound to `shapes` and `dtypes`, weights as constants."""
    proto = model.proto
    importer = _Importer(shapes, dtypes, keep_params_in_input=False, weights=model.weights)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # TVM prints each failing node's inputs
            return importer.from_onnx(proto.graph, opset)
    except UnsupportedOperator as error:  # a converter's refusal, which names the attribute and why
        _end_open_blocks(importer.bb)
        raise UnsupportedOperator(f"{_where(importer, proto)} (opset {opset}): {error}") from error
    except TvmschedError:
        raise
    except Exception as error:  # the importer raises TVMError, ValueError, AssertionError, KeyError, ...
        _end_open_blocks(importer.bb)
        text = str(error).strip()
        message = text.splitlines()[-1] if text else type(error).__name__
        raise UnsupportedOperator(f"{_where(importer, proto)} (opset {opset}) cannot be imported: {message}; "
                                  f"replace it in the exporter or decompose it into supported ops") from error


def _where(importer: _Importer, proto: onnx.ModelProto) -> str:
    """The node being converted when the import failed, as errors name it."""
    node = importer.node
    if node is None:
        return "the graph"
    index = next((index for index, other in enumerate(proto.graph.node) if other == node), -1)
    return describe_node(node, index)


def _end_open_blocks(builder: relax.BlockBuilder) -> None:
    """End the blocks a failed import left open (TVM warns on stderr about each builder destroyed so)."""
    with contextlib.suppress(tvm.error.InternalError):
        while True:
            builder._end_block()
