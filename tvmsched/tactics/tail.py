"""Split tactics: a vendor plan computes a kernel's anchor and the per-channel ops right after it, TVM's
function the rest of its epilogue.

The libraries fuse few epilogues: cuDNN's fp32 graphs take a convolution with a bias and a relu but decline
a residual add, a sigmoid or SiLU; cuBLASLt's GELU is the tanh approximation, not ONNX's erf. Such a kernel
ran wholly in TVM. Split, the plan writes its part (the *head*: the anchor, then the leading bias, casts
and per-channel constant ops, which `tactics.affine` folds) into the kernel's intermediate tensor, a tensor
of the kernel that the memory plan places like its workspace, and the kernel's *tail*, its remaining
epilogue ops compiled by TVM as one element-wise function beside the kernels (`<symbol>_tail`), reads it
and writes the kernel's output. Both are issued on the kernel's stream, so both are captured into the CUDA
graph; selection times the pair as one implementation, beside TVM's kernel and the library's whole plans.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import tvm
from tvm import te, tirx

from tvmsched.tactics.library import Tactic, installed
from tvmsched.tactics.vendor_op import EpilogueOp, VendorOp
from tvmsched.target import on_gpu

if TYPE_CHECKING:
    from tvmsched.graph import Kernel, KernelGraph
    from tvmsched.target import TargetSpec

HEAD = ("bias", "subtract", "multiply", "divide")  # with a per-channel operand; casts too
FUSED_EVERYWHERE = (("relu",),)  # tails not worth a split: every library fuses them with a bias


def split_point(vendor_op: VendorOp) -> int | None:
    """How many epilogue ops a split's plan computes: the leading casts and per-channel ops; None where no
    tail would be left, or only one that every library fuses (a relu)."""
    head = 0
    for op in vendor_op.epilogue:
        if not (op.kind == "cast" or (op.kind in HEAD and op.axis is not None)):
            break
        head += 1
    tail = tuple(op.kind for op in vendor_op.epilogue[head:])
    return None if not tail or tail in FUSED_EVERYWHERE else head


def tail_symbol(symbol: str) -> str:
    """The name of kernel `symbol`'s tail function in the library."""
    return f"{symbol}_tail"


def wanted(kernels: str, spec: TargetSpec) -> bool:
    """Whether a build for `spec` choosing implementations by `kernels` compiles tails: where selection runs
    (a CUDA target with its GPU here) and may choose a library."""
    return kernels != "tvm" and on_gpu(spec) and bool(installed())


def workspace(kernel: Kernel, tactic: Tactic) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of the tensors `tactic` needs beside `kernel`'s parameters, in the order its launcher
    takes them: the plan's workspace bytes, where it needs any, then a split's head value."""
    shapes = [((tactic.workspace,), "uint8")] if tactic.workspace else []
    if tactic.split is not None:
        shapes.append((kernel.outputs[0].shape, kernel.vendor_op.head(tactic.split).out_dtype))
    return shapes


def with_tails(module: tvm.IRModule, graph: KernelGraph) -> tvm.IRModule:
    """`module` (the kernels) with the tail function of every kernel of `graph` that has a split."""
    tails = {tail_symbol(kernel.symbol): (kernel, split) for kernel in graph.kernels
             if kernel.vendor_op is not None and (split := split_point(kernel.vendor_op)) is not None}
    functions = dict(module.functions)
    for symbol, (kernel, split) in tails.items():
        functions[tvm.ir.GlobalVar(symbol)] = tail_function(kernel, split).with_attr("global_symbol", symbol)
    return tvm.IRModule(functions, attrs=module.attrs)


def tail_function(kernel: Kernel, split: int) -> tvm.tirx.PrimFunc:
    """The epilogue of `kernel` after its first `split` ops, as one element-wise function called as
    `tail(head value, *inputs, *outputs)`."""
    vendor_op = kernel.vendor_op
    shape = kernel.outputs[0].shape
    value = te.placeholder(shape, vendor_op.head(split).out_dtype, "head")
    inputs = [te.placeholder(tensor.shape, tensor.dtype, f"input{index}")
              for index, tensor in enumerate(kernel.inputs)]

    def element(*index):
        x = value(*index)
        for op in vendor_op.epilogue[split:]:
            operand = None if op.operand is None else _broadcast(inputs[op.operand], index)
            x = _apply(op, x, operand)
        return x
    output = te.compute(shape, element, "tail")
    return te.create_prim_func([value, *inputs, output])


def _broadcast(tensor: te.Tensor, index) -> tirx.PrimExpr:
    """`tensor` read at output `index`, its dimensions aligned right and those of size 1 broadcast."""
    offset = len(index) - len(tensor.shape)
    return tensor(*(0 if int(size) == 1 else index[offset + axis] for axis, size in enumerate(tensor.shape)))


def _apply(op: EpilogueOp, x: tirx.PrimExpr, operand: tirx.PrimExpr | None) -> tirx.PrimExpr:
    """Epilogue op `op` on `x` (and its operand), as TVM's legalization of the Relax op computes it."""
    dtype = op.dtype

    def constant(number: float) -> tirx.PrimExpr:
        return tirx.const(number, dtype)
    if op.kind in ("bias", "residual"):
        return x + operand
    if op.kind == "subtract":
        return x - operand
    if op.kind == "multiply":
        return x * operand
    if op.kind == "divide":
        return x / operand
    if op.kind == "relu":
        return tirx.max(x, constant(0))
    if op.kind == "clip":
        low, high = op.bounds
        x = x if low is None else tirx.max(x, constant(low))
        return x if high is None else tirx.min(x, constant(high))
    if op.kind == "sigmoid":
        return tirx.sigmoid(x)
    if op.kind == "silu":
        return x * tirx.sigmoid(x)
    if op.kind == "gelu":
        return (_erf(x / constant(math.sqrt(2)), dtype) + constant(1)) * x * constant(0.5)
    if op.kind == "cast":
        return x.astype(dtype)
    raise ValueError(f"no tail for epilogue op '{op.kind}'")


def _erf(x: tirx.PrimExpr, dtype: str) -> tirx.PrimExpr:
    """erf of `x` (of `dtype`) as TVM legalizes it: a float16 argument in float32."""
    if dtype != "float16":
        return tirx.erf(x)
    return tirx.erf(x.astype("float32")).astype("float16")
