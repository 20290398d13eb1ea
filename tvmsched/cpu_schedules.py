"""Default CPU schedules for kernels without tuning records, as rules that take a PrimFunc and return a
schedule of it or None where they do not apply.

`gemm` is the rule for convolutions and matrix products: TVM's kernels for them are plain loop nests that run
single-threaded and scalar (MetaSchedule's default llvm space, sampled without search, was about 3x slower
on squeezenet's convolutions than this rule). It tiles the output like a GEMM micro-kernel: a register tile
of positions (`tile_positions`) by one vector of output channels, accumulated over the whole reduction, with
the weights packed so that a vector of channels is contiguous, and parallel over the other output loops.
Vector widths come from the target's features: TVM's `llvm_get_vector_width` answers 512 bits for every
x86 CPU (AVX2 ones included), and a vector of twice the registers' width, or of a width that is not a
power of two (10 of 1,000 channels), made LLVM spill or shuffle: squeezenet ran 53 ms on one Zen 3 core
with those, 14 ms with 8-lane vectors.
`window` is the rule for pools and depthwise convolutions: a reduction over a small window, on one core.
`parallel` is the rule for the other kernels (data movement, element-wise chains): inline cheap
producers and the epilogues, parallelize the outer spatial loops, vectorize an innermost one."""

from __future__ import annotations

import math

import tvm
from tvm import s_tir
from tvm.s_tir import dlight
from tvm.s_tir.dlight.analysis import get_root_block, get_sblock_info
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.target.codegen import target_has_features

from tvmsched.target import host_cores
from tvmsched.windows import find_window, inline_producers, one_reduction, uses_var

PARALLEL_TASKS = 4  # per core, to even out the load
MIN_PARALLEL = 4096  # fewer output elements than this run on one core: the pool's start costs more


def vector_bits(target: tvm.target.Target) -> int:
    """The width of one SIMD register of `target`: AVX-512, AVX, else 128 bits (SSE, NEON)."""
    return next((bits for feature, bits in (("avx512f", 512), ("avx", 256))
                 if target_has_features(feature, target)), 128)


def vector_lanes(target: tvm.target.Target, dtype: tvm.DataType) -> int:
    """Lanes of one SIMD register of `target` for `dtype` (at least 4)."""
    return max(vector_bits(target) // max(dtype.bits, 8), 4)


def tile_positions(target: tvm.target.Target) -> int:
    """Output positions per register tile, one vector accumulator each, leaving registers for a weight
    vector and the broadcast inputs: 16 with AVX-512's 32 registers (measured on Zen 4: 4 to 32), 12 with 16
    (measured on Zen 3, squeezenet on one core: 16.6 ms at 16, 13.8 at 12, 14.8 at 8)."""
    return 16 if vector_bits(target) == 512 else 12


def gemm(function: tvm.tirx.PrimFunc, target: tvm.target.Target) -> s_tir.Schedule | None:
    """A kernel with one reduction block whose output has a channel axis indexing one input (the weights)
    and not the other, e.g. conv2d NCHW (channel f of W[f, c, kh, kw]) or a matmul (column j of B), with
    data-movement producers (padding) and element-wise epilogues; None for any other kernel."""
    sch = s_tir.Schedule(function)
    blocks = sch.get_child_blocks(get_root_block(sch))
    found = one_reduction(sch)
    if found is None or not inline_producers(sch, blocks[:found[0]], padding=False):
        return None
    index, kind = found
    block = blocks[index]
    axes = _gemm_axes(sch, block)
    if axes is None:
        return None
    channel, weight, weight_dim, group = axes
    for producer in sch.get_producers(block):  # padding kept in memory
        _parallel_vectorize(sch, producer, target)
    loops = sch.get_loops(block)
    spatial = [loop for loop, iter_kind in zip(loops, kind) if iter_kind == "S"]
    reduction = [loop for loop, iter_kind in zip(loops, kind) if iter_kind == "R"]
    position = [index for index in range(len(spatial)) if index != channel][-1]
    output_dim = list(kind).index("S") + channel  # output buffers are indexed by the spatial iters in order
    channels = int(sch.get(spatial[channel]).extent)
    lanes = _divisor(math.gcd(channels, group), vector_lanes(target, sch.get(block).writes[0].source.dtype))
    accumulator = sch.cache_write(block, 0, "local")
    sch.transform_layout(block, ("write", 0), _moved_last(len(spatial), output_dim))
    _reverse_inline_consumers(sch, accumulator)
    channel_outer, channel_inner = sch.split(spatial[channel], [None, lanes])
    extent, most = int(sch.get(spatial[position]).extent), tile_positions(target)
    tile = extent if extent <= most else min(range(most, most // 2 - 1, -1),
                                             key=lambda size: (-(-extent // size) * size, -size))
    position_outer, position_inner = sch.split(spatial[position], [None, tile])
    others = [loop for index, loop in enumerate(spatial) if index not in (channel, position)]
    sch.reorder(channel_outer, *others, position_outer, *reduction, position_inner, channel_inner)
    outer = sch.fuse(channel_outer, *others[:_parallel_count(sch, [channel_outer, *others])])
    sch.parallel(outer)
    sch.reverse_compute_at(accumulator, position_outer)
    sch.vectorize(channel_inner)
    sch.unroll(position_inner)
    sch.decompose_reduction(block, reduction[0])
    _epilogue_rest(sch, accumulator, target)
    if weight_dim != len(weight.shape) - 1:  # a vector of channels is not contiguous: pack the weights
        reads = [read.source for read in sch.get(block).reads]  # cache_write reordered them
        packed = sch.cache_read(block, next(index for index, read in enumerate(reads)
                                            if read.same_as(weight)), "local")
        sch.compute_at(packed, outer)
        sch.transform_layout(packed, ("write", 0), _moved_last(len(weight.shape), weight_dim))
    return sch


def window(function: tvm.tirx.PrimFunc, target: tvm.target.Target) -> s_tir.Schedule | None:
    """A window kernel (`windows`: a pool, a depthwise convolution): each row's reductions and then their
    epilogue, on one core, a pool's padding inlined (a convolution's stays in memory); None for any other
    kernel. Under dlight's Reduction rule, tried first before, an average pool of 1x288x35x35 took 4.75 ms
    here, 0.51 with this rule, and a depthwise 5x5 convolution with SiLU 9.09 against 1.48 ms
    (experiments/cpu_rules.py). They wait on memory: parallel variants were slower in probes."""
    sch = s_tir.Schedule(function)
    found = find_window(sch)
    blocks = sch.get_child_blocks(get_root_block(sch))
    if found is None or found.spatial < 2 \
            or not inline_producers(sch, blocks[:found.index], padding=found.reads == 1):
        return None
    row = sch.get_loops(found.block)[found.spatial - 2]
    epilogue = sch.get_consumers(found.block)
    while epilogue:  # the blocks that read the window's result, and those that read theirs, in order
        sch.reverse_compute_at(epilogue[0], row)
        epilogue = sch.get_consumers(epilogue[0])
    return sch


def parallel(function: tvm.tirx.PrimFunc, target: tvm.target.Target) -> s_tir.Schedule | None:
    """Any kernel: data-movement producers and element-wise consumers inlined where legal, then each block
    left parallel over its leading spatial loops (where it writes at least MIN_PARALLEL elements) and, where
    it has no reduction, vectorized over its innermost loop split by a divisor of the target's lanes."""
    sch = s_tir.Schedule(function)
    blocks = sch.get_child_blocks(get_root_block(sch))
    inline_producers(sch, blocks[:-1], padding=False)
    for block in sch.get_child_blocks(get_root_block(sch)):
        _reverse_inlined(sch, block)
    for block in sch.get_child_blocks(get_root_block(sch)):
        _parallel_vectorize(sch, block, target)
    return sch


def _parallel_vectorize(sch: s_tir.Schedule, block, target: tvm.target.Target) -> None:
    loops = sch.get_loops(block)
    kind = get_sblock_info(sch, block).dom_kind()
    if len(loops) != len(kind) or not kind.startswith("S"):
        return
    spatial = loops[:len(kind) - len(kind.lstrip("S"))]
    extents = [int(sch.get(loop).extent) for loop in spatial]
    if "R" not in kind and extents[-1] > 1:
        lanes = _divisor(extents[-1], vector_lanes(target, sch.get(block).writes[0].source.dtype))
        if lanes >= 4:
            sch.vectorize(sch.split(spatial[-1], [None, lanes])[1])
    if len(spatial) > 1 and math.prod(extents) >= MIN_PARALLEL:  # the innermost loop stays whole
        sch.parallel(sch.fuse(*spatial[:-1]) if len(spatial) > 2 else spatial[0])


def _parallel_count(sch: s_tir.Schedule, loops) -> int:
    """How many of `loops` after the first to fuse with it into the parallel loop: the fewest that give
    every core PARALLEL_TASKS tasks (the weights are packed once per task, so more cost more packing)."""
    tasks = int(sch.get(loops[0]).extent)
    for count, loop in enumerate(loops[1:]):
        if tasks >= PARALLEL_TASKS * host_cores():
            return count
        tasks *= int(sch.get(loop).extent)
    return len(loops) - 1


def _gemm_axes(sch: s_tir.Schedule, block) -> tuple[int, tvm.tirx.Buffer, int, int] | None:
    """(the channel's index among the spatial iters, the weights' buffer, its dimension the channel
    indexes, the channels per group) of a reduction `block`, or None where no spatial iter indexes one
    input alone. Besides the channel, the weights may be indexed only by batch iters, which index the
    other input too (a batched matmul of two activations, e.g. attention's). A grouped convolution's data
    is indexed by the channel's group alone (`f // group`), with at least 4 channels a group: a vector of
    channels within one group reads one data element (0 where the data does not use the channel)."""
    stmt = sch.get(block)
    iters = [iter_var.var for iter_var in stmt.iter_vars if iter_var.iter_type == 0]
    reads = [read for read in stmt.reads if not read.source.same_as(stmt.writes[0].source)]
    if len(reads) != 2:
        return None
    for channel in range(len(iters) - 1, -1, -1):
        users = [[dim for dim, axis in enumerate(read.region)
                  if uses_var(axis.min, iters[channel])] for read in reads]
        if sorted(map(len, users)) not in ([0, 1], [1, 1]):
            continue
        for weight, data, dims in ((reads[0], reads[1], users[0]), (reads[1], reads[0], users[1])):
            groups = {_group_of(axis.min, iters[channel]) for axis in data.region}
            group = max(groups) if None not in groups and len(groups - {0}) <= 1 else None
            if len(dims) != 1 or group is None or group % 4:  # 0: the data does not use the channel
                continue
            dim = dims[0]
            others = [axis for other, axis in enumerate(iters) if other != channel]
            batch = [axis for axis in others if any(uses_var(region.min, axis) for region in data.region)]
            alone = not any(uses_var(region.min, other) and not any(other.same_as(axis) for axis in batch)
                            for region in weight.region for other in others)
            tiled = others and any(uses_var(region.min, others[-1])  # the register tile's axis
                                   for region in weight.region)
            if others and alone and not tiled and weight.region[dim].min.same_as(iters[channel]):
                return channel, weight.source, dim, group
    return None


def _group_of(expr, var) -> int | None:
    """c where every use of `var` in `expr` is `var // c` (c constant); 0 where `expr` does not use `var`;
    None where it uses it otherwise."""
    if isinstance(expr, tvm.tirx.FloorDiv) and expr.a.same_as(var) and isinstance(expr.b, tvm.tirx.IntImm):
        return int(expr.b.value)
    if not uses_var(expr, var):
        return 0
    children = [getattr(expr, name) for name in ("a", "b") if hasattr(expr, name)]
    if not children:
        return None
    groups = {_group_of(child, var) for child in children} - {0}
    return groups.pop() if len(groups) == 1 and None not in groups else None


def _reverse_inline_consumers(sch: s_tir.Schedule, block) -> None:
    """Inline the element-wise chain that consumes `block` into it (the epilogue of a GEMM), as far as it
    goes: while `block` has one consumer (TVM inlines the first of two, e.g. GELU's x * erf(x / sqrt 2),
    into a kernel that reads the output the block no longer writes)."""
    while len(consumers := sch.get_consumers(block)) == 1 and _reverse_inlined(sch, consumers[0]):
        pass


def _reverse_inlined(sch: s_tir.Schedule, block) -> bool:
    """Inline `block` into its producer where TVM can, and not where it writes another shape than a
    producer (a broadcast, e.g. a squeeze-excitation gate times its feature map: TVM failed on those with
    "Cannot dispatch a null expression"); whether it was inlined."""
    if not all(_same_shape(sch, producer, block) for producer in sch.get_producers(block)):
        return False
    try:
        sch.reverse_compute_inline(block)
    except s_tir.ScheduleError:
        return False
    return True


def _same_shape(sch: s_tir.Schedule, block, other) -> bool:
    shapes = [[int(dim) for dim in sch.get(each).writes[0].source.shape] for each in (block, other)]
    return shapes[0] == shapes[1]


def _epilogue_rest(sch: s_tir.Schedule, block, target: tvm.target.Target) -> None:
    """The epilogue that `_reverse_inline_consumers` left after `block` (it reads the GEMM's output more than
    once): every intermediate block inlined into the last, which runs parallel and vectorized."""
    names, frontier = [], sch.get_consumers(block)
    while frontier:
        names += [sch.get(each).name_hint for each in frontier if sch.get(each).name_hint not in names]
        frontier = [consumer for each in frontier for consumer in sch.get_consumers(each)]
    for name in names:
        try:
            sch.compute_inline(sch.get_sblock(name))
        except s_tir.ScheduleError:
            _parallel_vectorize(sch, sch.get_sblock(name), target)


def _moved_last(rank: int, dim: int):
    """An index map moving dimension `dim` of a rank-`rank` buffer to the end."""
    return lambda *index: (*index[:dim], *index[dim + 1:], index[dim])


def _divisor(extent: int, limit: int) -> int:
    """The largest power of two that divides `extent` and is at most `limit` (a vector's lanes)."""
    size = 1
    while size * 2 <= limit and extent % (size * 2) == 0:
        size *= 2
    return size


class _Rule(CPUScheduleRule):
    """One of this module's rules as a dlight rule, applied as dlight's own are."""

    def __init__(self, rule):
        self.rule = rule

    def apply(self, function, target, _tunable):
        return self.rule(function, target) if self.is_target_available(target) else None


# In the order tried; dlight's Reduction for softmax and normalizations (reductions and element-wise blocks)
RULES = {"gemm": _Rule(gemm), "window": _Rule(window), "Reduction": dlight.cpu.Reduction(),
         "parallel": _Rule(parallel)}
