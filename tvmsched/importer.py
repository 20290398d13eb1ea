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
from tvmsched.lower import is_static


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
        self.graph: onnx.GraphProto | None = None
        self.weights = weights

    def _parse_graph_initializers(self, graph) -> None:
        super()._parse_graph_initializers(graph)
        for tensor in self.weights:
            self._nodes[tensor.name] = relax.const(self._parse_array(tensor))

    def from_onnx(self, graph: onnx.GraphProto, opset: int) -> tvm.IRModule:
        self.graph = graph
        return super().from_onnx(graph, opset)

    def where(self) -> str:
        """The node being converted, as errors name it, or 'the graph' before the first."""
        if self.node is None:
            return "the graph"
        return describe_node(self.node, next(
            (index for index, other in enumerate(self.graph.node) if other == self.node), -1))

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
                raise UnsupportedOperator(f"{self.where()} (opset {opset}): {error}") from error
            expr = self.bb.normalize(expr) if isinstance(expr, relax.Expr) else expr
        self._check_static(expr, opset)
        return expr

    def _check_static(self, expr, opset: int) -> None:
        """Refuse, naming the node, an output whose shape is known only at run time (a Range to a computed
        limit, a Reshape to a computed shape): the kernel graph could not be built from it."""
        fields = expr.ty.fields if isinstance(getattr(expr, "ty", None), relax.TupleType) else [
            getattr(expr, "ty", None)]
        for ty in fields:
            if isinstance(ty, relax.TensorType) and not is_static(ty):
                shape = "of unknown rank" if ty.shape is None else f"{list(ty.shape.values)}"
                raise UnsupportedOperator(
                    f"{self.where()} (opset {opset}): its output shape {shape} depends on values computed at "
                    f"run time, and tvmsched compiles tensor programs with static shapes; make those values "
                    f"constants in the exporter")


def import_model(model: FoldedModel, shapes: dict[str, list[int]], dtypes: dict[str, str],
                 opset: int) -> tvm.IRModule:
    """The Relax module of `model` with its inputs bound to `shapes` and `dtypes`, weights as constants."""
    proto = model.proto
    importer = _Importer(shapes, dtypes, keep_params_in_input=False, weights=model.weights)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # TVM prints each failing node's inputs
            return importer.from_onnx(proto.graph, opset)
    except TvmschedError:
        _end_open_blocks(importer.bb)
        raise
    except Exception as error:  # the importer raises TVMError, ValueError, AssertionError, KeyError, ...
        _end_open_blocks(importer.bb)
        text = str(error).strip()
        message = text.splitlines()[-1] if text else type(error).__name__
        raise UnsupportedOperator(f"{importer.where()} (opset {opset}) cannot be imported: {message}; "
                                  f"replace it in the exporter or decompose it into supported ops") from error


def _end_open_blocks(builder: relax.BlockBuilder) -> None:
    """End the blocks a failed import left open (TVM warns on stderr about each builder destroyed so)."""
    with contextlib.suppress(tvm.error.InternalError):
        while True:
            builder._end_block()
