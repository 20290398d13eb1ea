"""The data layout convolutions compute in: as the model is (ONNX's NCHW), or channels-last.

NHWC is TVM's `relax.transform.ConvertLayout` with conv2d in NHWC and its weights in OHWI: the ops between
convolutions follow the layout where they can, and layout transforms are inserted where they cannot and at
the model's inputs and outputs, which keep the model's layout. cuDNN's half-precision tensor-core
convolutions want channels-last; whether a build is faster in it is for measurement to say.
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvmsched.errors import check_choice

LAYOUTS = ("nchw", "nhwc")


def in_layout(module: tvm.IRModule, layout: str) -> tvm.IRModule:
    """`module` (an imported model) with its 2-D convolutions computing in `layout`."""
    check_choice("layout", layout, LAYOUTS)
    if layout == "nchw":
        return module
    module = relax.transform.ConvertToDataflow()(module)
    return relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(module)
