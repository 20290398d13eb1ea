"""Window kernels: one reduction over a small window per output, pools and depthwise convolutions.

dlight's reduction rules schedule them as reductions, a group of threads per output, which suits a long
reduction (a softmax's row) and not a window of 9 to 64 elements: on the CPU an average pool ran 9x,
a depthwise convolution with SiLU 6x, slower than under the `window` rule. The CPU's `window` rule and
the GPU's rule order (`codegen.gpu_rules`) give them a thread per output instead.
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
    spatial loops (the reduction loops follow them), of tensors read, and which spatial loop the window
    slides along innermost (neighbouring outputs along it read overlapping data: w in NCHW and NHWC)."""

    block: s_tir.schedule.SBlockRV
    index: int
    spatial: int
    reads: int
    slide: int


def find_window(sch: s_tir.Schedule) -> Window | None:
    """The window reduction of the kernel `sch` schedules, None for any other kernel: its one reduction
    block, with its loops in iteration order and static, at most WINDOW elements per output, reads one
    tensor (a pool) or two, the data and weights of a depthwise convolution (`_slides`). The data's
    innermost axis follows an output axis, so neighbouring outputs read neighbouring elements (a sum over
    a row's last axis is no window)."""
    found = one_reduction(sch)
    if found is None:
        return None
    index, kind = found
    block = sch.get_child_blocks(get_root_block(sch))[index]
    stmt, loops = sch.get(block), sch.get_loops(block)
    extents = [sch.get(loop).extent for loop in loops]
    spatial = len(kind.rstrip("R"))
    if len(loops) != len(kind) or "R" in kind[:spatial] \
            or not all(isinstance(extent, tvm.tirx.IntImm) for extent in extents) \
            or math.prod(int(extent) for extent in extents[spatial:]) > WINDOW:
        return None
    outputs, window = _iters(stmt)
    reads = [read for read in stmt.reads if not read.source.same_as(stmt.writes[0].source)]
    if len(reads) == 1:
        data = reads[0]
    elif len(reads) == 2:
        data = next((read for read in reads if _slides(read, reads, outputs, window)), None)
    else:
        data = None
    if data is None or not _indexed_by(data.region[-1], outputs):
        return None
    sliding = [position for position, var in enumerate(outputs)
               if any(_indexed_by(axis, [var]) and _indexed_by(axis, window) for axis in data.region)]
    if not sliding or len(outputs) != spatial:
        return None
    return Window(block, index, spatial, len(reads), sliding[-1])


def one_reduction(sch: s_tir.Schedule) -> tuple[int, str] | None:
    """The index among the root's blocks and the iteration kinds ("SSRR") of the kernel's one reduction
    block; None where it has none or several."""
    kinds = [get_sblock_info(sch, block).dom_kind() for block in sch.get_child_blocks(get_root_block(sch))]
    reductions = [index for index, kind in enumerate(kinds) if "R" in kind]
    return (reductions[0], kinds[reductions[0]]) if len(reductions) == 1 else None


def inline_producers(sch: s_tir.Schedule, blocks, padding: bool = True) -> bool:
    """Inline each of `blocks` that only moves data (copies, reshapes, and padding if `padding`); whether
    all others were (padding left in memory counts as inlined)."""
    inlined = True
    for block in reversed(blocks):
        stmt = sch.get(block)
        if not padding and get_sblock_info(sch, block).is_data_pad(sch):
            continue
        moves_data = len(stmt.reads) == 1 and "R" not in get_sblock_info(sch, block).dom_kind()
        try:
            if not moves_data:
                raise s_tir.ScheduleError("computes")
            sch.compute_inline(block)
        except s_tir.ScheduleError:
            inlined = False
    return inlined


def is_window_kernel(function: tvm.tirx.PrimFunc) -> bool:
    return find_window(s_tir.Schedule(function)) is not None


def _iters(stmt) -> tuple[list, list]:
    """A block's spatial iters, and its reduction iters over more than one element."""
    spatial = [iter_var.var for iter_var in stmt.iter_vars if iter_var.iter_type == tvm.tirx.IterVar.DataPar]
    reduction = [iter_var.var for iter_var in stmt.iter_vars
                 if iter_var.iter_type == tvm.tirx.IterVar.CommReduce and int(iter_var.dom.extent) > 1]
    return spatial, reduction


def _slides(data, reads, outputs, window) -> bool:
    """Whether `data` is a depthwise convolution's data beside its weights (the other of `reads`): an
    axis indexed by an output and a window iter together (h + kh), none by a window iter alone (a
    convolution's input channel: that is a GEMM), and every output iter of the weights (the channel) in
    it too (a convolution's output channel indexes the weights alone). A reduction over one element is
    no window (a 1x1 convolution's)."""
    weights = next(read for read in reads if not read.same_as(data))
    axes = [(_indexed_by(axis, outputs), _indexed_by(axis, window)) for axis in data.region]
    channels = [var for var in outputs if any(_indexed_by(axis, [var]) for axis in weights.region)]
    return (True, True) in axes and (False, True) not in axes \
        and all(any(_indexed_by(axis, [var]) for axis in data.region) for var in channels)


def _indexed_by(axis, variables) -> bool:
    """Whether a buffer region's axis is indexed by any of `variables`."""
    return any(uses_var(axis.min, var) for var in variables)


def uses_var(expr, var) -> bool:
    """Whether `expr` reads variable `var`."""
    return any(used.same_as(var) for used in collect_vars_used_in_prim_expr(expr))
