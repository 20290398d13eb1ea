"""NVRTC sources without TVM's unused type-traits header (`tvmsched.nvrtc_source`), on the CUDA sources TVM
generates here (no GPU or NVRTC needed to generate them)."""

import pytest
import tvm
import tvm_ffi
from tvm import te
from tvm.s_tir import dlight

from tvmsched import nvrtc_source


def cuda_source(dtype: str) -> str:
    """TVM's CUDA source of an elementwise kernel in `dtype` for the H100."""
    a = te.placeholder((1024,), dtype, name="a")
    b = te.compute((1024,), lambda i: a[i] * a[i], name="b")
    target = tvm.target.Target("nvidia/nvidia-h100")
    with target:
        module = dlight.ApplyDefaultSchedule(dlight.gpu.Fallback())(
            tvm.IRModule({"main": te.create_prim_func([a, b])}))
    return tvm.tirx.build(module, target=target).imports[0].inspect_source()


def test_a_float32_source_loses_the_type_traits_block_and_keeps_everything_else():
    source = cuda_source("float32")
    assert "#include <cuda/std/type_traits>" in source
    stripped = nvrtc_source.without_unused_type_traits(source)
    assert "cuda/std/type_traits" not in stripped and "using cuda::std::is_same" not in stripped
    assert "#include <cuda/std/cstdint>" in stripped and "main_kernel" in stripped
    before, _, after = source.partition(nvrtc_source.TYPE_TRAITS)
    assert stripped == before + "\n" + after


def test_a_float16_source_loses_it_too():
    stripped = nvrtc_source.without_unused_type_traits(cuda_source("float16"))
    assert "cuda/std/type_traits" not in stripped and "cuda_fp16.h" in stripped


def test_a_source_that_uses_an_alias_is_left_as_tvm_wrote_it():
    source = cuda_source("float32") + (
        "template <typename T> __device__ bool same() { return std::is_same_v<T, float>; }\n")
    assert nvrtc_source.without_unused_type_traits(source) == source
    assert nvrtc_source.without_unused_type_traits("extern \"C\" __global__ void k() {}") == \
        "extern \"C\" __global__ void k() {}"


@pytest.fixture
def float32_source() -> str:
    """Built before `recording_callback` replaces TVM's callback: on a CUDA host the build compiles it."""
    return cuda_source("float32")


@pytest.fixture
def recording_callback(monkeypatch):
    """TVM's compile callback replaced by one that records its sources, and `tvm_ffi`'s registrations
    counted; TVM's callback put back afterwards."""
    import tvm.support.nvcc  # noqa: F401

    original = tvm.get_global_func(nvrtc_source.CALLBACK)
    seen, registered = [], []
    tvm_ffi.register_global_func(nvrtc_source.CALLBACK, lambda code: seen.append(code) or b"cubin",
                                 override=True)
    monkeypatch.setattr(nvrtc_source, "_installed", False)
    register = tvm_ffi.register_global_func
    monkeypatch.setattr(tvm_ffi, "register_global_func",
                        lambda *args, **kwargs: registered.append(args[0]) or register(*args, **kwargs))
    yield seen, registered
    register(nvrtc_source.CALLBACK, original, override=True)


def test_install_wraps_the_callback_once_and_compiles_through_it(float32_source, recording_callback):
    seen, registered = recording_callback
    nvrtc_source.install()
    nvrtc_source.install()  # a second call registers nothing
    assert registered == [nvrtc_source.CALLBACK]
    assert bytes(tvm.get_global_func(nvrtc_source.CALLBACK)(float32_source)) == b"cubin"
    assert seen == [nvrtc_source.without_unused_type_traits(float32_source)]
