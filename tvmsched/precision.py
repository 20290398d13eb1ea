"""The precision a model is compiled in: fp32 as the model is, or fp16 storage with float32 accumulation.

fp16 is TVM's automatic mixed precision (`relax.transform.ToMixedPrecision`): convolutions and matrix
products take float16 operands and accumulate in float32, element-wise ops follow their inputs in float16,
and ops that need the range (normalizations, reductions) stay in float32; weights become float16
constants. The model's inputs and outputs keep their dtypes, so a compiled model is called as in fp32.

Batch norms are decomposed and constant-folded first: the pass then sees a batch norm as per-channel
arithmetic with constants, which follows the convolution in float16 and fuses with it and the activation
after it (as the op, it stays float32 between a cast from and a cast to float16, in kernels of its own).

Ops that only select or move elements (`take`, gathers, `flip`, `repeat`, `tile`, `tril`/`triu`, `where`,
`max`/`min`) give the same values in any float type, but TVM registers no mixed-precision policy for them,
and its pass computes an op without one in float32 between casts: ViT's attention casts its whole query-
key-value tensor to float32 before each of its three `take`s, 1.3 of 5.2 ms at batch 16 on the H100.
Softmax and log-softmax have none either: on float16 they are legalized to compute in float32 inside and
round once (`lower`), the values the float32 op gives on the rounded input, so they can take float16
without a float32 copy before them (which fused into the matmul before it, where no vendor library takes
it). For the pass all these follow their inputs' type, as reshapes and slices do (set, then reset).

TVM's pass cannot type a `call_tir` (its callee is an argument): each op a converter emitted as TE is
wrapped in a private Relax function for the pass, which computes it in float32 like an op it does not
know, and inlined back afterwards.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import tvm
from tvm import relax

from tvmsched.errors import UnsupportedOperator, check_choice
from tvmsched.lower import fold_constants, is_call_tir, with_main_mutated

PRECISIONS = ("fp32", "fp16")
POLICY = "TMixedPrecisionPolicy"
FOLLOW = 1  # TVM's MixedPrecisionPolicyKind.kFollow: an op computes in its inputs' type
_POLICIES = threading.Lock()
FOLLOWING = ("relax.nn.softmax", "relax.nn.log_softmax", "relax.take", "relax.gather_elements",
             "relax.gather_nd", "relax.flip", "relax.repeat", "relax.tile", "relax.tril", "relax.triu",
             "relax.where", "relax.max", "relax.min")


def in_precision(module: tvm.IRModule, precision: str) -> tvm.IRModule:
    """`module` (an imported model) computing in `precision`."""
    check_choice("precision", precision, PRECISIONS)
    if precision == "fp32":
        return module
    decomposed = fold_constants(relax.transform.DecomposeOpsForInference()(module))
    wrapped = relax.transform.ConvertToDataflow()(_te_calls_wrapped(decomposed))
    try:
        with _policies_follow():
            mixed = relax.transform.ToMixedPrecision(out_dtype="float32")(wrapped)
    except Exception as error:  # noqa: BLE001  (TVM's passes raise many types)
        raise UnsupportedOperator(f"TVM's mixed-precision pass does not take this model "
                                  f"({str(error).strip().splitlines()[-1][:160]}); build it with "
                                  f"--precision fp32") from None
    return relax.transform.ConvertToDataflow()(relax.transform.InlinePrivateFunctions()(mixed))


@contextmanager
def _policies_follow():
    """Within: the ops of FOLLOWING that have no policy in TVM follow their inputs' type. The policies are
    TVM's, for the whole process: one pass at a time sets and resets them."""
    with _POLICIES:
        set_here = []
        try:
            for op in map(tvm.ir.Op.get, FOLLOWING):
                if op.get_attr(POLICY) is None:
                    op.set_attr(POLICY, FOLLOW)
                    set_here.append(op)
            yield
        finally:
            for op in set_here:
                op.reset_attr(POLICY)


def _te_calls_wrapped(module: tvm.IRModule) -> tvm.IRModule:
    """`module` with every `call_tir` of `main` moved into a private Relax function of its own."""
    return with_main_mutated(module, _WrapTeCalls(module))


@relax.expr_functor.mutator
class _WrapTeCalls(relax.PyExprMutator):
    def visit_call_(self, op: relax.Call):
        call = super().visit_call_(op)
        if not is_call_tir(call):
            return call
        arguments = call.args[1]
        tensors = list(arguments.fields) if isinstance(arguments, relax.Tuple) else [arguments]
        parameters = [relax.Var(f"x{index}", tensor.ty) for index, tensor in enumerate(tensors)]
        body = relax.Call(call.op, [call.args[0], relax.Tuple(parameters), *call.args[2:]], call.attrs,
                          call.ty_args)
        function = relax.Function(parameters, body, ret_ty=call.ty, is_pure=True)
        return relax.Call(self.builder_.add_func(function, f"te_{call.args[0].name_hint}"), tensors)
