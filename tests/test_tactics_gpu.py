"""Vendor tactics on the GPU (needs a CUDA device and cuDNN's frontend): selection measures, the chosen
plans compute what TVM's kernels compute, inside the multi-stream CUDA graph, after a save and a load."""

import numpy as np
import onnxruntime
import pytest
from conftest import make_model, tensor
from onnx import helper

import tvmsched
from tvmsched.tactics.library import LIBRARIES, installed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif("cudnn" not in installed(), reason="needs cuDNN")]


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TVMSCHED_CACHE", str(tmp_path / "cache"))


def _reference(proto, x):
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


@pytest.mark.parametrize("kernels", ["vendor", "auto"])
def test_vendor_plans_match_onnxruntime_in_every_executor(branchy_model, kernels, private_cache, tmp_path):
    x = np.random.default_rng(3).standard_normal((4, 3, 8, 8)).astype("float32")
    model = tvmsched.compile(branchy_model, target="cuda", batch=4, kernels=kernels, schedule="dp",
                             max_streams=2)
    counts = model.graph.implementations()
    if kernels == "vendor":  # cuDNN takes a convolution with its relu or its bias
        assert counts.get("cudnn", 0) >= 1, counts
    expected = _reference(branchy_model, x)
    for executor in ("sequential", "streams", "cuda-graph"):
        with model.reschedule("dp", max_streams=2, executor=executor) as scheduled:
            for _ in range(2):
                np.testing.assert_allclose(scheduled(x), expected, rtol=1e-5, atol=1e-5)
    loaded = tvmsched.load(model.save(tmp_path / "build"))
    assert loaded.graph.implementations() == counts
    np.testing.assert_allclose(loaded(x), expected, rtol=1e-5, atol=1e-5)


def test_second_build_measures_nothing(branchy_model, private_cache, monkeypatch):
    first = tvmsched.compile(branchy_model, target="cuda", batch=4, kernels="vendor")
    from tvmsched.executor import streams

    def no_timer(*args, **kwargs):
        raise AssertionError("a cached selection made a timer")
    monkeypatch.setattr(streams.StageTimer, "__init__", no_timer)
    second = tvmsched.compile(branchy_model, target="cuda", batch=4, kernels="vendor")
    assert second.graph == first.graph


def test_a_batch_norm_after_a_convolution_runs_folded_in_cudnn(private_cache):
    from test_tactics_select import network

    proto = network()
    model = tvmsched.compile(proto, target="cuda", batch=2, kernels="vendor")
    batch_norm = [kernel for kernel in model.graph.kernels
                  if kernel.vendor_op is not None and "subtract" in kernel.vendor_op.name]
    assert batch_norm and all(kernel.tactic is not None for kernel in batch_norm)
    x = np.random.default_rng(4).standard_normal((2, 3, 8, 8)).astype("float32")
    np.testing.assert_allclose(model(x), _reference(proto, x), rtol=1e-4, atol=1e-5)


def transformer_block():
    """x (4, 32, 64): an MLP with a residual (matmul+bias+relu, matmul+bias+residual) and x·xᵀ (a batched
    matmul of two activations)."""
    rng = np.random.default_rng(5)
    shapes = {"w1": (64, 128), "b1": (128,), "w2": (128, 64), "b2": (64,)}
    weights = {name: (rng.standard_normal(shape) / 8).astype("float32") for name, shape in shapes.items()}
    nodes = [helper.make_node("MatMul", ["input", "w1"], ["m1"]),
             helper.make_node("Add", ["m1", "b1"], ["a1"]), helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["a2"]), helper.make_node("Add", ["a2", "input"], ["y"]),
             helper.make_node("Transpose", ["input"], ["t"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["input", "t"], ["z"])]
    return make_model(nodes, [tensor("input", [4, 32, 64])],
                      [tensor("y", [4, 32, 64]), tensor("z", [4, 32, 32])], weights)


@pytest.mark.skipif("cublaslt" not in installed(), reason="needs cuBLASLt (nvmath-python)")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_matmuls_run_in_cublaslt_and_match_onnxruntime(precision, private_cache, tmp_path, monkeypatch):
    monkeypatch.delitem(LIBRARIES, "cudnn")  # cuDNN also takes half-precision matmuls, and may be faster
    proto = transformer_block()
    x = np.random.default_rng(4).standard_normal((4, 32, 64)).astype("float32")
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"input": x})
    model = tvmsched.compile(proto, target="cuda", kernels="vendor", precision=precision, schedule="dp",
                             max_streams=2)
    tactics = [kernel.tactic.library for kernel in model.graph.kernels if kernel.tactic is not None]
    # in fp16, cuBLASLt declines the projection (an fp16 bias before the model's fp32 output) and x·xᵀ
    # (rounded to fp16 before its fp32 output)
    assert tactics.count("cublaslt") == (3 if precision == "fp32" else 1), model.graph.implementations()
    tolerance = 1e-5 if precision == "fp32" else 2e-2
    for executor in ("sequential", "cuda-graph"):
        with model.reschedule("dp", max_streams=2, executor=executor) as scheduled:
            for actual, reference in zip(scheduled(x), expected):
                np.testing.assert_allclose(actual, reference, rtol=tolerance, atol=tolerance)
    loaded = tvmsched.load(model.save(tmp_path / "build"))
    for actual, reference in zip(loaded(x), expected):
        np.testing.assert_allclose(actual, reference, rtol=tolerance, atol=tolerance)


def mlp_with_gelu():
    """x (4, 32, 64) → MatMul + bias + GELU (erf's, as exported) → MatMul + bias."""
    rng = np.random.default_rng(6)
    shapes = {"w1": (64, 256), "b1": (256,), "w2": (256, 64), "b2": (64,)}
    weights = {name: (rng.standard_normal(shape) / 8).astype("float32") for name, shape in shapes.items()}
    weights.update(root2=np.array(np.sqrt(2), "float32"), one=np.array(1, "float32"),
                   half=np.array(0.5, "float32"))
    nodes = [helper.make_node("MatMul", ["input", "w1"], ["m"]), helper.make_node("Add", ["m", "b1"], ["a"]),
             helper.make_node("Div", ["a", "root2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["a", "e1"], ["g"]),
             helper.make_node("Mul", ["g", "half"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["y"])]
    return make_model(nodes, [tensor("input", [4, 32, 64])], [tensor("y", [4, 32, 64])], weights)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_matmul_gelu_runs_in_a_library_whole_or_split(precision, private_cache):
    """cuDNN computes matmul + bias + GELU whole in fp16; in fp32 no library computes erf's GELU exactly
    (cuBLASLt's is the tanh approximation, cuDNN's fp32 matmul is not exact), so a library computes the
    matmul + bias and TVM's tail function the GELU (a split tactic)."""
    proto = mlp_with_gelu()
    x = np.random.default_rng(7).standard_normal((4, 32, 64)).astype("float32")
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    [expected] = session.run(None, {"input": x})
    model = tvmsched.compile(proto, target="cuda", kernels="vendor", precision=precision)
    [gelu] = [kernel for kernel in model.graph.kernels
              if kernel.vendor_op is not None and "gelu" in kernel.vendor_op.name]
    assert gelu.tactic is not None
    if precision == "fp32":
        assert gelu.tactic.split == 1, gelu.tactic
    tolerance = 1e-5 if precision == "fp32" else 2e-2
    with model.reschedule("sequential", executor="cuda-graph") as captured:
        np.testing.assert_allclose(captured(x), expected, rtol=tolerance, atol=tolerance)


def test_every_recognized_kernel_runs_in_a_library_whole_or_split(private_cache, tmp_path):
    """In fp32 cuDNN declines a sigmoid, a residual add and per-channel scaling after a convolution: split
    tactics run the convolution (and its bias) in cuDNN and the rest in TVM's tail, on dp's streams in the
    CUDA graph, and after a save and a load."""
    from test_tactics_select import network

    proto = network()
    model = tvmsched.compile(proto, target="cuda", batch=2, kernels="vendor", schedule="dp", max_streams=2)
    recognized = [kernel for kernel in model.graph.kernels if kernel.vendor_op is not None]
    assert all(kernel.tactic is not None for kernel in recognized), model.graph.implementations()
    assert any(kernel.tactic.split is not None for kernel in recognized), model.graph.implementations()
    x = np.random.default_rng(8).standard_normal((2, 3, 8, 8)).astype("float32")
    expected = _reference(proto, x)
    for executor in ("streams", "cuda-graph"):
        with model.reschedule("dp", max_streams=2, executor=executor) as scheduled:
            np.testing.assert_allclose(scheduled(x), expected, rtol=1e-4, atol=1e-5)
    loaded = tvmsched.load(model.save(tmp_path / "build"))
    np.testing.assert_allclose(loaded(x), expected, rtol=1e-4, atol=1e-5)


def test_dp_chooses_each_vendor_kernels_implementation_in_its_stage(branchy_model, private_cache):
    """Concurrency-aware tactics on the GPU: dp times its plan with TVM's function for each vendor kernel in
    a stage of several groups, records what it tried and kept, and the plan still computes the model."""
    from tvmsched.tactics import in_plan

    model = tvmsched.compile(branchy_model, target="cuda", batch=4, kernels="vendor", schedule="dp",
                             max_streams=2)
    candidates = in_plan.concurrent_kernels(model.graph, model.plan)
    stats = model.plan.schedule.get("tvm_in_stage")
    assert (stats is not None) == bool(candidates), model.plan.schedule
    if stats:
        assert stats["tried"] + stats["slower_alone"] == len(candidates)
        assert list(model.plan.tvm_kernels) == stats["kept"]
        before, after = model.plan.schedule["in_plan_ms"]
        assert (after < before) == bool(stats["kept"])
    x = np.random.default_rng(9).standard_normal((4, 3, 8, 8)).astype("float32")
    np.testing.assert_allclose(model(x), _reference(branchy_model, x), rtol=1e-5, atol=1e-5)
