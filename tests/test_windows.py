"""Window kernels (`tvmsched.windows`): which kernels are pools and depthwise convolutions, and the GPU rule
order they get."""

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
    threads; they get its Fallback first. A softmax-like reduction keeps the reduction rules."""
    spec = resolve_target("nvidia/nvidia-h100")
    assert next(schedule_candidates(_pool(), spec, []))[0] == "Fallback"
    assert next(schedule_candidates(_conv(8, 8, 8), spec, []))[0] == "Fallback"
    assert next(schedule_candidates(_sum([3], True), spec, []))[0] != "Fallback"
