"""A stand-in vendor library for the CPU tests: it computes a VendorOp with numpy (float64, rounded to each
op's dtype), so tests can check that a recognized kernel's VendorOp states what TVM's kernel computes, and
run tactic selection and the executors' vendor launches without a GPU.

Its plans are named in `StandIn.plans`: "exact" computes the op, "off" adds 1e-3 to every element (a plan
whose numbers differ, like a TF32 engine where fp32 was asked), "fails" raises when launched; each needs
`WORKSPACE` bytes. Every launch is recorded in `StandIn.launched` as (plan, stream, workspace bytes, the
VendorOp's name).
"""

from __future__ import annotations

import math

import numpy as np

from tvmsched.tactics.library import Candidate, VendorLibrary
from tvmsched.tactics.vendor_op import Conv2d, VendorOp

WORKSPACE = 256


def conv2d(x: np.ndarray, w: np.ndarray, anchor: Conv2d) -> np.ndarray:
    """The anchor's convolution in float64 (NCHW/OIHW or NHWC/OHWI, grouped, strided, padded, dilated)."""
    if anchor.layout == "NHWC":
        x, w = x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2)
    top, left, bottom, right = anchor.padding
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    w = w.astype(np.float64)
    (rows, columns), (row_step, column_step) = anchor.strides, anchor.dilation
    out_channels, group_channels, kernel_rows, kernel_columns = w.shape
    batch, groups = x.shape[0], anchor.groups
    height = (x.shape[2] - row_step * (kernel_rows - 1) - 1) // rows + 1
    width = (x.shape[3] - column_step * (kernel_columns - 1) - 1) // columns + 1
    out = np.zeros((batch, groups, out_channels // groups, height, width))
    for i in range(kernel_rows):
        for j in range(kernel_columns):
            patch = x[:, :, i * row_step:i * row_step + rows * (height - 1) + 1:rows,
                      j * column_step:j * column_step + columns * (width - 1) + 1:columns]
            patch = patch.reshape(batch, groups, group_channels, height, width)
            taps = w[:, :, i, j].reshape(groups, out_channels // groups, group_channels)
            out += np.einsum("ngchw,goc->ngohw", patch, taps)
    out = out.reshape(batch, out_channels, height, width)
    return out.transpose(0, 2, 3, 1) if anchor.layout == "NHWC" else out


def compute(vendor_op: VendorOp, arguments: list[np.ndarray]) -> np.ndarray:
    """What `vendor_op` writes to its output, given the kernel's parameters as arrays."""
    anchor = vendor_op.anchor
    data, weight = arguments[vendor_op.data], arguments[vendor_op.weight]
    value = (conv2d(data, weight, anchor) if isinstance(anchor, Conv2d)
             else np.matmul(data.astype(np.float64), weight.astype(np.float64)))
    value = value.astype(anchor.accumulate_dtype)
    for op in vendor_op.epilogue:
        other = None if op.operand is None else arguments[op.operand].astype(np.float64)
        x = value.astype(np.float64)
        if op.kind in ("bias", "residual"):
            x = x + other
        elif op.kind == "subtract":
            x = x - other
        elif op.kind == "multiply":
            x = x * other
        elif op.kind == "divide":
            x = x / other
        elif op.kind == "relu":
            x = np.maximum(x, 0)
        elif op.kind == "clip":
            x = np.clip(x, *op.bounds)
        elif op.kind == "sigmoid":
            x = 1 / (1 + np.exp(-x))
        elif op.kind == "silu":
            x = x / (1 + np.exp(-x))
        elif op.kind == "gelu":
            x = x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))) / 2
        elif op.kind != "cast":
            raise ValueError(f"no numpy for epilogue op '{op.kind}'")
        value = x.astype(op.dtype)
    return value


class StandIn(VendorLibrary):
    """The numpy library; register it with `LIBRARIES["standin"] = StandIn` (monkeypatched in tests)."""

    name = "standin"
    plans = ("exact",)
    launched: list[tuple[str, object, int, str]] = []
    opened = 0  # instances made

    def __init__(self):
        StandIn.opened += 1

    @staticmethod
    def version() -> str:
        return "1.0"

    def candidates(self, vendor_op: VendorOp, limit: int) -> list[Candidate]:
        return [Candidate(plan, WORKSPACE) for plan in self.plans][:limit]

    def launcher(self, vendor_op: VendorOp, plan: str, arguments: list, workspace, owner):
        def launch(stream) -> None:
            StandIn.launched.append((plan, stream, 0 if workspace is None else workspace.numpy().nbytes,
                                     vendor_op.name))
            if plan == "fails":
                raise RuntimeError("the stand-in plan 'fails' failed")
            value = compute(vendor_op, [None if argument is None else argument.numpy()  # None: not read
                                        for argument in arguments])
            arguments[vendor_op.output].copyfrom(value + (1e-3 if plan == "off" else 0))
        return launch
