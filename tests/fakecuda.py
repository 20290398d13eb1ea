"""A stand-in for cuda-python's runtime module, so the CUDA executors run on the CPU in tests.

Handles are numbers. It records each stream, event, graph and graph executable made and destroyed, refuses
(as CUDA does) a call with a handle that is not live, such as a second destroy, and makes the call numbered
`fail_at` fail. Destroys never fail and are not numbered. Every event's elapsed time is 1 ms, unless a test
sets `elapsed` to an iterator of the times to read in turn; `launched` counts graph launches. Copies are
made (the "device" is the CPU: host and device pointers are both CPU addresses); `log` lists the copies,
event records and waits in issue order, `registered` the host ranges page-locked now and `pinned` the
page-locked allocations. `FakeDriver` stands in for cuda-python's driver (CUDA's virtual memory
management): the "device" is a CPU tensor as large as the reservation; it records what is mapped and can
run out of memory.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import types
from collections import Counter
from collections.abc import Iterator

import tvm


class cudaError_t(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidResourceHandle = 400
    cudaErrorUnknown = 999


class cudaStreamCaptureMode(enum.IntEnum):
    cudaStreamCaptureModeThreadLocal = 1


class cudaMemcpyKind(enum.IntEnum):
    cudaMemcpyHostToDevice = 1


class cudaMemoryType(enum.IntEnum):
    cudaMemoryTypeUnregistered = 0
    cudaMemoryTypeHost = 1


class FakeCudart:
    cudaError_t = cudaError_t
    cudaStreamCaptureMode = cudaStreamCaptureMode
    cudaMemcpyKind = cudaMemcpyKind
    cudaMemoryType = cudaMemoryType
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
        self.pinned: dict[int, tuple] = {}  # page-locked allocations (cudaMallocHost): memory, bytes
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

    def cudaMallocHost(self, size):
        memory = ctypes.create_string_buffer(size + 4096)  # page-aligned within, as CUDA's
        pointer = -(-ctypes.addressof(memory) // 4096) * 4096
        self.pinned[pointer] = (memory, size)
        return self._call(), pointer

    def cudaFreeHost(self, pointer):
        del self.pinned[pointer]
        return cudaError_t.cudaSuccess,

    def cudaPointerGetAttributes(self, pointer):
        ranges = [*self.registered.items(), *((start, size) for start, (_, size) in self.pinned.items())]
        host = any(start <= pointer < start + size for start, size in ranges)
        kind = cudaMemoryType.cudaMemoryTypeHost if host else cudaMemoryType.cudaMemoryTypeUnregistered
        return self._call(), types.SimpleNamespace(type=kind)

    def cudaHostGetDevicePointer(self, pointer, flags):
        return self._call(), pointer  # unified addressing: the host pointer

    def cudaMemsetAsync(self, pointer, value, count, stream):
        ctypes.memset(pointer, value, count)
        return self._call(("stream", stream)),

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


GRANULARITY = 2 << 20  # the stand-in driver's allocation granularity


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_OUT_OF_MEMORY = 2


class FakeDriver:
    CUresult = CUresult
    CUmemAllocationType = types.SimpleNamespace(CU_MEM_ALLOCATION_TYPE_PINNED=1)
    CUmemLocationType = types.SimpleNamespace(CU_MEM_LOCATION_TYPE_DEVICE=1)
    CUmemAccess_flags = types.SimpleNamespace(CU_MEM_ACCESS_FLAGS_PROT_READWRITE=3)
    CUmemAllocationGranularity_flags = types.SimpleNamespace(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED=1)

    def __init__(self):
        self.reserved: dict[int, int] = {}  # base -> bytes
        self.maps: dict[int, int] = {}  # address -> bytes mapped there
        self.handles: set[int] = set()  # physical memory not released
        self.out_of_memory = False
        self.made = 0

    def CUmemAllocationProp(self):
        return types.SimpleNamespace(location=types.SimpleNamespace())

    def CUmemAccessDesc(self):
        return types.SimpleNamespace(location=types.SimpleNamespace())

    def cuGetErrorName(self, error):
        return CUresult.CUDA_SUCCESS, CUresult(error).name.encode()

    def cuMemGetAllocationGranularity(self, prop, flags):
        return CUresult.CUDA_SUCCESS, GRANULARITY

    def cuMemAddressReserve(self, size, alignment, address, flags):
        self.backing = tvm.runtime.empty((size,), "uint8", tvm.cpu())
        self.reserved[self.backing.data_ptr()] = size
        return CUresult.CUDA_SUCCESS, self.backing.data_ptr()

    def cuMemAddressFree(self, base, size):
        assert self.reserved.pop(base) == size and not self.maps
        return CUresult.CUDA_SUCCESS

    def cuMemCreate(self, size, prop, flags):
        if self.out_of_memory:
            return CUresult.CUDA_ERROR_OUT_OF_MEMORY, None
        self.made += 1
        self.handles.add(self.made)
        return CUresult.CUDA_SUCCESS, self.made

    def cuMemRelease(self, handle):
        self.handles.remove(handle)
        return CUresult.CUDA_SUCCESS

    def cuMemMap(self, address, size, offset, handle, flags):
        assert any(base <= address and address + size <= base + n for base, n in self.reserved.items())
        self.maps[address] = size
        return CUresult.CUDA_SUCCESS

    def cuMemUnmap(self, address, size):
        assert self.maps.pop(address) == size
        return CUresult.CUDA_SUCCESS

    def cuMemSetAccess(self, address, size, descriptors, count):
        return CUresult.CUDA_SUCCESS

    def cuCtxSynchronize(self):
        return CUresult.CUDA_SUCCESS
