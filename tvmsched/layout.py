"""The data layout convolutions compute in: as the model is (ONNX's NCHW), or channels-last.

NHWC is TVM's `relax.transform.ConvertLayout` with conv2d in NHWC and its weights in OHWI: the ops between
convolutions follow the layout where they can, and layout transforms are inserted where they cannot and at
the model's inputs and outputs, which keep the model's layout. A transpose of the model's becomes one that
keeps every axis in place where its input is already channels-last (a ConvNeXt block's permute to NHWC
after its depthwise convolution); those are dropped, or the convolution's kernel would carry an identity
transpose that no vendor library takes. cuDNN's half-precision tensor-core
convolutions want channels-last; whether a build is faster in it is for measurement to say.
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvmsched.errors import check_choice
from tvmsched.lower import is_op

LAYOUTS = ("nchw", "nhwc")


def in_layout(module: tvm.IRModule, layout: str) -> tvm.IRModule:
    """`module` (an imported model) with its 2-D convolutions computing in `layout`."""
    check_choice("layout", layout, LAYOUTS)
    if layout == "nchw":
        return module
    module = relax.transform.ConvertToDataflow()(module)
    converted = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(module)
    dropped = tvm.IRModule(dict(converted.functions), attrs=converted.attrs)
    dropped["main"] = _DropIdentityTransposes(converted).visit_expr(converted["main"])
    return relax.transform.CanonicalizeBindings()(dropped)


@relax.expr_functor.mutator
class _DropIdentityTransposes(relax.PyExprMutator):
    """Replaces each `permute_dims` that keeps every axis in place by its argument."""

    def visit_call_(self, op: relax.Call):
        call = super().visit_call_(op)
        if not is_op(call, "relax.permute_dims"):
            return call
        axes = call.attrs.axes
        if axes is None or [int(axis) for axis in axes] != list(range(len(axes))):
            return call
        return call.args[0]
