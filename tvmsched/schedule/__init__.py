"""Inter-operator schedulers: each turns a KernelGraph and a cost source into a Schedule (a (kernel,
stream) issue order, and stages where it has them); one file each, registered by name."""

from tvmsched.schedule import chains, dp, greedy, nimble, opara, sequential  # noqa: F401  (registers them)
from tvmsched.schedule.base import SCHEDULERS, Schedule, Scheduler, SchedulerError, Stage, create_scheduler

__all__ = ["SCHEDULERS", "Schedule", "Scheduler", "SchedulerError", "Stage", "create_scheduler"]
