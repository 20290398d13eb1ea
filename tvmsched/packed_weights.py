"""CPU builds: convolution weights stored with the output channel last (`weights_packed`), as the CPU
`gemm` rule reads them.

The `gemm` rule computes a vector of output channels at a time, so it wants a vector of one weight's
channels contiguous. With OIHW (or NHWC's OHWI) weights it packed them inside the kernel, on every call:
resnet50's 102 MB of weights read, rewritten and read again per inference (its kernels alone summed 27.6 ms,
an inference 35.5 ms; `experiments/results/profile_cpu_2026-11-26_resnet50.json`). Stored IHWO (HWIO) at
build time, the kernel reads them as they are. onnxruntime likewise packs its weights once, when a
session is created.
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvmsched.lower import is_op, with_main_mutated


def weights_packed(module: tvm.IRModule) -> tvm.IRModule:
    """`module` with each ungrouped 2-D convolution by constant weights (or constants the layout and
    precision rewrites transposed or cast) taking them with the output channel moved last (OIHW → IHWO,
    OHWI → HWIO)."""
    return with_main_mutated(module, _ChannelLast(module))


@relax.expr_functor.mutator
class _ChannelLast(relax.PyExprMutator):
    def visit_call_(self, op: relax.Call):
        call = super().visit_call_(op)
        if not (is_op(call, "relax.nn.conv2d") and int(call.attrs.groups) == 1
                and call.attrs.kernel_layout.index("O") != 3):
            return call
        weights = self._constant(call.args[1])
        if weights is None:
            return call
        layout = str(call.attrs.kernel_layout)
        moved = layout.replace("O", "") + "O"
        attrs = call.attrs
        stored = relax.const(weights.transpose([layout.index(axis) for axis in moved]).copy())
        return relax.op.nn.conv2d(call.args[0], stored, strides=attrs.strides, padding=attrs.padding,
                                  dilation=attrs.dilation, groups=1, data_layout=attrs.data_layout,
                                  kernel_layout=moved, out_layout=attrs.out_layout, out_dtype=attrs.out_dtype)

    def _constant(self, expr):
        """The value of `expr` where it is a constant, or a constant transposed or cast (as the layout and
        precision rewrites leave weights); else None."""
        if isinstance(expr, tvm.ir.Constant):
            return expr.value.numpy()
        bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        if is_op(bound, "relax.permute_dims"):  # axes None: reversed, as numpy's transpose()
            value, axes = self._constant(bound.args[0]), bound.attrs.axes
            if value is None:
                return None
            return value.transpose(None if axes is None else [int(axis) for axis in axes])
        if is_op(bound, "relax.astype"):
            value = self._constant(bound.args[0])
            return None if value is None else value.astype(str(bound.attrs.dtype))
        return None
