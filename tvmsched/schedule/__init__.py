"""Inter-operator schedulers: each turns a KernelGraph and a cost source into a Schedule (a (kernel,
stream) issue order, and stages where it has them); one file each, registered by name."""

import inspect

from tvmsched.schedule import chains, dp, greedy, nimble, opara, sequential  # noqa: F401  (registers them)
from tvmsched.schedule.base import SCHEDULERS, Schedule, Scheduler, SchedulerError, Stage, create_scheduler

# The schedulers that take a `stream_mapping` (those that issue stages of groups).
MAPPED_SCHEDULERS = tuple(sorted(name for name, cls in SCHEDULERS.items()
                                 if "stream_mapping" in inspect.signature(cls).parameters))

__all__ = ["MAPPED_SCHEDULERS", "SCHEDULERS", "Schedule", "Scheduler", "SchedulerError", "Stage",
           "create_scheduler"]
