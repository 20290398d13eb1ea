"""What tvmsched's converters share: reading attributes, dtypes, static shapes and build-time constant inputs,
and refusing an attribute or input they cannot convert correctly."""

from __future__ import annotations

import numpy as np
import tvm
from onnx import helper
from tvm import relax

from tvmsched.errors import UnsupportedOperator


def text_attribute(attr: dict, name: str, default: str) -> str:
    """A string attribute (TVM's importer hands them over as bytes)."""
    value = attr.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def dtype_of(expr: relax.Expr) -> str:
    return str(expr.ty.dtype)


def onnx_dtype(element_type: int) -> str:
    """The dtype name of an ONNX TensorProto element type (the `to`/`dtype` attributes)."""
    return str(np.dtype(helper.tensor_dtype_to_np_dtype(element_type)))


def static_shape(expr: relax.Expr) -> tuple[int, ...]:
    """The shape of a tensor whose dims are all known (tvmsched binds every input shape)."""
    dims = expr.ty.shape.values
    if not all(isinstance(dim, tvm.tirx.IntImm) for dim in dims):
        raise UnsupportedOperator(f"the shape {list(dims)} is not static; tvmsched compiles tensor programs "
                                  f"with static shapes")
    return tuple(int(dim) for dim in dims)


def constant_value(expr: relax.Expr | None) -> np.ndarray | None:
    """The value of a constant input (an initializer, a Constant, a folded shape), else None."""
    if isinstance(expr, tvm.ir.GenericConst):
        return expr.value.numpy()
    if isinstance(expr, relax.ShapeExpr) and all(isinstance(dim, tvm.tirx.IntImm) for dim in expr.values):
        return np.array([int(dim) for dim in expr.values], "int64")
    return None


def required_constant(expr: relax.Expr, what: str) -> np.ndarray:
    """The value of an input the conversion needs when the model is built, or a refusal saying so."""
    value = constant_value(expr)
    if value is None:
        raise UnsupportedOperator(f"{what} must be known when the model is built (an initializer or a "
                                  f"Constant), but it is computed at run time; make it a constant in the "
                                  f"exporter")
    return value


def refuse(what: str, why: str) -> UnsupportedOperator:
    """The error for an attribute or input value the converter cannot convert correctly."""
    return UnsupportedOperator(f"{what} is not supported: {why}")


def take(value: relax.Expr, indices, axis: int) -> relax.Expr:
    """`value` at constant `indices` (an int drops the axis) of `axis`; TVM's default mode warns on each."""
    return relax.op.take(value, relax.const(np.asarray(indices, "int64")), axis, mode="clip")


def constant(value, dtype: str) -> relax.Constant:
    return relax.const(np.asarray(value).astype(dtype), dtype)


def cast(bb: relax.BlockBuilder, expr: relax.Expr, dtype: str) -> relax.Expr:
    """`expr` as `dtype`, typed."""
    expr = bb.normalize(expr)
    return expr if dtype_of(expr) == dtype else bb.normalize(relax.op.astype(expr, dtype))


def normalize_axis(axis: int, rank: int, name: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise refuse(f"{name}={axis}", f"out of range for an input of rank {rank}")
    return axis % rank


def requested_outputs(attr: dict) -> int:
    """How many outputs the node lists (trailing optional outputs it does not use are not listed)."""
    return attr["tvm_custom"]["num_outputs"]
