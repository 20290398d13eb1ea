"""Kernel schedules at build: dlight's defaults and tuned records, without touching the caller's kernels;
scratch memory in global memory hoisted into workspace parameters."""

import numpy as np
import pytest
import tvm
from tvm import te, topi
from tvm.script import tirx as T

from tvmsched import frontend
from tvmsched.codegen import _check_no_pooled_workspace, default_schedules, hoist_workspace
from tvmsched.errors import GraphError
from tvmsched.lower import kernel_module, lower
from tvmsched.target import resolve_target


def test_default_schedules_leave_the_given_kernels_unscheduled(branchy_model):
    """dlight replaces functions in the module it is given; tuning once lost the unscheduled kernels (its
    workloads) that way, after measuring their defaults."""
    inputs = frontend.bind_input_shapes(branchy_model, 1)
    kernels = kernel_module(lower(frontend.to_relax(branchy_model, inputs)))
    scheduled = default_schedules(kernels, resolve_target("nvidia/nvidia-h100"))
    assert all(function.attrs.get("tirx.is_scheduled", False) for function in scheduled.functions.values())
    assert not any(function.attrs.get("tirx.is_scheduled", False) for function in kernels.functions.values())


def test_scratch_buffers_become_trailing_parameters_with_the_same_results():
    """An average pool without padded cells in its count keeps its padded input and its window sums in
    global memory: TVM would take them from the shared workspace pool at each call."""
    data = te.placeholder((1, 4, 9, 9), name="data")
    pool = topi.nn.pool2d(data, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "avg", count_include_pad=False)
    kernels = tvm.IRModule({"pool": te.create_prim_func([data, pool]).with_attr("global_symbol", "pool")})
    hoisted, workspace = hoist_workspace(kernels)
    assert workspace == {"pool": (((1, 4, 11, 11), "float32"), ((1, 4, 9, 9), "float32"))}
    assert len(hoisted["pool"].params) == 4
    x = np.random.default_rng(0).standard_normal((1, 4, 9, 9)).astype("float32")
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ones = np.pad(np.ones_like(x), ((0, 0), (0, 0), (1, 1), (1, 1)))
    window = lambda a: sum(a[:, :, i:i + 9, j:j + 9] for i in range(3) for j in range(3))  # noqa: E731
    expected = window(padded) / window(ones)
    device = tvm.cpu()
    library = tvm.compile(hoisted, target="llvm")
    arrays = [tvm.runtime.tensor(x, device), tvm.runtime.empty(x.shape, "float32", device),
              *(tvm.runtime.empty(shape, dtype, device) for shape, dtype in workspace["pool"])]
    library["pool"](*arrays)
    np.testing.assert_allclose(arrays[1].numpy(), expected, rtol=1e-5, atol=1e-6)


@T.prim_func(s_tir=True)
def _row_scratch(a: T.Buffer((4, 1024), "float32"), b: T.Buffer((4, 1024), "float32")):
    for i in range(4):
        with T.sblock("row"):
            vi = T.axis.spatial(4, i)
            row = T.sblock_alloc_buffer((1024,))  # 4 KiB: from the workspace pool, not the stack
            for j in range(1024):
                with T.sblock("scale"):
                    vj = T.axis.spatial(1024, j)
                    row[vj] = a[vi, vj] * T.float32(2)
            for j in range(1024):
                with T.sblock("shift"):
                    vj = T.axis.spatial(1024, j)
                    b[vi, vj] = row[vj] + T.float32(1)


def test_kernels_still_taking_the_workspace_pool_are_found_by_name():
    """Scratch in a nested block is not hoisted; the check of the compiled host code names its kernel
    (builds run it for CUDA, where streams would share the pool; the host code here is the CPU's)."""
    kernels, workspace = hoist_workspace(tvm.IRModule({"row_scratch": _row_scratch.with_attr(
        "global_symbol", "row_scratch")}))
    assert workspace == {}
    with pytest.raises(GraphError, match=r"kernels \['row_scratch'\] take scratch memory from TVM's shared"):
        _check_no_pooled_workspace(tvm.compile(kernels, target="llvm"), ["row_scratch"])


def test_hoisting_takes_a_kernel_off_the_workspace_pool():
    data = te.placeholder((1, 8, 16, 16), name="data")
    pool = topi.nn.pool2d(data, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "avg", count_include_pad=False)
    kernels = tvm.IRModule({"pool": te.create_prim_func([data, pool]).with_attr("global_symbol", "pool")})
    with pytest.raises(GraphError, match="pool"):
        _check_no_pooled_workspace(tvm.compile(kernels, target="llvm"), ["pool"])
    _check_no_pooled_workspace(tvm.compile(hoist_workspace(kernels)[0], target="llvm"), ["pool"])
