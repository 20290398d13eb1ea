"""A TVM tensor over memory that TVM did not allocate: an address, a shape, a dtype and the device that
reads it, handed to TVM through DLPack.

Direct host access needs it: page-locked host memory is valid on the GPU at its device pointer, but every
producer of DLPack at hand names such memory by where it lies (the host, `kDLCUDAHost`), and TVM's kernels
refuse a tensor that is not on their device (`kDLCUDA`).
"""

from __future__ import annotations

import ctypes

import tvm
import tvm_ffi


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


_ALIVE: dict[int, tuple] = {}  # by managed tensor address: its structures, until TVM frees the tensor


@_DELETER
def _release(address: int) -> None:
    _ALIVE.pop(address, None)


_capsule = ctypes.pythonapi.PyCapsule_New
_capsule.restype = ctypes.py_object
_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def tensor_at(address: int, shape: tuple[int, ...], dtype: str,
              device: tvm.runtime.Device) -> tvm.runtime.Tensor:
    """A contiguous tensor of `shape` and `dtype` at `address`, on `device`. The memory is not owned: the
    caller keeps it alive as long as the tensor."""
    data_type = tvm_ffi.dtype(dtype)
    extents = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    managed = _Managed()
    managed.dl_tensor = _Tensor(address, _Device(device.dlpack_device_type(), device.index), len(shape),
                                _DataType(data_type.type_code, data_type.bits, data_type.lanes),
                                extents, None, 0)
    managed.deleter = _release
    pointer = ctypes.addressof(managed)
    _ALIVE[pointer] = (managed, extents)
    try:
        return tvm_ffi.from_dlpack(_capsule(pointer, b"dltensor", None))
    except BaseException:
        _ALIVE.pop(pointer, None)  # TVM took nothing: no deleter will run
        raise
