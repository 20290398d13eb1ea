"""The CPU-only rewrites: convolutions' output channels padded to full vectors (`tvmsched.pad_channels`)
and their weights stored output channel last (`tvmsched.packed_weights`). The rewritten builds compute
what onnxruntime computes, and only the convolutions the rules name are rewritten."""

import numpy as np
import pytest
import tvm
from conftest import make_model, onnxruntime_outputs, tensor
from onnx import helper

import tvmsched
from tvmsched.cpu_schedules import vector_lanes
from tvmsched.target import resolve_target


def _convolution(channels: int, epilogue: str, groups: int = 1):
    """A 3x3 convolution of 32 channels to `channels` with a bias and `epilogue` ("relu", or "norm": a
    batch norm, then a relu), read by an average pool so that it is the convolution's alone."""
    rng = np.random.default_rng(22)
    weights = {"w": rng.standard_normal((channels, 32 // groups, 3, 3)).astype("float32") / 10,
               "b": rng.standard_normal(channels).astype("float32")}
    nodes = [helper.make_node("Conv", ["input", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=groups)]
    if epilogue == "norm":
        weights |= {"gamma": rng.uniform(0.5, 1.5, channels).astype("float32"),
                    "beta": rng.standard_normal(channels).astype("float32"),
                    "mean": rng.standard_normal(channels).astype("float32"),
                    "var": rng.uniform(0.5, 1.5, channels).astype("float32")}
        nodes.append(helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"]))
        nodes.append(helper.make_node("Relu", ["n"], ["r"]))
    else:
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
    nodes.append(helper.make_node("GlobalAveragePool", ["r"], ["output"]))
    return make_model(nodes, [tensor("input", [1, 32, 9, 9])], [tensor("output", [1, channels, 1, 1])],
                      weights)


def _padded(model) -> bool:
    return any("strided_slice" in kernel.op_kinds for kernel in model.graph.kernels)


@pytest.mark.parametrize("channels, epilogue", [(1000, "relu"), (78, "norm"), (156, "relu")])
def test_padded_convolutions_compute_what_the_model_computes(channels, epilogue):
    """Padded where the rule says for this CPU's lanes (1,000 channels run 8 lanes of AVX-512's 16, 78
    two); the bias, a batch norm's statistics and the relu are padded with the convolution and the slice
    comes after them."""
    proto = _convolution(channels, epilogue)
    x = np.random.default_rng(23).standard_normal((1, 32, 9, 9)).astype("float32")
    model = tvmsched.compile(proto, target="llvm")
    lanes = vector_lanes(resolve_target("llvm").tvm_target, tvm.DataType("float32"))
    extra = -channels % lanes
    assert _padded(model) == bool(extra and extra <= channels / 8 and (channels >= 96 or channels % 4))
    assert not any(kernel.op_kinds[:2] == ("conv2d", "strided_slice") for kernel in model.graph.kernels)
    np.testing.assert_allclose(model(x), onnxruntime_outputs(proto, {"input": x})[0], rtol=1e-4, atol=1e-5)


def test_a_constant_data_input_keeps_its_batch():
    """A convolution of a constant (an input bound with --constant-input) pads its weights alone."""
    rng = np.random.default_rng(24)
    weights = {"w": rng.standard_normal((100, 8, 3, 3)).astype("float32"),
               "data": rng.standard_normal((1, 8, 9, 9)).astype("float32")}
    nodes = [helper.make_node("Conv", ["data", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "input"], ["output"])]
    proto = make_model(nodes, [tensor("input", [1, 100, 9, 9])], [tensor("output", [1, 100, 9, 9])], weights)
    x = rng.standard_normal((1, 100, 9, 9)).astype("float32")
    np.testing.assert_allclose(tvmsched.compile(proto, target="llvm")(x),
                               onnxruntime_outputs(proto, {"input": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels, groups, target", [
    (44, 1, "llvm"),  # four lanes and under 96 channels: padding measured no faster (nasnet)
    (24, 1, "llvm"),  # padding to 32 would add a third more filters
    (1000, 8, "llvm"),  # grouped
    (1000, 1, "nvidia/nvidia-h100"),  # the GPU's schedules do not vectorize channels
])
def test_other_convolutions_are_not_padded(channels, groups, target):
    model = tvmsched.compile(_convolution(channels, "relu", groups), target=target, tuned=False)
    assert not _padded(model)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_cpu_weights_are_stored_output_channel_last(layout):
    """The CPU gemm rule reads a vector of output channels: stored OIHW (OHWI) it packed them inside the
    kernel on every call, so CPU builds store them IHWO (HWIO); the GPU's keep theirs. Outputs match."""
    from tvmsched import frontend
    from tvmsched.rewrite import rewrite

    proto = _convolution(64, "norm")
    inputs = frontend.bind_input_shapes(proto)
    for target, moved in (("llvm", True), ("nvidia/nvidia-h100", False)):
        module = rewrite(frontend.to_relax(proto, inputs), layout=layout, spec=resolve_target(target)).module
        layouts = [str(binding.value.attrs.kernel_layout) for block in module["main"].body.blocks
                   for binding in block.bindings if getattr(binding.value, "op", None) is not None
                   and getattr(binding.value.op, "name", "") == "relax.nn.conv2d"]
        assert layouts and all(kernel.endswith("O") == moved for kernel in layouts), (target, layouts)
    x = np.random.default_rng(25).standard_normal((1, 32, 9, 9)).astype("float32")
    model = tvmsched.compile(proto, target="llvm", layout=layout)
    np.testing.assert_allclose(model(x), onnxruntime_outputs(proto, {"input": x})[0], rtol=1e-4, atol=1e-5)


def test_weights_reversed_by_a_transpose_without_axes_are_stored_output_channel_last():
    """A constant transposed with no axes (reversed, as numpy's transpose()) is packed like any other: the
    convolution takes the reversed values stored IHWO."""
    from tvm import relax

    from tvmsched.packed_weights import weights_packed

    weights = np.random.default_rng(30).standard_normal((3, 3, 32, 16)).astype("float32")  # reversed OIHW
    builder = relax.BlockBuilder()
    data = relax.Var("x", relax.TensorType((1, 32, 9, 9), "float32"))
    with builder.function("main", [data]):
        with builder.dataflow():
            oihw = builder.emit(relax.op.permute_dims(relax.const(weights)))
            output = builder.emit_output(relax.op.nn.conv2d(data, oihw, padding=1))
        builder.emit_func_output(output)
    packed = weights_packed(builder.get())
    [conv] = [binding.value for block in packed["main"].body.blocks for binding in block.bindings
              if getattr(getattr(binding.value, "op", None), "name", "") == "relax.nn.conv2d"]
    assert str(conv.attrs.kernel_layout) == "IHWO"
    np.testing.assert_array_equal(conv.args[1].value.numpy(), weights.transpose().transpose(1, 2, 3, 0))
