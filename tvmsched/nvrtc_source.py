"""CUDA sources handed to NVRTC without the type-traits header that TVM includes where nothing uses it.

TVM 0.27's CUDA codegen opens every source it compiles with NVRTC with `#include <cuda/std/type_traits>`
and a `namespace std` block of aliases (`tvm/backend/cuda/codegen/header.py`), which only its fp8 and fp4
conversion helpers use. Parsing that header is most of NVRTC's work on a kernel: a 4-line elementwise kernel
took 0.42 s to compile with it and 0.07 s without it (this development machine, NVRTC 13.0); googlenet's
batch-16 convolutions took 0.75-0.85 s each on the H100 host, where `tune` compiles every candidate alone
(`experiments/results/nvrtc_compile_h100_2026-11-27.json`). `install()` wraps TVM's compile callback so that
a source in which no alias of the block is used elsewhere is compiled without the block; any other source
(with fp8 or fp4 helpers, or from a TVM whose header differs) is compiled as TVM wrote it.
"""

from __future__ import annotations

import re

import tvm_ffi

CALLBACK = "tvm_callback_cuda_compile"
TYPE_TRAITS = """
  #include <cuda/std/type_traits>
  namespace std {
    using cuda::std::is_same;
    using cuda::std::is_same_v;
    using cuda::std::is_integral;
    using cuda::std::is_signed;
    using cuda::std::is_unsigned;
    using cuda::std::is_floating_point;
    using cuda::std::enable_if;
    using cuda::std::conditional;
  }
"""
ALIASES = re.compile(r"\b(is_same|is_same_v|is_integral|is_signed|is_unsigned|is_floating_point|enable_if|"
                     r"conditional)\b")
_installed = False


def without_unused_type_traits(code: str) -> str:
    """`code` without TVM's type-traits block where it holds the block once and uses none of its aliases
    elsewhere; else `code` unchanged."""
    before, block, after = code.partition(TYPE_TRAITS)
    if not block or ALIASES.search(before) or ALIASES.search(after):
        return code
    return before + "\n" + after


def install() -> None:
    """Make TVM's CUDA compile callback (NVRTC or nvcc, as TVM_CUDA_COMPILE_MODE says) compile sources
    through `without_unused_type_traits`, once per process."""
    global _installed
    if _installed:
        return
    import tvm.support.nvcc  # noqa: F401  (registers TVM's callback)

    compile_cuda = tvm.get_global_func(CALLBACK)
    tvm_ffi.register_global_func(CALLBACK, lambda code: compile_cuda(without_unused_type_traits(code)),
                                 override=True)
    _installed = True
