"""The default CPU schedules: which rule schedules each kind of kernel, that the scheduled kernels run
parallel and vectorized and compute what onnxruntime does, and that a rule that raises is skipped."""

import re

import numpy as np
import pytest
from conftest import assert_matches, make_model, onnxruntime_outputs, tensor
from onnx import helper

import tvmsched
from tvmsched import cpu_schedules, frontend
from tvmsched.codegen import schedule_candidates
from tvmsched.lower import kernel_module, lower
from tvmsched.target import resolve_target

RNG = np.random.default_rng(0)


def _weights(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype("float32") * 0.3


def _conv_model():
    """A 3x3 convolution with bias and ReLU (13 columns: not a multiple of the register tile), then a max
    pool, a grouped convolution, an element-wise chain and a global mean."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["relu"]),
             helper.make_node("MaxPool", ["relu"], ["pool"], kernel_shape=[3, 3], strides=[2, 2]),
             helper.make_node("Conv", ["pool", "dw"], ["depthwise"], group=24, pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["depthwise"], ["gate"]),
             helper.make_node("Mul", ["gate", "depthwise"], ["swish"]),
             helper.make_node("ReduceMean", ["swish"], ["out"], axes=[2, 3])]
    return make_model(nodes, [tensor("x", [1, 5, 13, 13])], [tensor("out", [1, 24, 1, 1])],
                      {"w": _weights(24, 5, 3, 3), "b": _weights(24), "dw": _weights(24, 1, 3, 3)}, opset=17)


def _matmul_softmax_model():
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["fc"], transB=1),
             helper.make_node("Softmax", ["fc"], ["out"], axis=-1)]
    return make_model(nodes, [tensor("x", [3, 40])], [tensor("out", [3, 20])],
                      {"w": _weights(20, 40), "b": _weights(20)}, opset=17)


def _attention_model():
    """One attention head pair: projections, then scores and context as matmuls of two activations."""
    def heads(name, perm):
        return [helper.make_node("MatMul", ["x", f"w{name}"], [f"{name}2"]),
                helper.make_node("Reshape", [f"{name}2", "shape"], [f"{name}3"]),
                helper.make_node("Transpose", [f"{name}3"], [name], perm=perm)]

    nodes = [*heads("q", [0, 2, 1, 3]), *heads("k", [0, 2, 3, 1]), *heads("v", [0, 2, 1, 3]),
             helper.make_node("MatMul", ["q", "k"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["out"])]
    weights = {f"w{name}": _weights(16, 16) for name in "qkv"} | {"shape": np.array([1, 6, 2, 8])}
    return make_model(nodes, [tensor("x", [1, 6, 16])], [tensor("out", [1, 2, 6, 8])], weights, opset=17)


def _gelu_model():
    """A transformer's MLP input layer: matmul, bias and GELU as exported (x * (erf(x / sqrt 2) + 1) / 2)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["a"]),
             helper.make_node("Div", ["a", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["f"]), helper.make_node("Mul", ["a", "f"], ["g"]),
             helper.make_node("Mul", ["g", "half"], ["out"])]
    scalars = {name: np.array(value, "float32")
               for name, value in (("sqrt2", 2 ** 0.5), ("one", 1.0), ("half", 0.5))}
    return make_model(nodes, [tensor("x", [2, 5, 12])], [tensor("out", [2, 5, 24])],
                      {"w": _weights(12, 24), "b": _weights(24), **scalars}, opset=17)


def _squeeze_excitation_model():
    """A gate computed by a 1x1 convolution on a pooled map, broadcast onto the map (EfficientNet, RegNetY):
    the convolution's epilogue writes a larger tensor than its product."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["pooled"], axes=[2, 3]),
             helper.make_node("Conv", ["pooled", "w", "b"], ["conv"]),
             helper.make_node("Sigmoid", ["conv"], ["gate"]), helper.make_node("Mul", ["x", "gate"], ["out"])]
    return make_model(nodes, [tensor("x", [1, 16, 7, 7])], [tensor("out", [1, 16, 7, 7])],
                      {"w": _weights(16, 16, 1, 1), "b": _weights(16)}, opset=17)


def _grouped_conv_model():
    """RegNet's and ResNeXt's grouped 3x3 convolution (4 groups of 8 channels), with bias and ReLU."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], group=4, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["out"])]
    return make_model(nodes, [tensor("x", [1, 32, 9, 9])], [tensor("out", [1, 32, 9, 9])],
                      {"w": _weights(32, 8, 3, 3), "b": _weights(32)}, opset=17)


def _pool_model():
    """Inception's average pool (padded, the padding not counted), then a 5x5 depthwise convolution and a
    global average pool."""
    nodes = [helper.make_node("AveragePool", ["x"], ["avg"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["avg", "dw"], ["depthwise"], group=6, pads=[2, 2, 2, 2]),
             helper.make_node("GlobalAveragePool", ["depthwise"], ["out"])]
    return make_model(nodes, [tensor("x", [1, 6, 11, 11])], [tensor("out", [1, 6, 1, 1])],
                      {"dw": _weights(6, 1, 5, 5)}, opset=17)


def _first_rules(model) -> dict[str, str]:
    """The rule of each kernel's first schedule candidate on the CPU, by the kernel's operators."""
    inputs = frontend.bind_input_shapes(model, 1)
    kernels = kernel_module(lower(frontend.to_relax(model, inputs)))
    spec = resolve_target("llvm")
    return {global_var.name_hint: next(schedule_candidates(function, spec, []))[0]
            for global_var, function in kernels.functions.items()}


@pytest.mark.parametrize("model", [_conv_model, _matmul_softmax_model, _attention_model, _gelu_model,
                                   _squeeze_excitation_model, _grouped_conv_model, _pool_model])
def test_scheduled_models_match_onnxruntime(model):
    model = model()
    inputs = {"x": RNG.standard_normal([dim.dim_value for dim in
                                        model.graph.input[0].type.tensor_type.shape.dim]).astype("float32")}
    compiled = tvmsched.compile(model, target="llvm")
    assert compiled.meta.fallbacks == ()
    assert_matches(compiled.run(inputs), onnxruntime_outputs(model, inputs))


def test_each_kernel_kind_gets_its_rule():
    """Convolutions and matrix products by `gemm`; pools and depthwise convolutions (with their epilogues)
    by `window`; softmax and global means by dlight's Reduction."""
    rules = _first_rules(_conv_model()) | _first_rules(_matmul_softmax_model())
    assert rules == {"fused_conv2d_add_relu": "gemm", "max_pool2d": "window", "mean": "Reduction",
                     "fused_conv2d1_tir_sigmoid_multiply": "window", "fused_matmul_add": "gemm",
                     "softmax": "Reduction"}
    assert _first_rules(_pool_model()) == {"avg_pool2d": "window", "conv2d": "window", "mean": "Reduction"}


def test_grouped_convolutions_get_the_gemm_rule_and_depthwise_ones_do_not():
    """A vector of channels within one group reads one data element: 224 channels in 28 groups of 8 on
    28 x 28 took 29.2 ms under dlight's Reduction, 0.85 ms with `gemm`, here. A depthwise convolution (one
    channel a group) would get one-lane vectors: it gets the `window` rule."""
    assert _first_rules(_grouped_conv_model()) == {"fused_conv2d_add_relu": "gemm"}
    assert _first_rules(_conv_model())["fused_conv2d1_tir_sigmoid_multiply"] == "window"


def test_matmuls_of_two_activations_get_the_gemm_rule():
    """Attention's batched matmuls (the heads index both inputs): 38 ms with dlight's Reduction, 2.0 ms
    with `gemm` for 12 heads of 197 x 197 by 197 x 64 on this 2-core machine (onnxruntime 1.1 ms)."""
    rules = _first_rules(_attention_model())  # matmul: the projections; matmul1: scores; matmul2: context
    assert {name: rules[name] for name in ("matmul", "matmul1", "matmul2")} == dict.fromkeys(
        ("matmul", "matmul1", "matmul2"), "gemm")


def test_an_epilogue_that_reads_the_product_twice_stays_in_the_gemm_kernel():
    """GELU reads the biased product twice: inlining its first reader made a kernel that did not compile,
    and dlight's Reduction ran the MLP layer of ViT-B/16 (197 x 768 by 768 x 3072) in 2.5 s here, against
    44 ms with `gemm` (onnxruntime 6 ms)."""
    import tvm

    inputs = frontend.bind_input_shapes(_gelu_model(), 1)
    [function] = kernel_module(lower(frontend.to_relax(_gelu_model(), inputs))).functions.values()
    target = resolve_target("llvm").tvm_target
    schedule = cpu_schedules.gemm(function, target)
    tvm.compile(schedule.mod, target=target)  # raised "T_add_intermediate is used before its definition"
    script = schedule.mod["main"].script()
    assert script.count("T.erf(") == 1 and script.count("T.sblock(") == 5  # GELU's rest in one block


def test_a_broadcast_consumer_is_not_inlined_into_its_producer():
    """Swin-V2's normalization x / max(|x|, eps), with eps a kernel input: inlining the broadcast into the
    norm failed in TVM ("Cannot dispatch a null expression"), and the kernel ran unscheduled."""
    nodes = [helper.make_node("ReduceL2", ["x"], ["norm"], axes=[-1], keepdims=1),
             helper.make_node("Max", ["norm", "eps"], ["clamped"]),
             helper.make_node("Expand", ["clamped", "shape"], ["wide"]),
             helper.make_node("Div", ["x", "wide"], ["out"])]
    model = make_model(nodes, [tensor("x", [4, 3, 6, 32]), tensor("eps", [])], [tensor("out", [4, 3, 6, 32])],
                       {"shape": np.array([4, 3, 6, 32])}, opset=17)
    inputs = {"x": RNG.standard_normal((4, 3, 6, 32)).astype("float32"), "eps": np.array(1e-12, "float32")}
    compiled = tvmsched.compile(model, target="llvm")
    assert compiled.meta.fallbacks == ()
    assert_matches(compiled.run(inputs), onnxruntime_outputs(model, inputs))


def test_the_gemm_rule_runs_parallel_and_vectorized():
    inputs = frontend.bind_input_shapes(_conv_model(), 1)
    kernels = kernel_module(lower(frontend.to_relax(_conv_model(), inputs)))
    schedule = cpu_schedules.gemm(kernels["fused_conv2d_add_relu"], resolve_target("llvm").tvm_target)
    script = schedule.mod["main"].script()
    assert "T.parallel(" in script and "T.vectorized(" in script and "T.unroll(" in script


def test_a_rule_that_raises_is_skipped_and_named(monkeypatch):
    def broken(function, target):
        raise RuntimeError("a broken rule")

    monkeypatch.setitem(cpu_schedules.RULES, "gemm", cpu_schedules._Rule(broken))
    model = _matmul_softmax_model()
    inputs = {"x": RNG.standard_normal((3, 40)).astype("float32")}
    compiled = tvmsched.compile(model, target="llvm")
    why = "gemm failed (RuntimeError: a broken rule); runs the Reduction schedule"
    assert dict(compiled.meta.fallbacks) == {"fused_matmul_add": why, "softmax": why}
    assert_matches(compiled.run(inputs), onnxruntime_outputs(model, inputs))


@pytest.mark.parametrize("mcpu, lanes, tile", [("znver3", 8, 12), ("haswell", 8, 12), ("znver4", 16, 16),
                                               ("skylake-avx512", 16, 16), ("x86-64", 4, 12)])
def test_vectors_follow_the_targets_registers(mcpu, lanes, tile):
    """TVM's llvm_get_vector_width says 512 bits for every x86 CPU: the lanes come from the features."""
    import tvm

    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    assert cpu_schedules.vector_lanes(target, tvm.DataType("float32")) == lanes
    assert cpu_schedules.tile_positions(target) == tile


def test_a_channel_count_vectorizes_by_a_power_of_two():
    """1,000 output channels on 16 lanes were vectors of 10, which LLVM shuffles: 8 divides them."""
    import tvm

    model = make_model([helper.make_node("Conv", ["x", "w"], ["out"])], [tensor("x", [1, 16, 5, 5])],
                       [tensor("out", [1, 1000, 5, 5])], {"w": _weights(1000, 16, 1, 1)}, opset=17)
    inputs = frontend.bind_input_shapes(model, 1)
    [function] = kernel_module(lower(frontend.to_relax(model, inputs))).functions.values()
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    script = cpu_schedules.gemm(function, target).mod["main"].script()
    assert set(re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", script)) == {"8"}

