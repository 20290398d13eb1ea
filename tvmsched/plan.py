"""ExecutionPlan: the ordered kernel launches of one inference, each on a stream, with the cross-stream
waits and the buffer plan that make it race-free.

A plan is plain data made from a scheduler's (kernel, stream) order by `make_plan`; `validate` checks it
against its graph before any executor runs it, so a wrong plan fails loudly instead of racing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvmsched.errors import ArtifactError, GraphError
from tvmsched.graph import KernelGraph
from tvmsched.memory import MemoryPlan, plan_memory

SCHEMA = 1


@dataclass(frozen=True)
class Launch:
    """Launch kernel `kernel` on `stream`, after the kernels in `waits` (on other streams) complete."""

    kernel: int
    stream: int = 0
    waits: tuple[int, ...] = ()


@dataclass(frozen=True)
class ExecutionPlan:
    """The launches of one inference in issue order, for the graph with hash `graph_hash`."""

    graph_hash: str
    scheduler: str
    launches: tuple[Launch, ...]
    memory: MemoryPlan
    context: dict = field(default_factory=dict)  # target key, device, batch: what the plan was made for
    schedule: dict = field(default_factory=dict)  # the scheduler's stages and statistics, for people
    # kernels that run TVM's function in this plan instead of their tactic (chosen for the stage they run
    # in, `tactics.in_plan`)
    tvm_kernels: tuple[int, ...] = ()

    @property
    def num_streams(self) -> int:
        return 1 + max((launch.stream for launch in self.launches), default=0)

    def validate(self, graph: KernelGraph) -> None:
        """Raise GraphError unless every kernel runs once, ordered after the kernels it reads, and no two
        tensors share a buffer while either may still be in use."""
        if self.graph_hash != graph.hash:
            raise GraphError(f"plan was made for graph {self.graph_hash}, not {graph.hash}; rebuild it")
        kernels = [launch.kernel for launch in self.launches]
        if sorted(kernels) != list(range(len(graph.kernels))):
            repeated = sorted({kernel for kernel in kernels if kernels.count(kernel) > 1})
            missing = sorted(set(range(len(graph.kernels))) - set(kernels))
            raise GraphError(f"plan must launch each kernel once: repeated {repeated}, missing {missing}")
        order = HappensBefore(self.launches)
        for launch in self.launches:
            unordered = [producer for producer in sorted(graph.dependencies(launch.kernel))
                         if not order.ordered(producer, launch.kernel)]
            if unordered:
                raise GraphError(f"plan launches kernel {launch.kernel} without waiting for its inputs from "
                                 f"kernels {unordered}")
        self.memory.validate(graph, order)
        if len(set(self.tvm_kernels)) != len(self.tvm_kernels) or not all(
                isinstance(kernel, int) and 0 <= kernel < len(graph.kernels) for kernel in self.tvm_kernels):
            raise GraphError(f"plan names kernels {list(self.tvm_kernels)} to run TVM's function, not each "
                             f"once of the graph's {len(graph.kernels)}; rebuild it")
        without = [kernel for kernel in self.tvm_kernels if graph.kernels[kernel].tactic is None]
        if without:
            raise GraphError(f"plan runs TVM's function instead of the tactic of kernels {without}, which "
                             f"have none; rebuild it")

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "graph_hash": self.graph_hash, "scheduler": self.scheduler,
                **self.context, "num_streams": self.num_streams,
                "launches": [[launch.kernel, launch.stream, list(launch.waits)] for launch in self.launches],
                "memory": self.memory.to_json(), "schedule": self.schedule,
                "tvm_kernels": list(self.tvm_kernels)}

    @classmethod
    def from_json(cls, data: dict) -> ExecutionPlan:
        if data.get("schema") != SCHEMA:
            raise ArtifactError(f"plan schema {data.get('schema')} is not {SCHEMA}; rebuild the model")
        try:
            launches = tuple(Launch(kernel, stream, tuple(waits))
                             for kernel, stream, waits in data["launches"])
            context = {key: data[key] for key in CONTEXT_KEYS if key in data}
            memory = MemoryPlan.from_json(data["memory"])
            return cls(data["graph_hash"], data["scheduler"], launches, memory, context,
                       data.get("schedule", {}), tuple(data.get("tvm_kernels", ())))
        except (KeyError, TypeError, ValueError) as error:
            raise ArtifactError(f"plan.json is malformed ({type(error).__name__}: {error}); "
                                f"rebuild the model") from error


CONTEXT_KEYS = ("target", "device", "batch")


class HappensBefore:
    """Which launches complete before which start: stream order plus wait edges, transitively.

    Vector clocks: `started[k][s]` is the index, within stream s, of the last launch on s known to be
    complete when kernel k starts; `completed[k]` adds k itself.
    """

    def __init__(self, launches: tuple[Launch, ...] | list[Launch] = ()):
        self.position: dict[int, tuple[int, int]] = {}
        self.issued: dict[int, int] = {}
        self.started: dict[int, dict[int, int]] = {}
        self.completed: dict[int, dict[int, int]] = {}
        self._stream_clock: dict[int, dict[int, int]] = {}
        self._stream_length: dict[int, int] = {}
        for launch in launches:
            self.append(launch)

    def stream_clock(self, stream: int) -> dict[int, int]:
        """What is complete when the next launch on `stream` starts, before any waits."""
        return dict(self._stream_clock.get(stream, {}))

    def append(self, launch: Launch) -> None:
        clock = self.stream_clock(launch.stream)
        for producer in launch.waits:
            if producer not in self.completed:
                raise GraphError(f"plan launches kernel {launch.kernel} waiting for kernel {producer}, which "
                                 f"is not launched before it; rebuild it")
            _merge(clock, self.completed[producer])
        index = self._stream_length.get(launch.stream, 0)
        self.position[launch.kernel] = (launch.stream, index)
        self.issued[launch.kernel] = len(self.issued)
        self.started[launch.kernel] = clock
        self.completed[launch.kernel] = {**clock, launch.stream: index}
        self._stream_length[launch.stream] = index + 1
        self._stream_clock[launch.stream] = self.completed[launch.kernel]

    def ordered(self, first: int, second: int) -> bool:
        """Whether kernel `first` completes before kernel `second` starts."""
        stream, index = self.position[first]
        return self.started[second].get(stream, -1) >= index


def _merge(clock: dict[int, int], other: dict[int, int]) -> None:
    for stream, index in other.items():
        if clock.get(stream, -1) < index:
            clock[stream] = index


def add_waits(graph: KernelGraph, order: list[tuple[int, int]]) -> tuple[Launch, ...]:
    """Launches for a (kernel, stream) issue order, each waiting only for the producers on other streams
    that stream order and earlier waits do not already make complete (latest producers first)."""
    issued = HappensBefore()
    launches = []
    for kernel, stream in order:
        producers = graph.dependencies(kernel)
        if not producers <= issued.issued.keys():
            raise GraphError(f"order issues kernel {kernel} before its producers "
                             f"{sorted(producers - issued.issued.keys())}")
        clock = issued.stream_clock(stream)
        waits = []
        for producer in sorted(producers, key=lambda k: -issued.issued[k]):
            producer_stream, index = issued.position[producer]
            if clock.get(producer_stream, -1) < index:
                waits.append(producer)
                _merge(clock, issued.completed[producer])
        launches.append(Launch(kernel, stream, tuple(sorted(waits))))
        issued.append(launches[-1])
    return tuple(launches)


def make_plan(graph: KernelGraph, order: list[tuple[int, int]], scheduler: str,
              context: dict | None = None, schedule: dict | None = None,
              tvm_kernels: tuple[int, ...] = ()) -> ExecutionPlan:
    """The validated plan for a scheduler's (kernel, stream) issue order (`tvm_kernels`: kernels that run
    TVM's function instead of their tactic)."""
    launches = add_waits(graph, order)
    memory = plan_memory(graph, HappensBefore(launches), launches)
    plan = ExecutionPlan(graph.hash, scheduler, launches, memory, dict(context or {}), dict(schedule or {}),
                         tuple(tvm_kernels))
    plan.validate(graph)
    return plan

