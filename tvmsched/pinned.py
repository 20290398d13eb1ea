"""Page-locking a loaded build's mapped weights, so that uploads from them are asynchronous DMA.

A copy to the GPU from pageable memory goes through the driver's staging buffer and blocks the host while
it does (H100: 98 MB in 18 ms, as 267 copies 19 ms); the same file mapping registered with the driver
(read-only: the file is mapped read-only) takes 4 ms to register and then copies at the link's speed,
without blocking the host (2.0 ms, as 267 copies 2.7 ms;
`experiments/results/pinned_probe_h100_2026-11-26.json`).
Registration lasts as long as the mapping: it is undone just before the mapping is freed.
"""

from __future__ import annotations

import weakref

import numpy as np

from tvmsched import cuda
from tvmsched.errors import TargetError


def pin_mapping(arrays: dict[str, np.ndarray]) -> bool:
    """Page-lock the file mapping that `arrays` view (as `tvmsched.weights.read` makes them) with the CUDA
    driver, read-only, until the mapping is freed; False, changing nothing, where they view no mapping
    or the driver refuses (uploads then copy from pageable memory, as without it)."""
    mappings = {id(array.base): array.base for array in arrays.values() if isinstance(array.base, np.memmap)}
    if len(mappings) != 1:
        return False
    (mapping,) = mappings.values()
    try:
        cudart = cuda.runtime()
    except TargetError:  # no cuda-python: the sequential executor uploads from pageable memory
        return False
    pointer, size = mapping.ctypes.data, mapping.nbytes
    flags = cudart.cudaHostRegisterReadOnly | cudart.cudaHostRegisterPortable
    error = cudart.cudaHostRegister(pointer, size, flags)
    if (error[0] if isinstance(error, tuple) else error) != cudart.cudaError_t.cudaSuccess:
        cudart.cudaGetLastError()  # clear the refusal, which would otherwise surface in a later call
        return False
    weakref.finalize(mapping, cudart.cudaHostUnregister, pointer)
    return True
