"""What a vendor library is asked to compute for a kernel: its VendorOp on its parameters, with a constant
per-channel affine epilogue folded into the weights.

A batch norm that the model left after a convolution reaches the kernel as `conv2d` then per-channel
subtract, divide, multiply and add of constants. cuDNN fuses a bias after a convolution but not those, so
such kernels had no vendor plan. The leading run of per-channel constant ops, x * s + t, is folded into a
copy of the weights (scaled by s along the output channels) and one bias t: the library computes conv2d +
bias + the rest of the epilogue on the folded parameters, which are appended after the kernel's own.
Casts between float types inside that run (fp16: the convolution's float32 sum is rounded to float16 before
the batch norm) fold away: the library keeps its float32 intermediate. The result differs from TVM's kernel
by rounding only; selection's numeric check compares them as for any plan.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from tvmsched.graph import Kernel
from tvmsched.tactics.vendor_op import Conv2d, EpilogueOp, VendorOp

FOLDABLE = ("bias", "subtract", "multiply", "divide")
FLOATS = ("float16", "bfloat16", "float32", "float64")


def fold_affine(vendor_op: VendorOp, constants: dict[int, np.ndarray],
                parameters: int) -> tuple[VendorOp, list[np.ndarray]] | None:
    """The VendorOp with its leading per-channel constant ops folded, and the folded weight and bias, which
    become parameters `parameters` and `parameters + 1`; None where nothing folds (no such op beyond a bias,
    weights that are not constant, not a convolution). `constants` holds the constant parameters by
    position."""
    shapes = {position: value.shape for position, value in constants.items()}
    folding = _folding(vendor_op, shapes, parameters)
    if folding is None:
        return None
    op, folded = folding
    anchor = vendor_op.anchor
    axis = anchor.channel_axis
    scale, shift = np.ones(anchor.out_shape[axis]), np.zeros(anchor.out_shape[axis])
    for step in vendor_op.epilogue[:folded]:
        if step.kind == "cast":
            continue
        value = constants[step.operand].astype(np.float64).reshape(-1)
        if step.kind == "bias":
            shift = shift + value
        elif step.kind == "subtract":
            shift = shift - value
        elif step.kind == "multiply":
            scale, shift = scale * value, shift * value
        else:
            scale, shift = scale / value, shift / value
    weight = constants[vendor_op.weight]
    scaled = (weight.astype(np.float64) * scale.reshape(-1, *[1] * (weight.ndim - 1))).astype(weight.dtype)
    shape = [len(shift) if dimension == axis else 1 for dimension in range(len(anchor.out_shape))]
    return op, [scaled, shift.reshape(shape).astype(anchor.accumulate_dtype)]


def _folding(vendor_op: VendorOp, shapes: dict[int, tuple[int, ...]],
             parameters: int) -> tuple[VendorOp, int] | None:
    """`fold_affine`'s VendorOp and how many leading epilogue ops it folds, from the constant parameters'
    `shapes` alone."""
    anchor = vendor_op.anchor
    if not isinstance(anchor, Conv2d) or vendor_op.weight not in shapes:
        return None
    axis = anchor.channel_axis
    folded = 0
    for op in vendor_op.epilogue:
        if op.kind == "cast" and op.dtype in FLOATS:
            folded += 1
            continue
        if op.kind not in FOLDABLE or op.axis != axis or op.operand not in shapes \
                or int(np.prod(shapes[op.operand])) != anchor.out_shape[axis]:
            break
        folded += 1
    if not any(op.kind not in ("bias", "cast") for op in vendor_op.epilogue[:folded]):
        return None
    bias = EpilogueOp("bias", anchor.accumulate_dtype, parameters + 1, axis)
    epilogue = (bias, *vendor_op.epilogue[folded:])
    if epilogue[-1].dtype != vendor_op.out_dtype:
        epilogue += (EpilogueOp("cast", vendor_op.out_dtype),)
    return replace(vendor_op, weight=parameters, epilogue=epilogue), folded


def vendor_call(kernel: Kernel, value: Callable[[str], np.ndarray],
                split: int | None = None) -> tuple[VendorOp, list[np.ndarray]]:
    """The VendorOp a library computes for `kernel` (its head of `split` epilogue ops, where given:
    `tactics.tail`), and the arrays to pass after the kernel's parameters (inputs, then outputs): folded
    by `fold_affine` where the epilogue allows, else the op and none. `value(name)` is a constant tensor's
    value on the host."""
    vendor_op, constants = _head(kernel, split)
    values = {position: value(kernel.inputs[position].name) for position in constants}
    folding = fold_affine(vendor_op, values, len(kernel.inputs) + len(kernel.outputs))
    return folding or (vendor_op, [])


def vendor_op_of(kernel: Kernel, split: int | None = None) -> VendorOp:
    """`vendor_call`'s VendorOp alone, from the constants' shapes: no value is read or folded."""
    folding = _folding_of(kernel, split)
    return folding[0] if folding else _head(kernel, split)[0]


def folds(kernel: Kernel, split: int | None = None) -> bool:
    """Whether `vendor_call` folds weights for the kernel (from the constants' shapes alone)."""
    return _folding_of(kernel, split) is not None


def _folding_of(kernel: Kernel, split: int | None) -> tuple[VendorOp, int] | None:
    vendor_op, constants = _head(kernel, split)
    return _folding(vendor_op, {position: kernel.inputs[position].shape for position in constants},
                    len(kernel.inputs) + len(kernel.outputs))


def _head(kernel: Kernel, split: int | None) -> tuple[VendorOp, list[int]]:
    """The kernel's VendorOp (its head of `split` epilogue ops) and the positions of the constant
    parameters it reads."""
    vendor_op = kernel.vendor_op if split is None else kernel.vendor_op.head(split)
    read = set(vendor_op.parameters) - {vendor_op.data}
    return vendor_op, [position for position, tensor in enumerate(kernel.inputs)
                       if position in read and tensor.kind == "constant"]
