"""`tune`: MetaSchedule on a model's unique kernels, into the tuning log of the target.

Each unique kernel (a MetaSchedule task, weighted by how often the model runs it) gets up to `trials`
measured candidates over all runs: the manifest counts trials per workload, so rerunning continues where
the last run stopped and skips kernels that have their trials. Kernels are tuned one after the other, each
by its own MetaSchedule run sharing builder, runner, cost model and database: tuned together, MetaSchedule
measures every kernel once before it commits any record, which on the H100 took longer than a device
session. A time budget stops at the next measured batch; Ctrl-C stops at once; in both cases every
measured record is already in the log.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops

from tvmsched.errors import TvmschedError
from tvmsched.lower import LoweredModule
from tvmsched.target import TargetSpec, target_device_name
from tvmsched.tuning.builder import PooledBuilder
from tvmsched.tuning.log import TuningLog

SEARCH_STRATEGIES = ("evolutionary", "replay-trace", "replay-func")
COST_MODELS = ("xgb", "mlp", "random")


@dataclass(frozen=True)
class TuneOptions:
    trials: int = 64  # per unique kernel, over all runs
    time_budget_s: float | None = None
    search: str = "evolutionary"
    cost_model: str = "xgb"
    rpc: str | None = None  # HOST:PORT:KEY of a TVM RPC tracker
    workers: int | None = None  # parallel builds (default: every core)
    build_timeout_s: float = 60.0
    seed: int = 0

    def __post_init__(self):
        if self.trials < 1:
            raise TvmschedError(f"--trials must be at least 1, got {self.trials}")
        if self.search not in SEARCH_STRATEGIES:
            raise TvmschedError(f"unknown search '{self.search}'; use one of {', '.join(SEARCH_STRATEGIES)}")
        if self.cost_model not in COST_MODELS:
            raise TvmschedError(f"unknown cost model '{self.cost_model}'; use one of "
                                f"{', '.join(COST_MODELS)}")
        if self.rpc:
            _parse_rpc(self.rpc)


@dataclass
class TaskProgress:
    name: str
    workload: str
    weight: int  # runs per inference
    flops: int  # per run
    trials_before: int
    trials: int = 0  # this run
    best_ms: float | None = None
    seconds: float = 0.0  # this run


@dataclass
class TuneResult:
    log: TuningLog
    tasks: list[TaskProgress]
    skipped: int  # kernels that already had their trials
    seconds: float = 0.0
    stopped_by_budget: bool = False
    failed_builds: int = 0
    failed_runs: int = 0
    messages: list[str] = field(default_factory=list)
    current: int = 0  # index in `tasks` of the kernel being tuned; those before it are finished

    @property
    def trials(self) -> int:
        return sum(task.trials for task in self.tasks)

    @property
    def estimated_ms(self) -> float | None:
        """Σ weight × best latency over the tasks measured so far (None before any)."""
        known = [task.weight * task.best_ms for task in self.tasks if task.best_ms is not None]
        return sum(known) if known else None


def workload_key(task: ms.ExtractedTask) -> str:
    """A task's workload as the kernel graph names it (structural hash without the symbol)."""
    function = task.dispatched[0]["main"]
    return f"{tvm_ffi.structural_hash(function.without_attr('global_symbol')) & (2**64 - 1):016x}"


def tune(lowered: LoweredModule, spec: TargetSpec, log: TuningLog, options: TuneOptions,
         progress: Callable[[TuneResult], None] = lambda result: None) -> TuneResult:
    """Tune the kernels of `lowered` for `spec` into `log`, one kernel at a time, the most expensive first
    (weight × FLOPs), so a time budget goes where it matters; `progress` is called after every measured
    batch with the running result."""
    extracted = ms.relax_integration.extract_tasks(lowered.module, _tuning_target(spec))
    with log.locked():
        manifest = log.manifest()
        done = manifest["workloads"]
        tasks, todo = [], []
        for task in extracted:
            key = workload_key(task)
            before = done.get(key, {}).get("trials", 0)
            if before < options.trials and not task.mod.attrs.get("tirx.is_scheduled", False):
                flops = int(estimate_tir_flops(task.dispatched[0]))
                tasks.append(TaskProgress(task.task_name, key, int(task.weight), flops, before))
                todo.append(task)
        pairs = sorted(zip(tasks, todo), key=lambda pair: pair[0].weight * pair[0].flops, reverse=True)
        tasks, todo = [task for task, _ in pairs], [extracted for _, extracted in pairs]
        result = TuneResult(log, tasks, skipped=len(extracted) - len(tasks))
        if not todo:
            return result
        _quiet_metaschedule_console()
        start = time.perf_counter()
        callback = _ProgressCallback(result, options.time_budget_s, start, progress)
        builder = PooledBuilder(options.workers, options.build_timeout_s)
        try:
            with tempfile.TemporaryDirectory(prefix="tvmsched-tune-") as work_dir, log.unpacked() as database:
                contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
                    todo, work_dir, strategy=options.search, seed=options.seed,
                    num_threads=options.workers or "physical")
                shared = {"builder": builder, "runner": _runner(options), "database": database,
                          "cost_model": ms.CostModel.create(options.cost_model,
                                                            num_tuning_cores=contexts[0].num_threads),
                          "measure_callbacks": [*ms.measure_callback.MeasureCallback.create("default"),
                                                callback]}
                for index, (context, weight, task) in enumerate(zip(contexts, weights, tasks)):
                    result.current = index
                    trials = options.trials - task.trials_before
                    began = time.perf_counter()
                    try:
                        ms.tune_tasks(tasks=[context], task_weights=[weight], work_dir=work_dir,
                                      max_trials_global=trials, num_trials_per_iter=min(64, trials),
                                      task_scheduler="round-robin", **shared)
                    finally:
                        task.seconds = time.perf_counter() - began
                    callback.check_budget()
        except Exception as error:  # exceptions from the callback arrive re-wrapped by TVM's FFI
            if callback.interrupted or "KeyboardInterrupt" in str(error):
                raise KeyboardInterrupt from error
            if not result.stopped_by_budget:
                raise
        finally:
            builder.shutdown()
            result.seconds = time.perf_counter() - start
            for task in tasks:
                entry = done.setdefault(task.workload, {"name": task.name, "trials": 0})
                entry["trials"] = task.trials_before + task.trials
                entry["seconds"] = round(entry.get("seconds", 0.0) + task.seconds, 1)
                if task.best_ms is not None:
                    entry["best_ms"] = min(task.best_ms, entry.get("best_ms", task.best_ms))
            log.write_manifest(manifest, target_device_name(spec))
    return result


class _BudgetSpent(Exception):
    pass


@derived_object
class _ProgressCallback(ms.measure_callback.PyMeasureCallback):
    """Counts trials and best latencies per task, reports them, and stops every task once the time budget
    is spent."""

    def __init__(self, result: TuneResult, budget_s: float | None, start: float, report):
        super().__init__()
        self.result = result
        self.budget_s = budget_s
        self.start = start
        self.report = report
        self.interrupted = False

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        task = self.result.tasks[self.result.current]
        task.trials += len(measure_candidates)
        for built, ran in zip(builder_results, runner_results):
            if built.error_msg:
                self.result.failed_builds += 1
                self._remember(built.error_msg)
            elif ran.error_msg or not ran.run_secs:
                self.result.failed_runs += 1
                self._remember(ran.error_msg or "no timings")
            else:
                latency_ms = 1e3 * sum(float(s) for s in ran.run_secs) / len(ran.run_secs)
                task.best_ms = latency_ms if task.best_ms is None else min(task.best_ms, latency_ms)
        try:
            self.report(self.result)
        except KeyboardInterrupt:
            self.interrupted = True
            raise
        self.check_budget()  # after the database callback: this batch's records are in the log

    def check_budget(self) -> None:
        if self.budget_s is not None and time.perf_counter() - self.start > self.budget_s:
            self.result.stopped_by_budget = True
            raise _BudgetSpent

    def _remember(self, message: str) -> None:
        """Keep the first few distinct failure reasons (their last line) for the summary."""
        reason = message.strip().splitlines()[-1][:200] if message.strip() else "unknown"
        if reason not in self.result.messages and len(self.result.messages) < 5:
            self.result.messages.append(reason)


def _quiet_metaschedule_console() -> None:
    """MetaSchedule prints every trial to stdout at DEBUG; keep its console to warnings (its per-task logs
    go to the run's scratch directory). Its logging setup re-lists the logger's handlers by name and fails
    on an unnamed one left from an earlier run, so start from none: it creates its own again."""
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    logger.setLevel(logging.WARNING)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()


def _tuning_target(spec: TargetSpec) -> tvm.target.Target:
    """The target to tune for: MetaSchedule's CPU rules also need the number of cores."""
    if spec.kind == "llvm":
        return tvm.target.Target({**spec.config, "num-cores": psutil.cpu_count(logical=False) or 1})
    return spec.tvm_target


def _runner(options: TuneOptions):
    if not options.rpc:
        return ms.runner.LocalRunner()
    host, port, key = _parse_rpc(options.rpc)
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=key,
                                 session_timeout_sec=60)
    return ms.runner.RPCRunner(rpc_config=config)


def _parse_rpc(text: str) -> tuple[str, int, str]:
    host, _, rest = text.partition(":")
    port, _, key = rest.partition(":")
    if not (host and port.isdigit() and key):
        raise TvmschedError(f"--rpc '{text}': write HOST:PORT:KEY of a TVM RPC tracker, e.g. "
                            f"127.0.0.1:9190:h100")
    return host, int(port), key
