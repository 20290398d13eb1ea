"""The command line: help, one-line errors with exit code 2, and build → run → bench on a small model."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

from tvmsched.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tvmsched.cli", *args], capture_output=True, text=True,
                          timeout=600)


def test_help_lists_commands():
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("models", "build", "run", "bench"):
        assert command in result.stdout


@pytest.mark.parametrize("args, message", [
    (["build", "no_such_model", "-o", "out"], "neither a file nor a zoo model"),
    (["build", "model.onnx"], "required: -o/--output"),
    (["run", "x", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["run", "squeezenet", "--target", "metal"], "unknown target 'metal'"),
    (["run", "squeezenet", "--input-shape", "input:1xbad"], "cannot parse input shape"),
    (["models", "export", "nope", "-o", "x.onnx"], "no zoo model 'nope'"),
    (["tune", "--target", "llvm"], "name the models to tune"),
    (["tune", "squeezenet", "--time-budget", "soon"], "'soon' is not a duration"),
    (["tune", "squeezenet", "--target", "llvm", "--rpc", "localhost"], "write HOST:PORT:KEY"),
    (["tune", "squeezenet", "--seed", "7"], "unrecognized arguments: --seed 7"),  # not --seeds: no prefixes
    (["tune", "squeezenet", "--seeds", "0"], "--seeds: '0' is not an integer >= 1"),
])
def test_errors_are_one_line_with_exit_code_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_build_run_bench_round_trip(tmp_path, branchy_model, capsys, gpu_rewrites):
    model_path = tmp_path / "branchy.onnx"
    onnx.save(branchy_model, model_path)
    assert main(["build", str(model_path), "-o", str(tmp_path / "build"), "--batch", "2",
                 "--schedule", "dp", "--streams", "2"]) == 0
    assert (tmp_path / "build" / "model.so").is_file()
    assert json.loads((tmp_path / "build" / "plan.json").read_text())["scheduler"] == "dp"
    kernels = json.loads((tmp_path / "build" / "graph.json").read_text())["kernels"]
    recognized = sum(kernel["vendor_op"] is not None for kernel in kernels)
    line = f"kernels by implementation: {len(kernels)} tvm ({recognized} a vendor library could compute)"
    assert recognized and line in capsys.readouterr().err
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(tmp_path / "build"), "--input", f"input={tmp_path / 'x.npy'}",
                 "--save-output", str(tmp_path / "out.npz")]) == 0
    import tvmsched

    expected = tvmsched.compile(branchy_model, batch=2)(x)
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["output"], expected, rtol=1e-6)
    assert main(["bench", str(tmp_path / "build"), "--repeat", "3", "--warmup", "1",
                 "--json", str(tmp_path / "bench.json")]) == 0
    assert json.loads((tmp_path / "bench.json").read_text())["median_ms"] > 0
    assert main(["bench", str(tmp_path / "build"), "--budget", "0.5s", "--json",
                 str(tmp_path / "bench.json")]) == 0
    assert 3 <= json.loads((tmp_path / "bench.json").read_text())["repeat"] <= 200  # as the budget allows
    assert main(["run", str(tmp_path / "build"), "--input", "image=x.npy"]) == 2


def test_models_list_and_export(tmp_path, capsys):
    assert main(["models", "list"]) == 0
    assert "inception_v3" in capsys.readouterr().out
    assert main(["models", "export", "squeezenet", "-o", str(tmp_path / "sq.onnx")]) == 0
    onnx.checker.check_model(onnx.load(tmp_path / "sq.onnx"))


@pytest.mark.parametrize("flags, time_orders", [([], None), (["--stage-sums"], False)])
def test_build_passes_the_dp_options(monkeypatch, flags, time_orders):
    """The flags given reach `compile`; the others are left to the scheduler's defaults."""
    import tvmsched
    from tvmsched.errors import TvmschedError

    seen = {}

    def compile_options(model, **options):
        seen.update(options)
        raise TvmschedError("stop before compiling")

    monkeypatch.setattr(tvmsched, "compile", compile_options)
    args = ["build", "squeezenet", "-o", "unused", "--schedule", "dp", "--max-states", "64", *flags]
    assert main(args) == 2
    assert seen.get("time_orders") is time_orders and seen["max_states"] == 64 and seen["schedule"] == "dp"
    assert "max_groups" not in seen and "max_streams" not in seen


def test_a_new_schedulers_flag_reaches_it_from_the_command_line(monkeypatch, capsys):
    """A scheduler declares its options as flags (`Scheduler.flags`); the CLI makes them, passes them to
    that scheduler and refuses them for the others, with nothing else to change."""
    import tvmsched
    from tvmsched.errors import TvmschedError
    from tvmsched.schedule import SCHEDULERS
    from tvmsched.schedule.base import Flag
    from tvmsched.schedule.sequential import SequentialScheduler

    class Windowed(SequentialScheduler):
        flags = (Flag("window", "--window", "kernels looked ahead"),)

        def __init__(self, max_streams: int = 8, window: int = 2):
            super().__init__(max_streams)
            self.window = window

    monkeypatch.setitem(SCHEDULERS, "windowed", Windowed)
    seen = {}

    def compile_options(model, **options):
        seen.update(options)
        raise TvmschedError("stop before compiling")

    monkeypatch.setattr(tvmsched, "compile", compile_options)
    assert main(["build", "squeezenet", "-o", "unused", "--schedule", "windowed", "--window", "5"]) == 2
    assert seen["schedule"] == "windowed" and seen["window"] == 5
    capsys.readouterr()
    assert "argument --window: '0' is not an integer >= 1" in error_line(
        capsys, "build", "squeezenet", "-o", "unused", "--schedule", "windowed", "--window", "0")
    assert "--schedule dp does not take --window" in error_line(
        capsys, "build", "squeezenet", "-o", "unused", "--schedule", "dp", "--window", "5")


def test_each_schedulers_flag_has_a_name_of_its_own_in_every_command():
    """argparse would give a scheduler option and a command's own argument of the same name one value."""
    from tvmsched.cli import _build_parser
    from tvmsched.schedule import scheduler_flags

    keywords = {flag.keyword for flag in scheduler_flags()} | {"max_streams", "cost"}
    commands = next(action for action in _build_parser()._actions
                    if action.choices and "build" in action.choices)
    checked = 0
    for parser in commands.choices.values():
        dests = [action.dest for action in parser._actions]
        if "time_orders" in dests:
            checked += 1
            assert all(dests.count(keyword) == 1 for keyword in keywords), parser.prog
    assert checked >= 3  # build, run, bench at least


def test_a_saved_builds_schedulers_flag_alone_reschedules_it(tmp_path, branchy_model, capsys):
    onnx.save(branchy_model, tmp_path / "m.onnx")
    build = str(tmp_path / "build")
    assert main(["build", str(tmp_path / "m.onnx"), "-o", build, "--batch", "2", "--schedule", "dp",
                 "--target", "llvm"]) == 0
    capsys.readouterr()
    assert main(["run", build, "--max-states", "4"]) == 0
    assert "rescheduled" in capsys.readouterr().err
    assert main(["run", build]) == 0
    assert "rescheduled" not in capsys.readouterr().err


def test_tune_reports_kernels_that_got_no_candidate():
    """A kernel whose search produced nothing to measure is named, not left out of the run's output."""
    from tvmsched.cli import _kernel_line
    from tvmsched.tuning.tune import TaskProgress

    task = TaskProgress("fused_conv2d", "w1", weight=2, flops=1, bytes=1, trials_before=0, default_ms=0.25,
                        seconds=95.2, exhausted=True, state="done")
    assert _kernel_line(task) == ("  fused_conv2d (x2): the search found no candidate to measure in 95 s; it "
                                  "keeps the default schedule (default 0.2500 ms) and later runs skip it")
    task.trials, task.best_ms = 16, 0.125
    assert _kernel_line(task) == "  fused_conv2d (x2): 16 trials, best 0.1250 ms (default 0.2500 ms)"


def error_line(capsys, *argv: str) -> str:
    """Run the command in this process: it must end with exit code 2 and one error line, no traceback."""
    try:
        code = main(list(argv))
    except SystemExit as exit:  # argparse's errors
        code = exit.code
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_an_unexpected_exception_is_one_line_naming_it_a_bug_unless_debugging(capsys, monkeypatch):
    from tvmsched import cli

    def broken(args):
        raise RuntimeError("something inside broke")
    monkeypatch.setattr(cli, "_models_list", broken)
    line = error_line(capsys, "models", "list")
    assert "internal error (RuntimeError: something inside broke)" in line and "TVMSCHED_DEBUG=1" in line
    monkeypatch.setenv("TVMSCHED_DEBUG", "1")
    with pytest.raises(RuntimeError, match="something inside broke"):
        main(["models", "list"])


def test_ctrl_c_that_tvm_turned_into_an_error_is_reported_as_interrupted(capsys, monkeypatch):
    """TVM raises an empty RuntimeError where Ctrl-C lands in Python code it called back."""
    import signal

    from tvmsched import cli

    def interrupted_inside_tvm(args):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            raise RuntimeError("") from None
    monkeypatch.setattr(cli, "_models_list", interrupted_inside_tvm)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (not ignored)
    try:
        assert main(["models", "list"]) == 130
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, outer)
    assert "interrupted" in capsys.readouterr().err


def test_error_text_is_printed_as_is_not_as_markup(capsys, monkeypatch):
    from tvmsched import cli
    from tvmsched.errors import UsageError

    def broken(args):
        raise UsageError("expected list[int], got [/b] here")
    monkeypatch.setattr(cli, "_models_list", broken)
    assert error_line(capsys, "models", "list") == "error: expected list[int], got [/b] here"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A sequential llvm build of the branchy model at batch 1, with the model file and input files."""
    import conftest

    folder = tmp_path_factory.mktemp("cli")
    onnx.save(conftest.branchy_model.__wrapped__(), folder / "branchy.onnx")
    assert main(["build", str(folder / "branchy.onnx"), "-o", str(folder / "build"), "--batch", "1",
                 "--target", "llvm"]) == 0
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype("float32")
    np.save(folder / "x.npy", x)
    np.savez(folder / "x.npz", input=x)
    (folder / "notes.txt.npy").write_text("not an array")
    (folder / "a_file").write_text("")
    return folder


def test_version(capsys):
    import tvm

    import tvmsched

    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.strip() == f"tvmsched {tvmsched.__version__} (TVM {tvm.__version__})"


@pytest.mark.parametrize("args, message", [
    (["bench", "{build}", "--repeat", "0"], "argument --repeat: '0' is not an integer >= 1"),
    (["bench", "{build}", "--warmup", "-1"], "argument --warmup: '-1' is not an integer >= 0"),
    (["run", "{build}", "--streams", "0"], "argument --streams: '0' is not an integer >= 1"),
    (["run", "{build}", "--batch", "two"], "argument --batch: 'two' is not an integer >= 1"),
    (["run", "{build}", "--seed", "-3"], "argument --seed: '-3' is not an integer >= 0"),
    (["tune", "squeezenet", "--time-budget=-5m"], "argument --time-budget: '-5m' is not a duration"),
    (["tune", "squeezenet", "--concurrent", "0"], "argument --concurrent: '0' is not an integer >= 1"),
    (["build", "{model}", "-o", "{folder}/a_file"], "argument -o/--output: '{folder}/a_file' is a file; give "
                                                    "the path of a directory to write"),
    (["build", "{model}", "-o", "{folder}/a_file/build"], "'{folder}/a_file/build' cannot be written: "
                                                          "'{folder}/a_file' is a file"),
    (["profile", "{build}", "-o", "{folder}/a_file"], "'{folder}/a_file' is a file"),
    (["run", "{build}", "--save-output", "{folder}"], "argument --save-output: '{folder}' is a directory"),
    (["models", "export", "squeezenet", "-o", "{folder}"],
     "'{folder}' is a directory; give the path of a file"),
    (["tune", "{model}", "--log", "{folder}/a_file"], "argument --log: '{folder}/a_file' is a file"),
    (["build", "{model}", "-o", "{folder}/out", "--log", "{folder}/no_log"],
     "argument --log: there is no tuning log '{folder}/no_log'; give a directory that tvmsched tune wrote"),
])
def test_bad_flags_are_refused_before_any_work(saved, capsys, monkeypatch, args, message):
    import tvmsched

    monkeypatch.setattr(tvmsched, "compile", None)  # compiling would fail with a traceback
    fill = {"build": str(saved / "build"), "model": str(saved / "branchy.onnx"), "folder": str(saved)}
    assert message.format(**fill) in error_line(capsys, *(arg.format(**fill) for arg in args))


@pytest.mark.parametrize("flag, message", [
    ("input=missing.npy", "--input input=missing.npy: 'missing.npy' does not exist; write the array with "
                          "numpy.save"),
    ("input=/dev/null", "--input input=/dev/null: '/dev/null' is not a file; write the array with "
                        "numpy.save"),
    ("input=notes.txt.npy", "'notes.txt.npy' is not a NumPy .npy file; write the array with "
                            "numpy.save('notes.txt.npy', array)"),
    ("input=x.npz", "'x.npz' is an .npz archive (of input), not one array; save the input alone: "
                    "numpy.save('input.npy', numpy.load('x.npz')['input'])"),
    ("x.npy", "--input 'x.npy': write NAME=FILE.npy"),
    ("image=x.npy", "the model's inputs are input; unknown: image"),
])
def test_input_files_that_are_missing_or_not_one_array(saved, capsys, monkeypatch, flag, message):
    monkeypatch.chdir(saved)
    assert message in error_line(capsys, "run", "build", "--input", flag)


def test_outputs_that_cannot_be_written(saved, capsys):
    assert "cannot write '/proc/x.onnx' (" in error_line(capsys, "models", "export", "squeezenet", "-o",
                                                          "/proc/x.onnx")
    assert "cannot write '/proc/out.npz' (" in error_line(capsys, "run", str(saved / "build"),
                                                           "--save-output", "/proc/out.npz")
    assert "cannot write '/proc/bench.json' (" in error_line(capsys, "bench", str(saved / "build"),
                                                              "--repeat", "1", "--json", "/proc/bench.json")


def test_a_saved_build_refuses_compile_flags_and_reschedules_for_scheduling_flags(saved, capsys):
    build = str(saved / "build")
    assert error_line(capsys, "run", build, "--target", "llvm", "--log", str(saved)) == (
        f"error: '{build}' is a saved build, and --target, --log apply when compiling; rebuild it (tvmsched "
        f"build MODEL -o {build} --target --log ...) or leave them out")
    assert "and --input-shape applies when compiling" in error_line(capsys, "bench", build, "--input-shape",
                                                                    "input:1x3x8x8")
    assert error_line(capsys, "run", build, "--max-states", "5") == (
        "error: --schedule sequential does not take --max-states; leave it out or choose a scheduler that "
        "does (tvmsched run --help)")
    assert main(["run", build, "--schedule", "greedy", "--streams", "2", "--save-output",
                 str(saved / "greedy.npz")]) == 0
    assert f"rescheduled {build} (greedy): 2 stream(s)" in capsys.readouterr().err
    assert main(["run", build, "--save-output", str(saved / "saved.npz")]) == 0
    assert "rescheduled" not in capsys.readouterr().err  # the saved plan, as it was
    greedy, sequential = (np.load(saved / name)["output"] for name in ("greedy.npz", "saved.npz"))
    np.testing.assert_array_equal(greedy, sequential)


def test_a_scheduler_flag_the_schedule_does_not_take_is_refused(saved, capsys):
    assert "--schedule greedy does not take --max-group-size, --stage-sums" in error_line(
        capsys, "run", str(saved / "branchy.onnx"), "--batch", "1", "--schedule", "greedy",
        "--max-group-size", "2", "--stage-sums")


def test_tune_names_a_missing_model(capsys):
    assert "model file 'missing.onnx' does not exist" in error_line(capsys, "tune", "missing.onnx",
                                                                     "--target", "llvm")


def test_constant_input_on_build_and_run(tmp_path, capsys, runtime_axes_model):
    """--constant-input binds an input's value at build time; a build directory refuses another value."""
    onnx.save(runtime_axes_model, tmp_path / "sum.onnx")
    np.save(tmp_path / "axes.npy", np.array([1]))
    np.save(tmp_path / "other.npy", np.array([0]))
    x = np.arange(12, dtype="float32").reshape(3, 4)
    np.save(tmp_path / "x.npy", x)
    assert main(["build", str(tmp_path / "sum.onnx"), "-o", str(tmp_path / "build"), "--target", "llvm"]) == 2
    assert "--constant-input axes=FILE.npy" in capsys.readouterr().err
    assert main(["build", str(tmp_path / "sum.onnx"), "-o", str(tmp_path / "build"), "--target", "llvm",
                 "--constant-input", f"axes={tmp_path / 'axes.npy'}"]) == 0
    assert main(["run", str(tmp_path / "build"), "--input", f"x={tmp_path / 'x.npy'}",
                 "--save-output", str(tmp_path / "out.npz"),
                 "--constant-input", f"axes={tmp_path / 'axes.npy'}"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["y"], x.sum(axis=1))
    capsys.readouterr()
    assert main(["run", str(tmp_path / "build"), "--constant-input", f"axes={tmp_path / 'other.npy'}"]) == 2
    assert "another value of input 'axes'" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "build"), "--input", f"axes={tmp_path / 'axes.npy'}"]) == 2
    assert "'axes' was bound to a value when the model was built" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "build"), "--constant-input", "axes"]) == 2
    assert "write NAME=FILE.npy" in capsys.readouterr().err


def test_build_merge_reports_the_merged_convolutions_and_a_saved_build_refuses_it(saved, capsys):
    build = str(saved / "merged")
    assert main(["build", str(saved / "branchy.onnx"), "-o", build, "--batch", "1", "--target", "llvm",
                 "--merge", "all"]) == 0
    # the branchy model's 3x3 and 1x1
    assert "merged 2 convolutions into 1, 0 matmuls into 0" in capsys.readouterr().err
    meta = json.loads((saved / "merged" / "meta.json").read_text())
    assert meta["merge"] == "all" and meta["merged_convolutions"] == [2] and meta["merged_matmuls"] == []
    assert "and --merge applies when compiling" in error_line(capsys, "run", build, "--merge", "auto")
    assert "invalid choice: 'yes'" in error_line(capsys, "build", str(saved / "branchy.onnx"), "--merge",
                                                 "yes")


def test_build_merge_auto_prints_each_group_choice(saved, capsys):
    assert main(["build", str(saved / "branchy.onnx"), "-o", str(saved / "auto"), "--batch", "1",
                 "--target", "llvm", "--merge", "auto"]) == 0
    err = capsys.readouterr().err
    # on an 8x8 image the CPU's analytic cost counts a kernel call for more than the 1x1's padded taps
    assert "2 convolutions of one tensor:" in err and "faster merged alone" in err
    assert "merged 2 convolutions into 1" in err
    assert main(["build", str(saved / "branchy.onnx"), "-o", str(saved / "auto_dp"), "--batch", "1",
                 "--target", "llvm", "--merge", "auto", "--schedule", "dp"]) == 0
    assert "; dp's search of the whole model merges it" in capsys.readouterr().err


def test_tune_merge_tunes_the_merged_kernels(saved, monkeypatch):
    from tvmsched import tuning

    class Stop(BaseException):  # not caught as an internal error by main
        pass

    lowered = []

    def tune(modules, *args, **kwargs):
        lowered.extend(modules)
        raise Stop
    monkeypatch.setattr(tuning, "tune", tune)
    for flags in ([], ["--merge"], ["--merge", "auto"]):  # --merge alone is all
        with pytest.raises(Stop):
            main(["tune", str(saved / "branchy.onnx"), "--batch", "1", "--target", "llvm",
                  "--log", str(saved / "logs"), *flags])
    # auto tunes the kernels of both sides of its choice
    convolutions = [sum("conv2d" in kinds for kinds in module.op_kinds.values()) for module in lowered]
    assert convolutions == [2, 1, 2, 1]
