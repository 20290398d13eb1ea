"""--precision fp16 on the CPU: float16 kernels whose results stay within the stated tolerance of the fp32
build, with the model's input and output dtypes, also around ops imported as TE calls; the precision is saved
with a build and is a compile flag; a failure of TVM's mixed-precision pass is refused with the fix."""

import json

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import helper
from test_tactics_select import network

import tvmsched
from tvmsched import precision
from tvmsched.cli import main
from tvmsched.errors import UnsupportedOperator, UsageError

TOLERANCE = 1e-2  # max |fp16 - fp32| over max |fp32|, the figure docs/DESIGN.md states


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(actual.astype(np.float64) - expected).max() / np.abs(expected).max())


def mobile_block():
    """MobileNetV3's activations after convolutions: HardSwish, and a HardSigmoid gate (TVM's converters of
    both were out of reach of the mixed-precision pass)."""
    rng = np.random.default_rng(3)
    weights = {"w1": rng.standard_normal((8, 3, 3, 3)).astype("float32") * 0.3,
               "w2": rng.standard_normal((8, 8, 1, 1)).astype("float32") * 0.3}
    nodes = [helper.make_node("Conv", ["input", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c1"], ["h"]),
             helper.make_node("Conv", ["h", "w2"], ["c2"]),
             helper.make_node("HardSigmoid", ["c2"], ["g"], alpha=1 / 6),
             helper.make_node("Mul", ["h", "g"], ["output"])]
    return make_model(nodes, [tensor("input", [2, 3, 8, 8])], [tensor("output", [2, 8, 8, 8])], weights)


@pytest.mark.parametrize("model", ["network", "branchy", "mobile"])
def test_fp16_stays_within_the_tolerance_of_fp32(model, branchy_model):
    proto = {"network": network, "branchy": lambda: branchy_model, "mobile": mobile_block}[model]()
    shape = (2, 3, 8, 8)
    half = tvmsched.compile(proto, target="llvm", batch=2, precision="fp16")
    full = tvmsched.compile(proto, target="llvm", batch=2)
    assert half.meta.precision == "fp16" and full.meta.precision == "fp32"
    dtypes = {tensor.dtype for kernel in half.graph.kernels for tensor in kernel.inputs + kernel.outputs}
    assert "float16" in dtypes and "float16" not in {tensor.dtype for kernel in full.graph.kernels
                                                    for tensor in kernel.inputs + kernel.outputs}
    x = np.random.default_rng(2).standard_normal(shape).astype("float32")
    actual, expected = half(x), full(x)
    assert actual.dtype == expected.dtype == np.float32 and actual.shape == expected.shape
    assert 0 < relative_error(actual, expected) <= TOLERANCE  # rounded to float16, and not more


@pytest.mark.parametrize("flag, value, printed, default", [("precision", "fp16", "in fp16, nchw", "fp32"),
                                                            ("layout", "nhwc", "in fp32, nhwc", "nchw")])
def test_precision_and_layout_are_saved_and_are_compile_flags(branchy_model, tmp_path, capsys, flag, value,
                                                              printed, default):
    path = tmp_path / "model.onnx"
    path.write_bytes(branchy_model.SerializeToString())
    assert main(["build", str(path), "--target", "llvm", "--batch", "2", f"--{flag}", value,
                 "-o", str(tmp_path / "build")]) == 0
    assert printed in capsys.readouterr().err
    assert json.loads((tmp_path / "build" / "meta.json").read_text())[flag] == value
    assert getattr(tvmsched.load(tmp_path / "build").meta, flag) == value
    assert main(["run", str(tmp_path / "build"), f"--{flag}", default]) == 2
    assert f"--{flag} applies when compiling" in capsys.readouterr().err
    meta = json.loads((tmp_path / "build" / "meta.json").read_text())
    del meta[flag]  # a build made before the flag existed has the default
    assert getattr(tvmsched.api.ModelMeta.from_json(meta), flag) == default


@pytest.mark.parametrize("op", ["Softplus", "CumSum"])
def test_ops_imported_as_te_calls_compute_in_float32_between_fp16_ops(op):
    """TVM's pass cannot type a call_tir: such ops (here a converter's TE) are wrapped for it."""
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((4, 3, 3, 3)).astype("float32") * 0.3, "axis": np.array(1, "int64")}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(op, ["c", "axis"] if op == "CumSum" else ["c"], ["y"])]
    proto = make_model(nodes, [tensor("x", [1, 3, 6, 6])], [tensor("y", [1, 4, 6, 6])],
                       weights if op == "CumSum" else {"w": weights["w"]}, opset=20)
    x = rng.standard_normal((1, 3, 6, 6)).astype("float32")
    half = tvmsched.compile(proto, target="llvm", precision="fp16")
    assert any(tensor.dtype == "float16" for kernel in half.graph.kernels for tensor in kernel.outputs)
    assert 0 < relative_error(half(x), tvmsched.compile(proto, target="llvm")(x)) <= TOLERANCE


def test_an_unknown_precision_or_a_failing_pass_is_refused(branchy_model, monkeypatch):
    with pytest.raises(UsageError, match="unknown precision 'fp8'"):
        tvmsched.compile(branchy_model, target="llvm", precision="fp8",
                         progress=lambda stage: pytest.fail(f"started {stage}"))

    def failing(out_dtype):
        def run(module):
            raise RuntimeError("Check failed: something TVM's pass does not take")
        return run
    monkeypatch.setattr(precision.relax.transform, "ToMixedPrecision", failing)
    with pytest.raises(UnsupportedOperator, match="pass does not take this model.*--precision fp32"):
        tvmsched.compile(branchy_model, target="llvm", batch=2, precision="fp16")


def test_fp16_batch_norm_computes_in_float16_fused_with_its_convolution_and_relu():
    """A batch norm imported as the op would stay float32, in kernels of its own between casts; decomposed
    first, it follows its convolution in float16 and fuses with it and the relu after it."""
    half = tvmsched.compile(network(), target="llvm", batch=2, precision="fp16")
    [kernel] = [kernel for kernel in half.graph.kernels if "subtract" in kernel.op_kinds]
    assert {"conv2d", "divide", "multiply", "relu"} <= set(kernel.op_kinds)
    assert [tensor.dtype for tensor in kernel.outputs] == ["float16"]
    assert kernel.vendor_op.name == "conv2d+cast+subtract+divide+multiply+bias+relu"
