"""Recognition of the fused kernels a vendor library could compute: anchors, epilogues, parameter roles,
refusals, half precision, JSON, and a zoo model."""

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper
from test_graph import graph_of
from tvm import relax, te

from tvmsched.graph import KernelGraph
from tvmsched.lower import lower
from tvmsched.tactics.vendor_op import Conv2d, EpilogueOp, Matmul, VendorOp

RNG = np.random.default_rng(0)


def weights(dtype="float32", **shapes) -> dict[str, np.ndarray]:
    return {name: RNG.standard_normal(shape).astype(dtype) for name, shape in shapes.items()}


def only_kernel(model):
    """The one kernel of `model`'s graph that has an anchor (conv2d or matmul)."""
    graph, _ = graph_of(model)
    [kernel] = [kernel for kernel in graph.kernels if {"conv2d", "matmul"} & set(kernel.op_kinds)]
    return kernel


def conv_model(extra_nodes, extra_inputs=(), dtype=TensorProto.FLOAT, group=1, **more):
    """x (1, 4, 9, 9) → Conv(w, b; stride 2, pads 0,1,1,2, group) → `extra_nodes` → y (1, 8, 4, 5)."""
    element = "float16" if dtype == TensorProto.FLOAT16 else "float32"
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[0, 1, 1, 2], group=group)
    return make_model([conv, *extra_nodes], [tensor("x", [1, 4, 9, 9], dtype), *extra_inputs],
                      [tensor("y", [1, 8, 4, 5], dtype)],
                      {**weights(element, w=(8, 4 // group, 3, 3), b=(8,)), **more})


def test_conv_bias_relu():
    kernel = only_kernel(conv_model([helper.make_node("Relu", ["c"], ["y"])]))
    assert kernel.vendor_op == VendorOp(
        Conv2d("NCHW", (1, 4, 9, 9), (8, 4, 3, 3), (1, 8, 4, 5), (2, 2), (0, 1, 1, 2), (1, 1), 1, "float32",
               "float32"),
        0, 1, (EpilogueOp("bias", "float32", 2, 1), EpilogueOp("relu", "float32")), 3)
    assert kernel.vendor_op.name == "conv2d+bias+relu"
    assert [kernel.inputs[index].name for index in (0, 1)] == ["x", kernel.inputs[1].name]
    assert kernel.inputs[1].shape == (8, 4, 3, 3) and kernel.inputs[2].shape == (1, 8, 1, 1)
    assert kernel.vendor_op.output == len(kernel.inputs)


@pytest.mark.parametrize("group", [2, 4])
def test_grouped_and_depthwise_conv(group):
    kernel = only_kernel(conv_model([helper.make_node("Relu", ["c"], ["y"])], group=group))
    assert kernel.vendor_op.anchor.groups == group
    assert kernel.vendor_op.anchor.weight_shape == (8, 4 // group, 3, 3)


def test_conv_residual_relu():
    nodes = [helper.make_node("Add", ["c", "skip"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    kernel = only_kernel(conv_model(nodes, [tensor("skip", [1, 8, 4, 5])]))
    epilogue = kernel.vendor_op.epilogue
    assert [op.kind for op in epilogue] == ["bias", "residual", "relu"]
    assert kernel.inputs[epilogue[1].operand].name == "skip" and epilogue[1].axis is None


def test_conv_clip_bounds():
    bounds = {"low": np.array(0, "float32"), "high": np.array(6, "float32")}
    kernel = only_kernel(conv_model([helper.make_node("Clip", ["c", "low", "high"], ["y"])],
                                    **bounds))
    assert kernel.vendor_op.epilogue[-1] == EpilogueOp("clip", "float32", bounds=(0.0, 6.0))
    kernel = only_kernel(conv_model([helper.make_node("Clip", ["c", "low"], ["y"])], **bounds))
    assert kernel.vendor_op.epilogue[-1] == EpilogueOp("clip", "float32", bounds=(0.0, None))


@pytest.mark.parametrize("nodes", [
    [helper.make_node("Tanh", ["c"], ["y"])],  # an op no epilogue has
    [helper.make_node("Sub", ["b2", "c"], ["y"])],  # c - x: only x - c is recognized
    [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Mul", ["r", "c"], ["y"])],  # reads x twice
    [helper.make_node("Mul", ["c", "half"], ["y"])],  # a scalar constant, inlined into the PrimFunc
])
def test_kernel_with_other_ops_is_not_recognized(nodes):
    constants = {"b2": np.ones((1, 8, 1, 1), "float32"), "half": np.array(0.5, "float32")}
    kernel = only_kernel(conv_model(nodes, **constants))
    assert len(kernel.op_kinds) > 1 and kernel.vendor_op is None


def test_gemm_bias_silu():
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1),
             helper.make_node("Sigmoid", ["g"], ["s"]), helper.make_node("Mul", ["g", "s"], ["y"])]
    kernel = only_kernel(make_model(nodes, [tensor("x", [1, 16])], [tensor("y", [1, 8])],
                                    weights(w=(8, 16), b=(8,))))
    assert kernel.vendor_op == VendorOp(Matmul((1, 16), (16, 8), (1, 8), "float32", "float32"), 0, 1,
                                        (EpilogueOp("bias", "float32", 2, 1), EpilogueOp("silu", "float32")),
                                        3)


@pytest.mark.parametrize("half, recognized", [(0.5, True), (0.6, False)])
def test_matmul_bias_erf_gelu(half, recognized):
    """GELU as ONNX exports write it, x * 0.5 * (1 + erf(x / √2)); another constant is not GELU."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Div", ["a", "root2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["a", "e1"], ["g"]),
             helper.make_node("Mul", ["g", "half"], ["y"])]
    constants = {"root2": np.array(np.sqrt(2), "float32"), "one": np.array(1, "float32"),
                 "half": np.array(half, "float32")}
    kernel = only_kernel(make_model(nodes, [tensor("x", [1, 5, 16])], [tensor("y", [1, 5, 8])],
                                    {**weights(w=(16, 8), b=(8,)), **constants}))
    expected = (EpilogueOp("bias", "float32", 2, 2), EpilogueOp("gelu", "float32"))
    assert (kernel.vendor_op is not None and kernel.vendor_op.epilogue == expected) == recognized


def test_batched_matmul_bias():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    kernel = only_kernel(make_model(nodes, [tensor("x", [1, 3, 2, 16])], [tensor("y", [1, 3, 2, 8])],
                                    weights(w=(3, 16, 8), b=(8,))))
    assert kernel.vendor_op.anchor == Matmul((1, 3, 2, 16), (3, 16, 8), (1, 3, 2, 8), "float32", "float32")
    assert kernel.vendor_op.epilogue == (EpilogueOp("bias", "float32", 2, 3),)


def test_half_precision_conv_accumulates_in_float32():
    kernel = only_kernel(conv_model([helper.make_node("Relu", ["c"], ["y"])],
                                    dtype=TensorProto.FLOAT16))
    vendor_op = kernel.vendor_op
    assert (vendor_op.anchor.dtype, vendor_op.anchor.accumulate_dtype) == ("float16", "float32")
    assert [(op.kind, op.dtype) for op in vendor_op.epilogue] == [("cast", "float16"), ("bias", "float16"),
                                                                   ("relu", "float16")]
    assert vendor_op.out_dtype == "float16"


def test_json_round_trip_and_hash():
    bounds = {"low": np.array(0, "float32"), "high": np.array(6, "float32")}
    model = conv_model([helper.make_node("Clip", ["c", "low", "high"], ["y"])], **bounds)
    graph, _ = graph_of(model)
    loaded = KernelGraph.from_json(json.loads(json.dumps(graph.to_json())))
    assert loaded == graph and any(kernel.vendor_op for kernel in loaded.kernels)
    # vendor ops follow from what the hash covers: plans and measurements keyed before them stay valid
    without = replace(graph, kernels=tuple(replace(kernel, vendor_op=None) for kernel in graph.kernels))
    assert without.hash == graph.hash
    old = without.to_json()
    for kernel in old["kernels"]:
        del kernel["vendor_op"], kernel["tactic"]
    assert KernelGraph.from_json({**old, "schema": 2}) == without
    # a schema-2 build's plan names the hash schema-2 code computed (of its JSON): loading it still matches
    schema2 = {**old, "schema": 2}
    hashed_then = hashlib.sha256(json.dumps(schema2, sort_keys=True).encode()).hexdigest()[:16]
    assert KernelGraph.from_json(schema2).hash == hashed_then


def test_googlenet_every_convolution_recognized():
    """googlenet's 57 convolutions (each with its batch norm's subtract, divide, multiply, add) and its
    classifier; every role's shape is the kernel input's."""
    from tvmsched import zoo

    graph, _ = graph_of(zoo.build("googlenet"))
    anchored = [kernel for kernel in graph.kernels if {"conv2d", "matmul"} & set(kernel.op_kinds)]
    assert len(anchored) == 58 and all(kernel.vendor_op for kernel in anchored)
    for kernel in anchored:
        vendor_op, anchor = kernel.vendor_op, kernel.vendor_op.anchor
        data, weight = (anchor.data_shape, anchor.weight_shape) if isinstance(anchor, Conv2d) else \
            (anchor.a_shape, anchor.b_shape)
        assert (kernel.inputs[vendor_op.data].shape, kernel.inputs[vendor_op.weight].shape) == (data, weight)
        assert kernel.outputs[0].shape == anchor.out_shape and vendor_op.output == len(kernel.inputs)
        for op in vendor_op.epilogue:
            if op.operand is not None:
                axis = op.axis - len(anchor.out_shape)  # of the operand, right-aligned to the output
                assert kernel.inputs[op.operand].shape[axis] == anchor.out_shape[op.axis]


@pytest.mark.parametrize("kernel_layout, recognized", [("OHWI", True), ("HWIO", False)])
def test_nhwc_conv_needs_an_ohwi_weight(kernel_layout, recognized):
    """ONNX imports NCHW only; a Relax NHWC convolution is a vendor's with an OHWI weight alone."""
    builder = relax.BlockBuilder()
    data = relax.Var("x", relax.TensorType((1, 9, 9, 4), "float32"))
    weight = RNG.standard_normal((8, 3, 3, 4) if kernel_layout == "OHWI" else (3, 3, 4, 8)).astype("float32")
    with builder.function("main", [data]):
        with builder.dataflow():
            conv = builder.emit(relax.op.nn.conv2d(data, relax.const(weight), data_layout="NHWC",
                                                   kernel_layout=kernel_layout))
            biased = builder.emit(relax.op.add(conv, relax.const(np.ones((1, 1, 1, 8), "float32"))))
            output = builder.emit_output(relax.op.nn.relu(biased))
        builder.emit_func_output(output)
    vendor_ops = list(lower(builder.get()).vendor_ops.values())
    assert len(vendor_ops) == recognized
    if recognized:
        assert vendor_ops[0].anchor.layout == "NHWC" and vendor_ops[0].anchor.weight_shape == weight.shape
        assert vendor_ops[0].epilogue == (EpilogueOp("bias", "float32", 2, 3), EpilogueOp("relu", "float32"))


def test_an_op_is_known_by_what_it_computes_not_its_name():
    """A PrimFunc named `add` that subtracts is no bias add."""
    builder = relax.BlockBuilder()
    data = relax.Var("x", relax.TensorType((1, 4, 9, 9), "float32"))
    bias = relax.const(np.ones((1, 8, 1, 1), "float32"))
    with builder.function("main", [data]):
        with builder.dataflow():
            conv = builder.emit(relax.op.nn.conv2d(data, relax.const(weights(w=(8, 4, 3, 3))["w"])))
            output = builder.emit_output(builder.call_te(
                lambda a, b: te.compute(a.shape, lambda *i: a(*i) - b(0, i[1], 0, 0)), conv, bias,
                primfunc_name_hint="add"))
        builder.emit_func_output(output)
    lowered = lower(builder.get())
    assert ("conv2d", "add") in lowered.op_kinds.values() and lowered.vendor_ops == {}
