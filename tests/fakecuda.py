"""A stand-in for cuda-python's runtime module, so the CUDA executors run on the CPU in tests.

Handles are numbers. It records each stream, event, graph and graph executable made and destroyed, refuses
(as CUDA does) a call with a handle that is not live, such as a second destroy, and makes the call numbered
`fail_at` fail. Destroys never fail and are not numbered. Every event's elapsed time is 1 ms, unless a test
sets `elapsed` to an iterator of the times to read in turn; `launched` counts graph launches. Copies are
made (the "device" is the CPU: host and device pointers are both CPU addresses); `log` lists the copies,
event records and waits in issue order, and `registered` the host ranges page-locked now.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
from collections import Counter
from collections.abc import Iterator


class cudaError_t(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidResourceHandle = 400
    cudaErrorUnknown = 999


class cudaStreamCaptureMode(enum.IntEnum):
    cudaStreamCaptureModeThreadLocal = 1


class cudaMemcpyKind(enum.IntEnum):
    cudaMemcpyHostToDevice = 1


class FakeCudart:
    cudaError_t = cudaError_t
    cudaStreamCaptureMode = cudaStreamCaptureMode
    cudaMemcpyKind = cudaMemcpyKind
    cudaHostRegisterPortable = 1
    cudaHostRegisterReadOnly = 8
    cudaStreamNonBlocking = 1
    cudaEventDefault = 0
    cudaEventDisableTiming = 2
    cudaEventRecordExternal = 1

    def __init__(self):
        self.calls = 0  # calls so far that can fail
        self.fail_at: int | None = None
        self.live: dict[int, str] = {}  # handle -> kind
        self.made: Counter[str] = Counter()
        self.destroyed: Counter[str] = Counter()
        self.refused: list[tuple[str, int]] = []  # (kind, handle) of calls with a handle not live
        self.elapsed: Iterator[float] = itertools.repeat(1.0)
        self.launched = 0
        self.log: list[tuple] = []  # ("copy", dst, bytes, stream), ("record", event, stream), ("wait", ...)
        self.registered: dict[int, int] = {}  # page-locked host ranges: pointer -> bytes
        self._handles = itertools.count(1)

    def cudaGetErrorName(self, error):
        return cudaError_t.cudaSuccess, cudaError_t(error).name.encode()

    def cudaStreamCreateWithFlags(self, flags):
        return self._make("stream")

    def cudaEventCreateWithFlags(self, flags):
        return self._make("event")

    def cudaStreamEndCapture(self, stream):
        return self._make("graph", ("stream", stream))

    def cudaGraphInstantiate(self, graph, flags):
        return self._make("graph_exec", ("graph", graph))

    def cudaStreamDestroy(self, stream):
        return self._destroy("stream", stream)

    def cudaEventDestroy(self, event):
        return self._destroy("event", event)

    def cudaGraphDestroy(self, graph):
        return self._destroy("graph", graph)

    def cudaGraphExecDestroy(self, graph_exec):
        return self._destroy("graph_exec", graph_exec)

    def cudaEventRecord(self, event, stream):
        self.log.append(("record", event, stream))
        return self._call(("event", event), ("stream", stream)),

    def cudaEventRecordWithFlags(self, event, stream, flags):
        return self._call(("event", event), ("stream", stream)),

    def cudaStreamWaitEvent(self, stream, event, flags):
        self.log.append(("wait", stream, event))
        return self._call(("stream", stream), ("event", event)),

    def cudaMemcpyAsync(self, dst, src, count, kind, stream):
        error = self._call(("stream", stream))
        if error == cudaError_t.cudaSuccess:
            ctypes.memmove(dst, src, count)
            self.log.append(("copy", dst, count, stream))
        return error,

    def cudaHostRegister(self, pointer, size, flags):
        self.registered[pointer] = size
        return self._call(),

    def cudaHostUnregister(self, pointer):
        del self.registered[pointer]
        return cudaError_t.cudaSuccess,

    def cudaGetLastError(self):
        return cudaError_t.cudaSuccess,

    def cudaEventSynchronize(self, event):
        return self._call(("event", event)),

    def cudaStreamSynchronize(self, stream):
        return self._call(("stream", stream)),

    def cudaStreamBeginCapture(self, stream, mode):
        return self._call(("stream", stream)),

    def cudaGraphLaunch(self, graph_exec, stream):
        self.launched += 1
        return self._call(("graph_exec", graph_exec), ("stream", stream)),

    def cudaEventElapsedTime(self, start, end):
        return self._call(("event", start), ("event", end)), next(self.elapsed)

    def _call(self, *handles: tuple[str, int]) -> cudaError_t:
        """This call's error: a handle that is not live, or the failure asked for."""
        number, self.calls = self.calls, self.calls + 1
        dead = [(kind, handle) for kind, handle in handles if self.live.get(handle) != kind]
        if dead:
            self.refused.extend(dead)
            return cudaError_t.cudaErrorInvalidResourceHandle
        return cudaError_t.cudaErrorUnknown if number == self.fail_at else cudaError_t.cudaSuccess

    def _make(self, kind: str, *handles: tuple[str, int]):
        error = self._call(*handles)
        if error != cudaError_t.cudaSuccess:
            return error, None
        handle = next(self._handles)
        self.live[handle] = kind
        self.made[kind] += 1
        return error, handle

    def _destroy(self, kind: str, handle: int):
        if self.live.get(handle) != kind:
            self.refused.append((kind, handle))
            return cudaError_t.cudaErrorInvalidResourceHandle,
        del self.live[handle]
        self.destroyed[kind] += 1
        return cudaError_t.cudaSuccess,
