"""What the converter families share: the static shapes and dtypes of Relax expressions (tvmsched binds
every input shape before importing), attribute decoding, and the outputs a node asks for."""

from __future__ import annotations

import numpy as np
from onnx import helper
from tvm import relax

from tvmsched.errors import UnsupportedOperator


def dtype_of(expr: relax.Expr) -> str:
    return str(expr.ty.dtype)


def shape_of(expr: relax.Expr) -> tuple[int, ...]:
    """The static shape of a tensor expression."""
    return tuple(int(dim) for dim in expr.ty.shape.values)


def constant(value, dtype: str) -> relax.Constant:
    return relax.const(np.asarray(value).astype(dtype), dtype)


def cast(bb: relax.BlockBuilder, expr: relax.Expr, dtype: str) -> relax.Expr:
    """`expr` as `dtype`, typed."""
    expr = bb.normalize(expr)
    return expr if dtype_of(expr) == dtype else bb.normalize(relax.op.astype(expr, dtype))


def normalize_axis(axis: int, rank: int, name: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise UnsupportedOperator(f"{name}={axis} is out of range for an input of rank {rank}; export the "
                                  f"model with an axis in [{-rank}, {rank - 1}]")
    return axis % rank


def string_attribute(attr: dict, name: str, default: str) -> str:
    value = attr.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def tensor_dtype(attr: dict, name: str, default: str) -> str:
    """The dtype an attribute names by its ONNX element type (`stash_type`, `softmax_precision`)."""
    if name not in attr:
        return default
    return np.dtype(helper.tensor_dtype_to_np_dtype(attr[name])).name


def requested_outputs(attr: dict) -> int:
    """How many outputs the node lists (trailing optional outputs it does not use are not listed)."""
    return attr["tvm_custom"]["num_outputs"]
