"""The data layout convolutions compute in: as the model is (ONNX's NCHW), or channels-last.

NHWC is TVM's `relax.transform.ConvertLayout` with conv2d in NHWC and its weights in OHWI: the ops between
convolutions follow the layout where they can, and layout transforms are inserted where they cannot and at
the model's inputs and outputs, which keep the model's layout. A transpose of the model's becomes one that
keeps every axis in place where its input is already channels-last (a ConvNeXt block's permute to NHWC
after its depthwise convolution); those are dropped, or the convolution's kernel would carry an identity
transpose that no vendor library takes, and the others move towards their consumers where that
transposes less (`_transposes_sunk`). cuDNN's half-precision tensor-core convolutions want channels-last;
whether a build is faster in it is for measurement to say.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from tvmsched.errors import check_choice
from tvmsched.lower import constant_vars, is_op, with_main_mutated

LAYOUTS = ("nchw", "nhwc")
CHOICES = ("auto", *LAYOUTS)


def chosen(layout: str, precision: str, target_kind: str) -> str:
    """The layout a build computes in: `layout`, where "auto" is nhwc in fp16 on a GPU (cuDNN declines most
    fused half-precision NCHW graphs and takes NHWC ones: regnet_y_400mf fp16 at batch 16 on the H100 ran
    1.462 ms in NCHW, 0.891 in NHWC; every fp16 row measured since is NHWC) and the model's nchw elsewhere."""
    check_choice("layout", layout, CHOICES)
    if layout != "auto":
        return layout
    return "nhwc" if precision == "fp16" and target_kind == "cuda" else "nchw"


def in_layout(module: tvm.IRModule, layout: str) -> tvm.IRModule:
    """`module` (an imported model) with its 2-D convolutions computing in `layout`."""
    check_choice("layout", layout, LAYOUTS)
    if layout == "nchw":
        return module
    module = relax.transform.ConvertToDataflow()(module)
    converted = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(module)
    return _transposes_sunk(converted)


ELEMENT_WISE = frozenset(f"relax.{name}" for name in (
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "floor_divide", "astype", "exp",
    "log", "sqrt", "rsqrt", "sigmoid", "tanh", "erf", "negative", "abs", "clip", "square", "nn.relu",
    "nn.gelu", "nn.gelu_tanh", "nn.silu", "nn.leakyrelu"))


def _transposes_sunk(module: tvm.IRModule) -> tvm.IRModule:
    """`module` with its transposes moved past element-wise ops and composed (`_SinkTransposes`), where
    that leaves fewer elements transposed; else with its transposes that keep every axis in place dropped.

    ConvertLayout keeps each tensor the model transposes itself in the model's layout. A ConvNeXt block
    transposes to channels-last after its depthwise convolution and back before its layer scale and
    residual add; in NHWC that left a transpose back to NCHW and, for the next block's convolution, one to
    NHWC again: five of convnext_tiny's seven kinds of transpose kernels, 0.45 of its 2.2 ms kernel time
    at batch 16 in float16 on the H100. With the transpose moved past the multiply and the add, the two
    compose into one that keeps every axis in place, and is dropped (an identity transpose left in would
    also keep a convolution's kernel from a vendor library). The choice is made once for the whole model:
    a saving in one place also keeps any growth in another."""
    sunk = _rewritten(module, _SinkTransposes)
    identities = _rewritten(module, _DropIdentityTransposes)
    return sunk if _transposed(sunk) < _transposed(identities) else identities


def _rewritten(module: tvm.IRModule, mutator) -> tvm.IRModule:
    tidy = tvm.transform.Sequential([relax.transform.CanonicalizeBindings(),
                                     relax.transform.EliminateCommonSubexpr(),
                                     relax.transform.DeadCodeElimination()])
    return tidy(with_main_mutated(module, mutator(module)))


def _transposed(module: tvm.IRModule) -> int:
    """How many elements `module`'s main transposes, constants' transposes (folded later) aside."""
    constant = constant_vars(module["main"])
    return sum(math.prod(int(dim) for dim in binding.value.ty.shape.values)
               for block in module["main"].body.blocks for binding in block.bindings
               if is_op(binding.value, "relax.permute_dims") and binding.var not in constant)


@relax.expr_functor.mutator
class _DropIdentityTransposes(relax.PyExprMutator):
    """Replaces each `permute_dims` that keeps every axis in place by its argument."""

    def visit_call_(self, op: relax.Call):
        call = self.builder_.normalize(super().visit_call_(op))
        identity = is_op(call, "relax.permute_dims") and _axes(call) == sorted(_axes(call))
        return call.args[0] if identity else call


@relax.expr_functor.mutator
class _SinkTransposes(relax.PyExprMutator):
    """Moves transposes towards the consumers: a transpose of a transpose becomes one transpose (none where
    it keeps every axis in place), and an element-wise op whose tensor operands are all transposed alike,
    but for constants and tensors the model also transposes back, runs on the untransposed tensors and its
    result is transposed. What no consumer reads any more is left for DeadCodeElimination, transposes
    computed twice for EliminateCommonSubexpr."""

    def __init__(self, module: tvm.IRModule):
        super().__init__(module)
        self.transposes = {(binding.value.args[0].__chandle__(), tuple(_axes(binding.value)))
                           for block in module["main"].body.blocks for binding in block.bindings
                           if is_op(binding.value, "relax.permute_dims")}
        self.constants = constant_vars(module["main"])

    def visit_call_(self, op: relax.Call):
        call = self.builder_.normalize(super().visit_call_(op))
        if is_op(call, "relax.permute_dims"):
            tensor, first = self._transposed(call.args[0]) or (call.args[0], list(range(len(_axes(call)))))
            axes = [first[axis] for axis in _axes(call)]
            return tensor if axes == sorted(axes) else relax.op.permute_dims(tensor, axes)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name in ELEMENT_WISE):
            return call
        tensors = [arg for arg in call.args if isinstance(arg.ty, relax.TensorType)]
        sources = [self._transposed(arg) for arg in tensors]
        axes = {tuple(source[1]) for source in sources if source}
        rank = len(call.ty.shape.values) if isinstance(call.ty, relax.TensorType) and isinstance(
            call.ty.shape, relax.ShapeExpr) else -1
        if len(axes) != 1 or len(next(iter(axes))) != rank:
            return call
        [axes] = axes
        back = [axes.index(axis) for axis in range(rank)]
        if not all(source and len(source[1]) == rank or self._constant(arg)
                   or (arg.__chandle__(), tuple(back)) in self.transposes
                   for arg, source in zip(tensors, sources)):
            return call
        replaced = {arg.__chandle__(): source[0] if source else self._moved_back(arg, back, rank)
                    for arg, source in zip(tensors, sources)}
        args = [replaced.get(arg.__chandle__(), arg) for arg in call.args]
        untransposed = self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args))
        return relax.op.permute_dims(untransposed, list(axes))

    def _transposed(self, expr) -> tuple[relax.Expr, list[int]] | None:
        """(tensor, axes) where `expr` is a variable bound to `permute_dims(tensor, axes)`."""
        bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return (bound.args[0], _axes(bound)) if is_op(bound, "relax.permute_dims") else None

    def _constant(self, expr) -> bool:
        return isinstance(expr, tvm.ir.Constant) or expr in self.constants

    def _moved_back(self, tensor: relax.Expr, axes: list[int], rank: int) -> relax.Expr:
        """`tensor` as broadcast against a tensor of `rank` axes, transposed by `axes`."""
        shape = [int(dim) for dim in tensor.ty.shape.values]
        if not shape:
            return tensor
        full = tensor if len(shape) == rank else relax.op.reshape(tensor, [1] * (rank - len(shape)) + shape)
        return self.builder_.emit(relax.op.permute_dims(full, axes))


def _axes(call: relax.Call) -> list[int]:
    """The axes of a `permute_dims` call (None, reversing every axis, spelled out)."""
    axes = call.attrs.axes
    rank = len(call.args[0].ty.shape.values)
    return list(range(rank))[::-1] if axes is None else [int(axis) for axis in axes]
