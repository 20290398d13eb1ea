"""Device tensors at addresses that outlive their memory: one reserved range of device addresses (CUDA's
virtual memory management), carved in order, whose physical memory `release()` frees and `restore()` maps
again at the same addresses. An executor offloaded so keeps its launchers, vendor plans and CUDA graphs,
which hold those addresses; what the memory held is gone and must be written again.
"""

from __future__ import annotations

import tvm

from tvmsched import cuda
from tvmsched.cuda import check_driver
from tvmsched.dlpack import tensor_at
from tvmsched.errors import TargetError
from tvmsched.executor.slabs import aligned, tensor_bytes

CHUNK = 64 << 20  # physical memory mapped at a time while tensors are carved (rounded to the granularity)


class MappedArena:
    """Up to `reserve_bytes` of device tensors of `device` at addresses reserved once; physical memory is
    mapped behind them as they are carved, released by `release()` and mapped again, in one piece, by
    `restore()`. `close()` frees memory and addresses."""

    def __init__(self, device: tvm.runtime.Device, reserve_bytes: int):
        cu = cuda.driver()
        self.device = device
        self.prop = cu.CUmemAllocationProp()
        self.prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self.prop.location.id = device.index
        self.access = cu.CUmemAccessDesc()
        self.access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self.access.location.id = device.index
        self.access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.granularity = int(check_driver(cu.cuMemGetAllocationGranularity(
            self.prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)))
        self.size = self._rounded(reserve_bytes)
        self.base = int(check_driver(cu.cuMemAddressReserve(self.size, 0, 0, 0)))
        self.handles: list[tuple[int, int, object]] = []  # (offset, bytes, physical memory) mapped now
        self.mapped = 0  # bytes from the base that have memory behind them (before any release)
        self.used = 0
        try:
            self._map(0, min(self.size, self._rounded(CHUNK)))
            self.whole = tensor_at(self.base, (self.size,), "uint8", device)
        except BaseException:
            self.close()
            raise
        self.view = tvm.get_global_func("vm.builtin.ensure_zero_offset")

    @property
    def released(self) -> bool:
        return not self.handles and self.mapped > 0

    def empty(self, shape, dtype: str, at: int | None = None) -> tvm.runtime.Tensor:
        """A new tensor after the last one, at an aligned address (`slabs.aligned`), or at offset `at`
        (aligned, not before the end of the last one)."""
        start = self.used if at is None else at
        if start < self.used or start != aligned(start):
            raise ValueError(f"offset {start} is taken or unaligned (next free: {self.used})")
        end = start + max(tensor_bytes(shape, dtype), 1)
        if end > self.size:
            raise TargetError(f"the executor's device tensors outgrew their reserved {self.size} bytes")
        if end > self.mapped:
            self._map(self.mapped, min(self.size, self._rounded(max(end, self.mapped + CHUNK))) - self.mapped)
        tensor = self.view(tvm.runtime.Tensor._create_view(self.whole, shape, dtype, start))
        self.used = aligned(end)
        return tensor

    def release(self) -> None:
        """Free the physical memory (the addresses stay reserved), once the device is done with it."""
        cu = cuda.driver()
        if self.handles:
            check_driver(cu.cuCtxSynchronize())
        for offset, size, handle in self.handles:
            check_driver(cu.cuMemUnmap(self.base + offset, size))
            check_driver(cu.cuMemRelease(handle))
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
            check_driver(cuda.driver().cuMemAddressFree(self.base, self.size))
            self.base, self.mapped = None, 0

    def _map(self, offset: int, size: int) -> None:
        """Physical memory behind [offset, offset + size), readable and writable by the device; on failure
        nothing of it stays."""
        cu = cuda.driver()
        handle = check_driver(cu.cuMemCreate(size, self.prop, 0))
        try:
            check_driver(cu.cuMemMap(self.base + offset, size, 0, handle, 0))
            try:
                check_driver(cu.cuMemSetAccess(self.base + offset, size, [self.access], 1))
            except TargetError:
                check_driver(cu.cuMemUnmap(self.base + offset, size))
                raise
        except TargetError:
            check_driver(cu.cuMemRelease(handle))
            raise
        self.handles.append((offset, size, handle))
        self.mapped = max(self.mapped, offset + size)

    def _rounded(self, size: int) -> int:
        return -(-size // self.granularity) * self.granularity
