"""Device tensors at addresses that outlive their memory: one reserved range of device addresses (CUDA's
virtual memory management), carved in order, whose physical memory `release()` frees and `restore()` maps
again at the same addresses. An executor offloaded so keeps its launchers, vendor plans and CUDA graphs,
which hold those addresses; what the memory held is gone and must be written again.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
import tvm_ffi

from tvmsched.errors import TargetError
from tvmsched.executor.slabs import ALIGNMENT

CHUNK = 64 << 20  # physical memory mapped at a time while tensors are carved (rounded to the granularity)


def driver():
    """cuda-python's driver module (`cuda.bindings.driver`)."""
    from cuda.bindings import driver

    return driver


def check(result):
    """Unwrap a driver call's (error, *values) result, raising on any error."""
    cu = driver()
    error, *values = result if isinstance(result, tuple) else (result,)
    if error != cu.CUresult.CUDA_SUCCESS:
        raise TargetError(f"CUDA driver call failed with {cu.cuGetErrorName(error)[1].decode()}")
    return values[0] if len(values) == 1 else (values or None)


class MappedArena:
    """Up to `reserve_bytes` of device tensors of `device` at addresses reserved once; physical memory is
    mapped behind them as they are carved, released by `release()` and mapped again, in one piece, by
    `restore()`. `close()` frees memory and addresses."""

    def __init__(self, device: tvm.runtime.Device, reserve_bytes: int):
        from cuda.core import Buffer

        cu = driver()
        self.device = device
        self.prop = cu.CUmemAllocationProp()
        self.prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self.prop.location.id = device.index
        self.access = cu.CUmemAccessDesc()
        self.access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self.access.location.id = device.index
        self.access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.granularity = int(check(cu.cuMemGetAllocationGranularity(
            self.prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)))
        self.size = self._rounded(reserve_bytes)
        self.base = int(check(cu.cuMemAddressReserve(self.size, 0, 0, 0)))
        self.handles: list[tuple[int, int, object]] = []  # (offset, bytes, physical memory) mapped now
        self.mapped = 0  # bytes from the base that have memory behind them (before any release)
        self.used = 0
        try:
            self._map(0, min(self.size, self._rounded(CHUNK)))  # DLPack asks the driver about the base
            self.whole = tvm_ffi.from_dlpack(Buffer.from_handle(self.base, self.size))
        except BaseException:
            self.close()
            raise
        self.view = tvm.get_global_func("vm.builtin.ensure_zero_offset")

    @property
    def released(self) -> bool:
        return not self.handles and self.mapped > 0

    def empty(self, shape, dtype: str, at: int | None = None) -> tvm.runtime.Tensor:
        """A new tensor after the last one, at an address aligned to ALIGNMENT, or at offset `at` (aligned,
        not before the end of the last one)."""
        start = self.used if at is None else at
        if start < self.used or start % ALIGNMENT:
            raise ValueError(f"offset {start} is taken or unaligned (next free: {self.used})")
        nbytes = math.prod(int(dim) for dim in shape) * np.dtype(dtype).itemsize
        end = start + max(nbytes, 1)
        if end > self.size:
            raise TargetError(f"the executor's device tensors outgrew their reserved {self.size} bytes")
        if end > self.mapped:
            self._map(self.mapped, min(self.size, self._rounded(max(end, self.mapped + CHUNK))) - self.mapped)
        tensor = self.view(tvm.runtime.Tensor._create_view(self.whole, shape, dtype, start))
        self.used = -(-end // ALIGNMENT) * ALIGNMENT
        return tensor

    def release(self) -> None:
        """Free the physical memory (the addresses stay reserved), once the device is done with it."""
        cu = driver()
        if self.handles:
            check(cu.cuCtxSynchronize())
        for offset, size, handle in self.handles:
            check(cu.cuMemUnmap(self.base + offset, size))
            check(cu.cuMemRelease(handle))
        self.handles = []

    def restore(self) -> None:
        """Map physical memory behind every carved address again, in one piece; its contents are undefined.
        A restore that fails (out of memory) leaves the arena released, to be restored again."""
        if self.released:
            self._map(0, self.mapped)

    def close(self) -> None:
        """Free memory and addresses; the arena maps nothing afterwards. A second call does nothing."""
        if self.base is not None:
            self.release()
            check(driver().cuMemAddressFree(self.base, self.size))
            self.base, self.mapped = None, 0

    def _map(self, offset: int, size: int) -> None:
        """Physical memory behind [offset, offset + size), readable and writable by the device; on failure
        nothing of it stays."""
        cu = driver()
        handle = check(cu.cuMemCreate(size, self.prop, 0))
        try:
            check(cu.cuMemMap(self.base + offset, size, 0, handle, 0))
            try:
                check(cu.cuMemSetAccess(self.base + offset, size, [self.access], 1))
            except TargetError:
                check(cu.cuMemUnmap(self.base + offset, size))
                raise
        except TargetError:
            check(cu.cuMemRelease(handle))
            raise
        self.handles.append((offset, size, handle))
        self.mapped = max(self.mapped, offset + size)

    def _rounded(self, size: int) -> int:
        return -(-size // self.granularity) * self.granularity
