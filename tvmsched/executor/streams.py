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
from collections import ChainMap
from contextlib import ExitStack, contextmanager
from dataclasses import replace

import numpy as np
import tvm

from tvmsched import cuda, measure, weights
from tvmsched.cuda import check
from tvmsched.dlpack import tensor_at
from tvmsched.errors import TargetError
from tvmsched.executor.base import Executor, TraceEvent, register_executor, sample_value
from tvmsched.executor.mapped import MappedArena
from tvmsched.executor.slabs import ALIGNMENT, Slabs
from tvmsched.load_plan import KernelLoad
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
              origin=None, launchers: dict | None = None) -> None:
        """Fork from stream 0, issue every launch (default: the plan's) on its stream after its waits,
        join back to stream 0; `timing` maps kernels to (start, end) events recorded around them, after
        the event `origin` on stream 0 (as graph nodes when captured); `launchers` by kernel (default the
        executor's)."""
        cudart, main = self.cudart, self.main_stream
        launchers = self.launchers if launchers is None else launchers
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
            launchers[launch.kernel](stream)
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
    plan, each kernel after its own weights, or with its weights read in place (`offload(direct)`)."""

    def __init__(self, *args, **kwargs):
        self.arena: MappedArena | None = None
        self.reload_execs: dict[frozenset[int], object] = {}  # reload graphs, by kernels reading in place
        self.reload_exec = None  # the one an offloaded executor's next inference launches
        self.reload_sources: list[np.ndarray] = []  # the host values it copies
        self.located: list[list[tuple[int, int, int, tuple]]] | None = None  # `_page_locked`, made once
        self.last_placed: tuple[int, int, int, int] | None = None  # host pointer, bytes, offset, arena end
        self.follows: dict[int, int] = {}  # device pointer -> that of the neighbour it was placed after
        self.offloaded = False
        self.awaiting = False  # a reload graph was launched last: `synchronize` waits for its first result
        self.in_flight = False  # a reload graph's last copies may still run: waited for before any release
        super().__init__(*args, **kwargs)
        self.graph_exec = None
        if self.arena is not None:
            with self._closed_on_error():
                self.result_event = cuda.event(self.resources)

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
            self.offloaded, self.awaiting, self.in_flight = False, True, True
            return
        self.awaiting = False  # what follows on stream 0 is waited for whole
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

    def offload(self, direct: frozenset[int] = frozenset()) -> None:
        """Free the device memory and keep everything else; the next inference's kernels in `direct` read
        their weights in place (`_reload_graph`). A second call does nothing but choose `direct`. The first
        also captures the plan's graph (issuing the plan once if it never ran), and each `direct` its
        reload graph."""
        if self.arena is None:
            raise TargetError("this executor was not made offloadable "
                              "(create_executor(..., offloadable=True))")
        self.main_stream  # noqa: B018  (refuses a closed executor)
        if self.offloaded and direct in self.reload_execs:
            self.reload_exec = self.reload_execs[direct]
            return
        self._resident()
        if not self.warmed:
            self.issue()
        self._captured()
        if direct not in self.reload_execs:
            self.reload_execs[direct] = self._reload_graph(direct)
        self.reload_exec = self.reload_execs[direct]
        self._settle()
        self.arena.release()
        self.offloaded = True

    def synchronize(self) -> None:
        """After a reload graph's launch, wait for its first result alone (an event on stream 0): the copies
        of weights read in place go on, and what is issued next on stream 0 follows them."""
        if self.awaiting:
            self.awaiting = False
            check(self.cudart.cudaEventSynchronize(self.result_event))
            return
        super().synchronize()

    def _settle(self) -> None:
        """Wait for everything issued, a reload graph's last copies included."""
        self.awaiting = self.in_flight = False
        check(self.cudart.cudaStreamSynchronize(self.streams[0]))

    def close(self) -> None:
        """Wait for a reload graph's last copies (their page-locked sources and graph are released next),
        then close."""
        try:
            if self.in_flight and not self.closed:
                self._settle()
        finally:
            super().close()

    def _reloaded(self) -> None:
        """An offloaded executor's weights back on the device (the reload graph run), before a timing."""
        if self.offloaded:
            self.launch()
            self._settle()

    def _resident(self) -> None:
        """Map the memory back where it was released (what it holds is undefined until the reload graph
        runs: the weights and every buffer); refuses a closed executor."""
        self.main_stream  # noqa: B018  (raises on a closed executor, whose addresses are given back)
        if self.arena is not None:
            self.arena.restore()

    def _reload_graph(self, direct: frozenset[int]):
        """The CUDA graph of an offloaded executor's next inference: the upload order's copies on the copy
        stream, an event after each kernel's, and the plan issued with each kernel waiting on its own. The
        kernels in `direct` read their weights in place (`_direct_launchers`) and wait for no copy; the
        weights that only they read are copied after every other one, and the first result (an event on
        stream 0, `result_event`) does not wait for those copies. The copies read page-locked memory
        (`_page_locked`)."""
        cudart, main = self.cudart, self.main_stream
        located = self._located()
        deferred = {pointer for pointer, kernels in self._weight_readers().items() if kernels <= direct}
        copies = [[copy for copy in row if copy[0] not in deferred] for row in located]
        last = [copy for row in located for copy in row if copy[0] in deferred]
        events = {uploads.kernel: cuda.event(self.resources)
                  for uploads in self.upload_order if uploads.waits and uploads.kernel not in direct}
        launchers = {**self.launchers, **self._direct_launchers(direct)}
        needed, copied = cuda.event(self.resources), cuda.event(self.resources)

        def reload() -> None:
            check(cudart.cudaEventRecord(self.fork_event, main))
            check(cudart.cudaStreamWaitEvent(self.copy_stream, self.fork_event, 0))
            self._copy(_merged(copies, [events.get(uploads.kernel) for uploads in self.upload_order],
                               self.follows))
            check(cudart.cudaEventRecord(needed, self.copy_stream))  # all but the weights read in place
            self._copy(_merged([last], [None], self.follows))
            self.uploads = dict(events)  # the plan's issue waits on them, once
            self.issue(launchers=launchers)
            check(cudart.cudaStreamWaitEvent(main, needed, 0))  # constant outputs too
            self._record_timing(self.result_event, main)  # an event node the host can wait on
            check(cudart.cudaEventRecord(copied, self.copy_stream))
            check(cudart.cudaStreamWaitEvent(main, copied, 0))

        return cuda.capture(self.resources, main, reload)

    def _copy(self, items: list) -> None:
        """Issue on the copy stream each (destination, source, bytes) copy of `items`, and record each event
        among them, in order."""
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for item in items:
            if isinstance(item, tuple):
                check(self.cudart.cudaMemcpyAsync(*item, kind, self.copy_stream))
            else:
                check(self.cudart.cudaEventRecord(item, self.copy_stream))

    def _located(self) -> list[list[tuple[int, int, int, tuple]]]:
        """`_page_locked`, made on first use and kept."""
        if self.located is None:
            self.located = self._page_locked()
        return self.located

    def _weight_readers(self) -> dict[int, set[int]]:
        """By device pointer of each weight the reload graph copies, the kernels that read it (as an input
        or as a vendor plan's folded weight); a constant that is an output of the graph is read by `run`
        too (reader -1, never in place)."""
        copied = {copy[0] for row in self._located() for copy in row}
        readers: dict[int, set[int]] = {}
        for kernel in self.graph.kernels:
            for pointer in self._read_pointers(kernel) & copied:
                readers.setdefault(pointer, set()).add(kernel.id)
        for tensor in self.graph.outputs:
            buffer = self.buffers.get(tensor.name)
            if buffer is not None and buffer.data_ptr() in copied:
                readers.setdefault(buffer.data_ptr(), set()).add(-1)
        return readers

    def _read_pointers(self, kernel) -> set[int]:
        """The device pointers of every tensor `kernel` reads, its vendor plan's folded weights included."""
        call = self.calls.get(kernel.id)
        tensors = [self.buffers.get(tensor.name) for tensor in kernel.inputs]
        tensors += call.buffers if call else ()
        return {tensor.data_ptr() for tensor in tensors if tensor is not None}

    def _direct_launchers(self, kernels: frozenset[int]) -> dict[int, object]:
        """Launchers of `kernels` that read every weight (each tensor the reload graph copies) at its
        page-locked host memory's device address (direct host access) instead of in the arena."""
        host = {copy[0]: check(self.cudart.cudaHostGetDevicePointer(copy[1], 0))
                for row in self._located() for copy in row}

        def in_place(tensor):
            if tensor is None or tensor.data_ptr() not in host:
                return tensor
            pointer = int(host[tensor.data_ptr()])
            return tensor_at(pointer, tuple(tensor.shape), str(tensor.dtype), self.device)

        launchers = {}
        for kernel_id in sorted(kernels):
            kernel, call = self.graph.kernels[kernel_id], self.calls.get(kernel_id)
            views = {tensor.name: in_place(self.buffers[tensor.name]) for tensor in kernel.inputs
                     if tensor.name in self.buffers}
            if call is not None:
                call = replace(call, buffers=tuple(in_place(buffer) for buffer in call.buffers))
            launchers[kernel_id] = self._launcher(kernel, call, ChainMap(views, self.buffers))
        return launchers

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

    def load_timings(self) -> list[KernelLoad]:
        """Each kernel's row for `load_plan.plan_load`, in the plan's order, measured now: the bytes first
        copied for it in the reload graph and their time at the copies' bandwidth (all of them timed as one
        CUDA graph on the copy stream), and its time in one inference with every weight on the device and
        in one with every weight read in place (`_direct_launchers`), each after the L2 cache was
        overwritten, as a reload finds it."""
        self._reloaded()
        if not self.warmed:
            self.issue()
        self._settle()
        located = self._located()
        copies = [copy[:3] for row in located for copy in row]
        total = sum(copy[2] for copy in copies)
        copy_ms = measure.time_captured(self.copy_stream, lambda: self._copy(copies), replays=1,
                                        rounds=3) if copies else 0.0
        reading = frozenset(kernel for readers in self._weight_readers().values()
                            for kernel in readers if kernel != -1)  # -1: `run`, reading a constant output
        on_device = self._kernel_times(self.launchers)
        in_place = self._kernel_times({**self.launchers, **self._direct_launchers(reading)})
        rows = []
        for uploads, row in zip(self.upload_order, located):
            if uploads.kernel is None:
                continue
            nbytes = sum(copy[2] for copy in row)
            rows.append(KernelLoad(uploads.kernel, self.graph.kernels[uploads.kernel].symbol, nbytes,
                                   round(copy_ms * nbytes / total, 5) if total else 0.0,
                                   round(on_device[uploads.kernel], 5), round(in_place[uploads.kernel], 5)))
        return rows

    def _kernel_times(self, launchers: dict) -> dict[int, float]:
        """Milliseconds of each kernel in a replay of the plan's graph captured with `launchers`, after a
        memset of L2_FLUSH_BYTES (so no weight is in the L2 cache)."""
        events = self._replayed(launchers, flush=True)
        return {event.kernel: event.end_ms - event.start_ms for event in events}

    def trace(self) -> list[TraceEvent]:
        """One replay of the plan's CUDA Graph captured with timing-event nodes around each kernel."""
        self._reloaded()
        return self._replayed()

    def _replayed(self, launchers: dict | None = None, flush: bool = False) -> list[TraceEvent]:
        """When each kernel ran in the second replay (the first uploads the graph) of the plan's graph
        captured with timing-event nodes and `launchers` (default the executor's), each replay after a
        memset of L2_FLUSH_BYTES where `flush`."""
        cudart, main = self.cudart, self.main_stream
        scratch = tvm.runtime.empty((L2_FLUSH_BYTES,), "uint8", self.device) if flush else None

        def replay(timing, origin) -> None:
            with self.captured(self.plan.launches, timing=timing, origin=origin,
                               launchers=launchers) as executable:
                for _ in range(2):
                    if scratch is not None:
                        check(cudart.cudaMemsetAsync(scratch.data_ptr(), 0, L2_FLUSH_BYTES, main))
                    cuda.launch_graph(executable, main)
                    self.synchronize()
        return self._timed(replay)


def _sources(copies):
    """The (host value, device buffer) copies as (contiguous host bytes, buffer), empty ones left out."""
    for value, buffer in copies:
        source = np.ascontiguousarray(value)
        if source.nbytes:
            yield source, buffer


L2_FLUSH_BYTES = 256 << 20  # more than any GPU's L2 cache (H100: 50 MiB)
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
