"""A small builder of ONNX graphs for the zoo: named layers with seeded random weights, channels tracked."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 9  # readable by onnxruntime releases older than the installed onnx package


class GraphBuilder:
    """Appends ONNX nodes; every method takes and returns tensor names and knows each tensor's channels."""

    def __init__(self, name: str, batch: int | str, image_size: int, seed: int, channels: int = 3):
        self.name = name
        self.batch = batch
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.channels: dict[str, int] = {"input": channels}
        self.image_size = image_size
        self.counter = 0

    def _unique(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}_{self.counter}"

    def _node(self, op: str, inputs: list[str], channels: int, output: str | None = None,
              **attributes) -> str:
        output = output or self._unique(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attributes))
        self.channels[output] = channels
        return output

    def constant(self, value: np.ndarray, prefix: str = "w") -> str:
        name = self._unique(prefix)
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def conv(self, x: str, out_channels: int, kernel: int | tuple[int, int], stride: int = 1,
             pad: int | tuple[int, int] | None = None, groups: int = 1, bias: bool = False,
             gain: float = 2.0) -> str:
        """Convolution with weights of variance gain / fan_in (He-normal for inputs after a ReLU; gain 1
        keeps the variance of an unrectified input); `pad` defaults to half the kernel."""
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        ph, pw = (kh // 2, kw // 2) if pad is None else ((pad, pad) if isinstance(pad, int) else pad)
        in_channels = self.channels[x]
        fan_in = in_channels // groups * kh * kw
        shape = (out_channels, in_channels // groups, kh, kw)
        weight = self.rng.standard_normal(shape) * np.sqrt(gain / fan_in)
        inputs = [x, self.constant(weight)]
        if bias:
            inputs.append(self.constant(self.rng.normal(0.0, 0.05, out_channels), "b"))
        return self._node("Conv", inputs, out_channels, kernel_shape=[kh, kw], strides=[stride, stride],
                          pads=[ph, pw, ph, pw], group=groups)

    def batch_norm(self, x: str, epsilon: float = 1e-3, gamma: float = 1.0) -> str:
        """Inference batch norm with random statistics near identity, its scale multiplied by `gamma`."""
        channels = self.channels[x]
        scale = self.constant(gamma * self.rng.uniform(0.8, 1.2, channels), "gamma")
        shift = self.constant(self.rng.normal(0.0, 0.05, channels), "beta")
        mean = self.constant(self.rng.normal(0.0, 0.05, channels), "mean")
        variance = self.constant(self.rng.uniform(0.8, 1.2, channels), "var")
        return self._node("BatchNormalization", [x, scale, shift, mean, variance], channels, epsilon=epsilon)

    def relu(self, x: str) -> str:
        return self._node("Relu", [x], self.channels[x])

    def sigmoid(self, x: str) -> str:
        return self._node("Sigmoid", [x], self.channels[x])

    def conv_bn(self, x: str, out_channels: int, kernel, stride: int = 1, pad=None, groups: int = 1,
                relu: bool = True, gamma: float = 1.0) -> str:
        """Conv (no bias) → BatchNorm → optional ReLU: torchvision's BasicConv2d."""
        y = self.batch_norm(self.conv(x, out_channels, kernel, stride, pad, groups), gamma=gamma)
        return self.relu(y) if relu else y

    def max_pool(self, x: str, kernel: int, stride: int, pad: int = 0, ceil: bool = False) -> str:
        return self._node("MaxPool", [x], self.channels[x], kernel_shape=[kernel, kernel],
                          strides=[stride, stride], pads=[pad] * 4, ceil_mode=int(ceil))

    def avg_pool(self, x: str, kernel: int, stride: int, pad: int = 0, count_include_pad: bool = True) -> str:
        return self._node("AveragePool", [x], self.channels[x], kernel_shape=[kernel, kernel],
                          strides=[stride, stride], pads=[pad] * 4, count_include_pad=int(count_include_pad))

    def global_avg_pool(self, x: str) -> str:
        return self._node("GlobalAveragePool", [x], self.channels[x])

    def concat(self, inputs: list[str]) -> str:
        return self._node("Concat", inputs, sum(self.channels[x] for x in inputs), axis=1)

    def add(self, inputs: list[str]) -> str:
        total = inputs[0]
        for x in inputs[1:]:
            total = self._node("Add", [total, x], self.channels[x])
        return total

    def scale(self, x: str, factor: float) -> str:
        return self._node("Mul", [x, self.constant(np.array(factor), "scale")], self.channels[x])

    def crop_top_left(self, x: str) -> str:
        """Shift by one pixel: pad bottom/right by one, drop the first row and column."""
        padded = self._node("Pad", [x, self._int_constant([0, 0, 0, 0, 0, 0, 1, 1])], self.channels[x])
        starts = self._int_constant([1, 1])
        ends = self._int_constant([2**31 - 1, 2**31 - 1])
        axes = self._int_constant([2, 3])
        return self._node("Slice", [padded, starts, ends, axes], self.channels[x])

    def _int_constant(self, values: list[int]) -> str:
        name = self._unique("i")
        self.initializers.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def flatten(self, x: str, output: str | None = None) -> str:
        return self._node("Flatten", [x], self.channels[x], output, axis=1)

    def classifier(self, x: str, num_classes: int) -> str:
        """Global average pool → Flatten → Gemm: logits named `output`."""
        pooled = self.flatten(self.global_avg_pool(x))
        features = self.channels[x]
        weight = self.constant(self.rng.standard_normal((num_classes, features)) * np.sqrt(1.0 / features))
        bias = self.constant(self.rng.normal(0.0, 0.05, num_classes), "b")
        return self._node("Gemm", [pooled, weight, bias], num_classes, "output", transB=1)

    def finish(self, output: str = "output") -> onnx.ModelProto:
        """The checked model with input `input` [batch, 3, H, W] and output [batch, classes]."""
        size = self.image_size
        graph = helper.make_graph(
            self.nodes, self.name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [self.batch, 3, size, size])],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, [self.batch, self.channels[output]])],
            self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  ir_version=IR_VERSION, producer_name="tvmsched.zoo")
        onnx.checker.check_model(model)
        return model
