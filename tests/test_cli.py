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
])
def test_errors_are_one_line_with_exit_code_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_build_run_bench_round_trip(tmp_path, branchy_model, capsys):
    model_path = tmp_path / "branchy.onnx"
    onnx.save(branchy_model, model_path)
    assert main(["build", str(model_path), "-o", str(tmp_path / "build"), "--batch", "2",
                 "--schedule", "dp", "--streams", "2"]) == 0
    assert (tmp_path / "build" / "model.so").is_file()
    assert json.loads((tmp_path / "build" / "plan.json").read_text())["scheduler"] == "dp"
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
    assert main(["run", str(tmp_path / "build"), "--input", "image=x.npy"]) == 2


def test_models_list_and_export(tmp_path, capsys):
    assert main(["models", "list"]) == 0
    assert "inception_v3" in capsys.readouterr().out
    assert main(["models", "export", "squeezenet", "-o", str(tmp_path / "sq.onnx")]) == 0
    onnx.checker.check_model(onnx.load(tmp_path / "sq.onnx"))


@pytest.mark.parametrize("flags, time_orders", [([], True), (["--stage-sums"], False)])
def test_build_passes_the_dp_options(monkeypatch, flags, time_orders):
    import tvmsched
    from tvmsched.errors import TvmschedError

    seen = {}

    def compile_options(model, **options):
        seen.update(options)
        raise TvmschedError("stop before compiling")

    monkeypatch.setattr(tvmsched, "compile", compile_options)
    args = ["build", "squeezenet", "-o", "unused", "--schedule", "dp", "--max-states", "64", *flags]
    assert main(args) == 2
    assert seen["time_orders"] is time_orders and seen["max_states"] == 64 and seen["schedule"] == "dp"


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
