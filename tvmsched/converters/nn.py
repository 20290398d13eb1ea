"""Neural-network ops where TVM's converter is wrong or incomplete (ConvTranspose's output_shape and SAME
padding, Dropout's mask, SpaceToDepth's CRD mode, MaxPool's Indices output, RoiAlign's max mode) or missing
(CausalConvWithState, Col2Im, DeformConv)."""

from __future__ import annotations

import numpy as np
from tvm import relax, te, tirx
from tvm.relax.frontend.onnx import onnx_frontend

from tvmsched.converters import register_converter
from tvmsched.converters.common import (
    constant_value,
    dtype_of,
    refuse,
    required_constant,
    static_shape,
    text_attribute,
)


@register_converter("ConvTranspose")
class ConvTranspose(onnx_frontend.ConvTranspose):
    """Pads derived from `output_shape` or SAME auto_pad as the ONNX spec derives them (TVM's converter
    ignores output_shape and clamps a negative SAME padding to 0, giving a smaller output). A negative end
    pad grows the output by output_padding."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x, weight, bias = inputs[0], inputs[1], inputs[2]
        spatial = static_shape(x)[2:]
        rank = len(spatial)
        strides = list(attr.get("strides", [1] * rank))
        dilations = list(attr.get("dilations", [1] * rank))
        output_padding = list(attr.get("output_padding", [0] * rank))
        kernel = list(attr.get("kernel_shape", static_shape(weight)[2:]))
        auto_pad = text_attribute(attr, "auto_pad", "NOTSET")
        if "output_shape" in attr or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            target = list(attr["output_shape"])[-rank:] if "output_shape" in attr else [
                size * stride for size, stride in zip(spatial, strides)]
            total = [stride * (size - 1) + extra + (k - 1) * dilation + 1 - out for size, stride, extra, k,
                     dilation, out in zip(spatial, strides, output_padding, kernel, dilations, target)]
            if "output_shape" not in attr and min(total) < 0:
                raise refuse(f"auto_pad {auto_pad} with strides {strides} wider than the kernel",
                             "the ONNX spec grows the output to input * stride there, onnxruntime does not")
            begin = [pad // 2 if auto_pad == "SAME_UPPER" else pad - pad // 2 for pad in total]
            pads = begin + [pad - start for pad, start in zip(total, begin)]
        elif auto_pad == "VALID":
            pads = [0] * (2 * rank)
        else:
            pads = list(attr.get("pads", [0] * (2 * rank)))
        # A negative end pad grows the output at the end: output_padding (below the stride) does that.
        extra = [padding - min(pads[rank + axis], 0) for axis, padding in enumerate(output_padding)]
        if min(pads[:rank]) < 0 or any(padding >= stride for padding, stride in zip(extra, strides)):
            raise refuse(f"output_shape {list(attr['output_shape'])}", "tvmsched grows a transposed "
                         "convolution's output by less than its stride, at the end only")
        conv_attr = {key: value for key, value in attr.items() if key not in ("auto_pad", "output_shape")}
        conv_attr.update(pads=[max(pad, 0) for pad in pads], output_padding=extra)
        return super()._impl_v1(bb, [x, weight, bias], conv_attr, params)


@register_converter("Dropout")
class Dropout(onnx_frontend.OnnxOpConverter):
    """Inference: the output is the input and the mask all true. Before opset 12 the inference mask is
    refused (ONNX's reference makes it true, onnxruntime false), and so is training mode, where the output is
    random, unless its ratio is a constant 0."""

    @classmethod
    def _inference(cls, x: relax.Expr) -> relax.Tuple:
        return relax.Tuple([x, relax.op.ones(x.ty.shape, "bool")])

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if attr["tvm_custom"]["num_outputs"] > 1:
            raise refuse("the mask output before opset 12", "ONNX's reference makes it all true and "
                         "onnxruntime all false; export with opset 12 or later")
        return inputs[0]

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        x, ratio, training = inputs[0], inputs[1], inputs[2]
        if training is not None:
            mode = constant_value(training)
            if mode is None:
                raise refuse("a training_mode computed at run time", "training-mode dropout is random; "
                             "export the model for inference (training_mode false or absent)")
            rate = None if ratio is None else constant_value(ratio)
            if bool(mode) and (rate is None or float(rate) != 0):
                raise refuse("training_mode true", "training-mode dropout is random (unless its ratio is a "
                             "constant 0); export the model for inference")
        return cls._inference(x)


@register_converter("SpaceToDepth")
class SpaceToDepth(onnx_frontend.SpaceToDepth):
    """Opset 28 added mode CRD (the channel-major order DepthToSpace has); TVM converts DCR only."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        mode = text_attribute(attr, "mode", "DCR")
        if mode == "DCR":
            return super()._impl_v1(bb, inputs, attr, params)
        if mode != "CRD":
            raise refuse(f"mode '{mode}'", "ONNX defines DCR and CRD")
        block = int(attr["blocksize"])
        batch, channels, height, width = static_shape(inputs[0])
        x = relax.op.reshape(inputs[0], (batch, channels, height // block, block, width // block, block))
        x = relax.op.permute_dims(x, [0, 1, 3, 5, 2, 4])
        return relax.op.reshape(x, (batch, channels * block * block, height // block, width // block))


@register_converter("RoiAlign")
class RoiAlign(onnx_frontend.RoiAlign):
    """Mode max is refused: ONNX's reference takes the largest of the bilinear corner terms, onnxruntime and
    TVM pool differently, and they disagree."""

    @classmethod
    def _impl(cls, bb, inputs, attr, params, default_coordinate_transformation_mode):
        if text_attribute(attr, "mode", "avg") != "avg":
            raise refuse("mode 'max'", "implementations disagree on it (ONNX's reference maximizes the "
                         "bilinear corner terms); use mode 'avg'")
        return super()._impl(bb, inputs, attr, params, default_coordinate_transformation_mode)


@register_converter("MaxPool")
class MaxPool(onnx_frontend.MaxPool):
    """TVM pools the values; the optional Indices output (the flat input index of each window's first maximum,
    row-major, or column-major over H and W with storage_order 1) is computed here."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        values = bb.emit(super()._impl_v1(bb, inputs, attr, params))
        if attr["tvm_custom"]["num_outputs"] < 2:
            return values
        pads = _pads_before(inputs[0], values, attr)
        indices = bb.emit_te(lambda data, pooled: _pool_indices(data, pooled, pads, attr), inputs[0], values)
        return relax.Tuple([values, indices])


def _pads_before(x: relax.Expr, values: relax.Expr, attr: dict) -> list[int]:
    """The padding before each spatial axis, given the output size TVM's pool computed."""
    spatial, pooled = static_shape(x)[2:], static_shape(values)[2:]
    rank = len(spatial)
    auto_pad = text_attribute(attr, "auto_pad", "NOTSET")
    if auto_pad == "VALID":
        return [0] * rank
    if auto_pad == "NOTSET":
        return list(attr.get("pads", [0] * (2 * rank)))[:rank]
    strides = attr.get("strides", [1] * rank)
    dilations = attr.get("dilations", [1] * rank)
    total = [(out - 1) * stride + (k - 1) * dilation + 1 - size for out, stride, k, dilation, size in
             zip(pooled, strides, attr["kernel_shape"], dilations, spatial)]
    return [max(pad, 0) // 2 if auto_pad == "SAME_UPPER" else max(pad, 0) - max(pad, 0) // 2 for pad in total]


def _pool_indices(data: te.Tensor, values: te.Tensor, pads: list[int], attr: dict) -> te.Tensor:
    """int64 flat index of the first maximum of each pooling window: the smallest index (row-major order is
    scan order) among the window's elements equal to the pooled value, a min-reduction every target
    schedules (an argmax reducer over pairs has no cross-thread reduction on CUDA)."""
    shape = [int(dim) for dim in data.shape]
    spatial = shape[2:]
    rank = len(spatial)
    strides = attr.get("strides", [1] * rank)
    dilations = attr.get("dilations", [1] * rank)
    column_major = attr.get("storage_order", 0) == 1
    if column_major and rank != 2:
        raise refuse(f"storage_order 1 for a {rank}-D MaxPool", "ONNX defines the column-major index for 2-D")
    window = [te.reduce_axis((0, k), name=f"k{axis}") for axis, k in enumerate(attr["kernel_shape"])]

    def compute(n, c, *out):
        position = [out[axis] * strides[axis] - pads[axis] + window[axis] * dilations[axis] for axis in
                    range(rank)]
        inside = tirx.all(*[tirx.all(index >= 0, index < size) for index, size in zip(position, spatial)])
        flat = n * shape[1] + c
        for index, size in zip(position, spatial):
            flat = flat * size + index
        clamped = [tirx.max(tirx.min(index, size - 1), 0) for index, size in zip(position, spatial)]
        maximum = tirx.all(inside, data[(n, c, *clamped)] == values[(n, c, *out)])
        return te.min(tirx.Select(maximum, flat.astype("int64"), tirx.max_value("int64")), axis=window)

    first = te.compute(values.shape, compute, name="pool_argmax")
    if not column_major:
        return first
    height, width = spatial

    def transpose(*index):
        plane, within = first(*index) // (height * width), first(*index) % (height * width)
        return plane * (height * width) + within // width + (within % width) * height
    return te.compute(first.shape, transpose, name="pool_argmax_column_major")


@register_converter("CausalConvWithState")
class CausalConvWithState(onnx_frontend.OnnxOpConverter):
    """A depthwise causal 1-D convolution over the past state (zeros if absent) followed by the input,
    optionally with SiLU; the present state is the last k - 1 positions of that sequence."""

    @classmethod
    def _impl_v27(cls, bb, inputs, attr, params):
        x, weight, bias, past = inputs[:4]
        batch, channels, length = static_shape(x)
        kernel = static_shape(weight)[2]
        dtype = dtype_of(x)
        history = past if past is not None else relax.op.zeros((batch, channels, kernel - 1), dtype)
        padded = bb.normalize(relax.op.concat([history, x], axis=2) if kernel > 1 else x)
        wide = "float64" if dtype == "float64" else "float32"  # float16 accumulates in float32
        # A sum of k shifted slices times their weights: one elementwise kernel (k is small, 4 in Mamba),
        # where dlight's convolution schedules fail on CUDA for k = 1.
        result = None
        for tap in range(kernel):
            window = relax.op.astype(relax.op.strided_slice(padded, [2], [tap], [tap + length]), wide)
            scale = relax.op.reshape(relax.op.strided_slice(weight, [2], [tap], [tap + 1]), [channels, 1])
            term = relax.op.multiply(window, relax.op.astype(scale, wide))
            result = term if result is None else relax.op.add(result, term)
        if bias is not None:
            result = relax.op.add(result, relax.op.astype(relax.op.reshape(bias, [1, channels, 1]), wide))
        activation = text_attribute(attr, "activation", "none")
        if activation in ("silu", "swish"):
            result = relax.op.multiply(result, relax.op.sigmoid(result))
        elif activation != "none":
            raise refuse(f"activation '{activation}'", "ONNX defines none, silu and swish")
        result = relax.op.astype(result, dtype)
        if kernel > 1:
            present = relax.op.strided_slice(padded, [2], [length], [length + kernel - 1])
        else:  # an empty state: a constant, since no kernel can compute a zero-size tensor on CUDA
            present = relax.const(np.zeros((batch, channels, 0), dtype), dtype)
        return relax.Tuple([result, present])


@register_converter("Col2Im")
class Col2Im(onnx_frontend.OnnxOpConverter):
    """Each image position sums the column entries of every block that covers it (PyTorch's fold)."""

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        image = [int(size) for size in required_constant(inputs[1], "input 'image_shape'").tolist()]
        block = [int(size) for size in required_constant(inputs[2], "input 'block_shape'").tolist()]
        rank = len(image)
        strides = list(attr.get("strides", [1] * rank))
        dilations = list(attr.get("dilations", [1] * rank))
        pads = list(attr.get("pads", [0] * (2 * rank)))
        counts = [(size + pads[axis] + pads[rank + axis] - dilations[axis] * (block[axis] - 1) - 1)
                  // strides[axis] + 1 for axis, size in enumerate(image)]

        def compute(columns):
            batch, rows, _ = (int(dim) for dim in columns.shape)
            taps = [te.reduce_axis((0, size), name=f"k{axis}") for axis, size in enumerate(block)]

            def fold(n, c, *position):
                starts = [position[axis] + pads[axis] - taps[axis] * dilations[axis] for axis in range(rank)]
                covered = tirx.all(*[tirx.all(start % strides[axis] == 0, start >= 0,
                                              start // strides[axis] < counts[axis])
                                     for axis, start in enumerate(starts)])
                row, column = c, 0
                for axis in range(rank):
                    row = row * block[axis] + taps[axis]
                    column = column * counts[axis] + tirx.max(starts[axis], 0) // strides[axis]
                value = columns[n, row, tirx.min(column, columns.shape[2] - 1)]
                return te.sum(tirx.Select(covered, value, tirx.const(0, columns.dtype)), axis=taps)
            return te.compute((batch, rows // int(np.prod(block)), *image), fold, name="col2im")
        return bb.emit_te(compute, inputs[0])


@register_converter("DeformConv")
class DeformConv(onnx_frontend.OnnxOpConverter):
    """2-D deformable convolution: each kernel tap samples the input bilinearly (zero outside) at its offset
    position, scaled by the mask; the samples of each group then meet the weights in one matmul."""

    @classmethod
    def _impl_v19(cls, bb, inputs, attr, params):
        x, weight, offset, bias, mask = inputs[:5]
        batch, channels = static_shape(x)[:2]
        out_channels, group_channels, kernel_h, kernel_w = static_shape(weight)
        out_h, out_w = static_shape(offset)[2:]
        groups, offset_groups = int(attr.get("group", 1)), int(attr.get("offset_group", 1))
        stride_h, stride_w = attr.get("strides", [1, 1])
        dilation_h, dilation_w = attr.get("dilations", [1, 1])
        pad_top, pad_left = list(attr.get("pads", [0, 0, 0, 0]))[:2]
        taps = kernel_h * kernel_w

        def sample(data, offsets, *scale):
            def value(n, c, i, j, row, column):
                tap = (c // (channels // offset_groups)) * taps + i * kernel_w + j
                y = (row * stride_h - pad_top + i * dilation_h).astype(data.dtype) + offsets[n, 2 * tap, row,
                                                                                            column]
                x = (column * stride_w - pad_left + j * dilation_w).astype(data.dtype) + offsets[
                    n, 2 * tap + 1, row, column]
                total = _bilinear(data, n, c, y, x)
                return total * scale[0][n, tap, row, column] if scale else total
            return te.compute((batch, channels, kernel_h, kernel_w, out_h, out_w), value,
                              name="deform_sample")

        sampled = bb.emit_te(sample, x, offset, *([mask] if mask is not None else []))
        columns = relax.op.reshape(sampled, [batch, groups, group_channels * taps, out_h * out_w])
        kernels = relax.op.reshape(weight, [1, groups, out_channels // groups, group_channels * taps])
        result = relax.op.reshape(relax.op.matmul(kernels, columns), [batch, out_channels, out_h, out_w])
        if bias is not None:
            result = relax.op.add(result, relax.op.reshape(bias, [1, out_channels, 1, 1]))
        return result


def _bilinear(data: te.Tensor, n, c, y, x):
    """data[n, c] at the fractional position (y, x), each of the four corners outside it counting zero."""
    height, width = (int(dim) for dim in data.shape[2:])
    top, left = tirx.floor(y), tirx.floor(x)
    total = tirx.const(0, data.dtype)
    for corner_y, weight_y in ((top, 1 - (y - top)), (top + 1, y - top)):
        for corner_x, weight_x in ((left, 1 - (x - left)), (left + 1, x - left)):
            row, column = corner_y.astype("int64"), corner_x.astype("int64")
            inside = tirx.all(row >= 0, row < height, column >= 0, column < width)
            clamped = tirx.min(tirx.max(row, 0), height - 1), tirx.min(tirx.max(column, 0), width - 1)
            pixel = data[(n, c, *clamped)]
            total = total + tirx.Select(inside, pixel, tirx.const(0, data.dtype)) * weight_y * weight_x
    return total
