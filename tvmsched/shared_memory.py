"""CUDA builds that TVM's shared-memory planning breaks, built again with static shared allocations merged
as dynamic ones are (`tirx.merge_static_smem`).

TVM 0.27 refuses many tensor-core schedules with "tvm_access_ptr element type must match the source
buffer (float16 vs float32)", likely because its planning gives a float32 shared buffer a float16 one's
space. Of MetaSchedule's fp16 NHWC tensor-core candidates for the H100, 11 of 64 and 1 of 62 built for two
convolutions, 54 and 62 with the option (`experiments/tensorcore_candidates.py`,
`experiments/results/tensorcore_candidates_cpu_2026-11-26*.json`, built on the CPU). Only a build that
fails so is built again, so a library whose kernels all build as TVM builds them is compiled as before;
in one that needs the option, every kernel is compiled with it (static shared arrays become one buffer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import tvm

MERGED = {"tirx.merge_static_smem": True}
REFUSED = "tvm_access_ptr element type must match"
Built = TypeVar("Built")


def built_retrying_merged(build: Callable[[], Built], target_kind: str) -> Built:
    """`build()`, or where a CUDA build fails with REFUSED, `build()` again under the current pass
    configuration with MERGED added."""
    try:
        return build()
    except Exception as error:  # noqa: BLE001  (TVM raises its own error types)
        if target_kind != "cuda" or REFUSED not in str(error):
            raise
    current = tvm.transform.PassContext.current()
    with tvm.transform.PassContext(opt_level=current.opt_level, required_pass=current.required_pass,
                                   disabled_pass=current.disabled_pass,
                                   config={**dict(current.config), **MERGED}):
        return build()
