"""The kernel loop of a tuning run: each kernel tuned by its own MetaSchedule run, several at once.

A kernel's MetaSchedule run alternates CPU work (evolutionary search, then compiling a batch of candidates,
where the batch waits for its slowest build) with a short GPU measurement, so one kernel at a time leaves
both mostly idle. Several kernels are tuned at once by threads (TVM releases the GIL in its calls); they
share the builder's worker pool, which fills the gaps, and the runner, whose single worker measures one
candidate at a time, so GPU timings never overlap. Builds and searches run at a lower CPU priority than
the measuring process. The cost model and the log's database are shared behind locks.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from tvmsched.tuning.builder import CANCELLED, NICENESS
from tvmsched.tuning.defaults import mean_ms


class Stopped(Exception):
    """The run stops: its time budget is spent, Ctrl-C was pressed, or a kernel's run failed."""


class RunControl:
    """When a tuning run stops, shared by its threads: the time budget, Ctrl-C, or the first failure."""

    def __init__(self, result, budget_s: float | None):
        self.result = result
        self.deadline = None if budget_s is None else time.perf_counter() + budget_s
        self.stop = threading.Event()
        self.lock = threading.Lock()  # guards the result's counters and the progress report
        self.interrupted = False
        self.error: BaseException | None = None

    def over(self) -> bool:
        """Whether the run should stop (marking the result when the budget did it)."""
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.result.stopped_by_budget = True
            self.stop.set()
        return self.stop.is_set()

    def check(self) -> None:
        """Raise `Stopped` if the run should stop."""
        if self.over():
            raise Stopped

    def may_start(self) -> bool:
        """Whether a kernel started now is expected to finish within the time budget: the kernels this run
        finished took `expected` seconds each (their median), and a kernel's run is checked against the
        budget only after its batches and between its search's generations, so one started late would
        overrun it by about that much. When it may not, the run counts as stopped by the budget, and the
        kernels in flight go on."""
        if self.deadline is None:
            return True
        finished = sorted(task.seconds for task in self.result.tasks if task.state == "done")
        expected = finished[len(finished) // 2] if finished else 0.0
        if time.perf_counter() + expected <= self.deadline:
            return True
        self.result.stopped_by_budget = True
        return False

    def interrupt(self) -> None:
        self.interrupted = True
        self.stop.set()

    @contextmanager
    def interrupts(self):
        """While the run is on, the first Ctrl-C (or SIGTERM, as `timeout` and job schedulers send) stops
        it after the batches in flight and the second at once. (TVM hands a KeyboardInterrupt raised in
        Python code it calls back as an unnamed error, so the run cannot wait for one.) Only the main
        thread takes signals; elsewhere they are left alone."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def first_stops_then_raise(signum, frame) -> None:
            if self.interrupted:
                raise KeyboardInterrupt
            self.interrupt()

        previous = {number: signal.signal(number, first_stops_then_raise)
                    for number in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.stop.set()


@dataclass(frozen=True)
class KernelTuning:
    """What every kernel's MetaSchedule run shares."""

    contexts: list  # one TuneContext per task of `result.tasks`, in the same order
    weights: list[float]
    work_dir: str
    builder: ms.builder.Builder
    runner: ms.runner.Runner
    database: SharedDatabase
    cost_model: SharedCostModel
    checkpoint: Callable[[], None]  # keeps what the run measured so far (the manifest), after each kernel
    # The context of kernel `index` with a patient initial sampling, for a second search where the first
    # found no candidate to measure (None: no second search)
    patient_context: Callable[[int], object] | None = None


def tune_kernels(tuning: KernelTuning, control: RunControl, concurrent: int,
                 report: Callable[[object], None]) -> None:
    """Tune `control.result.tasks` in order, `concurrent` kernels at a time, until all are done or the run
    stops (see `RunControl.interrupts` for Ctrl-C); the first failure of a kernel's run stops the others
    and is raised."""
    pending = iter(range(len(tuning.contexts)))
    taking = threading.Lock()

    def work(background: bool) -> None:
        if background:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICENESS)
        while not control.stop.is_set():
            with taking:
                index = next(pending, None) if control.may_start() else None
            if index is None:
                return
            _tune_kernel(index, tuning, control, report)
            tuning.checkpoint()

    if concurrent == 1:
        work(background=False)
    else:
        threads = [threading.Thread(target=work, args=(True,), name=f"tvmsched-tune-{number}", daemon=True)
                   for number in range(concurrent)]
        for thread in threads:
            thread.start()
        _join(threads)
    if control.error is not None and not control.interrupted:
        raise control.error


def _join(threads: list[threading.Thread]) -> None:
    """Wait for `threads`, staying responsive to Ctrl-C."""
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)


def _tune_kernel(index: int, tuning: KernelTuning, control: RunControl, report) -> None:
    """One kernel's MetaSchedule run: its remaining trials, batch by batch, each batch's records committed
    as it is measured."""
    task = control.result.tasks[index]
    trials = task.wanted - task.trials_before
    task.state = "tuning"
    began = time.perf_counter()
    try:
        _search(tuning.contexts[index], index, trials, tuning, control, report)
        if not task.trials and tuning.patient_context is not None and not control.stop.is_set():
            _search(tuning.patient_context(index), index, trials, tuning, control, report)
        task.exhausted = task.trials < trials  # returned early, no error: no candidates left
        task.state = "done"
    except Exception as error:  # callbacks' exceptions arrive re-wrapped by TVM's FFI
        if not control.stop.is_set():
            control.fail(error)
    finally:
        task.state = "done" if task.state == "done" else "stopped"
        task.seconds = time.perf_counter() - began


def _search(context, index: int, trials: int, tuning: KernelTuning, control: RunControl, report) -> None:
    """One MetaSchedule run of kernel `index` with `context`, for up to `trials` measured candidates."""
    ms.tune_tasks(tasks=[context], task_weights=[tuning.weights[index]], work_dir=tuning.work_dir,
                  max_trials_global=trials, num_trials_per_iter=min(64, trials), task_scheduler="round-robin",
                  builder=tuning.builder, runner=tuning.runner, database=tuning.database,
                  cost_model=tuning.cost_model,
                  measure_callbacks=[_AddTrials(tuning.database), ms.measure_callback.RemoveBuildArtifact(),
                                     ms.measure_callback.UpdateCostModel(),
                                     _ProgressCallback(control.result.tasks[index], control, report)])


# How TVM's worker pools report a worker process that died. A terminal's Ctrl-C reaches the builder's and
# the runner's workers too, and kills the candidates they hold.
WORKER_DIED = "Subprocess terminated"
FAILED_SECONDS = 1e10  # the time MetaSchedule records for a candidate that failed to build or run


def is_trial(built: ms.builder.BuilderResult, ran: ms.runner.RunnerResult) -> bool:
    """Whether a measured candidate counts as a trial of its kernel: it ran, or failed for a reason of its
    own. One whose worker died or whose build was cancelled when the run stopped says nothing of itself:
    it is neither recorded nor counted, so a later run tunes its kernel again."""
    error = built.error_msg or ran.error_msg or ""
    return WORKER_DIED not in error and not error.startswith(CANCELLED)


@derived_object
class _AddTrials(ms.measure_callback.PyMeasureCallback):
    """MetaSchedule's AddToDatabase, for the candidates that are trials (`is_trial`) only."""

    def __init__(self, database: SharedDatabase):
        super().__init__()
        self.database = database

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        context = task_scheduler.tasks_[task_id].ctx
        workload = self.database.commit_workload(context.mod)
        failed = [tvm.tirx.FloatImm("float32", FAILED_SECONDS)]
        for candidate, built, ran in zip(measure_candidates, builder_results, runner_results):
            if is_trial(built, ran):
                record = ms.database.TuningRecord(candidate.sch.trace, workload, ran.run_secs or failed,
                                                  context.target, candidate.args_info)
                self.database.commit_tuning_record(record)


@derived_object
class _ProgressCallback(ms.measure_callback.PyMeasureCallback):
    """After each measured batch of one kernel: count its trials (`is_trial`), failures and best latency,
    report, and stop if the run should."""

    def __init__(self, task, control: RunControl, report):
        super().__init__()
        self.task = task
        self.control = control
        self.report = report

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        result = self.control.result
        with self.control.lock:
            for built, ran in zip(builder_results, runner_results):
                if not is_trial(built, ran):
                    continue
                self.task.trials += 1
                if built.error_msg:
                    result.failed_builds += 1
                    _remember(result, built.error_msg)
                elif ran.error_msg or not ran.run_secs:
                    result.failed_runs += 1
                    _remember(result, ran.error_msg or "no timings")
                else:
                    latency_ms = mean_ms(ran.run_secs)
                    self.task.best_ms = min(latency_ms, self.task.best_ms or latency_ms)
            try:
                self.report(result)
            except KeyboardInterrupt:
                self.control.interrupt()
                raise
        self.control.check()  # after the database callback: this batch's records are in the log


def _remember(result, message: str) -> None:
    """Keep the first few distinct failure reasons (their last line) for the summary."""
    reason = message.strip().splitlines()[-1][:200] if message.strip() else "unknown"
    if reason not in result.messages and len(result.messages) < 5:
        result.messages.append(reason)


@derived_object
class SharedDatabase(ms.database.PyDatabase):
    """The log's database for several kernels' threads: one call at a time, and closed when the run ends,
    so a thread still finishing a batch cannot append to a log that is being packed."""

    def __init__(self, database: ms.database.Database):
        super().__init__()
        self.database = database
        self.lock = threading.Lock()
        self.closed = False

    def close(self) -> None:
        with self.lock:
            self.closed = True

    def _writable(self) -> None:
        if self.closed:
            raise Stopped("the tuning run has ended")

    def has_workload(self, mod) -> bool:
        with self.lock:
            return self.database.has_workload(mod)

    def commit_workload(self, mod):
        with self.lock:
            self._writable()
            return self.database.commit_workload(mod)

    def commit_tuning_record(self, record) -> None:
        with self.lock:
            self._writable()
            self.database.commit_tuning_record(record)

    def get_top_k(self, workload, top_k: int):
        with self.lock:
            return self.database.get_top_k(workload, top_k)

    def get_all_tuning_records(self):
        with self.lock:
            return self.database.get_all_tuning_records()

    def __len__(self) -> int:
        with self.lock:
            return len(self.database)


@derived_object
class SharedCostModel(ms.cost_model.PyCostModel):
    """One cost model for the kernels tuned at once, trained on all their measurements (each kernel's first
    batch is ranked by what the others taught it); one call at a time. Once `over()` (the run's end), a
    prediction raises `Stopped`: the evolutionary search asks for one every generation, and so ends there
    instead of after its batch is built and measured (on the 2-GPU host, where a search took 90 s, a run
    with a 100 s budget ended after 238 s)."""

    def __init__(self, model: ms.CostModel, over: Callable[[], bool]):
        super().__init__()
        self.model = model
        self.over = over
        self.lock = threading.Lock()

    def load(self, path: str) -> None:
        with self.lock:
            self.model.load(path)

    def save(self, path: str) -> None:
        with self.lock:
            self.model.save(path)

    def update(self, context, candidates, results) -> None:
        with self.lock:
            self.model.update(context, candidates, results)

    def predict(self, context, candidates):
        if self.over():
            raise Stopped("the tuning run has ended")
        with self.lock:
            return self.model.predict(context, candidates)
