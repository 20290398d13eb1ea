"""--precision fp16 on the CPU: float16 kernels whose results stay within the stated tolerance of the fp32
build, with the model's input and output dtypes, also around ops imported as TE calls; the precision is saved
with a build and is a compile flag; a failure of TVM's mixed-precision pass is refused with the fix."""

import json

import numpy as np
import pytest
import tvm
from conftest import make_model, onnxruntime_outputs, tensor
from onnx import TensorProto, helper
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


def test_fp16_batch_norm_computes_in_float16_fused_with_its_convolution_and_relu(gpu_rewrites):
    """A batch norm imported as the op would stay float32, in kernels of its own between casts; decomposed
    first, it follows its convolution in float16 and fuses with it and the relu after it."""
    half = tvmsched.compile(network(), target="llvm", batch=2, precision="fp16")
    [kernel] = [kernel for kernel in half.graph.kernels if "subtract" in kernel.op_kinds]
    assert {"conv2d", "divide", "multiply", "relu"} <= set(kernel.op_kinds)
    assert [tensor.dtype for tensor in kernel.outputs] == ["float16"]
    assert kernel.vendor_op.name == "conv2d+cast+subtract+divide+multiply+bias+relu"


def attention_inputs():
    """ViT's attention: one projection reshaped to (3, ...) and picked apart by Gather into the query, key and
    value; softmax(q·kᵀ)·v."""
    rng = np.random.default_rng(9)
    weights = {"w": rng.standard_normal((8, 24)).astype("float32") / 3, "shape": np.array([4, 8, 3, 8]),
               "i0": np.array(0), "i1": np.array(1), "i2": np.array(2)}
    nodes = [helper.make_node("MatMul", ["input", "w"], ["p"]),
             helper.make_node("Reshape", ["p", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["qkv"], perm=[2, 0, 1, 3]),
             *(helper.make_node("Gather", ["qkv", f"i{i}"], [name], axis=0) for i, name in enumerate("qkv")),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Softmax", ["s"], ["a"], axis=-1),
             helper.make_node("MatMul", ["a", "v"], ["output"])]
    return make_model(nodes, [tensor("input", [4, 8, 8])], [tensor("output", [4, 8, 8])], weights)


def test_gathers_compute_in_float16_with_no_float32_copy_of_their_input():
    """TVM's pass computes an op without a policy in float32: each Gather cast the whole tensor it picks from
    to float32 first. They follow their input's type, within the pass only."""
    proto = attention_inputs()
    x = np.random.default_rng(10).standard_normal((4, 8, 8)).astype("float32")
    [expected] = onnxruntime_outputs(proto, {"input": x})
    model = tvmsched.compile(proto, target="llvm", precision="fp16")
    casts = [kernel for kernel in model.graph.kernels if kernel.op_kinds == ("cast",)]
    assert not any(ref.shape[0] == 3 for kernel in casts for ref in kernel.inputs), casts
    takes = [kernel for kernel in model.graph.kernels if "take" in kernel.op_kinds]
    assert len(takes) == 3 and {ref.dtype for kernel in takes for ref in kernel.outputs} == {"float16"}
    assert relative_error(model(x), expected) <= TOLERANCE
    assert tvm.ir.Op.get("relax.take").get_attr(precision.POLICY) is None


def test_softmax_takes_float16_and_computes_in_float32_inside():
    """The product before the softmax ends in one cast to float16 (a vendor library takes it; a cast back to
    float32 fused there had it declined); the softmax reads and writes float16."""
    proto = attention_inputs()
    x = np.random.default_rng(11).standard_normal((4, 8, 8)).astype("float32")
    [expected] = onnxruntime_outputs(proto, {"input": x})
    model = tvmsched.compile(proto, target="llvm", precision="fp16")
    [scores] = [kernel for kernel in model.graph.kernels if kernel.op_kinds == ("matmul", "cast")
                and kernel.outputs[0].shape == (4, 8, 8) and kernel.vendor_op is not None]
    [softmax] = [kernel for kernel in model.graph.kernels if "softmax" in kernel.op_kinds]
    assert scores.outputs[0].dtype == softmax.inputs[0].dtype == softmax.outputs[0].dtype == "float16"
    assert relative_error(model(x), expected) <= TOLERANCE


def test_a_float16_softmax_sums_in_float32():
    """4096 equal float16 logits: summed in float16 the exponentials stop at 2048, giving 1/2048 each."""
    proto = make_model([helper.make_node("Softmax", ["input"], ["output"], axis=-1)],
                       [tensor("input", [2, 4096], TensorProto.FLOAT16)],
                       [tensor("output", [2, 4096], TensorProto.FLOAT16)], {})
    model = tvmsched.compile(proto, target="llvm")
    np.testing.assert_array_equal(model(np.zeros((2, 4096), "float16")), np.float16(1 / 4096))
