"""The MetaSchedule builder for `tune`: candidates compiled in a pool of worker processes kept for the run.

MetaSchedule's LocalBuilder starts fresh workers for every batch, and each pays `import tvm` (7.7 s on the
H100 host, where tvm_ffi also imports torch) before it builds anything; its default build function then
imports `tvm.s_tir.tensor_intrin` (39 s there), more than the builder's timeout. Here workers are reused for
`uses` builds (then replaced, against the slow memory growth that made LocalBuilder restart them) and build
without that import: fp32 schedules use no tensor intrinsics. Workers run at a lower CPU priority, so the
runner's process measures undisturbed while other kernels build.
"""

from __future__ import annotations

import os

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder.local_builder import default_export
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind


def build_kernel(mod, target):
    """MetaSchedule's default build without `import tvm.s_tir.tensor_intrin`."""
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def build_and_export(mod, target) -> str:
    """Runs in a worker: compile one candidate and write it to a temporary archive; returns its path."""
    return default_export(build_kernel(mod, target))


NICENESS = 10  # of builds and searches: they yield the CPU to the process that measures


@derived_object
class PooledBuilder(ms.builder.PyBuilder):
    """Builds candidates on `workers` processes that live for the whole tuning run."""

    def __init__(self, workers: int | None, timeout_s: float, uses: int = 128):
        super().__init__()
        self.timeout_s = timeout_s
        self.pool = PopenPoolExecutor(max_workers=workers, timeout=timeout_s, maximum_process_uses=uses,
                                      initializer=os.nice, initargs=(NICENESS,))

    def build(self, build_inputs: list[ms.builder.BuilderInput]) -> list[ms.builder.BuilderResult]:
        results = []
        jobs = [(item.mod, item.target) for item in build_inputs]
        for outcome in self.pool.map_with_error_catching(lambda job: build_and_export(*job), jobs):
            if outcome.status == StatusKind.COMPLETE:
                results.append(ms.builder.BuilderResult(outcome.value, None))
            elif outcome.status == StatusKind.TIMEOUT:
                results.append(ms.builder.BuilderResult(None, f"build timed out after {self.timeout_s:g} s"))
            else:
                results.append(ms.builder.BuilderResult(None, f"build failed:\n{outcome.value}"))
        return results

    def shutdown(self) -> None:
        self.pool.shutdown()
