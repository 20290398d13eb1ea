"""The Scheduler interface, the Schedule it returns, and the registry of schedulers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from tvmsched.cost import StageCost
from tvmsched.errors import TvmschedError
from tvmsched.graph import KernelGraph
from tvmsched.registry import registrar

SCHEDULERS: dict[str, type[Scheduler]] = {}


class SchedulerError(TvmschedError):
    """An unknown scheduler, or options it cannot work with."""


@dataclass(frozen=True)
class Flag:
    """A scheduler's option as a command-line flag: `flag` sets the keyword argument `keyword` to a positive
    integer, or to one of `choices`, or, with `switch` set, takes no value and sets it to `switch`."""

    keyword: str
    flag: str
    help: str
    choices: tuple[str, ...] = ()
    switch: bool | None = None


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
    def from_stages(cls, stages: list[Stage], stats: dict | None = None, graph: KernelGraph | None = None,
                    mapping: str = "index") -> Schedule:
        """Stage by stage, each group on one stream: group i of each stage on stream i ("index"), or on the
        stream `affinity_streams` picks ("affinity", needs `graph`)."""
        streams = (affinity_streams(stages, graph) if mapping == "affinity"
                   else [range(len(stage.groups)) for stage in stages])
        order = tuple((kernel, stream) for stage, numbers in zip(stages, streams)
                      for stream, group in zip(numbers, stage.groups) for kernel in group)
        return cls(order, tuple(stages), {**(stats or {}), "stream_mapping": mapping})

    def to_json(self) -> dict:
        stages = [[list(group) for group in stage.groups] for stage in self.stages] if self.stages else None
        return {"stages": stages, **self.stats}


STREAM_MAPPINGS = ("index", "affinity")
DEFAULT_STREAM_MAPPING = "affinity"  # measured faster on the H100 (docs/schedulers.md)
STREAM_MAPPING_FLAG = Flag("stream_mapping", "--stream-mapping",
                           "the stream of each group of a stage; affinity (default): a stream whose last "
                           "kernel the group reads, else the one idle longest, so fewer groups queue behind "
                           "unrelated ones; index: group i on stream i", choices=STREAM_MAPPINGS)


def check_stream_mapping(mapping: str) -> str:
    if mapping not in STREAM_MAPPINGS:
        raise SchedulerError(f"unknown stream mapping '{mapping}'; available: {', '.join(STREAM_MAPPINGS)}")
    return mapping


def affinity_streams(stages: list[Stage], graph: KernelGraph) -> list[list[int]]:
    """The stream of each group of each stage: a stream whose last kernel the group reads (the latest
    such), so that stream order keeps the dependency, else the free stream idle longest. Either way a
    group waits on its stream only for kernels it depends on where possible; with group i on stream i, a
    group often queues behind an unrelated one. One exception: a stage of one group that does not continue
    a stream of the stage before goes on the stream of that stage's first group, since the schedule chose
    to run it after, not beside, that stage (on an idle stream the two would overlap: on the H100 that
    made squeezenet's dp plan 1.43x slower). A stage's groups never share a stream, and no more streams
    are used than the widest stage has groups."""
    tails: list[int] = []  # the last kernel issued on each stream
    issued: list[int] = []  # when it was issued (stage position)
    streams: list[list[int]] = []
    for position, stage in enumerate(stages):
        taken: set[int] = set()
        numbers = []
        for group in stage.groups:
            producers = set().union(*(graph.dependencies(kernel) for kernel in group))
            free = [stream for stream in range(len(tails)) if stream not in taken]
            feeding = [stream for stream in free if tails[stream] in producers]
            if position and len(stage.groups) == 1 and not set(feeding) & set(streams[-1]):
                stream = streams[-1][0]
            elif feeding:
                stream = max(feeding, key=issued.__getitem__)
            elif free:
                stream = min(free, key=issued.__getitem__)
            else:
                stream = len(tails)
                tails.append(-1)
                issued.append(-1)
            taken.add(stream)
            numbers.append(stream)
            tails[stream], issued[stream] = group[-1], position
        streams.append(numbers)
    return streams


register_scheduler = registrar(SCHEDULERS)  # class decorator: @register_scheduler("name")


def create_scheduler(name: str, **options) -> Scheduler:
    if name not in SCHEDULERS:
        raise SchedulerError(f"unknown schedule '{name}'; available: {', '.join(sorted(SCHEDULERS))}")
    return SCHEDULERS[name](**options)


class Scheduler(ABC):
    """Decides which stream runs each kernel and the order kernels are issued in."""

    name = "scheduler"
    flags: tuple[Flag, ...] = ()  # its options that commands set by flag (the CLI makes them from these)

    def __init__(self, max_streams: int = 8):
        if max_streams < 1:
            raise SchedulerError(f"max_streams must be at least 1, got {max_streams}")
        self.max_streams = max_streams

    @abstractmethod
    def schedule(self, graph: KernelGraph, cost: StageCost) -> Schedule:
        """A Schedule whose order is a topological order of `graph`, using at most max_streams streams."""
