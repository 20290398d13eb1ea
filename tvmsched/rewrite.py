"""The rewrites a build asks for between import and lowering, in their one order: IOS-Merge first (it merges
float32 NCHW convolutions with constant weights, as imported), then on the CPU the convolutions' channels
padded to the vector's lanes (`pad_channels`, which wants them as imported too), then the precision, then
the layout, and last on the CPU the convolutions' weights stored output channel last (`packed_weights`)."""

from __future__ import annotations

import tvm

from tvmsched.cpu_schedules import vector_lanes
from tvmsched.layout import in_layout
from tvmsched.merge import Merged
from tvmsched.merge_choice import MergeChoice, merge_chosen
from tvmsched.packed_weights import weights_packed
from tvmsched.pad_channels import channels_padded
from tvmsched.precision import in_precision
from tvmsched.target import TargetSpec

MERGES = ("off", "all", "auto")


def rewrite(module: tvm.IRModule, precision: str = "fp32", layout: str = "nchw", merge: str = "off",
            choices: tuple[MergeChoice, ...] = (), spec: TargetSpec | None = None) -> Merged:
    """`module` (as `frontend.to_relax` imports it) merged as `merge` says (`tvmsched.merge`: "all" every
    group, "auto" the groups that `choices` merge, `tvmsched.merge_choice`), then `prepared`."""
    if merge == "off":
        merged = Merged(module)
    else:
        merged = Merged(*merge_chosen(module, choices if merge == "auto" else None), choices=choices)
    return Merged(prepared(merged.module, precision, layout, spec), merged.convolutions, merged.matmuls,
                  merged.choices)


def prepared(module: tvm.IRModule, precision: str = "fp32", layout: str = "nchw",
             spec: TargetSpec | None = None) -> tvm.IRModule:
    """`module`, merged or not, for a CPU `spec` with its convolutions' channels padded to the vector's lanes
    (`tvmsched.pad_channels`), computing in `precision` (`tvmsched.precision`) with its convolutions in
    `layout` (`tvmsched.layout`), and for a CPU `spec` their weights stored output channel last
    (`tvmsched.packed_weights`)."""
    cpu = spec is not None and spec.kind != "cuda"
    if cpu:
        module = channels_padded(module, vector_lanes(spec.tvm_target, tvm.DataType("float32")))
    module = in_layout(in_precision(module, precision), layout)
    return weights_packed(module) if cpu else module
