"""Device tensors carved from a few large allocations: a GPU executor makes hundreds of tensors (every
weight, input and pooled buffer), and on the H100 each `tvm.runtime.empty` cost about 30 us of a
resnet50 executor's 14-17 ms of making (`experiments/results/executor_profile_h100_2026-11-26.json`); a
view costs 2.4 us. A view keeps its slab's memory alive, so tensors shared with another executor outlive
this one. Not for the CPU, where one large fresh allocation made executors slower
(`experiments/results/weights_one_allocation_cpu_2026-11-27.json`).
"""

from __future__ import annotations

import math

import numpy as np
import tvm

ALIGNMENT = 256  # of every tensor's address (TVM aligns its CPU allocations to 64 bytes only)


def aligned(nbytes: int) -> int:
    """`nbytes` rounded up to ALIGNMENT."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def tensor_bytes(shape, dtype: str) -> int:
    return math.prod(int(dim) for dim in shape) * np.dtype(dtype).itemsize


class Slabs:
    """Tensors of up to a quarter of `slab_bytes` carved in order from slabs of `slab_bytes`; larger ones
    allocated on their own."""

    def __init__(self, device: tvm.runtime.Device, slab_bytes: int = 32 << 20):
        self.device = device
        self.slab_bytes = slab_bytes
        self.slab: tvm.runtime.Tensor | None = None
        self.offset = 0
        self.view = tvm.get_global_func("vm.builtin.ensure_zero_offset")  # the offset into the pointer

    def empty(self, shape, dtype: str) -> tvm.runtime.Tensor:
        nbytes = tensor_bytes(shape, dtype)
        if nbytes > self.slab_bytes // 4:
            return tvm.runtime.empty(shape, dtype, self.device)
        if self.slab is None or self.offset + nbytes > self.slab_bytes:  # a new slab, aligned from its start
            self.slab = tvm.runtime.empty((self.slab_bytes + ALIGNMENT,), "uint8", self.device)
            self.offset = -self.slab.data_ptr() % ALIGNMENT
        tensor = self.view(self.slab._create_view(shape, dtype, self.offset))
        self.offset += aligned(max(nbytes, 1))
        return tensor
