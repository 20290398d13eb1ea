"""Window kernels: one reduction over a small window per output, pools and depthwise convolutions.

dlight's reduction rules schedule them as reductions, a group of threads per output, which suits a long
reduction (a softmax's row) and not a window of 9 to 64 elements: on the CPU they ran 3-20x slower than
the plain loops. The CPU's `window` rule and the GPU's rule order (`codegen.schedule_candidates`) give
them a thread per output instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm import s_tir
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr, get_root_block, get_sblock_info

WINDOW = 64  # reduction elements per output at most


@dataclass(frozen=True)
class Window:
    """The reduction block of a window kernel, with its index among the root's blocks, its number of
    spatial loops (the reduction loops follow them) and of tensors read."""

    block: s_tir.schedule.SBlockRV
    index: int
    spatial: int
    reads: int


def find_window(sch: s_tir.Schedule) -> Window | None:
    """The window reduction of the kernel `sch` schedules: its one reduction block reads one tensor, or
    two of which one slides (`_slides`: a depthwise convolution's data, and its weights), at most WINDOW
    elements per output; None for any other kernel."""
    blocks = sch.get_child_blocks(get_root_block(sch))
    kinds = [get_sblock_info(sch, block).dom_kind() for block in blocks]
    reductions = [index for index, kind in enumerate(kinds) if "R" in kind]
    if len(reductions) != 1:
        return None
    index = reductions[0]
    block, kind = blocks[index], kinds[index]
    stmt, loops = sch.get(block), sch.get_loops(block)
    reads = [read for read in stmt.reads if not read.source.same_as(stmt.writes[0].source)]
    spatial = len(kind.rstrip("R"))
    if len(reads) > 2 or len(loops) != len(kind) or "R" in kind[:spatial] or spatial < 2 \
            or len(reads) == 2 and not any(_slides(read, stmt.iter_vars) for read in reads) \
            or math.prod(int(sch.get(loop).extent) for loop in loops[spatial:]) > WINDOW:
        return None
    return Window(block, index, spatial, len(reads))


def is_window_kernel(function: tvm.tirx.PrimFunc) -> bool:
    return find_window(s_tir.Schedule(function)) is not None


def _slides(read, iter_vars) -> bool:
    """Whether `read` is a window's data: an axis indexed by a spatial and a reduction iter together
    (h + kh), and no axis by a reduction iter alone (a convolution's input channel: that is a GEMM).
    Reductions over one element do not count (a 1x1 convolution's window does not slide)."""
    spatial = [iter_var.var for iter_var in iter_vars if int(iter_var.iter_type) == 0]
    reduction = [iter_var.var for iter_var in iter_vars
                 if int(iter_var.iter_type) == 2 and int(iter_var.dom.extent) > 1]
    axes = [tuple(any(uses_var(axis.min, var) for var in kind) for kind in (spatial, reduction))
            for axis in read.region]
    return (True, True) in axes and (False, True) not in axes


def uses_var(expr, var) -> bool:
    """Whether `expr` reads variable `var`."""
    return any(used.same_as(var) for used in collect_vars_used_in_prim_expr(expr))
