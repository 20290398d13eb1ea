"""Relax passes that turn an imported model into one `call_tir` per fused kernel.

The sequence is TVM's "zero" pipeline spelled out, so that the operators inside each fused kernel can be
recorded between FuseOps and FuseTIR (they name the kernel's `op_kinds`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import tvm
from tvm import relax


@dataclass(frozen=True)
class LoweredModule:
    """A Relax module whose `main` calls only PrimFuncs, and the operators fused into each PrimFunc."""

    module: tvm.IRModule
    op_kinds: dict[str, tuple[str, ...]]


def lower(module: tvm.IRModule) -> LoweredModule:
    """Legalize, fold constants and fuse `module`; every PrimFunc gets its global symbol."""
    module = relax.transform.DecomposeOpsForInference()(module)
    module = tvm.transform.Sequential([
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
    ])(module)
    op_kinds = _fused_op_kinds(module)
    module = tvm.transform.Sequential([
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
        relax.transform.AttachGlobalSymbol(),
    ])(module)
    for global_var, function in module.functions.items():
        if isinstance(function, tvm.tirx.PrimFunc) and global_var.name_hint not in op_kinds:
            op_kinds[global_var.name_hint] = (_op_name(global_var.name_hint),)
    return LoweredModule(module, op_kinds)


def kernel_module(lowered: LoweredModule) -> tvm.IRModule:
    """The PrimFuncs of a lowered module alone: what gets compiled into the kernel library."""
    return tvm.IRModule({global_var: function for global_var, function in lowered.module.functions.items()
                         if isinstance(function, tvm.tirx.PrimFunc)})


def is_call_tir(expr) -> bool:
    """Whether `expr` is `R.call_tir(primfunc, args, ...)`."""
    return (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name == "relax.call_tir")


def _fused_op_kinds(module: tvm.IRModule) -> dict[str, tuple[str, ...]]:
    """For each fused Relax function (named like the PrimFunc FuseTIR makes of it), its operators."""
    kinds = {}
    for global_var, function in module.functions.items():
        if isinstance(function, relax.Function) and function.attrs and "Primitive" in function.attrs:
            kinds[global_var.name_hint] = tuple(_op_name(name) for name in _callees(function))
    return kinds


def _callees(function: relax.Function) -> list[str]:
    """The PrimFuncs a Relax function calls with call_tir, in order."""
    callees = []

    def visit(expr) -> None:
        if is_call_tir(expr):
            callees.append(expr.args[0].name_hint)

    relax.analysis.post_order_visit(function.body, visit)
    return callees


def _op_name(symbol: str) -> str:
    """`conv2d3` → `conv2d`: legalized PrimFuncs are named after their operator plus a dedup suffix."""
    return re.sub(r"(?<=[a-z_])\d+$", "", symbol)
