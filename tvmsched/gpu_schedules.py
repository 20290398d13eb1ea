"""Default GPU schedules of tvmsched's own, tried before dlight's rules where they apply (`codegen`).

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
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

from tvmsched.windows import find_window, inline_producers

THREADS = 256  # per block
UNROLL = 512  # loop iterations unrolled at most (a thread's outputs times its window's elements)
OUTPUTS = 8  # neighbouring outputs per thread at most, along the axis the window slides
MIN_THREADS = 1 << 17  # threads kept at least where a kernel has them: half of what an H100 holds at once
FALLBACK_OUTPUTS = 1 << 20  # more outputs than this, along an innermost sliding axis: Fallback's schedule


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


def _divisor(extent: int, *bounds: int) -> int:
    """The largest divisor of `extent` within every bound."""
    return max(factor for factor in range(1, min(bounds) + 1) if extent % factor == 0)


class _Rule(GPUScheduleRule):
    """One of this module's rules as a dlight rule, applied as dlight's own are."""

    def __init__(self, rule):
        self.rule = rule

    def apply(self, function, target, _tunable):
        return self.rule(function, target) if self.is_target_available(target) else None


RULES = {"window": _Rule(window)}
