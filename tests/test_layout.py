"""--layout nhwc on the CPU: channels-last convolutions compute what the model computes, in the model's input
and output layout, are recognized for the vendor libraries as NHWC, and combine with fp16 and merge (saving
and the compile flag: tests/test_precision.py)."""


import numpy as np
import pytest
from conftest import make_model, onnxruntime_outputs, tensor
from onnx import helper
from test_precision import TOLERANCE, relative_error
from test_tactics_select import network

import tvmsched
from tvmsched.errors import UsageError
from tvmsched.tactics.vendor_op import Conv2d


def test_nhwc_computes_what_the_model_computes():
    proto = network()
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype("float32")
    model = tvmsched.compile(proto, target="llvm", batch=2, layout="nhwc")
    assert model.meta.layout == "nhwc"
    [expected] = onnxruntime_outputs(proto, {"input": x})
    np.testing.assert_allclose(model(x), expected, rtol=1e-4, atol=1e-5)
    convolutions = [kernel.vendor_op.anchor for kernel in model.graph.kernels
                    if kernel.vendor_op is not None and isinstance(kernel.vendor_op.anchor, Conv2d)]
    assert convolutions and {anchor.layout for anchor in convolutions} == {"NHWC"}
    half = tvmsched.compile(proto, target="llvm", batch=2, layout="nhwc", precision="fp16")
    assert relative_error(half(x), expected) <= TOLERANCE


@pytest.mark.parametrize("target, precision, layout", [("llvm", "fp16", "nchw"), ("cuda", "fp32", "nchw"),
                                                       ("cuda", "fp16", "nhwc")])
def test_auto_computes_channels_last_in_fp16_on_a_gpu_only(target, precision, layout):
    """Built for CUDA without a GPU too: code generation needs none, and the executor is made at first use."""
    model = tvmsched.compile(network(), target=target, batch=2, precision=precision, kernels="tvm")
    assert model.meta.layout == layout
    convolutions = {kernel.vendor_op.anchor.layout for kernel in model.graph.kernels
                    if kernel.vendor_op is not None and isinstance(kernel.vendor_op.anchor, Conv2d)}
    assert convolutions == {layout.upper()}


def test_an_unknown_layout_is_refused_before_compiling(branchy_model):
    with pytest.raises(UsageError, match="unknown layout 'NHWC'"):
        tvmsched.compile(branchy_model, target="llvm", layout="NHWC",
                         progress=lambda stage: pytest.fail(f"started {stage}"))


def test_merge_comes_first_and_composes_with_nhwc_and_fp16():
    proto = network()  # two 1x1 convolutions read one tensor
    x = np.random.default_rng(6).standard_normal((2, 3, 8, 8)).astype("float32")
    [expected] = onnxruntime_outputs(proto, {"input": x})
    for precision, tolerance in (("fp32", 1e-5), ("fp16", TOLERANCE)):
        model = tvmsched.compile(proto, target="llvm", batch=2, merge="all", layout="nhwc",
                                 precision=precision)
        assert model.meta.merged_convolutions == (2,)
        assert relative_error(model(x), expected) <= tolerance


def convnext_block(blocks: int = 1):
    """ConvNeXt blocks as torchvision exports them: a depthwise 7x7 convolution, a transpose to
    channels-last for the layer norm and the two matmuls, a transpose back, the layer scale and the
    residual; several blocks after a 1x1 convolution (the stem)."""
    rng = np.random.default_rng(7)
    c = 8
    weights, nodes, x = {}, [], "input"
    if blocks > 1:
        weights["stem"] = rng.standard_normal((c, c, 1, 1)).astype("float32") / 3
        nodes, x = [helper.make_node("Conv", ["input", "stem"], ["stemmed"])], "stemmed"
    for block in range(blocks):
        def name(base: str, block: int = block) -> str:
            return f"{base}{block}"
        weights |= {name("dw"): rng.standard_normal((c, 1, 7, 7)).astype("float32") / 7,
                    name("db"): rng.standard_normal(c).astype("float32"), name("g"): np.ones(c, "float32"),
                    name("b"): np.zeros(c, "float32"),
                    name("w1"): rng.standard_normal((c, 4 * c)).astype("float32") / 3,
                    name("b1"): rng.standard_normal(4 * c).astype("float32"),
                    name("w2"): rng.standard_normal((4 * c, c)).astype("float32") / 6,
                    name("b2"): rng.standard_normal(c).astype("float32"),
                    name("scale"): rng.uniform(0.5, 1.5, (c, 1, 1)).astype("float32")}
        nodes += [helper.make_node("Conv", [x, name("dw"), name("db")], [name("c")], group=c,
                                   pads=[3, 3, 3, 3]),
                  helper.make_node("Transpose", [name("c")], [name("t")], perm=[0, 2, 3, 1]),
                  helper.make_node("LayerNormalization", [name("t"), name("g"), name("b")], [name("n")],
                                   axis=-1, epsilon=1e-6),
                  helper.make_node("MatMul", [name("n"), name("w1")], [name("m1")]),
                  helper.make_node("Add", [name("m1"), name("b1")], [name("a1")]),
                  helper.make_node("Relu", [name("a1")], [name("r")]),
                  helper.make_node("MatMul", [name("r"), name("w2")], [name("m2")]),
                  helper.make_node("Add", [name("m2"), name("b2")], [name("a2")]),
                  helper.make_node("Transpose", [name("a2")], [name("t2")], perm=[0, 3, 1, 2]),
                  helper.make_node("Mul", [name("scale"), name("t2")], [name("s")]),
                  helper.make_node("Add", [name("s"), x], [name("y")])]
        x = name("y")
    nodes[-1].output[0] = "y"
    return make_model(nodes, [tensor("input", [2, c, 8, 8])], [tensor("y", [2, c, 8, 8])], weights)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_transpose_to_channels_last_after_a_convolution_is_dropped(precision):
    """In NHWC the block's first transpose keeps every axis in place: the convolution's kernel is the
    convolution and its bias alone (a vendor library takes it), and the block computes what it did."""
    proto = convnext_block()
    x = np.random.default_rng(8).standard_normal((2, 8, 8, 8)).astype("float32")
    [expected] = onnxruntime_outputs(proto, {"input": x})
    model = tvmsched.compile(proto, target="llvm", layout="nhwc", precision=precision)
    [convolution] = [kernel for kernel in model.graph.kernels if "conv2d" in kernel.op_kinds]
    assert "transpose" not in convolution.op_kinds and isinstance(convolution.vendor_op.anchor, Conv2d)
    assert relative_error(model(x), expected) <= (1e-5 if precision == "fp32" else TOLERANCE)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_transposes_between_convnext_blocks_cancel(precision):
    """In NHWC the transpose back to NCHW ending a block moves past its layer scale and residual add, and
    composes with the next block's transpose to channels-last into one that keeps every axis in place:
    three blocks after a stem transpose only the model's input and output, and compute what they did."""
    proto = convnext_block(blocks=3)
    x = np.random.default_rng(9).standard_normal((2, 8, 8, 8)).astype("float32")
    [expected] = onnxruntime_outputs(proto, {"input": x})
    model = tvmsched.compile(proto, target="llvm", layout="nhwc", precision=precision)
    transposing = [kernel.op_kinds for kernel in model.graph.kernels if "transpose" in kernel.op_kinds]
    assert len(transposing) == 2, transposing
    assert relative_error(model(x), expected) <= (1e-5 if precision == "fp32" else TOLERANCE)


def test_a_transpose_is_not_moved_where_that_transposes_more():
    """A transposed tensor read by a softmax and by a relu whose result a softmax reads: moving the
    transpose past the relu would leave two transposes for one, so it stays."""
    nodes = [helper.make_node("Transpose", ["input"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Softmax", ["t"], ["s1"], axis=-1), helper.make_node("Relu", ["t"], ["r"]),
             helper.make_node("Softmax", ["r"], ["s2"], axis=-1),
             helper.make_node("Add", ["s1", "s2"], ["y"])]
    proto = make_model(nodes, [tensor("input", [2, 3, 4, 5])], [tensor("y", [2, 4, 5, 3])], {})
    x = np.random.default_rng(10).standard_normal((2, 3, 4, 5)).astype("float32")
    model = tvmsched.compile(proto, target="llvm", layout="nhwc")
    assert sum("transpose" in kernel.op_kinds for kernel in model.graph.kernels) == 1
    np.testing.assert_allclose(model(x), onnxruntime_outputs(proto, {"input": x})[0], rtol=1e-5, atol=1e-6)


def test_a_transpose_of_a_split_output_counts_as_transposing():
    """A transpose of one of Split's outputs (a field of a computed tuple, not a constant) read by three
    element-wise ops, beside a transpose, relu and transpose back that moving would save: moved past the
    three ops it would be three transposes of 192 elements for one of 16 saved, so nothing moves."""
    nodes = [helper.make_node("Split", ["input", "sizes"], ["s0", "s1"], axis=0),
             helper.make_node("Transpose", ["s0"], ["t"], perm=[0, 2, 3, 1]),
             *[helper.make_node(op, ["t"], [f"y{index}"])
               for index, op in enumerate(("Relu", "Sigmoid", "Abs"))],
             helper.make_node("Transpose", ["small"], ["u"], perm=[0, 2, 3, 1]),
             helper.make_node("Relu", ["u"], ["r"]),
             helper.make_node("Transpose", ["r"], ["y3"], perm=[0, 3, 1, 2])]
    outputs = [tensor(f"y{index}", [1, 8, 4, 6]) for index in range(3)] + [tensor("y3", [1, 2, 2, 4])]
    proto = make_model(nodes, [tensor("input", [2, 6, 8, 4]), tensor("small", [1, 2, 2, 4])], outputs,
                       {"sizes": np.array([1, 1])})
    rng = np.random.default_rng(11)
    inputs = {"input": rng.standard_normal((2, 6, 8, 4)).astype("float32"),
              "small": rng.standard_normal((1, 2, 2, 4)).astype("float32")}
    model = tvmsched.compile(proto, target="llvm", layout="nhwc")
    transposing = [kernel.op_kinds for kernel in model.graph.kernels if "transpose" in kernel.op_kinds]
    assert len(transposing) == 2, transposing  # the split's transpose, and the small pair's
    for got, expected in zip(model(*inputs.values()), onnxruntime_outputs(proto, inputs)):
        np.testing.assert_allclose(got, expected, rtol=1e-6)
