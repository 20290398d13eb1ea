"""Tuning on llvm with tiny trial counts: records are applied at build, reruns resume without duplicate
workloads, an interrupted or budget-stopped run keeps its records, foreign and corrupt logs are refused,
and two runs never write one log at once."""

import gzip
import importlib
import json
import os
import re
import shutil
import signal
import time
from collections import Counter

import numpy as np
import psutil
import pytest
import tvm
from conftest import assert_matches, onnxruntime_outputs
from tvm.s_tir import meta_schedule as ms

import tvmsched
from tvmsched import frontend
from tvmsched.errors import TargetError, TuningLogError, TvmschedError
from tvmsched.lower import lower
from tvmsched.target import resolve_target
from tvmsched.tuning import TuneOptions, TuningLog, tune
from tvmsched.tuning.kernels import RunControl
from tvmsched.tuning.tune import Settled, TaskProgress, TuneResult

LLVM = resolve_target("llvm")
FAST = {"workers": 2, "search": "replay-trace", "cost_model": "random"}


def lowered(model, batch=1):
    inputs = frontend.bind_input_shapes(model, batch)
    return lower(frontend.to_relax(model, inputs))


def lines(path):
    """A log file's lines, packed or not (a finished run leaves only the packed .gz)."""
    log = TuningLog(path.parent, LLVM.key)
    return [line.rstrip("\n") for line in log.lines(path)]


@pytest.fixture(scope="module")
def tuned_log(tmp_path_factory, request):
    """One tuning run of the branchy model (2 trials per kernel), shared by the tests that read it."""
    branchy = request.getfixturevalue("branchy_model")
    log = TuningLog.for_target(LLVM, tmp_path_factory.mktemp("logs"))
    result = tune(lowered(branchy), LLVM, log, TuneOptions(trials=2, **FAST))
    set_defaults(log, lambda key, entry: None)  # 2 random trials rarely beat llvm's default: apply them all
    return log, result


def set_defaults(log, default_ms):
    """Rewrite the manifest's default latency of each workload to `default_ms(key, entry)` (None:
    unmeasured)."""
    manifest = log.manifest()
    for key, entry in manifest["workloads"].items():
        entry.pop("default_ms", None)
        if default_ms(key, entry) is not None:
            entry["default_ms"] = default_ms(key, entry)
    log.write_manifest(manifest, manifest["device"])


@pytest.fixture(scope="module")
def branchy_model():
    import conftest

    return conftest.branchy_model.__wrapped__()


def test_tune_writes_records_and_a_manifest(tuned_log):
    log, result = tuned_log
    manifest = json.loads((log.directory / "manifest.json").read_text())
    assert manifest["target"] == LLVM.key and manifest["tvm"] == tvmsched.api.tvm.__version__
    assert len(manifest["workloads"]) == len(result.tasks) > 0
    assert all(entry["trials"] >= 1 for entry in manifest["workloads"].values())
    assert len(lines(log.records_path)) == result.trials
    assert result.estimated_ms is not None and result.estimated_ms > 0
    # the most expensive kernels first, by what the run measured before tuning (the defaults); a kernel's
    # priority afterwards also counts its tuned best, which may reorder them
    work = [task.weight * task.default_ms for task in result.tasks]
    assert work == sorted(work, reverse=True)


def test_build_applies_the_log_and_matches_onnxruntime(tuned_log, branchy_model):
    log, _ = tuned_log
    model = tvmsched.compile(branchy_model, target="llvm", batch=1, tuning_log=log.directory.parent)
    assert model.meta.tuned_kernels and model.meta.tuning_log == str(log.directory)
    untuned = tvmsched.compile(branchy_model, target="llvm", batch=1, tuning_log=log.directory, tuned=False)
    assert untuned.meta.tuned_kernels == ()
    # measured stage latencies are cached by this hash: tuned and default kernels must not share them
    assert model.meta.kernels_hash != untuned.meta.kernels_hash
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype("float32")
    assert_matches([model(x)], onnxruntime_outputs(branchy_model, {"input": x}))


def test_build_keeps_the_default_where_tuning_measured_slower(tuned_log, tmp_path, branchy_model):
    log, _ = tuned_log
    copy = TuningLog(shutil.copytree(log.directory, tmp_path / LLVM.key), LLVM.key)
    slower = next(key for key, entry in copy.manifest()["workloads"].items() if "best_ms" in entry)
    set_defaults(copy, lambda key, entry: entry["best_ms"] / (2 if key == slower else 0.5))
    model = tvmsched.compile(branchy_model, target="llvm", batch=1, tuning_log=copy.directory)
    symbols = {kernel.symbol for kernel in model.graph.kernels if kernel.workload == slower}
    assert symbols and not symbols & set(model.meta.tuned_kernels)
    reference = tvmsched.compile(branchy_model, target="llvm", batch=1, tuning_log=log.directory)
    assert set(model.meta.tuned_kernels) == set(reference.meta.tuned_kernels) - symbols != set()


def test_a_run_raising_trials_tunes_first_where_builds_spend_the_time(tuned_log, tmp_path, branchy_model):
    """Resumed with more trials, kernels are ordered by weight × the latency a build gets now (the faster
    of default and best tuned), not by the default: a kernel that tuning already made fast goes last."""
    log, _ = tuned_log
    copy = TuningLog(shutil.copytree(log.directory, tmp_path / LLVM.key), LLVM.key)
    manifest = copy.manifest()
    keys = sorted(manifest["workloads"])
    for rank, key in enumerate(keys):  # the last key has the slowest default, but tuning made it fastest
        manifest["workloads"][key].update(default_ms=1.0 + rank, best_ms=1e-3 if key == keys[-1] else 5.0)
    copy.write_manifest(manifest, manifest["device"])
    result = tune(lowered(branchy_model), LLVM, copy, TuneOptions(trials=3, time_budget_s=0.0, **FAST))
    latency = {key: min(1.0 + rank, 1e-3 if key == keys[-1] else 5.0) for rank, key in enumerate(keys)}
    weights = {task.workload: task.weight for task in result.tasks}
    expected = sorted(keys, key=lambda key: -weights[key] * latency[key])
    assert [task.workload for task in result.tasks] == expected and expected[-1] == keys[-1]
    # builds' latency now, lowered by whatever this run measured before its budget stopped it
    assert 0 < result.estimated_ms <= sum(weights[key] * latency[key] for key in keys) + 1e-9


def test_rerun_skips_done_kernels_and_adds_no_duplicate_workloads(tuned_log, branchy_model):
    log, first = tuned_log
    workloads = lines(log.workloads_path)
    again = tune(lowered(branchy_model), LLVM, log, TuneOptions(trials=2, **FAST))
    assert again.trials == 0 and again.skipped == len(first.tasks) + first.skipped
    # the estimate covers the model's kernels, those that had their trials too: comparable between runs
    kept = {key: min(entry[name] for name in ("default_ms", "best_ms") if name in entry)
            for key, entry in log.manifest()["workloads"].items()}
    assert again.estimated_ms == pytest.approx(sum(task.weight * kept[task.workload] for task in first.tasks))
    records = lines(log.records_path)
    more = tune(lowered(branchy_model), LLVM, log, TuneOptions(trials=3, **FAST))
    assert more.trials >= 1
    assert lines(log.records_path)[:len(records)] == records  # nothing lost, the new ones appended
    assert len(lines(log.records_path)) == len(records) + more.trials
    assert lines(log.workloads_path) == workloads  # the same workloads, none appended twice
    assert len(set(lines(log.workloads_path))) == len(workloads)


def test_several_models_share_kernels_and_are_tuned_most_expensive_first(tmp_path, branchy_model):
    log = TuningLog.for_target(LLVM, tmp_path)
    single = tune(lowered(branchy_model), LLVM, TuningLog.for_target(LLVM, tmp_path / "single"),
                  TuneOptions(trials=1, **FAST))
    models = [lowered(branchy_model), lowered(branchy_model), lowered(branchy_model, batch=2)]
    result = tune(models, LLVM, log, TuneOptions(trials=1, **FAST))
    weights = {task.workload: task.weight for task in result.tasks}
    assert all(weights[task.workload] == 2 * task.weight for task in single.tasks)  # one task, both runs
    assert len(result.tasks) == 2 * len(single.tasks)  # batch 2 brings its own kernels
    # ordered by weight x default latency (a fresh log has no tuned best yet); `priority` itself changes as
    # the run's candidates beat a default
    assert all(task.default_ms is not None for task in result.tasks)
    priorities = [task.weight * task.default_ms for task in result.tasks]
    assert priorities == sorted(priorities, reverse=True)


def test_cli_tunes_into_the_log(tmp_path, branchy_model, capsys):
    import onnx

    from tvmsched.cli import main

    onnx.save(branchy_model, tmp_path / "branchy.onnx")
    code = main(["tune", str(tmp_path / "branchy.onnx"), "--batch", "1", "--target", "llvm", "--trials", "1",
                 "--log", str(tmp_path / "logs"), "--search", "replay-trace", "--cost-model", "random",
                 "--workers", "2", "--concurrent", "2"])
    manifest = json.loads((tmp_path / "logs" / LLVM.key / "manifest.json").read_text())
    assert code == 0 and manifest["workloads"]
    assert all(entry["trials"] == 1 for entry in manifest["workloads"].values())
    assert "budget" not in capsys.readouterr().err  # none was given


def test_cli_says_how_much_of_a_spent_budget_lowering_took(tmp_path, branchy_model, capsys):
    import onnx

    from tvmsched.cli import main

    onnx.save(branchy_model, tmp_path / "branchy.onnx")
    code = main(["tune", str(tmp_path / "branchy.onnx"), "--batch", "1", "--target", "llvm", "--trials", "4",
                 "--log", str(tmp_path / "logs"), "--time-budget", "0s", "--workers", "1"])
    assert code == 0
    assert re.search(r"0 trials on \d+ kernels in \d+ s \(time budget spent importing and lowering: \d+ s "
                     r"of 0\)", " ".join(capsys.readouterr().err.split()))


def relu_model(*widths: int):
    """One Relu per width, on an input of shape [1, width] each: a kernel each."""
    from conftest import make_model, tensor
    from onnx import helper

    return make_model([helper.make_node("Relu", [f"x{width}"], [f"y{width}"]) for width in widths],
                      [tensor(f"x{width}", [1, width]) for width in widths],
                      [tensor(f"y{width}", [1, width]) for width in widths], {})


def test_builds_apply_your_log_first_then_the_shipped_one(tmp_path, monkeypatch):
    """`tune` writes the user's log by default; a build applies it and the shipped one, the user's deciding
    for the kernels it measured."""
    from tvmsched.tuning import log as logs

    shipped, user = tmp_path / "shipped", tmp_path / "user"
    monkeypatch.setattr(logs, "shipped_root", lambda: shipped)
    monkeypatch.setenv("TVMSCHED_TUNING_LOGS", str(user))
    tune(lowered(relu_model(4, 8)), LLVM, TuningLog.for_target(LLVM, shipped), TuneOptions(trials=2, **FAST))
    tune(lowered(relu_model(8)), LLVM, TuningLog.for_target(LLVM), TuneOptions(trials=2, **FAST))
    assert json.loads((user / LLVM.key / "manifest.json").read_text())["workloads"]  # the user's log
    for root in (shipped, user):
        set_defaults(TuningLog.for_target(LLVM, root), lambda key, entry: None)  # apply every record
    model = tvmsched.compile(relu_model(4, 8), target="llvm")
    assert model.meta.tuning_log == f"{user / LLVM.key}, {shipped / LLVM.key}"
    assert len(model.meta.tuned_kernels) == 2
    # where the user's log measured its tuning slower than the default, the default is kept
    set_defaults(TuningLog.for_target(LLVM), lambda key, entry: entry["best_ms"] / 2)
    model = tvmsched.compile(relu_model(4, 8), target="llvm")
    width = {kernel.symbol: kernel.outputs[0].shape[1] for kernel in model.graph.kernels}
    assert [width[symbol] for symbol in model.meta.tuned_kernels] == [4]
    assert tvmsched.compile(relu_model(4, 8), target="llvm", tuning_log=user).meta.tuned_kernels == ()


def test_cli_tune_writes_your_log_not_the_shipped_one(tmp_path, monkeypatch):
    import onnx

    from tvmsched.cli import main
    from tvmsched.tuning import log as logs

    monkeypatch.setattr(logs, "shipped_root", lambda: tmp_path / "shipped")
    monkeypatch.delenv("TVMSCHED_TUNING_LOGS")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    onnx.save(relu_model(8), tmp_path / "relu.onnx")
    assert main(["tune", str(tmp_path / "relu.onnx"), "--target", "llvm", "--trials", "1", "--search",
                 "replay-trace", "--cost-model", "random", "--workers", "1"]) == 0
    log = tmp_path / "home" / ".cache" / "tvmsched" / "tuning_logs" / LLVM.key
    assert json.loads((log / "manifest.json").read_text())["workloads"]
    assert not (tmp_path / "shipped").exists()


def test_a_kernel_with_no_candidates_left_counts_as_done(tmp_path):
    from conftest import make_model, tensor
    from onnx import helper

    relu = helper.make_node("Relu", ["x"], ["y"])
    model = make_model([relu], [tensor("x", [4, 8])], [tensor("y", [4, 8])], {})
    log = TuningLog.for_target(LLVM, tmp_path)
    options = TuneOptions(trials=32, workers=2, population=16, generations=1, cost_model="random")
    first = tune(lowered(model), LLVM, log, options)
    assert [task.exhausted for task in first.tasks] == [True] and first.trials < 32  # one schedule exists
    assert log.manifest()["workloads"][first.tasks[0].workload]["exhausted"]
    again = tune(lowered(model), LLVM, log, options)
    assert again.tasks == [] and again.skipped == 1


def test_time_budget_stops_and_keeps_records(tmp_path, branchy_model):
    log = TuningLog.for_target(LLVM, tmp_path)
    first = tune(lowered(branchy_model), LLVM, log, TuneOptions(trials=4, time_budget_s=0, **FAST))
    assert first.stopped_by_budget and first.trials == 0  # stopped after measuring the defaults
    defaults = {workload: entry["default_ms"] for workload, entry in log.manifest()["workloads"].items()}
    assert len(defaults) == len(first.tasks) and all(value > 0 for value in defaults.values())
    spent = tune(lowered(branchy_model), LLVM, log, TuneOptions(trials=4, time_budget_s=0, **FAST))
    assert spent.stopped_by_budget and spent.trials == 0  # a spent budget starts no kernel
    assert spent.tasks[0].default_ms == defaults[spent.tasks[0].workload]  # measured once
    result = tune(lowered(branchy_model), LLVM, log, TuneOptions(trials=4, time_budget_s=600, **FAST))
    assert not result.stopped_by_budget and result.trials > 0
    assert len(lines(log.records_path)) == result.trials


def test_time_budget_starts_no_kernel_expected_to_end_after_it():
    """A kernel's run is checked against the budget only after its batches, so a kernel started late would
    overrun the budget by about what the run's finished kernels took."""
    tasks = [TaskProgress(f"k{index}", str(index), 1, 0, 0, 0) for index in range(3)]
    result = TuneResult(log=None, tasks=tasks)
    control = RunControl(result, budget_s=100)
    assert control.may_start()  # nothing finished yet: only the deadline counts
    tasks[0].state, tasks[0].seconds = "done", 30.0
    tasks[1].state, tasks[1].seconds = "stopped", 500.0  # a stopped kernel says nothing of a kernel's time
    assert control.may_start() and not result.stopped_by_budget
    tasks[1].state = "done"
    tasks[2].state, tasks[2].seconds = "done", 200.0
    assert not control.may_start() and result.stopped_by_budget  # the median, 200 s, ends after 100 s
    assert not control.stop.is_set()  # the kernels in flight go on
    assert RunControl(TuneResult(log=None, tasks=tasks), budget_s=None).may_start()


@pytest.mark.parametrize("concurrent,how", [(1, signal.SIGINT), (2, signal.SIGINT), (2, "raise"),
                                            (1, signal.SIGTERM)])
def test_interrupt_keeps_records_and_manifest(tmp_path, branchy_model, concurrent, how):
    """Ctrl-C (a SIGINT, or a KeyboardInterrupt from the progress callback) or a SIGTERM (`timeout`) stops
    the run after the batches in flight; every measured record is in the log and counted in the
    manifest."""
    log = TuningLog.for_target(LLVM, tmp_path)
    batches = []
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

    def interrupt(result):
        batches.append(result.trials)
        if len(batches) == 2 and how == "raise":
            raise KeyboardInterrupt
        if len(batches) == 2:
            os.kill(os.getpid(), how)

    with pytest.raises(KeyboardInterrupt):
        tune(lowered(branchy_model), LLVM, log, TuneOptions(trials=4, concurrent=concurrent, **FAST),
             progress=interrupt)
    manifest = json.loads((log.directory / "manifest.json").read_text())
    trials = sum(entry["trials"] for entry in manifest["workloads"].values())
    assert trials == len(lines(log.records_path)) == batches[-1] >= batches[1] > 0
    assert trials < 4 * len(manifest["workloads"])  # stopped early
    # the handlers are the caller's again (a shell's background job starts with SIGINT ignored)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


def test_ctrl_c_in_a_terminal_counts_no_candidate_it_killed(tmp_path, branchy_model, monkeypatch):
    """A terminal's Ctrl-C reaches the builder's and runner's worker processes too, and the candidates they
    were building fail: those are no trials. The log holds no record of them, the manifest counts none, and
    a resumed run tunes that kernel again."""
    from tvmsched.tuning.builder import PooledBuilder

    build = PooledBuilder._cls.build
    calls = []

    def build_then_ctrl_c(self, inputs):
        calls.append(len(inputs))
        if len(calls) == 3:  # the defaults, the first kernel's batch, then Ctrl-C during the second's
            workers = psutil.Process().children(recursive=True)
            for worker in workers:
                os.kill(worker.pid, signal.SIGINT)
            psutil.wait_procs(workers, timeout=60)
            os.kill(os.getpid(), signal.SIGINT)
        return build(self, inputs)

    monkeypatch.setattr(PooledBuilder._cls, "build", build_then_ctrl_c)
    log = TuningLog.for_target(LLVM, tmp_path)
    with pytest.raises(KeyboardInterrupt):
        tune(lowered(branchy_model), LLVM, log, TuneOptions(trials=4, **FAST))
    manifest = log.manifest()["workloads"]
    run_secs = [json.loads(line)[1][1] for line in lines(log.records_path)]
    assert len(run_secs) == sum(entry["trials"] for entry in manifest.values())
    assert all(max(seconds) < 1 for seconds in run_secs)  # no record of a killed candidate
    done = {key for key, entry in manifest.items() if entry["trials"] == 4}
    assert len(done) == 1  # the first kernel (a fresh worker may measure some of the second's batch)
    monkeypatch.setattr(PooledBuilder._cls, "build", build)
    again = tune(lowered(branchy_model), LLVM, log, TuneOptions(trials=4, **FAST))
    assert sorted(task.workload for task in again.tasks) == sorted(set(manifest) - done)


def test_a_candidate_whose_worker_died_or_was_cancelled_is_no_trial():
    from tvm.s_tir import meta_schedule as ms

    from tvmsched.tuning.kernels import is_trial

    built, failed = ms.builder.BuilderResult("a.so", None), ms.builder.BuilderResult(None, "error: bad")
    measured = ms.runner.RunnerResult([0.001], None)
    assert is_trial(built, measured) and is_trial(failed, ms.runner.RunnerResult(None, "no artifact"))
    assert is_trial(built, ms.runner.RunnerResult(None, "LocalRunner: Timeout, killed after 30 seconds"))
    assert not is_trial(built, ms.runner.RunnerResult(None, "LocalRunner: An exception occurred\n"
                                                            "Subprocess terminated"))
    assert not is_trial(ms.builder.BuilderResult(None, "build failed:\nSubprocess terminated"), measured)
    assert not is_trial(ms.builder.BuilderResult(None, "build cancelled: the tuning run stopped"), measured)


def test_kernels_tuned_at_once_keep_their_records_apart(tmp_path, branchy_model):
    """Three kernels at a time share the builder, runner and database: each gets its trials, the
    database holds exactly the records counted for each, and each workload once."""
    log = TuningLog.for_target(LLVM, tmp_path)
    at_once = []

    def count_tuning(result):
        at_once.append(sum(task.state == "tuning" for task in result.tasks))

    result = tune(lowered(branchy_model), LLVM, log, TuneOptions(trials=3, concurrent=3, **FAST),
                  progress=count_tuning)
    assert len(result.tasks) > 3 and all(task.state == "done" for task in result.tasks)
    assert max(at_once) == 3
    workloads = lines(log.workloads_path)
    assert len(workloads) == len(set(workloads)) == len(result.tasks)
    per_workload = Counter(json.loads(line)[0] for line in lines(log.records_path))
    manifest = log.manifest()["workloads"]
    assert sorted(per_workload.values()) == sorted(entry["trials"] for entry in manifest.values())
    assert sum(per_workload.values()) == result.trials == sum(task.trials for task in result.tasks)
    assert all(task.trials == 3 or task.exhausted for task in result.tasks)


def test_foreign_corrupt_and_busy_logs_are_refused(tuned_log, tmp_path, branchy_model):
    log, _ = tuned_log
    cuda = resolve_target("nvidia/nvidia-h100")
    with pytest.raises(TuningLogError, match=f"made for {LLVM.key}, not {cuda.key}"):
        TuningLog.for_target(cuda, log.directory)
    corrupt = TuningLog(tmp_path / LLVM.key, LLVM.key)
    corrupt.directory.mkdir()
    corrupt.workloads_path.write_text("".join(log.lines(log.workloads_path)))
    records = lines(log.records_path)
    corrupt.records_path.write_text("\n".join([records[0], "[0, {broken", *records[1:]]) + "\n")
    with pytest.raises(TuningLogError, match=r"database_tuning_record.json:2: not a MetaSchedule"):
        tvmsched.compile(branchy_model, target="llvm", batch=1, tuning_log=tmp_path)
    corrupt.records_path.unlink()  # now the packed archive is read: cut it short
    packed = corrupt.directory / (corrupt.records_path.name + ".gz")
    packed.write_bytes((log.directory / packed.name).read_bytes()[:100])
    with pytest.raises(TuningLogError, match=r"database_tuning_record.json.gz' is corrupt .*git checkout"):
        tvmsched.compile(branchy_model, target="llvm", batch=1, tuning_log=tmp_path)
    with log.locked(), pytest.raises(TuningLogError, match="another `tvmsched tune` is writing"):
        tune(lowered(branchy_model), LLVM, log, TuneOptions(trials=5, **FAST))


@pytest.mark.skipif(tvm.cuda(0).exist, reason="needs a machine without a CUDA device")
def test_tuning_for_a_gpu_without_one_is_refused_before_anything_is_measured(tmp_path, branchy_model):
    log = TuningLog.for_target(resolve_target("cuda"), tmp_path)
    with pytest.raises(TargetError, match="no CUDA device is present here; .*--rpc HOST:PORT:KEY"):
        tune(lowered(branchy_model), resolve_target("cuda"), log, TuneOptions(trials=1))
    assert not log.exists() and not (tmp_path / "manifest.json").exists()


class _FailingRunner:
    """A runner on a device that cannot run anything."""

    class _Future:
        def result(self):
            error = "Traceback ...\nCUDA Runtime Error: initialization error\n"
            return tvm.s_tir.meta_schedule.runner.RunnerResult(None, error)

    class _Pool:  # MetaSchedule's runners measure in a worker pool, which `tune` shuts down
        def shutdown(self):
            pass

    pool = _Pool()

    def run(self, inputs):
        return [self._Future() for _ in inputs]


def test_a_run_whose_defaults_all_fail_to_run_stops_with_the_devices_error(tmp_path, branchy_model,
                                                                           monkeypatch):
    monkeypatch.setattr(importlib.import_module("tvmsched.tuning.tune"), "_runner",
                        lambda options: _FailingRunner())
    log = TuningLog.for_target(LLVM, tmp_path)
    with pytest.raises(TargetError, match=r"all \d+ default schedules built but none ran where candidates "
                                          r"are measured \(CUDA Runtime Error: initialization error\)"):
        tune(lowered(branchy_model), LLVM, log, TuneOptions(trials=2, **FAST))


def test_tune_measures_through_an_rpc_tracker(tmp_path, branchy_model, rpc_tracker):
    """--rpc: candidates run on the servers registered with a tracker (all local here, on llvm)."""
    from tvm import rpc

    log = TuningLog.for_target(LLVM, tmp_path)
    result = tune(lowered(branchy_model), LLVM, log, TuneOptions(trials=2, rpc=str(rpc_tracker), **FAST))
    assert result.trials > 0 and result.failed_runs == 0 and result.failed_builds == 0
    assert all(task.best_ms is not None for task in result.tasks)
    assert len(lines(log.records_path)) == result.trials
    # the run let go of the servers: another tuner need not wait for their sessions' timeout (300 s; a
    # server registers again with the tracker a moment after its session ends)
    tracker = rpc.connect_tracker(rpc_tracker.host, rpc_tracker.port)
    deadline = time.monotonic() + 30
    while tracker.summary()["queue_info"][rpc_tracker.key]["free"] < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert tracker.summary()["queue_info"][rpc_tracker.key]["free"] == 2


def test_log_is_packed_and_a_killed_runs_leftovers_are_used_then_packed(tuned_log, tmp_path, branchy_model):
    log, _ = tuned_log
    assert not log.records_path.exists() and not log.workloads_path.exists()
    packed = [log.directory / (path.name + ".gz") for path in (log.workloads_path, log.records_path)]
    assert all(path.is_file() for path in packed) and lines(log.records_path)
    # a killed run leaves unpacked files: the records it loaded, then those it appended, the last cut off
    left = TuningLog(tmp_path / LLVM.key, LLVM.key)
    shutil.copytree(log.directory, left.directory)
    set_defaults(left, lambda key, entry: None)  # apply every record
    records = lines(log.records_path)
    (left.directory / packed[1].name).write_bytes(gzip.compress("".join(f"{line}\n" for line in records[:-2])
                                                                .encode()))
    left.workloads_path.write_text("".join(log.lines(log.workloads_path)))
    left.records_path.write_text(f"{records[0]}\n{records[-2]}\n{records[-1][:40]}")
    assert lines(left.records_path) == [*records[:-1], records[-1][:40]]  # builds see the newest state ...
    model = tvmsched.compile(branchy_model, target="llvm", batch=1, tuning_log=left.directory)
    assert model.meta.tuned_kernels  # ... without the cut-off line
    with left.locked():  # the next run packs them first
        assert not left.records_path.exists()
    assert lines(left.records_path) == records[:-1]


def test_a_run_unpacks_only_the_records_of_its_kernels_and_keeps_the_rest(tuned_log, tmp_path):
    log, _ = tuned_log
    copy = TuningLog(shutil.copytree(log.directory, tmp_path / LLVM.key), LLVM.key)
    records = lines(copy.records_path)
    first = json.loads(lines(copy.workloads_path)[0])[0]
    with copy.locked(), copy.unpacked({first}) as database:
        unpacked = copy.records_path.read_text().splitlines()
        assert unpacked and {json.loads(line)[0] for line in unpacked} == {0}
        assert len(unpacked) == sum(json.loads(line)[0] == 0 for line in records) < len(records)
        assert len(database) == len(unpacked)
    assert lines(copy.records_path) == records and not copy.records_path.exists()


def test_builds_load_only_the_best_record_of_each_workload(tuned_log, tmp_path):
    log, _ = tuned_log
    best = {}
    for line in lines(log.records_path):
        index, (_, run_secs, *_) = json.loads(line)
        if run_secs and sum(run_secs) / len(run_secs) < 1e9:
            best[index] = min(best.get(index, 1e9), sum(run_secs) / len(run_secs))
    log.database(tmp_path)
    kept = [json.loads(line) for line in (tmp_path / "database_tuning_record.json").read_text().splitlines()]
    assert sorted(index for index, _ in kept) == sorted(best)
    assert all(sum(record[1]) / len(record[1]) == best[index] for index, record in kept)


def test_a_build_loads_only_its_own_workloads_records(tuned_log, tmp_path):
    """A build reads the best records of the workloads it compiles alone, renumbered (MetaSchedule replays
    every record it loads; a tensor-core record of another model would need TVM's tensor intrinsics)."""
    log, _ = tuned_log
    workloads = lines(log.workloads_path)
    keys = [json.loads(line)[0] for line in workloads]
    log.database(tmp_path / "all")
    everything = [json.loads(line) for line in (tmp_path / "all" / "database_tuning_record.json").read_text()
                  .splitlines()]
    wanted = {keys[index] for index, _ in everything[::2]}
    log.database(tmp_path / "some", wanted)
    kept_workloads = (tmp_path / "some" / "database_workload.json").read_text().splitlines()
    kept = [json.loads(line) for line in (tmp_path / "some" / "database_tuning_record.json").read_text()
            .splitlines()]
    assert [json.loads(line)[0] for line in kept_workloads] == [key for key in keys if key in wanted]
    assert sorted((json.loads(kept_workloads[index])[0], record[1]) for index, record in kept) == sorted(
        (keys[index], record[1]) for index, record in everything if keys[index] in wanted)


@pytest.mark.gpu
def test_two_kernels_at_once_on_the_gpu_then_the_build_matches_onnxruntime(tmp_path, branchy_model):
    """The CUDA path of concurrent tuning: pooled NVRTC builds, one runner measuring for both threads."""
    cuda = resolve_target("cuda")
    log = TuningLog.for_target(cuda, tmp_path)
    options = TuneOptions(trials=4, concurrent=2, search="replay-trace", cost_model="random")
    result = tune(lowered(branchy_model), cuda, log, options)
    assert result.failed_runs == 0 and all(task.best_ms and task.default_ms for task in result.tasks)
    per_workload = Counter(json.loads(line)[0] for line in lines(log.records_path))
    assert sorted(per_workload.values()) == sorted(task.trials for task in result.tasks)
    set_defaults(log, lambda key, entry: None)  # apply every record
    model = tvmsched.compile(branchy_model, target="cuda", batch=1, tuning_log=log.directory)
    tuned = {kernel.workload for kernel in model.graph.kernels if kernel.symbol in model.meta.tuned_kernels}
    assert tuned == {task.workload for task in result.tasks}
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype("float32")
    assert_matches([model(x)], onnxruntime_outputs(branchy_model, {"input": x}))


def test_a_kernel_two_models_name_differently_is_tuned_once_and_applied_in_both(tmp_path):
    from conftest import make_model, tensor
    from onnx import helper

    node = helper.make_node
    one = make_model([node("Relu", ["x"], ["y"])], [tensor("x", [1, 8])], [tensor("y", [1, 8])], {})
    two = make_model([node("Relu", ["a"], ["c"]), node("Relu", ["b"], ["d"])], [tensor("a", [1, 4]),
                     tensor("b", [1, 8])], [tensor("c", [1, 4]), tensor("d", [1, 8])], {})
    log = TuningLog.for_target(LLVM, tmp_path)
    result = tune([lowered(one), lowered(two)], LLVM, log, TuneOptions(trials=2, **FAST))
    assert sorted(task.weight for task in result.tasks) == [1, 2]  # the [1, 8] relu: 'relu' and 'relu1'
    set_defaults(log, lambda key, entry: None)  # apply every record
    for model in (one, two):
        compiled = tvmsched.compile(model, target="llvm", batch=1, tuning_log=log.directory)
        assert len(compiled.meta.tuned_kernels) == len(compiled.graph.kernels)  # under either symbol


def test_a_kernel_whose_search_finds_no_candidate_is_searched_again_patiently(tmp_path):
    """On the H100, 0.3-0.7% of a big convolution's random schedules fit 48 KB of shared memory, fewer than
    MetaSchedule's evolutionary search waits for: the second search starts from fewer, and its candidates
    build for CUDA (cross-compiled here, nothing measured)."""
    from conftest import make_model, tensor
    from onnx import helper
    from tvm.s_tir import meta_schedule as ms

    from tvmsched.tuning.builder import build_kernel
    from tvmsched.tuning.tune import _anonymous, _kernel_tuning, _quiet_metaschedule_console

    stem = helper.make_node("Conv", ["x", "w"], ["y"], pads=[3, 3, 3, 3], strides=[2, 2])
    model = make_model([stem], [tensor("x", [1, 3, 224, 224])], [tensor("y", [1, 64, 112, 112])],
                       {"w": np.ones((64, 3, 7, 7), "float32")})
    target = resolve_target("cuda").tvm_target
    tasks = [_anonymous(task) for task in ms.relax_integration.extract_tasks(lowered(model).module, target)]
    options = TuneOptions(trials=4, population=16, generations=1, workers=1, cost_model="random")
    _quiet_metaschedule_console()  # as `tune` does first: MetaSchedule's logging trips on other handlers
    tuning = _kernel_tuning(tasks, options, 1, str(tmp_path), None, None, None, None, lambda: False)
    context = tuning.patient_context(0)  # its logging set up again beside the first contexts'
    context.search_strategy.pre_tuning(4, 4, context.space_generator.generate_design_space(context.mod),
                                       ms.database.MemoryDatabase(), ms.cost_model.RandomModel())
    candidates = context.search_strategy.generate_measure_candidates()
    assert candidates is not None and len(candidates) == 4
    assert build_kernel(candidates[0].sch.mod, target).imports  # the CUDA module


@pytest.mark.parametrize("seeds, patient_seeds", [(50, 8), (16, 8), (4, 4)])
def test_seeds_set_where_the_search_starts_and_the_patient_search_starts_from_no_more(seeds, patient_seeds):
    from tvmsched.tuning.tune import PATIENT_SAMPLING, _strategy

    options = TuneOptions(seeds=seeds)
    assert _strategy(options).init_min_unmeasured == seeds
    patient = _strategy(options, patient=True)
    assert patient.init_min_unmeasured == patient_seeds
    assert patient.max_fail_count == PATIENT_SAMPLING["max_fail_count"]
    with pytest.raises(TvmschedError, match="--seeds"):
        TuneOptions(seeds=0)


@pytest.mark.parametrize("first_measures", [0, 4])
def test_only_a_kernel_whose_first_search_measured_nothing_is_searched_again(monkeypatch, first_measures):
    """The second, patient search runs after a first one that measured nothing, and not otherwise."""
    from tvmsched.tuning import kernels

    searched = []

    def search(context, index, trials, tuning, control, report):
        searched.append(context)
        control.result.tasks[index].trials += first_measures if context == "first" else trials

    monkeypatch.setattr(kernels, "_search", search)
    task = TaskProgress("conv", "w1", weight=1, flops=1, bytes=1, trials_before=0, wanted=4)
    tuning = kernels.KernelTuning(["first"], [1.0], "", None, None, None, None, lambda: None,
                                  patient_context=lambda index: "patient")
    kernels._tune_kernel(0, tuning, RunControl(TuneResult(log=None, tasks=[task]), budget_s=None), print)
    assert searched == (["first", "patient"] if first_measures == 0 else ["first"])
    assert task.state == "done" and task.trials == 4 and not task.exhausted


def test_a_search_past_the_budget_stops_at_its_next_prediction_and_builds_nothing():
    """The evolutionary search asks the cost model once a generation: past the run's end it is told to stop
    there, and a batch it still hands over is not built (cancelled builds are not trials)."""
    from tvmsched.tuning.builder import CANCELLED, PooledBuilder
    from tvmsched.tuning.kernels import SharedCostModel, Stopped

    control = RunControl(TuneResult(log=None, tasks=[]), budget_s=0)
    model = SharedCostModel(ms.CostModel.create("random"), control.over)
    with pytest.raises(Stopped):
        model._inst.predict(None, [])  # as MetaSchedule's search calls it back
    assert control.result.stopped_by_budget
    builder = PooledBuilder(1, 10.0)
    try:
        builder.stop_when(control.over)
        results = builder.build([ms.builder.BuilderInput(None, None)] * 2)
        assert [result.error_msg for result in results] == [CANCELLED] * 2
    finally:
        builder.shutdown()


def test_a_kernel_a_vendor_plan_runs_faster_is_tuned_only_while_tvm_can_still_beat_it():
    from tvmsched.tuning.tune import VENDOR_PROBE, VENDOR_REACH, trials_wanted

    assert trials_wanted(64, 0, None, None, None) == 64  # no vendor plan: every trial
    assert trials_wanted(64, 0, 1.0, None, 2.0) == 64  # TVM's default is faster already
    assert trials_wanted(64, 0, 3.0, None, 2.0) == VENDOR_PROBE  # a probe first
    assert trials_wanted(8, 0, 3.0, None, 2.0) == 8
    assert trials_wanted(64, VENDOR_PROBE, 3.0, 2.0 * VENDOR_REACH, 2.0) == 64  # within reach: the rest
    assert trials_wanted(64, VENDOR_PROBE, 3.0, 2.0 * VENDOR_REACH * 1.01, 2.0) is None  # out of reach
    assert trials_wanted(64, VENDOR_PROBE, 3.0, None, 2.0) is None  # the probe found nothing valid
    settled = Settled(weight=2, default_ms=3.0, best_ms=2.6, vendor_ms=2.0, left_to_vendor=True)
    assert settled.latency_ms == 2.0  # what a build gets now: the vendor plan
    result = TuneResult(log=None, tasks=[], settled=[settled, Settled(1, 1.0, None)])
    assert (result.skipped, result.left_to_vendor, result.estimated_ms) == (2, 1, 5.0)
