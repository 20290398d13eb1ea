"""The rewrites a build asks for between import and lowering, in their one order: IOS-Merge first (it merges
float32 NCHW convolutions with constant weights, as imported), then on the CPU the convolutions' channels
padded to the vector's lanes (`pad_channels`, which wants them as imported too), then the precision, then
the layout, and last on the CPU the convolutions' weights stored output channel last (`packed_weights`)."""

from __future__ import annotations

from collections.abc import Callable

import tvm

from tvmsched.cpu_schedules import vector_lanes
from tvmsched.layout import in_layout
from tvmsched.merge import Merged, merge_parallel
from tvmsched.merge_choice import choose_merges, merge_chosen
from tvmsched.packed_weights import weights_packed
from tvmsched.pad_channels import channels_padded
from tvmsched.precision import in_precision
from tvmsched.target import TargetSpec

MERGES = ("off", "all", "auto")


def rewrite(module: tvm.IRModule, precision: str = "fp32", layout: str = "nchw", merge: str = "off",
            latencies: Callable[[tvm.IRModule], tuple[float, ...]] | None = None,
            spec: TargetSpec | None = None) -> Merged:
    """`module` (as `frontend.to_relax` imports it) merged as `merge` says (`tvmsched.merge`: "all" every
    group, "auto" the groups that `latencies` finds faster merged, `tvmsched.merge_choice`; `latencies`
    takes modules rewritten in `precision` and `layout`), for a CPU `spec` with its convolutions' channels
    padded to the vector's lanes (`tvmsched.pad_channels`), computing in `precision`
    (`tvmsched.precision`) with its convolutions in `layout` (`tvmsched.layout`), and for a CPU `spec` their
    weights stored output channel last (`tvmsched.packed_weights`)."""
    cpu = spec is not None and spec.kind != "cuda"

    def rewritten(part: tvm.IRModule) -> tvm.IRModule:
        if cpu:
            part = channels_padded(part, vector_lanes(spec.tvm_target, tvm.DataType("float32")))
        part = in_layout(in_precision(part, precision), layout)
        return weights_packed(part) if cpu else part

    if merge == "all":
        merged = merge_parallel(module)
    elif merge == "auto":
        choices = choose_merges(module, lambda part: latencies(rewritten(part)))
        merged = Merged(*merge_chosen(module, choices), choices=choices)
    else:
        merged = Merged(module)
    return Merged(rewritten(merged.module), merged.convolutions, merged.matmuls, merged.choices)
