"""The GPU rule for row reductions with short rows (`gpu_schedules.rows`): which kernels it takes, and that
its schedule computes what the kernel computes."""

import re
import shutil

import pytest
import tvm
from test_windows import assert_computes_the_kernel
from tvm import te, topi

from tvmsched.codegen import schedule_candidates
from tvmsched.target import resolve_target


def _layer_norm(shape, dtype="float32"):
    data = te.placeholder(shape, dtype, name="data")
    gamma = te.placeholder(shape[-1:], dtype, name="gamma")
    beta = te.placeholder(shape[-1:], dtype, name="beta")
    return te.create_prim_func([data, gamma, beta, topi.nn.layer_norm(data, gamma, beta, axis=[-1])])


def _softmax(shape, axis=-1):
    data = te.placeholder(shape, name="data")
    return te.create_prim_func([data, topi.nn.softmax(data, axis=axis)])


@pytest.mark.parametrize("function, rule, warps", [
    (_layer_norm((16, 56, 56, 96), "float16"), "rows", 8),  # ConvNeXt's, channels-last
    (_layer_norm((4, 28, 28, 96)), "rows", 4),  # 8 rows a block would not divide the innermost axis
    (_softmax((2, 12, 197, 197)), "rows", 1),  # ViT's attention scores: a row not a multiple of a warp
    (_layer_norm((1, 128, 384)), "rows", 1),  # few rows: one a block
    (_layer_norm((2, 128, 768)), "GeneralReduction", None),  # BERT's: long rows, a block each
    # over a middle axis: the same domain in every block, but the maxima read along another axis
    (_softmax((8, 128, 128), axis=1), "GeneralReduction", None),
])
def test_short_rows_take_a_warp_each(function, rule, warps):
    """Up to eight rows a block, as many as divide the innermost spatial axis and leave at least
    MIN_BLOCKS blocks, each computed by its own warp."""
    chosen, scheduled = next(schedule_candidates(function, resolve_target("nvidia/nvidia-h100"), []))
    assert chosen == rule
    if rule == "rows":
        script = scheduled.script()
        assert 'T.thread_binding(32, thread="threadIdx.x")' in script
        assert f'T.thread_binding({warps}, thread="threadIdx.y")' in script
        # a warp's reductions cover its row alone: unit loops above them
        assert re.search(r"(T\.grid\(1(, 1)*\)|range\(1\)):\n +for \w+ in T.thread_binding\(32", script)


@pytest.mark.parametrize("function", [_layer_norm((3, 5, 96)), _softmax((2, 3, 7, 45)),
                                      _layer_norm((16, 20))])
def test_the_rows_rule_computes_what_the_kernel_computes(function):
    """Its loops, without the thread bindings, on the CPU with bound checks, against the kernel as TVM
    wrote it: rows that do not fill the last block, and rows of fewer or more elements than a warp."""
    assert_computes_the_kernel(function, "rows", 1e-5)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to compile CUDA")
def test_the_rows_rule_compiles_for_cuda():
    spec = resolve_target("nvidia/nvidia-h100")
    scheduled = next(schedule_candidates(_softmax((2, 12, 197, 197)), spec, []))[1]
    tvm.compile(tvm.IRModule({"main": scheduled}), target=spec.tvm_target)
