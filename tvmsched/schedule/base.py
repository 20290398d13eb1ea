"""The Scheduler interface and its registry."""

from __future__ import annotations

from abc import ABC, abstractmethod

from tvmsched.errors import TvmschedError
from tvmsched.graph import KernelGraph

SCHEDULERS: dict[str, type[Scheduler]] = {}


class UnknownScheduler(TvmschedError):
    """A scheduler name that is not registered."""


def register_scheduler(name: str):
    """Class decorator: make a Scheduler available as `name`."""
    def register(cls: type[Scheduler]) -> type[Scheduler]:
        SCHEDULERS[name] = cls
        cls.name = name
        return cls
    return register


def create_scheduler(name: str, **options) -> Scheduler:
    if name not in SCHEDULERS:
        raise UnknownScheduler(f"unknown schedule '{name}'; available: {', '.join(sorted(SCHEDULERS))}")
    return SCHEDULERS[name](**options)


class Scheduler(ABC):
    """Decides which stream runs each kernel and the order kernels are issued in."""

    name = "scheduler"

    def __init__(self, max_streams: int = 8):
        if max_streams < 1:
            raise UnknownScheduler(f"max_streams must be at least 1, got {max_streams}")
        self.max_streams = max_streams

    @abstractmethod
    def order(self, graph: KernelGraph) -> list[tuple[int, int]]:
        """(kernel id, stream) pairs in issue order: a topological order of the graph."""
