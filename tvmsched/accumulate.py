"""Half-precision matrix products and convolutions accumulate in float32.

Relax computes `matmul` and `conv*` of float16/bfloat16 inputs in the inputs' dtype unless told otherwise, so
every partial sum is rounded to 10 (or 7) mantissa bits; ONNX's reference, onnxruntime, cuBLAS and cuDNN sum
in float32 and round once. This pass gives each such call `out_dtype="float32"` and casts the result back:
the same kernel after fusion (the cast fuses into it), one rounding instead of one per term.
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvmsched.lower import with_main_mutated

HALF = ("float16", "bfloat16")
ACCUMULATING = {"relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d",
                "relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose"}


def accumulate_in_float32(module: tvm.IRModule) -> tvm.IRModule:
    """`module` with every half-precision matmul and convolution of `main` summing in float32."""
    return with_main_mutated(module, _Accumulate(module))


@relax.expr_functor.mutator
class _Accumulate(relax.PyExprMutator):
    def visit_call_(self, op: relax.Call):
        call = self.builder_.normalize(super().visit_call_(op))
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name in ACCUMULATING):
            return call
        dtype = str(call.ty.dtype)
        if dtype not in HALF or str(call.args[0].ty.dtype) != dtype:
            return call  # already of a wider out_dtype, or a float32 product
        fields = {field.name: getattr(call.attrs, field.name)
                  for field in type(call.attrs).__tvm_ffi_type_info__.fields}
        fields["out_dtype"] = "float32"
        attrs = tvm.ir.make_node(type(call.attrs).__tvm_ffi_type_info__.type_key, **fields)
        wide = self.builder_.normalize(relax.Call(call.op, call.args, attrs))
        return relax.op.astype(wide, dtype)
