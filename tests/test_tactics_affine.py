"""Folding a constant per-channel affine epilogue (a batch norm left after a convolution) into the weights
and one bias for the vendor libraries: the folded op computes what the kernel computes (NCHW and NHWC),
only the leading run of per-channel constant ops folds, and nothing folds where it cannot."""

from dataclasses import replace

import numpy as np
import pytest
from vendor_standin import compute

from tvmsched.tactics.affine import fold_affine
from tvmsched.tactics.vendor_op import Conv2d, EpilogueOp, Matmul, VendorOp

RNG = np.random.default_rng(0)
BATCH_NORM = ("subtract", "divide", "multiply", "bias")


def conv_op(layout: str, epilogue: tuple[EpilogueOp, ...]) -> VendorOp:
    """A 3x3 convolution of 4 into 6 channels on parameters 0 (data) and 1 (weight), `epilogue` on the
    parameters after them, written to the parameter after those."""
    nchw = layout == "NCHW"
    anchor = Conv2d(layout, (2, 4, 7, 7) if nchw else (2, 7, 7, 4), (6, 4, 3, 3) if nchw else (6, 3, 3, 4),
                    (2, 6, 7, 7) if nchw else (2, 7, 7, 6), (1, 1), (1, 1, 1, 1), (1, 1), 1, "float32",
                    "float32")
    return VendorOp(anchor, 0, 1, epilogue, 2 + sum(op.operand is not None for op in epilogue))


def channel_ops(kinds, layout: str = "NCHW", start: int = 2) -> tuple[EpilogueOp, ...]:
    axis = 1 if layout == "NCHW" else 3
    return tuple(EpilogueOp(kind, "float32", start + index, axis) for index, kind in enumerate(kinds))


def arguments(vendor_op: VendorOp) -> list[np.ndarray]:
    """Random parameters for `vendor_op`: data, weight, per-channel operands (positive, for a divide),
    other operands of the output's shape, and the output."""
    anchor = vendor_op.anchor
    shape = [6 if dimension == (1 if anchor.layout == "NCHW" else 3) else 1 for dimension in range(4)]
    values = [RNG.standard_normal(anchor.data_shape), RNG.standard_normal(anchor.weight_shape)]
    for op in vendor_op.epilogue:
        if op.operand is not None:
            values.append(RNG.uniform(0.5, 2.0, shape) if op.axis is not None
                          else RNG.standard_normal(anchor.out_shape))
    return [value.astype("float32") for value in values] + [np.zeros(anchor.out_shape, "float32")]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("after", [(), ("relu",), ("clip",)])
def test_a_batch_norm_folds_into_the_weights_and_one_bias(layout, after):
    extra = tuple(EpilogueOp(kind, "float32", bounds=(0.0, 6.0) if kind == "clip" else None)
                  for kind in after)
    vendor_op = conv_op(layout, channel_ops(BATCH_NORM, layout) + extra)
    values = arguments(vendor_op)
    constants = dict(enumerate(values[1:-1], start=1))
    folded, arrays = fold_affine(vendor_op, constants, len(values))
    assert folded.name == "+".join(["conv2d", "bias", *after])
    assert folded.weight == len(values) and folded.epilogue[0].operand == len(values) + 1
    assert [array.dtype for array in arrays] == ["float32", "float32"]
    np.testing.assert_allclose(compute(folded, values + arrays), compute(vendor_op, values), rtol=2e-5,
                               atol=2e-5)


def test_only_the_leading_per_channel_constant_ops_fold():
    epilogue = channel_ops(("multiply", "bias")) + (EpilogueOp("relu", "float32"),) + \
        channel_ops(("multiply",), start=4)
    vendor_op = conv_op("NCHW", epilogue)
    values = arguments(vendor_op)
    folded, arrays = fold_affine(vendor_op, dict(enumerate(values[1:-1], start=1)), len(values))
    assert [op.kind for op in folded.epilogue] == ["bias", "relu", "multiply"]
    np.testing.assert_allclose(compute(folded, values + arrays), compute(vendor_op, values), rtol=2e-5,
                               atol=2e-5)


def test_nothing_folds_where_it_cannot():
    batch_norm = conv_op("NCHW", channel_ops(BATCH_NORM))
    values = arguments(batch_norm)
    constants = dict(enumerate(values[1:-1], start=1))
    assert fold_affine(conv_op("NCHW", channel_ops(("bias",))), constants, 5) is None  # cuDNN fuses a bias
    for position in (1, 2):  # the weight, or the first op's operand, is not a constant
        without = {key: value for key, value in constants.items() if key != position}
        assert fold_affine(batch_norm, without, 7) is None
    relu_first = conv_op("NCHW", (EpilogueOp("relu", "float32"),) + channel_ops(("multiply",)))
    assert fold_affine(relu_first, constants, 5) is None
    full = conv_op("NCHW", (EpilogueOp("multiply", "float32", 2, None),))  # not per channel
    assert fold_affine(full, {1: values[1], 2: np.ones((2, 6, 7, 7), "float32")}, 5) is None
    matmul = VendorOp(Matmul((4, 8), (8, 6), (4, 6), "float32", "float32"), 0, 1,
                      (EpilogueOp("multiply", "float32", 2, 1),), 3)
    assert fold_affine(matmul, {1: np.ones((8, 6), "float32"), 2: np.ones(6, "float32")}, 4) is None


def test_fp16_casts_inside_the_batch_norm_fold_away():
    """fp16: the float32 sum is rounded to float16 before the batch norm; folded, the library keeps float32
    until the output, which keeps its float16 dtype."""
    nchw = conv_op("NCHW", ())
    anchor = replace(nchw.anchor, dtype="float16")
    epilogue = (EpilogueOp("cast", "float16"),) + tuple(
        EpilogueOp(kind, "float16", 2 + index, 1) for index, kind in enumerate(BATCH_NORM))
    for after in ((), (EpilogueOp("relu", "float16"),)):
        vendor_op = VendorOp(anchor, 0, 1, epilogue + after, 6)
        values = [value.astype("float16") for value in arguments(replace(vendor_op, anchor=nchw.anchor))]
        folded, arrays = fold_affine(vendor_op, dict(enumerate(values[1:-1], start=1)), len(values))
        assert folded.name == ("conv2d+bias+relu" if after else "conv2d+bias+cast")
        assert folded.out_dtype == "float16" and arrays[1].dtype == np.float32
        expected = compute(vendor_op, values).astype(np.float64)
        actual = compute(folded, values + arrays)
        assert actual.dtype == np.float16
        assert np.abs(actual - expected).max() <= 5e-3 * np.abs(expected).max()
