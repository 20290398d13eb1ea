"""The rewrites a build asks for between import and lowering, in their one order: IOS-Merge first (it merges
float32 NCHW convolutions with constant weights, as imported), then the precision, then the layout."""

from __future__ import annotations

import tvm

from tvmsched.layout import in_layout
from tvmsched.merge import Merged, merge_parallel
from tvmsched.precision import in_precision


def rewrite(module: tvm.IRModule, precision: str = "fp32", layout: str = "nchw",
            merge: bool = False) -> Merged:
    """`module` (as `frontend.to_relax` imports it) merged where `merge` (`tvmsched.merge`), computing in
    `precision` (`tvmsched.precision`) with its convolutions in `layout` (`tvmsched.layout`)."""
    merged = merge_parallel(module) if merge else Merged(module)
    return Merged(in_layout(in_precision(merged.module, precision), layout), merged.convolutions,
                  merged.matmuls)
