"""The PyTorch baseline of a zoo model: its ONNX graph run node by node with torch.nn.functional (cuDNN on
the GPU), so PyTorch and tvmsched execute the very same network and weights; `cuda_graph` replays it as one
CUDA Graph. Covers the operators the zoo uses; anything else raises. Needs torch (present on the device).
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper


class OnnxModule(torch.nn.Module):
    """An ONNX ModelProto as a torch module with one positional input per graph input."""

    def __init__(self, proto: onnx.ModelProto):
        super().__init__()
        arrays = {item.name: numpy_helper.to_array(item) for item in proto.graph.initializer}
        self.slots = {name: f"w{index}" for index, name in enumerate(arrays)}
        for name, array in arrays.items():
            self.register_buffer(self.slots[name], torch.from_numpy(array.copy()))
        self.inputs = [value.name for value in proto.graph.input if value.name not in arrays]
        self.outputs = [value.name for value in proto.graph.output]
        self.steps = [(list(node.input), node.output[0], _operator(node, arrays))
                      for node in proto.graph.node]

    def forward(self, *inputs):
        values = {name: getattr(self, slot) for name, slot in self.slots.items()}
        values.update(zip(self.inputs, inputs))
        for names, output, run in self.steps:
            values[output] = run(*(values[name] if name else None for name in names))
        outputs = [values[name] for name in self.outputs]
        return outputs[0] if len(outputs) == 1 else outputs


def fp32_settings() -> None:
    """The settings every PyTorch baseline here runs with: TF32 off in cuDNN and matmuls (fp32 like
    tvmsched), cuDNN's algorithm search on."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True


def cuda_graph(module: torch.nn.Module, example: torch.Tensor):
    """Capture one inference of `module` (on the GPU, as `example`) into a CUDA graph, after three warm-up
    inferences on a side stream; returns (replay, static input, static output)."""
    static_input = example.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(3):
            module(static_input)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_output = module(static_input)
    return graph.replay, static_input, static_output


def _operator(node: onnx.NodeProto, arrays: dict[str, np.ndarray]):
    """A function of the node's input tensors; integer operands (pads, slice bounds) are read from the
    initializers now, so the forward pass never copies from the device and can be captured."""
    attrs = {item.name: onnx.helper.get_attribute_value(item) for item in node.attribute}
    kind = node.op_type
    if kind == "Conv":
        padding = _symmetric(node, attrs.get("pads", [0, 0, 0, 0]))
        return lambda x, w, b=None: F.conv2d(x, w, b, stride=attrs.get("strides", 1), padding=padding,
                                             dilation=attrs.get("dilations", 1), groups=attrs.get("group", 1))
    if kind == "MaxPool":
        padding = _symmetric(node, attrs.get("pads", [0, 0, 0, 0]))
        return lambda x: F.max_pool2d(x, attrs["kernel_shape"], attrs.get("strides", 1), padding,
                                      dilation=attrs.get("dilations", 1),
                                      ceil_mode=bool(attrs.get("ceil_mode")))
    if kind == "AveragePool":
        padding = _symmetric(node, attrs.get("pads", [0, 0, 0, 0]))
        return lambda x: F.avg_pool2d(x, attrs["kernel_shape"], attrs.get("strides", 1), padding,
                                      ceil_mode=bool(attrs.get("ceil_mode")),
                                      count_include_pad=bool(attrs.get("count_include_pad", 0)))
    if kind == "BatchNormalization":
        return lambda x, scale, bias, mean, var: F.batch_norm(x, mean, var, scale, bias, training=False,
                                                              eps=attrs.get("epsilon", 1e-5))
    if kind == "Gemm":
        def gemm(a, b, c=None):
            a = a.t() if attrs.get("transA") else a
            b = b.t() if attrs.get("transB") else b
            out = attrs.get("alpha", 1.0) * (a @ b)
            return out if c is None else out + attrs.get("beta", 1.0) * c
        return gemm
    if kind == "Pad":
        pads = [int(p) for p in (arrays[node.input[1]] if len(node.input) > 1 else attrs["pads"])]
        half = len(pads) // 2
        torch_pads = [p for axis in reversed(range(half)) for p in (pads[axis], pads[axis + half])]
        if attrs.get("mode", b"constant") not in (b"constant", "constant"):
            raise NotImplementedError(f"Pad mode {attrs['mode']} in node {node.name}")
        return lambda x, *_: F.pad(x, torch_pads)
    if kind == "Slice":
        starts, ends = arrays[node.input[1]], arrays[node.input[2]]
        axes = arrays[node.input[3]] if len(node.input) > 3 else range(len(starts))
        steps = arrays[node.input[4]] if len(node.input) > 4 else [1] * len(starts)
        bounds = [(int(axis), slice(int(start), None if end >= 2**31 - 1 else int(end), int(step)))
                  for start, end, axis, step in zip(starts, ends, axes, steps)]  # plain ints: traceable

        def slice_(x, *_):
            index = [slice(None)] * x.dim()
            for axis, bound in bounds:
                index[axis] = bound
            return x[tuple(index)]
        return slice_
    simple = {"Relu": F.relu, "Add": torch.add, "Mul": torch.mul,
              "GlobalAveragePool": lambda x: x.mean((2, 3), keepdim=True),
              "Concat": lambda *xs: torch.cat(xs, attrs["axis"]),
              "Flatten": lambda x: x.flatten(axis).flatten(0, axis - 1) if axis else x.reshape(1, -1)}
    axis = attrs.get("axis", 1)  # Flatten's; torch.compile traces flatten, not a product of sizes
    if kind in simple:
        return simple[kind]
    raise NotImplementedError(f"operator {kind} (node {node.name}) has no PyTorch translation here")


def _symmetric(node: onnx.NodeProto, pads: list[int]) -> list[int]:
    half = len(pads) // 2
    if pads[:half] != pads[half:]:
        raise NotImplementedError(f"asymmetric pads {pads} in node {node.name}")
    return pads[:half]
