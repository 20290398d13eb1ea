"""The Scheduler interface, the Schedule it returns, and the registry of schedulers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from tvmsched.cost import CostModel
from tvmsched.errors import TvmschedError
from tvmsched.graph import KernelGraph

SCHEDULERS: dict[str, type[Scheduler]] = {}


class SchedulerError(TvmschedError):
    """An unknown scheduler, or options it cannot work with."""


@dataclass(frozen=True)
class Stage:
    """Kernel groups that run concurrently, one stream each; a group's kernels run in order."""

    groups: tuple[tuple[int, ...], ...]

    @property
    def kernels(self) -> tuple[int, ...]:
        return tuple(kernel for group in self.groups for kernel in group)



@dataclass(frozen=True)
class Schedule:
    """A scheduler's result: the (kernel, stream) issue order, and the stages it came from, if any."""

    order: tuple[tuple[int, int], ...]
    stages: tuple[Stage, ...] | None = None
    stats: dict = field(default_factory=dict)

    @classmethod
    def from_stages(cls, stages: list[Stage], stats: dict | None = None) -> Schedule:
        """Stage by stage, group i of each stage on stream i."""
        order = tuple((kernel, stream) for stage in stages
                      for stream, group in enumerate(stage.groups) for kernel in group)
        return cls(order, tuple(stages), dict(stats or {}))

    def to_json(self) -> dict:
        stages = [[list(group) for group in stage.groups] for stage in self.stages] if self.stages else None
        return {"stages": stages, **self.stats}


def register_scheduler(name: str):
    """Class decorator: make a Scheduler available as `name`."""
    def register(cls: type[Scheduler]) -> type[Scheduler]:
        SCHEDULERS[name] = cls
        cls.name = name
        return cls
    return register


def create_scheduler(name: str, **options) -> Scheduler:
    if name not in SCHEDULERS:
        raise SchedulerError(f"unknown schedule '{name}'; available: {', '.join(sorted(SCHEDULERS))}")
    return SCHEDULERS[name](**options)


class Scheduler(ABC):
    """Decides which stream runs each kernel and the order kernels are issued in."""

    name = "scheduler"

    def __init__(self, max_streams: int = 8):
        if max_streams < 1:
            raise SchedulerError(f"max_streams must be at least 1, got {max_streams}")
        self.max_streams = max_streams

    @abstractmethod
    def schedule(self, graph: KernelGraph, cost: CostModel) -> Schedule:
        """A Schedule whose order is a topological order of `graph`, using at most max_streams streams."""
