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
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder.local_builder import default_export
from tvm.support.popen_pool import PopenPoolExecutor


def build_kernel(mod, target):
    """MetaSchedule's default build without `import tvm.s_tir.tensor_intrin`, built again where TVM's
    shared-memory planning refuses it (`tvmsched.shared_memory`), and compiled without TVM's unused
    type-traits header (`tvmsched.nvrtc_source`), as model builds do."""
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from tvmsched import nvrtc_source
    from tvmsched.shared_memory import built_retrying_merged

    nvrtc_source.install()
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return built_retrying_merged(lambda: build(mod, target=target), target.kind.name)


def build_and_export(mod, target) -> str:
    """Runs in a worker: compile one candidate and write it to a temporary archive; returns its path."""
    return default_export(build_kernel(mod, target))


NICENESS = 10  # of builds and searches: they yield the CPU to the process that measures
CANCELLED = "build cancelled: the tuning run stopped"


@derived_object
class PooledBuilder(ms.builder.PyBuilder):
    """Builds candidates on `workers` processes that live for the whole tuning run; several threads may
    build at once. After `stop_when(over)`, a batch asked for once `over()` (the run's end) is not built;
    `shutdown` cancels the builds still queued."""

    def __init__(self, workers: int | None, timeout_s: float, uses: int = 128):
        super().__init__()
        self.timeout_s = timeout_s
        self.over: Callable[[], bool] = lambda: False
        self.pool = PopenPoolExecutor(max_workers=workers, timeout=timeout_s, maximum_process_uses=uses,
                                      initializer=os.nice, initargs=(NICENESS,))
        self.queued: set[Future] = set()
        self.lock = threading.Lock()

    def build(self, build_inputs: list[ms.builder.BuilderInput]) -> list[ms.builder.BuilderResult]:
        if self.over():
            return [ms.builder.BuilderResult(None, CANCELLED) for _ in build_inputs]
        futures = [self.pool.submit(build_and_export, item.mod, item.target) for item in build_inputs]
        with self.lock:
            self.queued.update(futures)
        try:
            return [self._result(future) for future in futures]
        finally:
            with self.lock:
                self.queued.difference_update(futures)

    def _result(self, future: Future) -> ms.builder.BuilderResult:
        try:
            return ms.builder.BuilderResult(future.result(), None)
        except TimeoutError:
            return ms.builder.BuilderResult(None, f"build timed out after {self.timeout_s:g} s")
        except CancelledError:
            return ms.builder.BuilderResult(None, CANCELLED)
        except Exception as error:
            return ms.builder.BuilderResult(None, f"build failed:\n{error}")

    def stop_when(self, over: Callable[[], bool]) -> None:
        self.over = over

    def shutdown(self) -> None:
        with self.lock:
            for future in self.queued:
                future.cancel()
        self.pool.shutdown()
