"""TVM tensors at an address that TVM did not allocate (`tvmsched.dlpack`), on the CPU: they read the memory
in place, TVM's functions run on them, and their structures are released with them (also when TVM refuses
one)."""

import gc

import numpy as np
import pytest
import tvm
import tvm.te as te

from tvmsched import dlpack


def test_a_tensor_at_an_address_reads_that_memory_and_a_tvm_function_runs_on_it():
    values = np.arange(12, dtype="float32").reshape(3, 4)
    view = dlpack.tensor_at(values.ctypes.data, (3, 4), "float32", tvm.cpu())
    assert tuple(view.shape) == (3, 4) and str(view.dtype) == "float32" and view.device == tvm.cpu()
    values[1, 2] = 100.0  # the view is the memory, not a copy
    np.testing.assert_array_equal(view.numpy(), values)
    a = te.placeholder((3, 4), "float32", name="a")
    doubled = te.compute((3, 4), lambda i, j: a[i, j] * 2, name="doubled")
    function = tvm.compile(te.create_prim_func([a, doubled]), target="llvm")
    out = tvm.runtime.empty((3, 4), "float32", tvm.cpu())
    function(view, out)
    np.testing.assert_array_equal(out.numpy(), values * 2)
    scalar = dlpack.tensor_at(values.ctypes.data, (), "float32", tvm.cpu())
    assert tuple(scalar.shape) == () and scalar.numpy() == 0.0
    assert str(dlpack.tensor_at(values.ctypes.data, (2,), "float16", tvm.cpu()).dtype) == "float16"


def test_the_structures_are_released_with_the_tensor_and_when_tvm_refuses_it(monkeypatch):
    gc.collect()
    before = len(dlpack._ALIVE)
    values = np.ones(4, "int32")
    view = dlpack.tensor_at(values.ctypes.data, (4,), "int32", tvm.cpu())
    assert len(dlpack._ALIVE) == before + 1
    del view
    gc.collect()
    assert len(dlpack._ALIVE) == before

    def refuse(capsule):
        raise ValueError("refused")
    monkeypatch.setattr(dlpack.tvm_ffi, "from_dlpack", refuse)
    with pytest.raises(ValueError, match="refused"):
        dlpack.tensor_at(values.ctypes.data, (4,), "int32", tvm.cpu())
    assert len(dlpack._ALIVE) == before
