"""Default GPU schedules of tvmsched's own, tried among dlight's rules where they apply (`codegen`).

`rows` is the rule for row reductions (a layer norm, a softmax: reductions over the trailing axes, then
an element-wise block over the same rows) whose rows are short: a warp per row, up to ROWS rows a block
(as many as divide the innermost spatial axis and keep MIN_BLOCKS blocks), where
dlight's GeneralReduction gives each row a block of 256 threads (ConvNeXt's layer norm over 96 channels
kept 96 of them busy: 0.060 ms for 16x56x56x96 in float16 on the H100, ten times its memory's time).

`window` is the rule for pools and depthwise convolutions (`windows`): a thread computes up to OUTPUTS
neighbouring outputs along the axis the window slides (each weight read once for them; fewer where the
kernel would keep less than MIN_THREADS threads), summing in registers, and computes the epilogue before
it writes. Where the window slides along the innermost axis (NCHW's w) a thread takes one output (8 along
w made neighbouring threads read 8 elements apart: 0.233 ms against 0.130), and above FALLBACK_OUTPUTS
outputs the rule declines, for Fallback's 1024 threads a block summing in global memory measured faster
there (H100, 7x7 depthwise, 16x96x56x56 fp32: 0.099 against 0.130 ms; 16x768x7x7: 0.016 against 0.012;
`experiments/results/window_rule_h100_2026-11-26.json`). dlight's Fallback, which took them
before, sums in the output buffer itself, in global memory, reading and writing it once per window
element, and runs the epilogue as a second kernel over that float32 buffer: a depthwise 7x7 convolution
of 16x56x56x96 in float16 (ConvNeXt's first stage) took 0.286 ms on the H100, 40 times its memory's time.
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir
from tvm.s_tir.dlight.analysis import get_root_block, normalize_prim_func
from tvm.s_tir.dlight.base import try_inline_contiguous_spatial
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

from tvmsched.windows import find_window, inline_producers

THREADS = 256  # per block
UNROLL = 512  # loop iterations unrolled at most (a thread's outputs times its window's elements)
OUTPUTS = 8  # neighbouring outputs per thread at most, along the axis the window slides
MIN_THREADS = 1 << 17  # threads kept at least where a kernel has them: half of what an H100 holds at once
FALLBACK_OUTPUTS = 1 << 20  # more outputs than this, along an innermost sliding axis: Fallback's schedule
WARP = 32
ROWS = 8  # rows per block (a warp each) under the rows rule, fewer where that would leave under MIN_BLOCKS
MIN_BLOCKS = 264  # two per SM of an H100
MAX_ROW = 512  # longer rows: dlight's GeneralReduction, a block per row


def window(function: tvm.tirx.PrimFunc, target: tvm.target.Target) -> s_tir.Schedule | None:
    """A window kernel: producers that only move data (padding included) inlined, a thread per few
    neighbouring outputs summing in registers, the element-wise epilogue inlined into its write (SiLU's
    x * sigmoid(x) first into its last block); None for any other kernel, or where a producer or an
    epilogue block does not inline."""
    sch = s_tir.Schedule(function)
    found = find_window(sch)
    if found is None or not inline_producers(sch, sch.get_child_blocks(get_root_block(sch))[:found.index]):
        return None
    blocks = sch.get_child_blocks(get_root_block(sch))
    names = [sch.get(block).name_hint for block in blocks]
    for block in blocks[names.index(sch.get(found.block).name_hint) + 1:-1]:
        try:
            sch.compute_inline(block)
        except s_tir.ScheduleError:
            return None
    loops = sch.get_loops(found.block)
    spatial, window_loops = loops[:found.spatial], loops[found.spatial:]
    outputs = math.prod(int(sch.get(loop).extent) for loop in spatial)
    later = spatial[found.slide + 1:]
    if not later and outputs > FALLBACK_OUTPUTS:
        return None
    per_thread = _divisor(int(sch.get(spatial[found.slide]).extent), OUTPUTS if later else 1,
                          max(1, outputs // MIN_THREADS))
    outer, inner = sch.split(spatial[found.slide], [None, per_thread])
    sch.reorder(*later, *window_loops, inner)  # each weight read once for the thread's outputs
    fused = sch.fuse(*spatial[:found.slide], outer, *later)
    # a block of fewer threads where the kernel has fewer: the write-back `reverse_compute_at` makes is
    # not guarded by the predicate of a block wider than the outputs (threads past them wrote past the end)
    blocks, threads = sch.split(fused, [None, min(THREADS, int(sch.get(fused).extent))])
    sch.bind(blocks, "blockIdx.x")
    sch.bind(threads, "threadIdx.x")
    sch.annotate(threads, "pragma_auto_unroll_max_step", UNROLL)
    sch.annotate(threads, "pragma_unroll_explicit", 1)
    written = sch.cache_write(found.block, 0, "local")
    sch.reverse_compute_at(written, threads)
    try:
        while consumers := sch.get_consumers(written):
            if len(consumers) > 1:
                return None
            sch.reverse_compute_inline(consumers[0])
    except s_tir.ScheduleError:
        return None
    return sch


def rows(function: tvm.tirx.PrimFunc, target: tvm.target.Target) -> s_tir.Schedule | None:
    """A row reduction with rows of at most MAX_ROW elements: its reduction blocks and its last block
    (element-wise over the same domain) share a warp per row, the reductions' results in registers; the
    warps of a block take neighbouring rows along the innermost spatial axis (as many as divide it); None
    for any other kernel."""
    sch = s_tir.Schedule(function)
    infos = try_inline_contiguous_spatial(sch, normalize_prim_func(sch))
    if not infos or len(infos) < 2:
        return None
    kinds = infos[0].dom_kind()
    reduced = len(kinds) - len(kinds.rstrip("R"))
    spatial = len(kinds) - reduced
    domain = [it.dom for it in infos[0].iters]
    if (not reduced or not spatial or "R" in kinds[:spatial]
            or any(info.dom_kind() != kinds for info in infos[:-1]) or not infos[-1].is_injective()
            or not all(isinstance(extent, int | tvm.tirx.IntImm) for extent in domain)
            or [str(it.dom) for it in infos[-1].iters] != [str(extent) for extent in domain]):
        return None
    domain = [int(extent) for extent in domain]
    if math.prod(domain[spatial:]) > MAX_ROW or not _read_by_rows(sch, infos, spatial):
        return None
    every = math.prod(domain[:spatial])  # rows
    per_block = max(count for count in (1, 2, 4, ROWS) if count == 1 or (
        domain[spatial - 1] % count == 0 and every // count >= MIN_BLOCKS))
    try:
        loops = sch.get_loops(infos[-1].block_rv)
        if [int(sch.get(loop).extent) for loop in loops] != domain:
            return None
        outer, warps = sch.split(loops[spatial - 1], [None, per_block])
        sch.bind(sch.fuse(*loops[:spatial - 1], outer), "blockIdx.x")
        sch.bind(warps, "threadIdx.y")
        _across_warp(sch, sch.fuse(*loops[spatial:]))
        for info in reversed(infos[:-1]):
            for index in range(len(sch.get(info.block_rv).writes)):
                sch.set_scope(info.block_rv, index, "local")
            sch.compute_at(info.block_rv, warps, preserve_unit_loops=True)
            _across_warp(sch, sch.fuse(*sch.get_loops(info.block_rv)[-reduced:]))
    except s_tir.ScheduleError:
        return None
    return sch


def _read_by_rows(sch: s_tir.Schedule, infos, spatial: int) -> bool:
    """Whether every block after a reduction reads its results at the block's own first `spatial` iters
    (constant indices aside): then a row's warp needs its row's results alone. A softmax over a middle axis
    of a square tensor has the same domain in every block but reads the maxima along another axis."""
    buffers = [write.source for info in infos[:-1] for write in sch.get(info.block_rv).writes]
    for info in infos[1:]:
        block = sch.get(info.block_rv)
        rows = [iter_var.var for iter_var in block.iter_vars[:spatial]]
        for read in block.reads:
            if any(read.source.same_as(buffer) for buffer in buffers):
                indices = [extent.min for extent in read.region
                           if not isinstance(extent.min, tvm.tirx.IntImm)]
                if len(indices) != len(rows) or not all(index.same_as(row)
                                                        for index, row in zip(indices, rows)):
                    return False
    return True


def _across_warp(sch: s_tir.Schedule, loop) -> None:
    """`loop` split over a warp's threads, each running its share serially."""
    serial, lanes = sch.split(loop, [None, WARP])
    sch.reorder(lanes, serial)
    sch.bind(lanes, "threadIdx.x")
    sch.annotate(serial, "pragma_auto_unroll_max_step", UNROLL)
    sch.annotate(serial, "pragma_unroll_explicit", 1)


def _divisor(extent: int, *bounds: int) -> int:
    """The largest divisor of `extent` within every bound."""
    return max(factor for factor in range(1, min(bounds) + 1) if extent % factor == 0)


class _Rule(GPUScheduleRule):
    """One of this module's rules as a dlight rule, applied as dlight's own are."""

    def __init__(self, rule):
        self.rule = rule

    def apply(self, function, target, _tunable):
        return self.rule(function, target) if self.is_target_available(target) else None


RULES = {"window": _Rule(window), "rows": _Rule(rows)}
