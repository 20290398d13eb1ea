"""Compile a graph's PrimFuncs into one kernel library for a target: tuned schedules from a MetaSchedule
database where it has them, dlight's defaults for the other GPU kernels."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.s_tir import dlight

from tvmsched.target import TargetSpec


def default_schedules(kernels: tvm.IRModule, spec: TargetSpec) -> tvm.IRModule:
    """Give every unscheduled GPU kernel dlight's default schedule; CPU kernels compile as they are."""
    if spec.kind != "cuda":
        return kernels
    gpu = dlight.gpu
    with spec.tvm_target:
        return dlight.ApplyDefaultSchedule(gpu.Matmul(), gpu.GEMV(), gpu.Reduction(), gpu.GeneralReduction(),
                                           gpu.Fallback())(kernels)


def tuned_schedules(kernels: tvm.IRModule, spec: TargetSpec, database,
                    keep_default: frozenset[str] = frozenset()) -> tuple[tvm.IRModule, list[str]]:
    """The kernels with the best schedule `database` records for each, except the symbols in `keep_default`,
    and the symbols it scheduled."""
    candidates = tvm.IRModule({global_var: function for global_var, function in kernels.functions.items()
                               if global_var.name_hint not in keep_default})
    with spec.tvm_target, database:
        scheduled = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(candidates)
    kernels = tvm.IRModule({**kernels.functions, **scheduled.functions})
    tuned = sorted(global_var.name_hint for global_var, function in scheduled.functions.items()
                   if function.attrs and function.attrs.get("tirx.is_scheduled", False))
    return kernels, tuned


def build_library(kernels: tvm.IRModule, spec: TargetSpec, database=None,
                  keep_default: frozenset[str] = frozenset()) -> tuple[tvm.runtime.Executable, list[str]]:
    """One library with every kernel, callable by symbol (`library[symbol](*inputs, *outputs)`), and the
    symbols whose schedules came from `database` (all but those in `keep_default`)."""
    tuned: list[str] = []
    if database is not None:
        kernels, tuned = tuned_schedules(kernels, spec, database, keep_default)
    return tvm.compile(default_schedules(kernels, spec), target=spec.tvm_target), tuned
