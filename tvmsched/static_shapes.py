"""Refusing, at import, an ONNX node whose output shape is not static: the kernel graph holds static shapes.

With every input shape bound, such a shape depends on values: on the input data (NonZero, Unique, NMS), on
the value of an integer graph input (a Reshape, Slice or Tile whose shape, starts or repeats are inputs), or
on other shapes that TVM's importer left unfolded. The refusal names the node and says which, with the fix.
"""

from __future__ import annotations

import onnx
import tvm
from tvm import relax

# Ops whose output shape depends on their input data by definition, whatever shape the converter gives
# them (TVM's NonMaxSuppression pads its output to the most boxes it could select): what it counts, and
# the inputs that decide it.
DATA_DEPENDENT = {"NonMaxSuppression": ("the number of boxes it selects", (0, 1, 2, 3, 4)),
                  "NonZero": ("the number of nonzero elements", (0,)),
                  "Unique": ("the number of distinct values", (0,)),
                  "Compress": ("the number of true conditions", (1,))}
# Ops whose output shape is set by the values of operands that need not be integers: those operands.
SHAPE_OPERANDS = {"Range": (0, 1, 2), "Resize": (2, 3), "Upsample": (1,)}
STATIC_SOURCES = ("Shape", "Size")  # their values are shapes, static once the inputs are bound


def dynamic_shape_problem(node: onnx.NodeProto, expr, graph: onnx.GraphProto, values: dict,
                          graph_inputs: list[str]) -> str | None:
    """Why `expr`, the conversion of `node`, has no static shape, and the fix; None if its shape is static.
    `values`: the converted tensors by ONNX name; `graph_inputs`: the graph's input names."""
    if not (isinstance(expr, relax.Expr) and (_dynamic(expr.ty) or node.op_type in DATA_DEPENDENT
                                              and not isinstance(expr, tvm.ir.Constant))):
        return None
    inputs, data = _shape_sources(node, graph, values, graph_inputs)
    if data:
        counted = f" ({DATA_DEPENDENT[node.op_type][0]})" if node.op_type in DATA_DEPENDENT else ""
        reason, fix = (f"depends on its input data{counted}", "replace it in the exporter (e.g. by a "
                       "fixed-size variant) or compute it outside the model")
    elif inputs:
        whose = "the value of graph input" if len(inputs) == 1 else "the values of graph inputs"
        reason, fix = f"depends on {whose} {_names(inputs)}", constant_input_advice(inputs)
    else:
        reason, fix = ("is computed from constants and other shapes only, but TVM's importer did not fold "
                       "it", "fold those computations into constants first (e.g. with onnxsim)")
    return f"its output shape {reason}, and tvmsched compiles static shapes only; {fix}"


def constant_input_advice(inputs: list[str]) -> str:
    """The fix for a shape computed from the values of graph inputs: bind those values at build time."""
    flags = " ".join(f"--constant-input {name}=FILE.npy" for name in inputs)
    return f"bind {'its value' if len(inputs) == 1 else 'their values'} at build time ({flags})"


def _shape_sources(node: onnx.NodeProto, graph: onnx.GraphProto, values: dict, graph_inputs: list[str]
                   ) -> tuple[list[str], bool]:
    """What `node`'s output shape is computed from: the graph inputs whose values reach it through integer
    or boolean tensors (shapes, indices, counts, masks) or as its shape operands (`SHAPE_OPERANDS`), and
    whether other data does (a tensor of another dtype, such as a data-dependent op's data). Constants and
    shapes are known when compiling."""
    producers = {output: other for other in graph.node for output in other.output}
    operands = {**{op: indices for op, (_, indices) in DATA_DEPENDENT.items()}, **SHAPE_OPERANDS}
    if node.op_type in operands:
        starts = [node.input[index] for index in operands[node.op_type] if index < len(node.input)]
    else:
        starts = [name for name in node.input if _integral(values.get(name))]
    shape_operands = set(starts) if node.op_type in SHAPE_OPERANDS else set()
    inputs, data, seen, pending = set(), False, set(), list(starts)
    while pending:
        name = pending.pop()
        value = values.get(name)
        if not name or name in seen or _known(value):
            continue
        seen.add(name)
        producer = producers.get(name)
        if not (_integral(value) or name in shape_operands):
            data = True
        elif name in graph_inputs:
            inputs.add(name)
        elif producer is not None and producer.op_type not in STATIC_SOURCES:
            pending += list(producer.input)
    return sorted(inputs), data


def _known(value) -> bool:
    """Whether a converted tensor's values are known when compiling: a constant, or a static shape."""
    return isinstance(value, tvm.ir.Constant) or (isinstance(getattr(value, "ty", None), relax.ShapeType)
                                                   and not _dynamic(value.ty))


def _dynamic(ty) -> bool:
    """Whether a converted value's type (a tensor, a shape, or a tuple of them) has a non-static shape."""
    if isinstance(ty, relax.TupleType):
        return any(_dynamic(field) for field in ty.fields)
    if isinstance(ty, relax.TensorType):
        return not isinstance(ty.shape, relax.ShapeExpr) or _symbolic(ty.shape.values)
    if isinstance(ty, relax.ShapeType):
        return ty.values is None or _symbolic(ty.values)
    return False


def _symbolic(dims) -> bool:
    return not all(isinstance(dim, tvm.tirx.IntImm) for dim in dims)


def _integral(value) -> bool:
    """Whether a converted value is a shape or an integer or boolean tensor."""
    ty = getattr(value, "ty", None)
    return isinstance(ty, relax.ShapeType) or (isinstance(ty, relax.TensorType) and (
        str(ty.dtype) == "bool" or str(ty.dtype).startswith(("int", "uint"))))


def _names(inputs: list[str]) -> str:
    return ", ".join(f"'{name}'" for name in inputs)
