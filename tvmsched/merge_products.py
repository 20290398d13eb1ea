"""IOS-Merge of matrix products: the products of one left operand by constant right operands (a MatMul's
weight, a Gemm's transposed or not) become one product by the right operands concatenated along their
columns, with the epilogue steps every member shares (bias adds, activations: `tvmsched.epilogues`), each
original result after them a slice of the merged one on the last axis (`merge.merge_groups`, as for
convolutions). A slice fuses with the reshape and transpose that follow it (BERT's query, key and value
projections split into heads).

Relax's own `CombineParallelMatmul` is not used: its pattern matching finds, per number of branches, the
groups of the first left operand only (with a group of three products before two Gemms of another input,
it merged the three and never offered the two), and it ends each merged product with a `split`, a kernel of
its own copying the whole result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from tvmsched.lower import is_op
from tvmsched.merge import Member, found_groups, keyed, merge_groups


@dataclass(frozen=True)
class Product(Member):
    """A mergeable `matmul`, its weight the constant right operand (K, N)."""

    @property
    def channels(self) -> int:
        return self.weight.shape[1]

    @property
    def key(self) -> tuple:
        """What products merged together must share."""
        return (self.call.args[0].__chandle__(), str(self.call.attrs.out_dtype), str(self.weight.dtype))


def matmul_groups(module: tvm.IRModule) -> list[list[Product]]:
    """The groups of products of `main` that `merge_matmuls` would merge, in its order."""
    return found_groups(module, _block_groups)


def merge_matmuls(module: tvm.IRModule, keep: Callable[[int], bool] = lambda index: True
                  ) -> tuple[tvm.IRModule, tuple[int, ...]]:
    """`module` with the products of `main` by constants that share a left operand merged, those of the
    groups whose index (in `matmul_groups`' order) `keep` accepts, and the size of each group merged."""
    return merge_groups(module, _block_groups, _merged_product, keep)


def _block_groups(block, values: dict) -> list[list[Product]]:
    """The groups of mergeable products of `block`, each of two or more, in program order."""
    return [group for group in keyed(block, values, _mergeable) if len(group) > 1]


def _mergeable(binding, values: dict) -> Product | None:
    """The binding as a `Product` if it multiplies a tensor by a constant matrix (or one transposed)."""
    call = binding.value
    if not (isinstance(binding, relax.VarBinding) and is_op(call, "relax.matmul")
            and isinstance(call.args[0], relax.Var)):
        return None
    weight = _constant_matrix(call.args[1], values)
    return None if weight is None else Product(binding.var, call, weight)


def _constant_matrix(expr, values: dict) -> np.ndarray | None:
    """The value of `expr` if it is a constant matrix or the transpose of one (through variables)."""
    if isinstance(expr, relax.Var):
        expr = values.get(expr.__chandle__())
    if is_op(expr, "relax.permute_dims"):
        matrix = _constant_matrix(expr.args[0], values)
        axes = None if expr.attrs.axes is None else [int(axis) for axis in expr.attrs.axes]
        return None if matrix is None else np.transpose(matrix, axes)
    if isinstance(expr, tvm.ir.Constant) and len(expr.value.shape) == 2:
        return expr.value.numpy()
    return None


def _merged_product(group: list[Product]) -> tuple[relax.Call, int]:
    """The product of the group's left operand by its members' matrices side by side, and how far its
    channel axis is from the right (the last: 1)."""
    weights = np.concatenate([product.weight for product in group], axis=1)
    return relax.op.matmul(group[0].call.args[0], relax.const(weights),
                           out_dtype=group[0].call.attrs.out_dtype), 1
