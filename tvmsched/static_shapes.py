"""Refusing, at import, an ONNX node whose output shape is not static: the kernel graph holds static shapes.

With every input shape bound and the shape computations folded (`fold`), such a shape depends on values:
on the input data (NonZero, Unique, NMS), on the value of an integer graph input (a mask, a count), or on
constants and shapes left unfolded. The refusal names the node and says which, with the fix; `fold`
refuses before the import the graph inputs that ops read as shapes or axes (`VALUE_INPUTS`).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
import tvm
from tvm import relax

from tvmsched.errors import ConstantInputRequired, UnsupportedOperator
from tvmsched.fold import VALUE_INPUTS, bind_values_fix
from tvmsched.lower import is_static

# Ops whose output shape depends on their input data by definition, with what it counts: static only where
# the data are constants (tvmsched's NonZero and Compress then compute or gather them). TVM's
# NonMaxSuppression pads its output to the most boxes it could select: static, yet not ONNX's.
DATA_DEPENDENT = {"NonMaxSuppression": "the number of boxes it selects",
                  "NonZero": "the number of nonzero elements", "Unique": "the number of distinct values",
                  "Compress": "the number of true conditions"}
PADDED = ("NonMaxSuppression",)
STATIC_SOURCES = ("Shape", "Size")  # their values are shapes, static once the inputs are bound


def check_static_output(node: onnx.NodeProto, expr, graph: onnx.GraphProto, values: dict,
                        graph_inputs: list[str], where: Callable[[], str]) -> None:
    """Refuse `expr`, the conversion of `node`, if its shape is not static: ConstantInputRequired where
    binding graph inputs' values would make it static, else UnsupportedOperator. `values`: the converted
    tensors by ONNX name; `graph_inputs`: the graph's input names; `where()`: how errors name the node."""
    if not (isinstance(expr, relax.Expr) and (_dynamic(expr.ty) or node.op_type in PADDED
                                              and not isinstance(expr, tvm.ir.Constant))):
        return
    inputs, data = _shape_sources(node, graph, values, graph_inputs)
    static_only = "and tvmsched compiles static shapes only"
    if inputs and not data:
        whose = "the value of graph input" if len(inputs) == 1 else "the values of graph inputs"
        raise ConstantInputRequired(f"{where()}: its output shape depends on {whose} {_names(inputs)}, "
                                    f"{static_only}; {bind_values_fix(tuple(inputs))}", tuple(inputs))
    if data:
        counted = f" ({DATA_DEPENDENT[node.op_type]})" if node.op_type in DATA_DEPENDENT else ""
        reason, fix = (f"depends on its input data{counted}", "replace it in the exporter (e.g. by a "
                       "fixed-size variant) or compute it outside the model")
    else:
        reason, fix = ("is computed from constants and other shapes only, but they were not folded",
                       "fold those computations into constants first (e.g. with onnxsim)")
    raise UnsupportedOperator(f"{where()}: its output shape {reason}, {static_only}; {fix}")


def _shape_sources(node: onnx.NodeProto, graph: onnx.GraphProto, values: dict, graph_inputs: list[str]
                   ) -> tuple[list[str], bool]:
    """What `node`'s output shape is computed from: the graph inputs whose values reach it through integer
    or boolean tensors (shapes, indices, counts, masks) or as its value inputs (`fold.VALUE_INPUTS`, such as
    a Range's float bounds), and whether other data does (a tensor of another dtype, such as a
    data-dependent op's data: all its inputs count). Constants and shapes are known when compiling."""
    producers = {output: other for other in graph.node for output in other.output}
    if node.op_type in DATA_DEPENDENT:
        starts = list(node.input)
    elif node.op_type in VALUE_INPUTS:
        starts = [node.input[index] for index in VALUE_INPUTS[node.op_type] if index < len(node.input)]
    else:
        starts = [name for name in node.input if _integral(values.get(name))]
    shape_operands = set(starts) if node.op_type in VALUE_INPUTS else set()
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
        return not is_static(ty)
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
