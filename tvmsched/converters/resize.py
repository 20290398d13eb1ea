"""Resize and Upsample as the ONNX spec defines them, for any rank, axes subset, coordinate transformation,
nearest rounding, cubic coefficient, exclude_outside, antialias and keep_aspect_ratio_policy.

TVM's converter turns scales into sizes (so a non-integral scale moves every sample), ignores axes,
antialias and the aspect policy, and needs static-list inputs. Here the resize is separable: the output
size, scale and sampling of each resized axis are fixed when the model is built, so each axis becomes a
gather of the taps each output sample reads, weighted by constants computed in float64 and summed (one
fused kernel per axis; nearest is a plain gather, exact for any dtype)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from tvmsched.converters import register_converter
from tvmsched.converters.common import dtype_of, refuse, required_constant, static_shape, take, text_attribute


@dataclass(frozen=True)
class Sampling:
    """How one Resize samples its input along every axis it resizes."""

    mode: str = "nearest"  # nearest, linear or cubic
    coordinates: str = "half_pixel"  # coordinate_transformation_mode
    nearest: str = "round_prefer_floor"  # nearest_mode
    cubic_a: float = -0.75
    exclude_outside: bool = False
    antialias: bool = False
    extrapolation: float = 0.0


@dataclass(frozen=True)
class AxisTaps:
    """Output sample j of an axis reads input `indices[j]` weighted by `weights[j]`; where `outside[j]` it
    is the extrapolation value instead (tf_crop_and_resize)."""

    indices: np.ndarray  # int64 [out, taps]
    weights: np.ndarray  # float64 [out, taps]
    outside: np.ndarray | None  # bool [out]


def source_coordinates(out_size: int, in_size: int, scale: float, mode: str,
                       roi: tuple[float, float]) -> np.ndarray:
    """The input coordinate each output sample maps to (float64), by coordinate_transformation_mode.
    `scale * in_size` is the fractional output length the spec's formulas use."""
    y = np.arange(out_size, dtype="float64")
    length = scale * in_size
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_size / 2 * (1 - out_size / length)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if length > 1 else np.full(out_size, -0.5)
    if mode == "align_corners":
        return y * (in_size - 1) / (length - 1) if length != 1 else np.zeros(out_size)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if length == 1:
            return np.full(out_size, (start + end) * (in_size - 1) / 2)
        return start * (in_size - 1) + y * (end - start) * (in_size - 1) / (length - 1)
    raise refuse(f"coordinate_transformation_mode '{mode}'", "ONNX does not define it")


def _keys_cubic(distance: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with coefficient a."""
    t = np.abs(distance)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def axis_taps(out_size: int, in_size: int, scale: float, sampling: Sampling,
              roi: tuple[float, float] = (0.0, 1.0)) -> AxisTaps:
    """The taps of one resized axis."""
    x = source_coordinates(out_size, in_size, scale, sampling.coordinates, roi)
    outside = (x < 0) | (x > in_size - 1) if sampling.coordinates == "tf_crop_and_resize" else None
    base = np.floor(x)
    fraction = x - base
    if sampling.mode == "nearest":
        rounding = {"round_prefer_floor": fraction > 0.5, "round_prefer_ceil": fraction >= 0.5,
                    "floor": np.zeros_like(x, bool), "ceil": fraction > 0}.get(sampling.nearest)
        if rounding is None:
            raise refuse(f"nearest_mode '{sampling.nearest}'", "ONNX does not define it")
        indices = (base + rounding)[:, None]
        weights = np.ones_like(indices)
    else:
        support = 1.0 if sampling.mode == "linear" else 2.0
        stretch = min(scale, 1.0) if sampling.antialias else 1.0  # antialias widens the kernel to downscale
        reach = int(np.ceil(support / stretch))
        indices = base[:, None] + np.arange(1 - reach, reach + 1)[None, :]
        distance = (indices - x[:, None]) * stretch
        weights = np.maximum(1 - np.abs(distance), 0) if sampling.mode == "linear" else \
            _keys_cubic(distance, sampling.cubic_a)
        if sampling.antialias:
            weights = weights / weights.sum(axis=1, keepdims=True)
    if sampling.exclude_outside:
        weights = np.where((indices < 0) | (indices >= in_size), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return AxisTaps(np.clip(indices, 0, in_size - 1).astype("int64"), weights, outside)


def resample_axis(bb: relax.BlockBuilder, data: relax.Expr, axis: int, taps: AxisTaps,
                  sampling: Sampling) -> relax.Expr:
    """`data` resampled along `axis` by `taps` (computed in the dtype of `data`)."""
    out_size, count = taps.indices.shape
    shape = static_shape(data)
    dtype = dtype_of(data)
    trailing = [1] * (len(shape) - axis - 1)
    result = None
    for tap in range(count):  # a sum of gathers: an elementwise kernel (a reduction over taps trips dlight)
        term = take(data, taps.indices[:, tap], axis)
        if count > 1:  # nearest: a plain gather, exact for any dtype
            term = relax.op.multiply(term, relax.const(taps.weights[:, tap].reshape(out_size, *trailing)
                                                       .astype(dtype)))
        result = term if result is None else relax.op.add(result, term)
    if taps.outside is not None and taps.outside.any():
        mask = relax.const(taps.outside.reshape(out_size, *trailing))
        result = relax.op.where(mask, relax.const(sampling.extrapolation, dtype), result)
    return bb.normalize(result)


def resize(bb: relax.BlockBuilder, x: relax.Expr, sizes: list[int], scales: list[float], sampling: Sampling,
           roi: list[tuple[float, float]]) -> relax.Expr:
    """`x` resized to `sizes` with per-axis `scales` (the ratios the coordinate transformation uses)."""
    shape = static_shape(x)
    dtype = dtype_of(x)
    floating = dtype in ("float16", "bfloat16", "float32", "float64")
    if sampling.mode != "nearest" and not floating:
        raise refuse(f"{sampling.mode} Resize of {dtype}", "implementations round integer results "
                     "differently; resize a float tensor")
    wide = "float32" if dtype in ("float16", "bfloat16") else dtype
    result = bb.normalize(relax.op.astype(x, wide)) if floating else x
    for axis, (size, scale, window) in enumerate(zip(sizes, scales, roi)):
        if size == shape[axis] and scale == 1 and window == (0.0, 1.0):
            continue
        result = resample_axis(bb, result, axis, axis_taps(size, shape[axis], scale, sampling, window),
                               sampling)
    return relax.op.astype(result, dtype) if floating and wide != dtype else result


def _sampling(attr: dict) -> Sampling:
    return Sampling(mode=text_attribute(attr, "mode", "nearest"),
                    coordinates=text_attribute(attr, "coordinate_transformation_mode", "half_pixel"),
                    nearest=text_attribute(attr, "nearest_mode", "round_prefer_floor"),
                    cubic_a=float(attr.get("cubic_coeff_a", -0.75)),
                    exclude_outside=bool(attr.get("exclude_outside", 0)),
                    antialias=bool(attr.get("antialias", 0)),
                    extrapolation=float(attr.get("extrapolation_value", 0.0)))


def _given(expr: relax.Expr | None, what: str) -> np.ndarray | None:
    """An optional constant input: None where absent or empty."""
    if expr is None:
        return None
    value = required_constant(expr, what)
    return value if value.size else None


@register_converter("Resize")
class Resize(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        """Opset 10 samples as Upsample does: asymmetric coordinates, nearest rounding down."""
        sampling = Sampling(mode=text_attribute(attr, "mode", "nearest"), coordinates="asymmetric",
                            nearest="floor")
        return _by_scales(bb, inputs[0], required_constant(inputs[1], "input 'scales'"), sampling)

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        x = inputs[0]
        shape = static_shape(x)
        rank = len(shape)
        axes = [axis % rank for axis in attr.get("axes", range(rank))]
        sampling = _sampling(attr)
        scales = _given(inputs[2], "input 'scales'")
        sizes = _given(inputs[3], "input 'sizes'")
        if (scales is None) == (sizes is None):
            raise refuse("a Resize without exactly one of scales and sizes", "ONNX requires one of them")
        roi = [(0.0, 1.0)] * rank
        if sampling.coordinates == "tf_crop_and_resize":
            if sizes is None:
                raise refuse("tf_crop_and_resize with scales", "the spec sizes the output by the roi, ONNX's "
                             "reference by the input; give sizes")
            window = required_constant(inputs[1], "input 'roi'").astype("float64").tolist()
            for index, axis in enumerate(axes):
                roi[axis] = (window[index], window[len(axes) + index])
        if scales is not None:
            return _by_scales(bb, x, np.array(_placed(scales.astype("float64").tolist(), axes, [1.0] * rank)),
                              sampling)
        factors = {axis: size / shape[axis] for axis, size in zip(axes, sizes.tolist())}
        out = _placed([int(size) for size in sizes.tolist()], axes, shape)
        policy = text_attribute(attr, "keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            if policy not in ("not_larger", "not_smaller"):
                raise refuse(f"keep_aspect_ratio_policy '{policy}'", "ONNX does not define it")
            common = (min if policy == "not_larger" else max)(factors.values())
            factors = dict.fromkeys(factors, common)
            out = [int(common * size + 0.5) if axis in factors else size for axis, size in enumerate(shape)]
        full = [factors.get(axis, 1.0) for axis in range(rank)]
        return resize(bb, x, out, full, sampling, roi)


def _placed(values: list, axes: list[int], others) -> list:
    """Per-axis values for the whole rank: `values` at `axes`, `others` elsewhere."""
    full = list(others)
    for axis, value in zip(axes, values):
        full[axis] = value
    return full


def _by_scales(bb: relax.BlockBuilder, x: relax.Expr, scales: np.ndarray, sampling: Sampling) -> relax.Expr:
    """Resize by a scale per axis: the output size is floor(input * scale)."""
    shape = static_shape(x)
    if len(scales) != len(shape) or (scales <= 0).any():
        raise refuse(f"scales {scales.tolist()} for a rank-{len(shape)} input", "ONNX needs one positive "
                     "scale per axis")
    sizes = [int(np.floor(size * scale)) for size, scale in zip(shape, scales.tolist())]
    if sampling.coordinates == "align_corners" and any(
            size != size_in * scale for size, size_in, scale in zip(sizes, shape, scales.tolist())):
        raise refuse("align_corners with a scale whose output length is fractional", "onnxruntime aligns to "
                     "the whole output length, ONNX's reference to the fractional one; give sizes")
    return resize(bb, x, sizes, scales.tolist(), sampling, [(0.0, 1.0)] * len(shape))


@register_converter("Upsample")
class Upsample(OnnxOpConverter):
    """Upsample (deprecated since opset 10) is Resize with asymmetric coordinates and nearest rounding
    down, its scales an attribute (opset 7) or a constant input (opset 9)."""

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        return _by_scales(bb, inputs[0], np.array(attr["scales"], "float64"), cls._sampling(attr))

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        return _by_scales(bb, inputs[0], required_constant(inputs[1], "input 'scales'").astype("float64"),
                          cls._sampling(attr))

    @classmethod
    def _sampling(cls, attr: dict) -> Sampling:
        mode = text_attribute(attr, "mode", "nearest")
        return Sampling(mode="linear" if mode == "bilinear" else mode, coordinates="asymmetric",
                        nearest="floor")
