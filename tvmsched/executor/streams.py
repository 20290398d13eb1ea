"""Multi-stream CUDA executors: the plan's launches on one CUDA stream per plan stream, ordered across
streams by events; `cuda-graph` captures the launches once into a CUDA Graph and replays it.

Each inference forks from stream 0 and joins back to it, so stream 0 alone orders consecutive
inferences and is the one stream a caller synchronizes with.

An executor owns the CUDA streams, events and graphs it makes: `close()` (or leaving a `with` block)
destroys each once, a constructor that raises destroys what it had made, and a closed executor refuses to
run.
"""

from __future__ import annotations

import ctypes
from contextlib import ExitStack, contextmanager
from dataclasses import replace

import numpy as np
import tvm

from tvmsched import cuda, measure, weights
from tvmsched.cuda import check
from tvmsched.errors import TargetError
from tvmsched.executor.base import Executor, TraceEvent, register_executor, sample_value
from tvmsched.executor.mapped import MappedArena
from tvmsched.executor.slabs import ALIGNMENT, Slabs
from tvmsched.memory import MemoryPlan
from tvmsched.plan import Launch, make_plan


def _check_cuda_device(device, executor: str) -> None:
    if device.dlpack_device_type() != 2:  # kDLCUDA
        raise TargetError(f"the '{executor}' executor needs a CUDA device; use 'sequential' on the CPU")


def _waited_on(launches: tuple[Launch, ...]) -> set[int]:
    """The kernels some launch waits on: only these record an event."""
    return {producer for launch in launches for producer in launch.waits}


@register_executor("streams")
class StreamsExecutor(Executor):
    """Launches live on several CUDA streams with event waits: no capture, for debugging."""

    def __init__(self, *args, **kwargs):
        self.cudart = cuda.runtime()
        self.closed = False
        self.uploads: dict[int, object] = {}  # the first inference's waits: by kernel, its weights' event
        self.sources: list = []  # the host values being copied, kept alive until the copies end
        self.warmed = False  # whether the plan was issued once (every kernel's module loaded)
        super().__init__(*args, **kwargs)  # its `upload` refuses a device that is not CUDA
        self.waited_on = _waited_on(self.plan.launches)
        with self._closed_on_error():
            self.streams = [cuda.stream(self.resources) for _ in range(self.plan.num_streams)]
            self.events = {kernel: cuda.event(self.resources) for kernel in self.waited_on}
            self.fork_event = cuda.event(self.resources)
            self.join_events = [cuda.event(self.resources) for _ in self.streams[1:]]

    def _allocator(self, host: dict[str, np.ndarray]):
        """Tensors carved from slabs (`executor.slabs`)."""
        if self.offloadable:
            return super()._allocator(host)
        return Slabs(self.device).empty

    def upload(self, order) -> None:
        """Copy the weights on a stream of their own, in `order`, each kernel's followed by an event that
        the kernel waits on in the first inference (`pipelined`; else the copies end here). From a
        page-locked file mapping (`tvmsched.pinned`) the copies run at the link's speed and the host does not
        wait for them; from pageable memory each waits for the driver's staging."""
        _check_cuda_device(self.device, self.name)
        if self.offloadable:
            self.upload_order = order  # what an offloaded executor's next inference uploads again
        self.copy_stream = cuda.stream(self.resources)
        self.resources.callback(self.finish_uploads)  # closing waits for copies in flight (LIFO: first)
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for uploads in order:
            for source, buffer in _sources(uploads.copies):
                self.sources.append(source)
                check(self.cudart.cudaMemcpyAsync(buffer.data_ptr(), source.ctypes.data, source.nbytes,
                                                  kind, self.copy_stream))
            if uploads.waits and self.pipelined:  # also with no copy of its own: an earlier kernel's
                self.uploads[uploads.kernel] = cuda.event(self.resources)
                check(self.cudart.cudaEventRecord(self.uploads[uploads.kernel], self.copy_stream))
        if not self.pipelined:
            self.finish_uploads()

    def finish_uploads(self) -> None:
        """Wait until every weight is on the device; the first inference's waits are then dropped."""
        if self.sources or self.uploads:
            check(self.cudart.cudaStreamSynchronize(self.copy_stream))
        self.sources, self.uploads = [], {}

    def close(self) -> None:
        """Destroy the executor's CUDA graphs, events and streams; it cannot run afterwards. A second call
        does nothing."""
        self.closed = True
        super().close()

    @contextmanager
    def _closed_on_error(self):
        """Close the executor if the block raises, so a constructor that fails leaks no handle."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    @property
    def device_constants(self) -> dict:
        self.finish_uploads()
        return super().device_constants

    @property
    def main_stream(self):
        """Stream 0, which every inference starts and ends on; refuses a closed executor."""
        if self.closed:
            raise TargetError(f"this '{self.name}' executor was closed; create a new one to run again")
        return self.streams[0]

    def issue(self, launches: tuple[Launch, ...] | None = None, timing: dict | None = None,
              origin=None) -> None:
        """Fork from stream 0, issue every launch (default: the plan's) on its stream after its waits,
        join back to stream 0; `timing` maps kernels to (start, end) events recorded around them, after
        the event `origin` on stream 0 (as graph nodes when captured)."""
        cudart, main = self.cudart, self.main_stream
        if origin is not None:
            self._record_timing(origin, main)
        check(cudart.cudaEventRecord(self.fork_event, main))
        for stream in self.streams[1:]:
            check(cudart.cudaStreamWaitEvent(stream, self.fork_event, 0))
        launches, waited_on = ((self.plan.launches, self.waited_on) if launches is None
                               else (launches, _waited_on(launches)))
        uploads, self.uploads, self.warmed = self.uploads, {}, True  # waited on by the first issue alone
        for launch in launches:
            stream = self.streams[launch.stream]
            if launch.kernel in uploads:
                check(cudart.cudaStreamWaitEvent(stream, uploads[launch.kernel], 0))
            for producer in launch.waits:
                check(cudart.cudaStreamWaitEvent(stream, self.events[producer], 0))
            if timing:
                self._record_timing(timing[launch.kernel][0], stream)
            self.launchers[launch.kernel](stream)
            if timing:
                self._record_timing(timing[launch.kernel][1], stream)
            if launch.kernel in waited_on:
                check(cudart.cudaEventRecord(self.events[launch.kernel], stream))
        for stream, event in zip(self.streams[1:], self.join_events):
            check(cudart.cudaEventRecord(event, stream))
            check(cudart.cudaStreamWaitEvent(main, event, 0))

    def _record_timing(self, event, stream) -> None:
        """Record a timing event; under capture it becomes an event-record node of the graph."""
        check(self.cudart.cudaEventRecordWithFlags(event, stream, self.cudart.cudaEventRecordExternal))

    def launch(self) -> None:
        self.issue()

    def graph_executable(self, owner: ExitStack, launches: tuple[Launch, ...], **timing):
        """An instantiated CUDA Graph of `launches`, recorded from stream 0 (`timing`: see `issue`) once the
        weights are on the device and the plan was issued live (which loads each kernel's module, not
        allowed in a capture); the executable and its graph are destroyed when `owner` closes."""
        if not self.warmed:
            self.issue()
        self.finish_uploads()
        self.synchronize()
        return cuda.capture(owner, self.main_stream, lambda: self.issue(launches, **timing))

    @contextmanager
    def captured(self, launches: tuple[Launch, ...], **timing):
        """A `graph_executable` of `launches` for the block only."""
        with ExitStack() as owner:
            yield self.graph_executable(owner, launches, **timing)

    def synchronize(self) -> None:
        """Wait for stream 0, and once the first inference was issued, for the last copies (the host
        values they read are then released)."""
        check(self.cudart.cudaStreamSynchronize(self.main_stream))
        if self.warmed:
            self.finish_uploads()

    def trace(self) -> list[TraceEvent]:
        """One inference issued live on the streams with timing events around each kernel."""
        return self._timed(lambda timing, origin: self.issue(timing=timing, origin=origin))

    @contextmanager
    def _timing_events(self, count: int):
        """`count` fresh timing events, destroyed when the block is left."""
        with ExitStack() as owner:
            yield [cuda.event(owner, timing=True) for _ in range(count)]

    def _timed(self, run) -> list[TraceEvent]:
        """Call `run(timing, origin)` with fresh timing events, wait, and read when each kernel ran."""
        cudart, launches = self.cudart, self.plan.launches
        with self._timing_events(1 + 2 * len(launches)) as events:
            origin = events[0]
            timing = {launch.kernel: (events[1 + 2 * index], events[2 + 2 * index])
                      for index, launch in enumerate(launches)}
            run(timing, origin)
            self.synchronize()
            return [TraceEvent(launch.kernel, launch.stream,
                               check(cudart.cudaEventElapsedTime(origin, timing[launch.kernel][0])),
                               check(cudart.cudaEventElapsedTime(origin, timing[launch.kernel][1])))
                    for launch in launches]

    def time_launches(self, repeat: int) -> list[float]:
        """Milliseconds of each of `repeat` inferences, by CUDA events on stream 0."""
        return measure.event_times(self.main_stream, self.launch, repeat)


@register_executor("cuda-graph")
class CudaGraphExecutor(StreamsExecutor):
    """Captures the multi-stream launches once into a CUDA Graph; each inference after the first is one
    graph launch. The first is issued live, each kernel after its own weights' upload; the second
    captures the plan (a timing captures it before it starts).

    Made `offloadable`, its tensors lie in a `MappedArena`, and `offload()` frees their memory while the
    executor, its launchers and its graphs are kept: the next inference maps the memory again at the same
    addresses and is one CUDA graph that copies the weights (from page-locked host memory) and runs the
    plan, each kernel after its own weights."""

    def __init__(self, *args, **kwargs):
        self.arena: MappedArena | None = None
        self.reload_exec = None  # the graph of an offloaded executor's next inference
        self.reload_sources: list[np.ndarray] = []  # the host values it copies
        self.last_placed: tuple[int, int, int, int] | None = None  # host pointer, bytes, offset, arena end
        self.follows: dict[int, int] = {}  # device pointer -> that of the neighbour it was placed after
        self.offloaded = False
        super().__init__(*args, **kwargs)
        self.graph_exec = None

    def _allocator(self, host: dict[str, np.ndarray]):
        if not self.offloadable:
            return super()._allocator(host)
        inputs = sum(tensor.nbytes for tensor in self.graph.inputs)
        used = sum(value.nbytes for value in host.values()) + sum(self.plan.memory.buffer_sizes) + inputs
        padding = 2 * len(host) * FILE_PADDING  # neighbours keep their file's page padding (`empty_like`)
        self.arena = MappedArena(self.device, 2 * used + padding + (256 << 20))  # folds replace constants
        self.resources.callback(self.arena.close)  # first registered: closed last
        return self.arena.empty

    def empty_like(self, value: np.ndarray) -> tvm.runtime.Tensor:
        """In the arena, a weight that follows the last tensor carved, and in host memory the last weight
        placed (the next entry of a loaded build's weights file, within its page padding), keeps the same
        distance on the device (`follows`), so that the reload graph copies such neighbours at once
        (`_merged`): nothing else lies between them."""
        if self.arena is None:
            return super().empty_like(value)
        start, last = value.ctypes.data, self.last_placed
        at = None
        if last is not None:
            host, nbytes, device, end = last
            gap = start - host
            if 0 <= start - (host + nbytes) < FILE_PADDING and gap % ALIGNMENT == 0 and \
                    self.arena.used == end:
                at = device + gap
        tensor = self.arena.empty(value.shape, str(value.dtype), at=at)
        if at is not None:
            self.follows[tensor.data_ptr()] = self.arena.base + last[2]
        self.last_placed = (start, value.nbytes, tensor.data_ptr() - self.arena.base, self.arena.used)
        return tensor

    def launch(self) -> None:
        if self.offloaded:
            self._resident()
            cuda.launch_graph(self.reload_exec, self.main_stream)
            self.offloaded = False
            return
        if self.graph_exec is None and not self.warmed:
            self.issue()
            return
        cuda.launch_graph(self._captured(), self.main_stream)

    def _captured(self):
        """The plan's CUDA graph, captured now if it was not yet."""
        if self.graph_exec is None:
            self.graph_exec = self.graph_executable(self.resources, self.plan.launches)
        return self.graph_exec

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self._resident()  # the inputs are copied in before the launch
        return super().run(inputs)

    def offload(self) -> None:
        """Free the device memory and keep everything else; a second call does nothing. The first also
        captures the plan's graph and the reload graph (issuing the plan once if it never ran)."""
        if self.arena is None:
            raise TargetError("this executor was not made offloadable "
                              "(create_executor(..., offloadable=True))")
        self.main_stream  # noqa: B018  (refuses a closed executor)
        if self.offloaded:
            return
        self._resident()
        if not self.warmed:
            self.issue()
        self._captured()
        if self.reload_exec is None:
            self.reload_exec = self._reload_graph()
        self.synchronize()
        self.arena.release()
        self.offloaded = True

    def _reloaded(self) -> None:
        """An offloaded executor's weights back on the device (the reload graph run), before a timing."""
        if self.offloaded:
            self.launch()
            self.synchronize()

    def _resident(self) -> None:
        """Map the memory back where it was released (what it holds is undefined until the reload graph
        runs: the weights and every buffer); refuses a closed executor."""
        self.main_stream  # noqa: B018  (raises on a closed executor, whose addresses are given back)
        if self.arena is not None:
            self.arena.restore()

    def _reload_graph(self):
        """The CUDA graph of an offloaded executor's next inference: the upload order's copies on the copy
        stream, an event after each kernel's, and the plan issued with each kernel waiting on its own. The
        copies read page-locked memory (`_page_locked`)."""
        cudart, main = self.cudart, self.main_stream
        copies = self._page_locked()
        events = {uploads.kernel: cuda.event(self.resources)
                  for uploads in self.upload_order if uploads.waits}
        copied = cuda.event(self.resources)
        kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice

        def reload() -> None:
            check(cudart.cudaEventRecord(self.fork_event, main))
            check(cudart.cudaStreamWaitEvent(self.copy_stream, self.fork_event, 0))
            for item in _merged(copies, [events.get(uploads.kernel) for uploads in self.upload_order],
                                self.follows):
                if isinstance(item, tuple):
                    check(cudart.cudaMemcpyAsync(*item, kind, self.copy_stream))
                else:
                    check(cudart.cudaEventRecord(item, self.copy_stream))
            self.uploads = dict(events)  # the plan's issue waits on them, once
            self.issue()
            check(cudart.cudaEventRecord(copied, self.copy_stream))
            check(cudart.cudaStreamWaitEvent(main, copied, 0))

        return cuda.capture(self.resources, main, reload)

    def _page_locked(self) -> list[list[tuple[int, int, int, tuple]]]:
        """Per entry of the upload order, its copies as (device pointer, host pointer, bytes, host region):
        a host value in page-locked memory (a loaded build's mapping, region: the mapping) is read in
        place; any other is copied once into page-locked memory of its own, kept with the executor (a
        region of its own: a copy spanning two page-locked allocations is refused, `_merged`)."""
        cudart = self.cudart
        located = []
        for uploads in self.upload_order:
            row = []
            for source, buffer in _sources(uploads.copies):
                self.reload_sources.append(source)  # kept alive while the executor may reload
                attributes = check(cudart.cudaPointerGetAttributes(source.ctypes.data))
                if attributes.type == cudart.cudaMemoryType.cudaMemoryTypeHost:
                    base = source.base if isinstance(source.base, np.ndarray) else source
                    row.append((buffer.data_ptr(), source.ctypes.data, source.nbytes, ("in place", id(base))))
                else:
                    pointer = cuda.own(self.resources, cudart.cudaMallocHost(source.nbytes),
                                       cudart.cudaFreeHost)
                    ctypes.memmove(pointer, source.ctypes.data, source.nbytes)
                    row.append((buffer.data_ptr(), pointer, source.nbytes, ("staged", pointer)))
            located.append(row)
        return located

    def time_launches(self, repeat: int) -> list[float]:
        self._reloaded()
        self._captured()  # not inside the first timed inference
        return super().time_launches(repeat)

    def trace(self) -> list[TraceEvent]:
        """One replay of the plan's CUDA Graph captured with timing-event nodes around each kernel."""
        self._reloaded()

        def replay(timing, origin) -> None:
            with self.captured(self.plan.launches, timing=timing, origin=origin) as executable:
                for _ in range(2):  # the first replay uploads the graph
                    cuda.launch_graph(executable, self.main_stream)
                    self.synchronize()
        return self._timed(replay)


def _sources(copies):
    """The (host value, device buffer) copies as (contiguous host bytes, buffer), empty ones left out."""
    for value, buffer in copies:
        source = np.ascontiguousarray(value)
        if source.nbytes:
            yield source, buffer


FILE_PADDING = weights.ALIGNMENT  # each entry of a build's weights file starts on a page
MERGED_BYTES = 8 << 20  # at most one copy of the reload graph: a kernel waits for its own weights' copy


def _merged(copies: list[list[tuple[int, int, int, object]]], events: list, follows: dict[int, int]) -> list:
    """The reload graph's copies (destination, source, bytes, host region) per kernel, a copy merged into
    the one before where its tensor was placed right after that one's last tensor (`follows`: destination
    -> the destination it follows) and both read one host region at the same distance, into one copy (with
    the padding between them) of up to MERGED_BYTES; each kernel's event (None: none) after the copy that
    ends its weights: a sequence of copies (destination, source, bytes) and events in issue order."""
    out: list = []
    current: list | None = None  # destination, source, bytes, region, the last destination merged
    waiting: list = []
    for kernel_copies, event in zip(copies, events):
        for destination, source, nbytes, region in kernel_copies:
            if current is not None and follows.get(destination) == current[4] and region == current[3] and \
                    source - current[1] == destination - current[0] and \
                    source + nbytes - current[1] <= MERGED_BYTES:
                current[2], current[4] = source + nbytes - current[1], destination
                continue
            if current is not None:
                out.append(tuple(current[:3]))
                out.extend(waiting)
                waiting = []
            current = [destination, source, nbytes, region, destination]
        if event is not None:
            waiting.append(event)
    if current is not None:
        out.append(tuple(current[:3]))
    return out + waiting


class StageTimer(StreamsExecutor):
    """Times stages of a graph on the GPU: each stage's groups on their own streams, captured into a small
    CUDA Graph and replayed, timed with CUDA events. Every tensor has a buffer of its own, filled by one
    full inference of standard-normal inputs first so kernels read realistic data. Whole plans are timed
    as the benchmark times them (`time_order`)."""

    name = "stage-timer"
    keeps_every_constant = True  # its executors may run TVM's function where its plan runs a vendor plan
    version = 4  # raised when what a timing includes changes, so cached timings of another stay apart

    def __init__(self, library, graph, plan, constants, device, max_groups: int = 8,
                 folded: dict | None = None):
        separate = MemoryPlan(tuple(tensor.nbytes for kernel in graph.kernels for tensor in kernel.written),
                              {tensor.name: index for index, tensor in
                               enumerate(t for kernel in graph.kernels for t in kernel.written)})
        super().__init__(library, graph, replace(plan, memory=separate), constants, device, folded=folded)
        with self._closed_on_error():
            rng = np.random.default_rng(0)
            for tensor in graph.inputs:
                self.buffers[tensor.name].copyfrom(sample_value(tensor.shape, tensor.dtype, rng))
            while len(self.streams) < max_groups:
                self.streams.append(cuda.stream(self.resources))
                self.join_events.append(cuda.event(self.resources))
            self.issue()
            self.synchronize()

    def time_stage(self, groups: tuple[tuple[int, ...], ...], replays: int = 5, rounds: int = 3) -> float:
        """Median over `rounds` of the mean milliseconds of `replays` back-to-back replays of the stage
        captured as one CUDA graph (`measure.time_captured`)."""
        launches = tuple(Launch(kernel, stream) for stream, group in enumerate(groups) for kernel in group)
        return measure.time_captured(self.main_stream, lambda: self.issue(launches), replays, rounds)

    def time_order(self, order: tuple[tuple[int, int], ...], warmup: int = 10, repeat: int = 50,
                   tvm_kernels: tuple[int, ...] = ()) -> float:
        """Median milliseconds of one inference of the plan for a (kernel, stream) issue order, taken as
        `CompiledModel.benchmark` takes it: the plan `make_plan` makes (the executor's waits and buffer
        plan) on the cuda-graph executor, each inference launched on an idle GPU and waited for. The
        executor reads the timer's constants, already on the device, rather than uploading them again, and
        its folded weights, rather than folding them again.
        `tvm_kernels` run TVM's function instead of their tactic."""
        plan = make_plan(self.graph, list(order), "timed", tvm_kernels=tvm_kernels)
        constants = self.device_constants
        with CudaGraphExecutor(self.library, self.graph, plan, constants, self.device,
                               folded=self.folded) as executor:
            for tensor in self.graph.inputs:
                executor.buffers[tensor.name].copyfrom(self.buffers[tensor.name])
            return measure.benchmark(executor, warmup, repeat)["median_ms"]
