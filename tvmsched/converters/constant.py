"""The Constant op in each of the attribute forms ONNX allows (TVM's converter reads `value` only, and turns a
string into a zero)."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from tvmsched.converters import register_converter
from tvmsched.converters.common import refuse

# The scalar and list attributes and the dtype ONNX gives each.
_TYPED_FORMS = {"value_float": "float32", "value_floats": "float32", "value_int": "int64",
                "value_ints": "int64"}


@register_converter("Constant")
class Constant(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if "value" in attr:
            value = numpy_helper.to_array(attr["value"])
            if value.dtype == object:
                raise refuse("a string tensor value", "tvmsched compiles numeric tensor programs")
            return relax.const(value, str(value.dtype))
        for form, dtype in _TYPED_FORMS.items():
            if form in attr:
                return relax.const(np.array(attr[form], dtype), dtype)
        forms = sorted(name for name in attr if name != "tvm_custom")
        raise refuse(f"a Constant given by {', '.join(forms) or 'no value'}",
                     "tvmsched converts tensor, float and int constants (strings are not numeric tensors)")
