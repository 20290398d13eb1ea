"""Inter-operator schedulers: each turns a KernelGraph and a cost source into a Schedule (a (kernel,
stream) issue order, and stages where it has them); one file each, registered by name."""

import inspect

from tvmsched.schedule import chains, dp, greedy, nimble, opara, sequential  # noqa: F401  (registers them)
from tvmsched.schedule.base import (
    SCHEDULERS,
    Flag,
    Schedule,
    Scheduler,
    SchedulerError,
    Stage,
    create_scheduler,
)


def scheduler_flags() -> dict[Flag, tuple[str, ...]]:
    """Every scheduler's flags, each with the names of the schedulers that take it, in name order."""
    taking: dict[Flag, list[str]] = {}
    for name in sorted(SCHEDULERS):
        for flag in SCHEDULERS[name].flags:
            taking.setdefault(flag, []).append(name)
    return {flag: tuple(names) for flag, names in taking.items()}


def options_for(schedule: str, **options) -> dict:
    """Those of `options` that the scheduler `schedule` takes (a command's flags, each for the schedulers
    that have it: `stream_mapping` for greedy and dp, the search bounds for dp)."""
    parameters = inspect.signature(SCHEDULERS[schedule]).parameters
    return {key: value for key, value in options.items() if key in parameters}


__all__ = ["SCHEDULERS", "Flag", "Schedule", "Scheduler", "SchedulerError", "Stage", "create_scheduler",
           "options_for", "scheduler_flags"]
