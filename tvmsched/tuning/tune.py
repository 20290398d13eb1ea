"""`tune`: MetaSchedule on a model's unique kernels, into the tuning log of the target.

Each unique kernel (a MetaSchedule task, weighted by how often the model runs it) gets up to `trials`
measured candidates over all runs: the manifest counts trials per workload, so rerunning continues where
the last run stopped and skips kernels that have their trials. Each kernel is tuned by its own MetaSchedule
run (`tuning.kernels`; several at once on a GPU) sharing builder, runner and database: tuned together,
MetaSchedule measures every kernel once before it commits any record, which on the H100 took longer than a
device session. A time budget stops each kernel in flight at its next measured batch or cost-model
prediction, and starts no kernel expected to end after it (`RunControl.may_start`); Ctrl-C stops after
the batches being measured; in both cases every measured record is already in the log.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops

from tvmsched.codegen import anonymous
from tvmsched.cost.analytic import kernel_alone
from tvmsched.errors import TargetError, TvmschedError
from tvmsched.lower import LoweredModule
from tvmsched.target import TargetSpec, gpu_present, host_cores, target_device_name
from tvmsched.tuning.builder import PooledBuilder
from tvmsched.tuning.defaults import measure_defaults
from tvmsched.tuning.intrinsics import import_tensor_intrinsics
from tvmsched.tuning.kernels import (
    KernelTuning,
    RunControl,
    SharedCostModel,
    SharedDatabase,
    Stopped,
    tune_kernels,
)
from tvmsched.tuning.log import TuningLog, database_key
from tvmsched.tuning.rpc import TrackerAddress, rpc_runner

SEARCH_STRATEGIES = ("evolutionary", "replay-trace", "replay-func")
COST_MODELS = ("xgb", "mlp", "random")


@dataclass(frozen=True)
class TuneOptions:
    trials: int = 64  # per unique kernel, over all runs
    time_budget_s: float | None = None
    search: str = "evolutionary"
    population: int = 256  # evolutionary search: candidates per generation (MetaSchedule: 512)
    generations: int = 2  # evolutionary search: rounds of mutation per measured batch (MetaSchedule: 4)
    seeds: int = 50  # evolutionary search: new valid random candidates it starts from (MetaSchedule: 50)
    cost_model: str = "xgb"
    rpc: str | None = None  # HOST:PORT:KEY of a TVM RPC tracker
    workers: int | None = None  # parallel builds (default: every core)
    concurrent: int | None = None  # kernels tuned at once (default: CONCURRENT, 1 when measuring on this CPU)
    build_timeout_s: float = 60.0
    seed: int = 0

    def __post_init__(self):
        if self.trials < 1:
            raise TvmschedError(f"--trials must be at least 1, got {self.trials}")
        if min(self.population, self.generations, self.seeds) < 1:
            raise TvmschedError("--population, --generations and --seeds must be at least 1")
        if self.search not in SEARCH_STRATEGIES:
            raise TvmschedError(f"unknown search '{self.search}'; use one of {', '.join(SEARCH_STRATEGIES)}")
        if self.cost_model not in COST_MODELS:
            raise TvmschedError(f"unknown cost model '{self.cost_model}'; use one of "
                                f"{', '.join(COST_MODELS)}")
        if self.concurrent is not None and self.concurrent < 1:
            raise TvmschedError(f"--concurrent must be at least 1, got {self.concurrent}")
        if self.rpc:
            TrackerAddress.parse(self.rpc)

    def kernels_at_once(self, spec: TargetSpec) -> int:
        """Kernels tuned at once: one where candidates are measured on this machine's CPU, whose timings
        concurrent builds would disturb."""
        if self.concurrent is not None:
            return self.concurrent
        return 1 if spec.kind == "llvm" and not self.rpc else CONCURRENT


@dataclass
class TaskProgress:
    name: str
    workload: str
    weight: int  # runs per inference, over all models of the run
    flops: int  # per run
    bytes: int  # read and written per run
    trials_before: int
    default_ms: float | None = None  # the default schedule's latency, measured once per log
    trials: int = 0  # this run
    best_ms: float | None = None  # this run's
    best_ms_before: float | None = None  # earlier runs'
    seconds: float = 0.0  # this run
    seconds_before: float = 0.0  # spent tuning it in earlier runs
    exhausted: bool = False  # the search ran out of new candidates before `wanted`
    state: str = "waiting"  # then "tuning", then "done" (all its trials, or exhausted) or "stopped"
    wanted: int = 0  # trials to reach over all runs (`trials_wanted`)
    vendor_ms: float | None = None  # the fastest vendor plan's, where a build timed one (tactics cache)

    @property
    def latency_ms(self) -> float | None:
        """The latency a build gets now: the fastest of the default, the best tuned so far and a vendor
        plan (None before any is measured)."""
        return _fastest(self.default_ms, self.best_ms_before, self.best_ms, self.vendor_ms)

    @property
    def priority(self) -> float:
        """Weight × latency (`latency_ms`, else the analytic model's estimate): the order in which kernels
        are tuned, so a run that raises --trials goes first where builds still spend the time."""
        latency = self.latency_ms
        return self.weight * (latency if latency is not None else kernel_alone(self.flops, self.bytes)[0])


@dataclass
class Settled:
    """A kernel of the models that already had its trials: runs per inference, and its latencies."""
    weight: int
    default_ms: float | None
    best_ms: float | None
    vendor_ms: float | None = None
    left_to_vendor: bool = False  # skipped: its probe left TVM more than VENDOR_REACH behind the vendor plan

    @property
    def latency_ms(self) -> float | None:
        """The latency a build gets: the fastest of default, best tuned and a vendor plan (None if none was
        measured)."""
        return _fastest(self.default_ms, self.best_ms, self.vendor_ms)


# A kernel that a vendor plan runs faster than TVM so far gets VENDOR_PROBE trials; the rest of --trials,
# in a later run, only where its best tuned came within VENDOR_REACH of the plan's time (TVM can still beat
# it there).
VENDOR_PROBE = 16
VENDOR_REACH = 1.25


def trials_wanted(trials: int, had: int, default_ms: float | None, best_ms: float | None,
                  vendor_ms: float | None) -> int | None:
    """The trials a kernel that `had` trials so far is tuned to over all runs: `trials`, but `VENDOR_PROBE`
    where a vendor plan (`vendor_ms`) runs it faster than its default and best tuned so far, and None (no
    more) once those trials left its best tuned more than `VENDOR_REACH` times the plan's time."""
    tvm_ms = _fastest(default_ms, best_ms)
    if vendor_ms is None or (tvm_ms is not None and tvm_ms <= vendor_ms):
        return trials
    if had < VENDOR_PROBE:
        return min(trials, VENDOR_PROBE)
    return trials if best_ms is not None and best_ms <= VENDOR_REACH * vendor_ms else None


def _fastest(*latencies: float | None) -> float | None:
    """The smallest of the measured latencies (None: not measured), or None if none was."""
    return min((ms_ for ms_ in latencies if ms_ is not None), default=None)


@dataclass
class TuneResult:
    log: TuningLog
    tasks: list[TaskProgress]
    settled: list[Settled] = field(default_factory=list)  # the models' kernels that had their trials
    seconds: float = 0.0
    stopped_by_budget: bool = False
    failed_builds: int = 0
    failed_runs: int = 0
    messages: list[str] = field(default_factory=list)

    @property
    def trials(self) -> int:
        return sum(task.trials for task in self.tasks)

    @property
    def skipped(self) -> int:
        """Kernels that already had their trials, or are left to their vendor plan."""
        return len(self.settled)

    @property
    def left_to_vendor(self) -> int:
        """Kernels skipped because their probe left TVM more than VENDOR_REACH behind the vendor plan."""
        return sum(kernel.left_to_vendor for kernel in self.settled)

    @property
    def estimated_ms(self) -> float | None:
        """Σ weight × latency over the models' kernels, each at its `latency_ms` (the fastest of default,
        best tuned and vendor plan), those that had their trials included; the kernel time of one inference
        of each model. None before any measurement."""
        known = [(kernel.weight, kernel.latency_ms) for kernel in [*self.tasks, *self.settled]]
        return sum(weight * ms_ for weight, ms_ in known if ms_ is not None) or None

    @property
    def default_ms(self) -> float | None:
        """Σ weight × default latency over the models' kernels whose default was measured."""
        measured = [kernel.weight * kernel.default_ms for kernel in [*self.tasks, *self.settled]
                    if kernel.default_ms is not None]
        return sum(measured) or None


def workload_key(task: ms.ExtractedTask) -> str:
    """A task's workload as the kernel graph names it (structural hash without the symbol)."""
    function = task.dispatched[0]["main"]
    return f"{tvm_ffi.structural_hash(function.without_attr('global_symbol')) & (2**64 - 1):016x}"


def tune(lowered: LoweredModule | Sequence[LoweredModule], spec: TargetSpec, log: TuningLog,
         options: TuneOptions, progress: Callable[[TuneResult], None] = lambda result: None,
         vendor_ms: dict[str, float] | None = None) -> TuneResult:
    """Tune the kernels of one or several lowered models for `spec` into `log`.

    First the default schedule of every kernel not measured before is measured (kept in the manifest);
    then kernels are tuned the slowest in total first over all models (weight × the latency a build gets
    now: the default's, the best tuned so far or a vendor plan's, whichever is fastest), so a time budget
    goes where it matters. `vendor_ms` holds, by workload, the vendor plans' times builds measured
    (`tactics.select.vendor_latencies`): a kernel a plan runs faster gets trials only where TVM can still
    beat it (`trials_wanted`). `progress` is called after every measured batch."""
    modules = [lowered] if isinstance(lowered, LoweredModule) else list(lowered)
    with log.locked():
        manifest = log.manifest()
        entries = manifest["workloads"]
        target = _tuning_target(spec)
        tasks, todo, settled = _collect(modules, target, entries, options.trials, vendor_ms or {})
        result = TuneResult(log, tasks, settled)
        if not todo:
            return result
        if spec.kind == "cuda" and not options.rpc and not gpu_present():
            raise TargetError(f"tuning for {spec.key} measures every candidate on its GPU, and no CUDA "
                              f"device is present here; run `tvmsched tune` on the machine with the GPU, or "
                              f"measure there through a TVM RPC tracker (--rpc HOST:PORT:KEY)")
        _quiet_metaschedule_console()
        start = time.perf_counter()
        control = RunControl(result, options.time_budget_s)
        concurrent = min(options.kernels_at_once(spec), len(todo))
        runner = _runner(options)
        builder = PooledBuilder(options.workers, options.build_timeout_s)

        def checkpoint() -> None:
            """Write what the run measured so far into the manifest, so a killed run loses none of it."""
            with control.lock:
                _record(entries, tasks)
                log.write_manifest(manifest, target_device_name(spec))

        try:
            with control.interrupts():
                _measure_defaults(tasks, todo, spec, target, builder, runner, control)
                for task in tasks:  # a default faster than the vendor plan gets every trial
                    task.wanted = trials_wanted(options.trials, task.trials_before, task.default_ms,
                                                task.best_ms_before, task.vendor_ms) or task.wanted
                checkpoint()
                builder.stop_when(control.over)  # the search's batches, not the defaults, end with the run
                order = sorted(range(len(tasks)), key=lambda index: tasks[index].priority, reverse=True)
                tasks[:], todo[:] = [tasks[index] for index in order], [todo[index] for index in order]
                progress(result)
                unpacked = log.unpacked({database_key(task.dispatched[0]) for task in todo})
                with tempfile.TemporaryDirectory(prefix="tvmsched-tune-") as work_dir, unpacked as database:
                    shared = SharedDatabase(database)
                    try:
                        tuning = _kernel_tuning(todo, options, concurrent, work_dir, builder, runner, shared,
                                                checkpoint, control.over)
                        tune_kernels(tuning, control, concurrent, progress)
                    finally:
                        shared.close()
        except Stopped:
            pass  # the time budget or Ctrl-C, while measuring the defaults
        except Exception:
            if not control.interrupted:  # else: a second Ctrl-C, re-raised by TVM as another error
                raise
        finally:
            result.seconds = time.perf_counter() - start
            checkpoint()
            builder.shutdown()
            runner.pool.shutdown()  # its workers hold RPC sessions, and so the servers, until they exit
        if control.interrupted:
            raise KeyboardInterrupt
    return result


# Kernels tuned at once on a GPU: a kernel's run keeps the 16 cores of the H100 host busy only while it
# searches, and its batch of builds waits for the slowest one.
CONCURRENT = 4
DEFAULTS_PER_BATCH = 64


def _measure_defaults(tasks: list[TaskProgress], todo: list[ms.ExtractedTask], spec: TargetSpec, target,
                      builder, runner, control: RunControl) -> None:
    """Measure the default schedule of the kernels without one in the manifest, DEFAULTS_PER_BATCH at a
    time (the time budget is checked between batches)."""
    unmeasured = [index for index, task in enumerate(tasks) if task.default_ms is None]
    for chunk in range(0, len(unmeasured), DEFAULTS_PER_BATCH):
        indices = unmeasured[chunk:chunk + DEFAULTS_PER_BATCH]
        latencies = measure_defaults([todo[i] for i in indices], spec, target, builder, runner)
        for index, latency in zip(indices, latencies):
            tasks[index].default_ms = latency
        control.check()


def _kernel_tuning(todo: list[ms.ExtractedTask], options: TuneOptions, concurrent: int, work_dir: str,
                   builder, runner, database: SharedDatabase, checkpoint, over) -> KernelTuning:
    """The MetaSchedule contexts of the kernels and what their runs share; the cores are divided among the
    searches of the kernels tuned at once."""
    cores = options.workers or host_cores()
    import_tensor_intrinsics()  # what each TuneContext imports, in a fifth of the time

    def contexts_with(strategy, tasks: list[ms.ExtractedTask]) -> tuple[list, list[float]]:
        return ms.relax_integration.extracted_tasks_to_tune_contexts(
            tasks, work_dir, strategy=strategy, seed=options.seed, num_threads=max(1, cores // concurrent))

    def patient_context(index: int):
        return contexts_with(_strategy(options, patient=True), [todo[index]])[0][0]

    contexts, weights = contexts_with(_strategy(options), todo)
    cost_model = SharedCostModel(ms.CostModel.create(options.cost_model, num_tuning_cores=cores), over)
    return KernelTuning(contexts, weights, work_dir, builder, runner, database, cost_model,
                        checkpoint, patient_context if options.search == "evolutionary" else None)


def _collect(modules: list[LoweredModule], target: tvm.target.Target, entries: dict, trials: int,
             vendor_ms: dict[str, float]) -> tuple[list[TaskProgress], list[ms.ExtractedTask], list[Settled]]:
    """The unique kernels of `modules` (weights summed over the models): those that still need trials
    (`trials_wanted`) and their MetaSchedule tasks, and those that had them (or are scheduled already)."""
    first: dict[str, ms.ExtractedTask] = {}
    weights: dict[str, int] = {}
    for module in modules:
        for task in ms.relax_integration.extract_tasks(module.module, target):
            key = workload_key(task)
            first.setdefault(key, task)
            weights[key] = weights.get(key, 0) + int(task.weight)
    tasks, todo, settled = [], [], []
    for key, task in first.items():
        weight, entry, vendor = weights[key], entries.get(key, {}), vendor_ms.get(key)
        wanted = trials_wanted(trials, entry.get("trials", 0), entry.get("default_ms"), entry.get("best_ms"),
                               vendor)
        if (wanted is None or entry.get("trials", 0) >= wanted or entry.get("exhausted")
                or task.mod.attrs.get("tirx.is_scheduled", False)):
            settled.append(Settled(weight, entry.get("default_ms"), entry.get("best_ms"), vendor,
                                   left_to_vendor=wanted is None))
            continue
        function = task.dispatched[0]
        tasks.append(TaskProgress(task.task_name, key, weight, int(estimate_tir_flops(function)),
                                  _traffic(function["main"]), entry.get("trials", 0), entry.get("default_ms"),
                                  best_ms_before=entry.get("best_ms"),
                                  seconds_before=entry.get("seconds", 0.0), wanted=wanted, vendor_ms=vendor))
        todo.append(_anonymous(task))
    return tasks, todo, settled


def _anonymous(task: ms.ExtractedTask) -> ms.ExtractedTask:
    """The task with its kernel under the symbol "main", as builds look it up (`codegen.anonymous`)."""
    module = task.dispatched[0]
    kernel = tvm.IRModule({"main": anonymous(module["main"])}, attrs=module.attrs)
    return ms.ExtractedTask(task.task_name, task.mod, task.target, [kernel], task.weight)


def _record(entries: dict, tasks: list[TaskProgress]) -> None:
    """Write what this run measured into the manifest's workload entries."""
    for task in tasks:
        if not task.trials and task.default_ms is None:
            continue
        entry = entries.setdefault(task.workload, {"name": task.name, "trials": 0})
        entry["trials"] = task.trials_before + task.trials
        entry["seconds"] = round(task.seconds_before + task.seconds, 1)
        for key in ("default_ms", "best_ms"):
            value = getattr(task, key)
            if value is not None:
                entry[key] = min(value, entry.get(key, value))
        if task.exhausted:
            entry["exhausted"] = True


def _traffic(function: tvm.tirx.PrimFunc) -> int:
    """Bytes of a kernel's tensor parameters (its reads and writes, each once)."""
    return sum(math.prod(int(dim) for dim in info.shape) * tvm_ffi.dtype(info.dtype).itemsize
               for info in ms.arg_info.ArgInfo.from_prim_func(function))


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
        return tvm.target.Target({**spec.config, "num-cores": host_cores()})
    return spec.tvm_target


# MetaSchedule's evolutionary search starts only from `seeds` (50) new candidates that pass its checks, and
# gives up after 5 rounds of `population` samples without one. On the H100, big batch-16 convolutions have
# 0.3-0.7% of random samples within 48 KB of shared memory (VerifyGPUCode): their search found none in
# 76-97 s. A kernel whose search found no candidate is searched again starting from at most 8, and giving up
# after 20 rounds.
PATIENT_SAMPLING = {"init_min_unmeasured": 8, "max_fail_count": 20}


def _strategy(options: TuneOptions, patient: bool = False):
    """The search strategy of `options`; `patient`: with PATIENT_SAMPLING's initial-population limits."""
    if options.search != "evolutionary":
        return options.search
    sampling = {"init_min_unmeasured": options.seeds}
    if patient:
        sampling = {**PATIENT_SAMPLING,
                    "init_min_unmeasured": min(options.seeds, PATIENT_SAMPLING["init_min_unmeasured"])}
    return ms.search_strategy.EvolutionarySearch(population_size=options.population,
                                                 genetic_num_iters=options.generations, **sampling)


# Each candidate runs for at least 20 ms (MetaSchedule's default: 100): on the H100 the best of 16 candidates
# of a squeezenet conv measured within 1% of the 100 ms figures, in 1.4 s instead of 4.5 s per batch.
EVALUATOR = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20, enable_cpu_cache_flush=False)


def _runner(options: TuneOptions):
    if not options.rpc:
        return ms.runner.LocalRunner(evaluator_config=EVALUATOR)
    return rpc_runner(TrackerAddress.parse(options.rpc), EVALUATOR)
