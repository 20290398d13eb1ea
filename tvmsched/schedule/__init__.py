"""Inter-operator schedulers: each turns a KernelGraph into a (kernel, stream) issue order, one file each,
registered by name."""

from tvmsched.schedule import chains, sequential  # noqa: F401  (register the schedulers)
from tvmsched.schedule.base import SCHEDULERS, Scheduler, create_scheduler, register_scheduler

__all__ = ["SCHEDULERS", "Scheduler", "create_scheduler", "register_scheduler"]
