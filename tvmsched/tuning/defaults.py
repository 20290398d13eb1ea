"""The latency of each kernel's default schedule (dlight's on a GPU), measured with a tuning run's builder
and runner: it orders the kernels to tune (the slowest in total first) and is the baseline tuned records
are compared with."""

from __future__ import annotations

import tvm
from tvm.s_tir import meta_schedule as ms

from tvmsched.codegen import default_schedules
from tvmsched.errors import TargetError
from tvmsched.target import TargetSpec


def measure_defaults(tasks: list[ms.ExtractedTask], spec: TargetSpec, target: tvm.target.Target, builder,
                     runner) -> list[float | None]:
    """Milliseconds per run of each task's default schedule (None where it failed to build or run); raises
    TargetError if none of those built ran (a device that cannot measure would waste the whole run)."""
    functions = [task.dispatched[0] for task in tasks]
    built = builder.build([ms.builder.BuilderInput(default_schedules(function, spec), target)
                           for function in functions])
    device_type = "cuda" if spec.kind == "cuda" else "cpu"
    inputs = [ms.runner.RunnerInput(result.artifact_path, device_type,
                                    ms.arg_info.ArgInfo.from_prim_func(function["main"]))
              for result, function in zip(built, functions) if result.error_msg is None]
    runs = [future.result() for future in runner.run(inputs)]
    failures = [ran.error_msg for ran in runs if ran.error_msg or not ran.run_secs]
    if runs and len(failures) == len(runs):
        lines = [line.strip() for line in str(failures[0] or "no timings").splitlines() if line.strip()]
        raise TargetError(f"all {len(runs)} default schedules built but none ran where candidates are "
                          f"measured ({lines[-1]}); check the device, or with --rpc the RPC servers' logs")
    ran_each = iter(runs)
    latencies = []
    for result in built:
        ran = next(ran_each) if result.error_msg is None else None
        ok = ran is not None and not ran.error_msg and ran.run_secs
        latencies.append(mean_ms(ran.run_secs) if ok else None)
    return latencies


def mean_ms(run_secs) -> float:
    """A MetaSchedule runner result's mean time per run, in milliseconds."""
    return 1e3 * sum(float(seconds) for seconds in run_secs) / len(run_secs)
