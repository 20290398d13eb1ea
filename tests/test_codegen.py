"""Kernel schedules at build: dlight's defaults and tuned records, without touching the caller's kernels."""

from tvmsched import frontend
from tvmsched.codegen import default_schedules
from tvmsched.lower import kernel_module, lower
from tvmsched.target import resolve_target


def test_default_schedules_leave_the_given_kernels_unscheduled(branchy_model):
    """dlight replaces functions in the module it is given; tuning once lost the unscheduled kernels (its
    workloads) that way, after measuring their defaults."""
    inputs = frontend.bind_input_shapes(branchy_model, 1)
    kernels = kernel_module(lower(frontend.to_relax(branchy_model, inputs)))
    scheduled = default_schedules(kernels, resolve_target("nvidia/nvidia-h100"))
    assert all(function.attrs.get("tirx.is_scheduled", False) for function in scheduled.functions.values())
    assert not any(function.attrs.get("tirx.is_scheduled", False) for function in kernels.functions.values())
