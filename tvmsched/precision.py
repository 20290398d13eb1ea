"""The precision a model is compiled in: fp32 as the model is, or fp16 storage with float32 accumulation.

fp16 is TVM's automatic mixed precision (`relax.transform.ToMixedPrecision`): convolutions and matrix
products take float16 operands and accumulate in float32, element-wise ops follow their inputs in float16,
and ops that need the range (softmax, normalizations, reductions) stay in float32; weights become float16
constants. The model's inputs and outputs keep their dtypes, so a compiled model is called as in fp32.
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvmsched.errors import UnsupportedOperator, UsageError

PRECISIONS = ("fp32", "fp16")


def check_precision(precision: str) -> None:
    """Refuse an unknown precision."""
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision '{precision}'; choose one of {', '.join(PRECISIONS)}")


def in_precision(module: tvm.IRModule, precision: str) -> tvm.IRModule:
    """`module` (an imported model) computing in `precision`."""
    check_precision(precision)
    if precision == "fp32":
        return module
    try:
        return relax.transform.ToMixedPrecision(out_dtype="float32")(
            relax.transform.ConvertToDataflow()(module))
    except Exception as error:  # noqa: BLE001  (TVM's passes raise many types)
        raise UnsupportedOperator(f"TVM's mixed-precision pass does not take this model "
                                  f"({str(error).strip().splitlines()[-1][:160]}); build it with "
                                  f"--precision fp32") from None
