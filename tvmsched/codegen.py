"""Compile a graph's PrimFuncs into one kernel library for a target: tuned schedules from a MetaSchedule
database where it has them, dlight's defaults for the other GPU kernels."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.s_tir import dlight

from tvmsched.target import TargetSpec


def default_schedules(kernels: tvm.IRModule, spec: TargetSpec) -> tvm.IRModule:
    """Give every unscheduled GPU kernel dlight's default schedule; CPU kernels compile as they are. dlight
    replaces the functions of the module it is given, so it gets a copy: `kernels` stays as it was."""
    if spec.kind != "cuda":
        return kernels
    gpu = dlight.gpu
    with spec.tvm_target:
        return dlight.ApplyDefaultSchedule(gpu.Matmul(), gpu.GEMV(), gpu.Reduction(), gpu.GeneralReduction(),
                                           gpu.Fallback())(tvm.IRModule(dict(kernels.functions),
                                                                        attrs=kernels.attrs))


def tuned_schedules(kernels: tvm.IRModule, spec: TargetSpec, database,
                    keep_default: frozenset[str] = frozenset()) -> tuple[tvm.IRModule, list[str]]:
    """The kernels with the best schedule `database` records for each, except the symbols in `keep_default`,
    and the symbols it scheduled. Kernels are looked up as tuning stores them, named "main" (`anonymous`)."""
    candidates = tvm.IRModule({global_var: anonymous(function) for global_var, function
                               in kernels.functions.items() if global_var.name_hint not in keep_default})
    with spec.tvm_target, database:
        scheduled = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(candidates)
    kernels = tvm.IRModule({**kernels.functions, **{
        global_var: function.with_attr("global_symbol", kernels[global_var].attrs["global_symbol"])
        for global_var, function in scheduled.functions.items()}})
    tuned = sorted(global_var.name_hint for global_var, function in scheduled.functions.items()
                   if function.attrs and function.attrs.get("tirx.is_scheduled", False))
    return kernels, tuned


def anonymous(function: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """A kernel under the symbol "main": a tuning record then applies to the same kernel whatever a model
    names it (MetaSchedule's workload includes the symbol)."""
    return function.with_attr("global_symbol", "main")


def build_library(kernels: tvm.IRModule, spec: TargetSpec, database=None,
                  keep_default: frozenset[str] = frozenset()) -> tuple[tvm.runtime.Executable, list[str]]:
    """One library with every kernel, callable by symbol (`library[symbol](*inputs, *outputs)`), and the
    symbols whose schedules came from `database` (all but those in `keep_default`)."""
    tuned: list[str] = []
    if database is not None:
        kernels, tuned = tuned_schedules(kernels, spec, database, keep_default)
    return tvm.compile(default_schedules(kernels, spec), target=spec.tvm_target), tuned
