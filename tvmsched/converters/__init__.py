"""tvmsched's own ONNX operator converters, used instead of TVM's Relax importer where that one is wrong or
missing. A converter is a TVM `OnnxOpConverter` subclass (`_impl_vN` per opset, as TVM's own are)
registered under the op it converts; one module per family of ops."""

from __future__ import annotations

from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

CONVERTERS: dict[str, type[OnnxOpConverter]] = {}


def register_converter(op_type: str):
    """Class decorator: convert ONNX `op_type` (default domain) with this class rather than TVM's."""
    def register(cls: type[OnnxOpConverter]) -> type[OnnxOpConverter]:
        CONVERTERS[op_type] = cls
        return cls
    return register


# The converter modules register themselves on import (kept sorted to ease merging).
from tvmsched.converters import (  # noqa: E402, F401
    attention,
    axis,
    constant,
    elementwise,
    linear_attention,
    loss,
    nn,
    normalization,
    quantize,
    recurrent,
    reduce,
    refused,
    resize,
    shape,
    sort,
)
