"""Shape folding: once the inputs' shapes are bound (and the constant inputs' values given), an ONNX graph's
shape computations (Shape → Gather → Concat → Reshape, Size, ConstantOfShape, Range, ...) are constants.
This stage evaluates them before the import, with onnxscript's constant folder (the one PyTorch's ONNX
exporter uses: docs/DESIGN.md says why this one), so that TVM's importer sees constant shapes.

The folder works on a light copy of the graph: weights over `WEIGHT_LIMIT` elements are declared to it as
inputs of known shape and never copied (they cannot decide a shape), and the file's own shape annotations
are left out, since the folder prefers an annotated dim to an inferred one (a model exported at batch 1
and bound to batch 16 would fold its reshapes for batch 1). The folded graph refers to those weights by
name; `FoldedModel.weights` are the original model's own tensors, which the importer reads in place.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tvmsched.errors import ConstantInputRequired, ShapeBindingError

WEIGHT_LIMIT = 8192  # elements; as onnxscript's own limit on the inputs of a node it folds
_REDUCE_OPS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
               "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
# The inputs of each op whose value decides an output shape, an axis or a branch (or that TVM's converter
# reads as a constant): with static shapes they must be constants once the graph is folded.
VALUE_INPUTS: dict[str, tuple[int, ...]] = {
    "AffineGrid": (1,), "CenterCropPad": (1,), "Col2Im": (1, 2), "ConstantOfShape": (0,), "CumProd": (1,),
    "CumSum": (1,), "Expand": (1,), "If": (0,), "OneHot": (1,), "Pad": (1, 2, 3), "Range": (0, 1, 2),
    "Reshape": (1,), "Resize": (1, 2, 3), "Slice": (1, 2, 3, 4), "Split": (1,), "Squeeze": (1,), "Tile": (1,),
    "TopK": (1,), "Trilu": (1,), "Unsqueeze": (1,), "Upsample": (1,), **{op: (1,) for op in _REDUCE_OPS}}


@dataclass(frozen=True)
class FoldedModel:
    """A graph whose shape computations are constants, and the large weights it refers to by name."""

    proto: onnx.ModelProto
    weights: tuple[onnx.TensorProto, ...]


def fold_shapes(proto: onnx.ModelProto, shapes: dict[str, tuple[int, ...]],
                constants: dict[str, np.ndarray]) -> FoldedModel:
    """Fold `proto` with its inputs bound to `shapes` and the inputs named in `constants` bound to those
    values (they become initializers: no longer inputs of the folded graph)."""
    import onnx_ir
    from onnxscript import optimizer

    tensors = [*proto.graph.initializer,
               *(numpy_helper.from_array(value, name) for name, value in constants.items())]
    weights = tuple(tensor for tensor in tensors if _elements(tensor) > WEIGHT_LIMIT)
    small = [tensor for tensor in tensors if _elements(tensor) <= WEIGHT_LIMIT]
    model = onnx_ir.from_proto(_light_copy(proto, shapes, small, weights))
    try:
        with _quiet():
            optimizer.fold_constants(model, onnx_shape_inference=True, should_fold=_fold_small_fills)
            optimizer.remove_unused_nodes(model)
        _tensor_constants(model)
    except Exception as error:  # the folder wraps what an op's evaluation raised
        cause = error.__cause__ or error
        raise ShapeBindingError(f"folding the model's shape computations failed: {error} ({cause}); check "
                                f"that the bound input shapes fit the model") from error
    folded = onnx_ir.to_proto(model)
    names = {tensor.name for tensor in weights}
    inputs = [value for value in folded.graph.input if value.name not in names]
    del folded.graph.input[:]
    folded.graph.input.extend(inputs)
    return FoldedModel(folded, weights)


def check_value_inputs(model: FoldedModel) -> None:
    """Refuse a graph in which a graph input's value decides a shape (`VALUE_INPUTS`): name the first node
    that needs one, and every graph input whose value such nodes need, with the fix."""
    graph = model.proto.graph
    producers = {output: node for node in graph.node for output in node.output}
    graph_inputs = {value.name for value in graph.input}
    found = []
    for index, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx"):
            continue
        for position in VALUE_INPUTS.get(node.op_type, ()):
            name = node.input[position] if position < len(node.input) else ""
            sources = _value_sources(name, producers, graph_inputs) if name else []
            if sources:
                found.append((index, node, name, sources))
    if not found:
        return
    from tvmsched.importer import describe_node

    index, node, name, _ = found[0]
    inputs = tuple(dict.fromkeys(source for *_, sources in found for source in sources))
    raise ConstantInputRequired(
        f"{describe_node(node, index)} needs the value of its input '{name}' when the model is built (it "
        f"decides a shape, an axis or a branch), but {_values_of(inputs)} only known at run time; "
        f"{bind_values_fix(inputs)}", inputs)


def bind_values_fix(inputs: tuple[str, ...]) -> str:
    """The fix for graph inputs whose values decide a shape: bind them when the model is built."""
    flags = " ".join(f"--constant-input {name}=FILE.npy" for name in inputs)
    return f"bind {'them' if len(inputs) > 1 else 'it'} with {flags} (constant_inputs= in Python)"


def _values_of(inputs: tuple[str, ...]) -> str:
    names = ", ".join(f"'{name}'" for name in inputs)
    return f"the values of graph inputs {names} are" if len(inputs) > 1 else f"graph input {names} is"


def _value_sources(name: str, producers: dict[str, onnx.NodeProto], graph_inputs: set[str]) -> list[str]:
    """The graph inputs whose values the value `name` is computed from (not through Shape or Size, which
    read a shape only: those that are left read a shape only known at run time)."""
    sources, seen, pending = [], set(), [name]
    while pending:
        current = pending.pop()
        if current in seen or not current:
            continue
        seen.add(current)
        if current in graph_inputs:
            sources.append(current)
        elif current in producers and producers[current].op_type not in ("Shape", "Size"):
            pending.extend(producers[current].input)
    return sorted(sources)


def _tensor_constants(model) -> None:
    """Give every Constant node its value as a `value` tensor, the only form TVM's importer reads (the
    folder writes `value_ints`; exporters write `value_float` and the like). The folder has set each
    Constant's output `const_value`."""
    import onnx_ir

    for node in onnx_ir.traversal.RecursiveGraphIterator(model.graph):
        value = node.outputs[0].const_value if node.op_type == "Constant" else None
        if value is not None and "value" not in node.attributes:
            node.attributes.clear()
            node.attributes["value"] = onnx_ir.AttrTensor("value", value)


def _light_copy(proto: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], initializers: list,
                weights: tuple[onnx.TensorProto, ...]) -> onnx.ModelProto:
    """The model with `initializers` only, its large `weights` declared as inputs, no shape annotations,
    and its inputs bound to `shapes`."""
    dtypes = {value.name: value.type.tensor_type.elem_type for value in proto.graph.input}
    inputs = [helper.make_tensor_value_info(name, dtypes[name], shape) for name, shape in shapes.items()]
    inputs += [helper.make_tensor_value_info(weight.name, weight.data_type, weight.dims)
               for weight in weights]
    outputs = [_unshaped(value) for value in proto.graph.output]
    graph = helper.make_graph(list(proto.graph.node), proto.graph.name, inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=list(proto.opset_import), ir_version=proto.ir_version,
                             functions=list(proto.functions))


def _unshaped(value: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    """`value` with its type only: an output's annotated dims may be those of another batch."""
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value)
    if copy.type.HasField("tensor_type"):
        copy.type.tensor_type.ClearField("shape")
    return copy


def _fold_small_fills(node) -> bool | None:
    """onnxscript keeps every ConstantOfShape (to keep files small); a shape computation made of one
    (torch's expand(-1) is Where(Equal(shape, ConstantOfShape(...) * -1), ...)) must fold too. Its output
    size limit still applies. None: onnxscript's default rules."""
    return True if node.op_type == "ConstantOfShape" and node.domain in ("", "ai.onnx") else None


def _elements(tensor: onnx.TensorProto) -> int:
    return int(np.prod(tensor.dims, dtype=np.int64))


@contextlib.contextmanager
def _quiet():
    """onnxscript logs a warning for each node the reference evaluator cannot evaluate (the node stays)."""
    logger = logging.getLogger("onnxscript")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
