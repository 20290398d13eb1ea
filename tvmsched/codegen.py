"""Compile a graph's PrimFuncs into one kernel library for a target (dlight default schedules on GPU)."""

from __future__ import annotations

import tvm
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


def build_library(kernels: tvm.IRModule, spec: TargetSpec) -> tvm.runtime.Executable:
    """One library with every kernel, callable by symbol: `library[symbol](*inputs, *outputs)`."""
    return tvm.compile(default_schedules(kernels, spec), target=spec.tvm_target)
