"""CUDA builds that TVM's shared-memory planning breaks, built again with static shared allocations merged
as dynamic ones are (`tirx.merge_static_smem`).

TVM 0.27 refuses many tensor-core schedules with "tvm_access_ptr element type must match the source
buffer (float16 vs float32)", likely because its planning gives a float32 shared buffer a float16 one's
space. Of MetaSchedule's fp16 NHWC tensor-core candidates for the H100, 11 of 64 and 1 of 62 built for two
convolutions, 54 and 62 with the option (`experiments/tensorcore_candidates.py`,
`experiments/results/tensorcore_candidates_cpu_2026-11-26*.json`, built on the CPU). Only a build that
fails so is built again, so a library whose kernels all build as TVM builds them is compiled as before;
in one that needs the option, every kernel is compiled with it (static shared arrays become one buffer),
and the next build of the same library, in any process, starts with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import tvm

from tvmsched.cache import Remembered

MERGED = {"tirx.merge_static_smem": True}
REFUSED = "tvm_access_ptr element type must match"
NEEDED = Remembered("builds.json", "merged_shared_memory1")  # the builds known to need MERGED: True
Built = TypeVar("Built")


def built_retrying_merged(build: Callable[[], Built], target_kind: str, key: str | None = None) -> Built:
    """`build()`, or where a CUDA build fails with REFUSED, `build()` again under the current pass
    configuration with MERGED added. A build whose `key` (its content and target) needed MERGED before, in
    this process or another, is built with it at once: the refused build cost googlenet's fp16 library 2.6
    s of 22.8 on this machine's CPU (`experiments/results/shared_memory_retry_cost_cpu_2026-11-26.json`)."""
    if key is None or NEEDED.get(key) is not True:
        try:
            return build()
        except Exception as error:  # noqa: BLE001  (TVM raises its own error types)
            if target_kind != "cuda" or REFUSED not in str(error):
                raise
        if key is not None:
            NEEDED.remember(key, True)
    current = tvm.transform.PassContext.current()
    with tvm.transform.PassContext(opt_level=current.opt_level, required_pass=current.required_pass,
                                   disabled_pass=current.disabled_pass,
                                   config={**dict(current.config), **MERGED}):
        return build()

