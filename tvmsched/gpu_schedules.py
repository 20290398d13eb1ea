"""Default GPU schedules of tvmsched's own, tried before dlight's rules where they apply (`codegen`).

`window` is the rule for pools and depthwise convolutions (`windows`): a thread per output that sums its
window in a register and computes the epilogue before it writes. dlight's Fallback, which took them
before, sums in the output buffer itself, in global memory, reading and writing it once per window
element, and runs the epilogue as a second kernel over that float32 buffer: a depthwise 7x7 convolution
of 16x56x56x96 in float16 (ConvNeXt's first stage) took 0.286 ms on the H100, 40 times its memory's time.
"""

from __future__ import annotations

import tvm
from tvm import s_tir
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

from tvmsched.windows import find_window, inline_producers

THREADS = 256  # per block
UNROLL = 64  # window elements unrolled at most (the largest window is WINDOW elements)


def window(function: tvm.tirx.PrimFunc, target: tvm.target.Target) -> s_tir.Schedule | None:
    """A window kernel: producers that only move data (padding included) inlined, a thread per output
    summing in a local register, the element-wise epilogue inlined into its write (SiLU's x * sigmoid(x)
    first into its last block); None for any other kernel, or where a producer or an epilogue block does
    not inline."""
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
    blocks, threads = sch.split(sch.fuse(*loops[:found.spatial]), [None, THREADS])
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


class _Rule(GPUScheduleRule):
    """One of this module's rules as a dlight rule, applied as dlight's own are."""

    def __init__(self, rule):
        self.rule = rule

    def apply(self, function, target, _tunable):
        return self.rule(function, target) if self.is_target_available(target) else None


RULES = {"window": _Rule(window)}
