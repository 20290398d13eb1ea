"""Window kernels (`tvmsched.windows`): which kernels are pools and depthwise convolutions, and the GPU rule
order they get."""

import math
import re
import shutil

import numpy as np
import pytest
import tvm
from tvm import te, topi

from tvmsched.codegen import schedule_candidates
from tvmsched.target import resolve_target
from tvmsched.windows import is_window_kernel


def _conv(channels, out_channels, groups, kernel=(3, 3)):
    data = te.placeholder((1, channels, 12, 12), name="data")
    weight = te.placeholder((out_channels, channels // groups, *kernel), name="weight")
    out = topi.nn.group_conv2d_nchw(data, weight, 1, 1, 1, groups) if groups > 1 else \
        topi.nn.conv2d_nchw(data, weight, 1, 1, 1)
    return te.create_prim_func([data, weight, topi.nn.relu(out)])


def _sum(axes, keepdims):
    data = te.placeholder((2, 16, 8, 8), name="data")
    return te.create_prim_func([data, topi.sum(data, axis=axes, keepdims=keepdims)])


def _pool():
    data = te.placeholder((1, 8, 9, 9), name="data")
    return te.create_prim_func([data, topi.nn.pool2d(data, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "avg",
                                                     count_include_pad=False)])


def _matmul():
    a, b = te.placeholder((4, 32), name="a"), te.placeholder((32, 8), name="b")
    return te.create_prim_func([a, b, topi.matmul(a, b)])


@pytest.mark.parametrize("function,window", [
    (_pool(), True),
    (_conv(8, 8, 8), True),  # depthwise
    (_conv(8, 8, 8, (1, 1)), False),  # a 1x1 depthwise window does not slide
    (_conv(1, 8, 1), False),  # one input channel: a convolution, whose output channel indexes the weights
    (_conv(4, 8, 1), False),  # 36 taps: within the window's size, and a GEMM
    (_matmul(), False),
    (_sum([3], True), False),  # a sum over the last axis: neighbouring outputs read far apart
    (_sum([3], False), False),
    (_sum([2, 3], True), False),  # a global mean
])
def test_window_kernels_are_pools_and_depthwise_convolutions(function, window):
    assert is_window_kernel(function) is window


def test_a_kernel_with_symbolic_extents_is_no_window():
    n = tvm.tirx.Var("n", "int64")
    data = te.placeholder((n, 8, 9, 9), name="data")
    pool = te.create_prim_func([data, topi.nn.pool2d(data, (3, 3), (1, 1), (1, 1), (0, 0, 0, 0), "max")])
    assert not is_window_kernel(pool)


def test_window_kernels_take_a_thread_per_output_first_on_the_gpu():
    """dlight's GeneralReduction gave each output of a pool or a depthwise convolution a block of 256
    threads; they get the window rule's thread per output first, then Fallback's. A softmax-like reduction
    keeps the reduction rules."""
    spec = resolve_target("nvidia/nvidia-h100")
    assert [rule for rule, _ in schedule_candidates(_pool(), spec, [])][:2] == ["window", "Fallback"]
    assert next(schedule_candidates(_conv(8, 8, 8), spec, []))[0] == "window"
    assert next(schedule_candidates(_sum([3], True), spec, []))[0] not in ("window", "Fallback")


def _depthwise_nhwc_half():
    """ConvNeXt's depthwise 7x7 convolution in float16 NHWC, summed in float32, with its cast and bias."""
    data = te.placeholder((2, 14, 14, 32), "float16", "data")
    weight = te.placeholder((32, 7, 7, 1), "float16", "weight")
    bias = te.placeholder((1, 1, 1, 32), "float16", "bias")
    out = topi.nn.conv(data, weight, 1, 3, 1, 32, "NHWC", "OHWI", out_dtype="float32")
    return te.create_prim_func([data, weight, bias, topi.add(topi.cast(out, "float16"), bias)])


@pytest.mark.parametrize("function", [_pool(), _conv(8, 8, 8), _depthwise_nhwc_half()])
def test_the_window_rule_sums_in_a_register_and_writes_the_epilogue_in_one_kernel(function):
    """Fallback summed in the output buffer in global memory and ran the epilogue as a second kernel."""
    spec = resolve_target("nvidia/nvidia-h100")
    rule, scheduled = next(schedule_candidates(function, spec, []))
    assert rule == "window"
    script = scheduled.script()
    allocations = [line for line in script.splitlines() if "alloc_buffer" in line]
    assert allocations and all('scope="local"' in line for line in allocations), allocations
    assert script.count('thread="blockIdx.x"') == 1  # one kernel


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to compile CUDA")
def test_the_window_rule_compiles_for_cuda():
    spec = resolve_target("nvidia/nvidia-h100")
    scheduled = next(schedule_candidates(_depthwise_nhwc_half(), spec, []))[1]
    tvm.compile(tvm.IRModule({"main": scheduled}), target=spec.tvm_target)


@pytest.mark.parametrize("shape, per_thread",
                         [((16, 56, 56, 96), 8), ((1, 56, 56, 96), 2), ((1, 7, 7, 768), 1)])
def test_a_thread_takes_neighbouring_outputs_where_enough_threads_remain(shape, per_thread):
    """ConvNeXt's depthwise convolutions: at batch 16 a thread computes 8 outputs along w (each weight read
    once for them) and 602,112 threads remain; fewer where fewer than 2^17 threads would (at batch 1 its
    first stage's 301,056 outputs, 2 each; its last stage's 37,632, 1 each)."""
    data = te.placeholder(shape, "float16", "data")
    weight = te.placeholder((shape[3], 7, 7, 1), "float16", "weight")
    out = topi.nn.conv(data, weight, 1, 3, 1, shape[3], "NHWC", "OHWI", out_dtype="float32")
    function = te.create_prim_func([data, weight, out])
    script = next(schedule_candidates(function, resolve_target("nvidia/nvidia-h100"), []))[1].script()
    assert f"T.grid(7, 7, 1, {per_thread})" in script
    blocks = -(-math.prod(shape) // per_thread // 256)
    assert f'T.thread_binding({blocks}, thread="blockIdx.x")' in script


def test_in_nchw_a_thread_takes_one_output_and_large_kernels_keep_fallback():
    """Sliding along the innermost axis (NCHW's w), 8 outputs a thread made neighbouring threads read 8
    elements apart; above 2^20 outputs Fallback's schedule measured faster (H100)."""
    spec = resolve_target("nvidia/nvidia-h100")
    for shape, first in (((1, 96, 56, 56), "window"), ((16, 96, 56, 56), "Fallback")):
        data = te.placeholder(shape, name="data")
        weight = te.placeholder((96, 1, 7, 7), name="weight")
        out = topi.nn.conv(data, weight, 1, 3, 1, 96, "NCHW", "OIHW")
        function = te.create_prim_func([data, weight, out])
        rule, scheduled = next(schedule_candidates(function, spec, []))
        assert rule == first
        if rule == "window":
            assert "T.grid(1, 7, 7, 1)" in scheduled.script()  # rc, ry, rx, then one output


def without_threads(function, rule_name: str = "window"):
    """A rule's schedule of `function` (`gpu_schedules.RULES`) with its thread bindings left out, to run on
    the CPU."""
    from tvm import s_tir

    from tvmsched import gpu_schedules

    rule = gpu_schedules.RULES[rule_name].rule
    bind, annotate = s_tir.Schedule.bind, s_tir.Schedule.annotate
    s_tir.Schedule.bind = lambda self, loop, thread: None
    s_tir.Schedule.annotate = lambda self, *args, **kwargs: None
    try:
        return rule(function, resolve_target("nvidia/nvidia-h100").tvm_target).mod["main"]
    finally:
        s_tir.Schedule.bind, s_tir.Schedule.annotate = bind, annotate


def _max_pool_nhwc():
    """200 outputs, under one block of threads, and no epilogue: the write-back is the last store."""
    data = te.placeholder((1, 10, 10, 8), name="data")
    return te.create_prim_func([data, topi.nn.pool2d(data, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max",
                                                     layout="NHWC")])


def _silu_gate():
    """A depthwise convolution with SiLU and a per-channel gate broadcast over it."""
    data, weight = te.placeholder((2, 6, 9, 9), name="data"), te.placeholder((6, 1, 3, 3), name="weight")
    gate = te.placeholder((2, 6, 1, 1), name="gate")
    out = topi.nn.conv(data, weight, 2, 1, 1, 6, "NCHW", "OIHW")
    silu = topi.multiply(out, topi.sigmoid(out))
    return te.create_prim_func([data, weight, gate, topi.multiply(silu, gate)])


@pytest.mark.parametrize("function", [_max_pool_nhwc(), _pool(), _conv(8, 8, 8), _silu_gate(),
                                      _depthwise_nhwc_half()])
def test_the_window_rule_computes_what_the_kernel_computes(function):
    """Its loops, without the thread bindings, on the CPU with bound checks, against the kernel as TVM
    wrote it. A block is never wider than the outputs: the write-back of a kernel under one block of 256
    threads had no guard, and its threads past the 200 outputs wrote past the end (which corrupted the
    heap when run this way)."""
    script = next(schedule_candidates(function, resolve_target("nvidia/nvidia-h100"), []))[1].script()
    threads = int(re.search(r"T.thread_binding\((\d+), thread=\"threadIdx.x\"", script).group(1))
    assert threads <= math.prod(int(dim) for dim in function.ty.params[-1].shape)
    assert_computes_the_kernel(function, "window", 1e-3)


def assert_computes_the_kernel(function, rule_name: str, tolerance: float) -> None:
    """A rule's schedule of `function`, its thread bindings left out, computes on the CPU with bound checks
    what the kernel as TVM wrote it computes."""
    rng = np.random.default_rng(14)
    arrays = [rng.standard_normal([int(dim) for dim in param.shape]).astype(str(param.dtype))
              for param in function.ty.params]
    outputs = []
    for each in (function, without_threads(function, rule_name)):
        with tvm.transform.PassContext(config={"tirx.instrument_bound_checkers": True}):
            library = tvm.compile(tvm.IRModule({"main": each}), target="llvm")
        tensors = [tvm.runtime.tensor(array) for array in arrays]
        library["main"](*tensors)
        outputs.append(tensors[-1].numpy())
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=tolerance, atol=tolerance)
