"""Ops along one axis: CumSum and CumProd (TVM's cumsum is left unlowered and it has no cumprod),
ReverseSequence and CenterCropPad (TVM has neither)."""

from __future__ import annotations

from tvm import relax, te, tirx
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from tvmsched.converters import register_converter
from tvmsched.converters.common import required_constant, static_shape


class _Cumulative(OnnxOpConverter):
    """A running reduction along a constant axis, as a reduction over the positions up to each one (inclusive
    or exclusive, forward or reverse): parallel, so every target schedules it, at n * n work per row."""

    identity = 0
    reducer = staticmethod(te.sum)

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        x = inputs[0]
        rank = len(static_shape(x))
        axis = int(required_constant(inputs[1], "input 'axis'").reshape(-1)[0]) % rank
        exclusive, reverse = bool(attr.get("exclusive", 0)), bool(attr.get("reverse", 0))

        def compute(data):
            other = te.reduce_axis((0, data.shape[axis]), name="k")

            def running(*index):
                position = index[axis]
                included = {(False, False): other <= position, (True, False): other < position,
                            (False, True): other >= position, (True, True): other > position}[
                    exclusive, reverse]
                source = data[(*index[:axis], other, *index[axis + 1:])]
                value = tirx.Select(included, source, tirx.const(cls.identity, data.dtype))
                return cls.reducer(value, axis=other)
            return te.compute(data.shape, running, name=cls.__name__.lower())
        return bb.emit_te(compute, x)


@register_converter("CumSum")
class CumSum(_Cumulative):
    pass


@register_converter("CumProd")
class CumProd(_Cumulative):
    identity = 1
    reducer = staticmethod(te.comm_reducer(lambda left, right: left * right,
                                           lambda dtype: tirx.const(1, dtype), name="product"))


@register_converter("ReverseSequence")
class ReverseSequence(OnnxOpConverter):
    """Each batch entry's first sequence_lens steps reversed, the rest kept (the lengths may be computed at
    run time)."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        time_axis, batch_axis = int(attr.get("time_axis", 0)), int(attr.get("batch_axis", 1))

        def compute(data, lengths):
            def reversed_within(*index):
                step, length = index[time_axis], lengths[index[batch_axis]].astype("int64")
                source = tirx.Select(step < length, length - 1 - step, step.astype("int64"))
                return data[(*index[:time_axis], source, *index[time_axis + 1:])]
            return te.compute(data.shape, reversed_within, name="reverse_sequence")
        return bb.emit_te(compute, inputs[0], inputs[1])


@register_converter("CenterCropPad")
class CenterCropPad(OnnxOpConverter):
    """Crop a centered window (its start rounded down) or pad with zeros (the odd pixel at the end)."""

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        x = inputs[0]
        shape = static_shape(x)
        rank = len(shape)
        target = required_constant(inputs[1], "input 'shape'").tolist()
        axes = [axis % rank for axis in attr.get("axes", range(rank))]
        sizes = dict(zip(axes, (int(size) for size in target)))
        begin = [max(shape[axis] - sizes.get(axis, shape[axis]), 0) // 2 for axis in range(rank)]
        end = [start + min(shape[axis], sizes.get(axis, shape[axis])) for axis, start in enumerate(begin)]
        result = relax.op.strided_slice(x, list(range(rank)), begin, end)
        pads = [max(sizes.get(axis, shape[axis]) - shape[axis], 0) for axis in range(rank)]
        if any(pads):
            result = relax.op.nn.pad(result, [width for pad in pads for width in (pad // 2, pad - pad // 2)])
        return result
