"""CPU builds: convolutions whose output channels are not a multiple of the vector's lanes compute zero
filters up to one, with their per-channel epilogue, and the result is sliced back (`channels_padded`).

The CPU `gemm` rule computes one vector of output channels at a time, as wide as the largest power of two
dividing the channel count: squeezenet's 1,000-channel classifier (a 1x1 convolution) ran 8 lanes of
AVX-512's 16, randwire's 78 channels 2. A convolution is padded with zero filters where that adds at most
an eighth more and it has at least FEWEST channels or vectors of at most NARROW lanes (nasnet's 88-channel
convolutions measured 5% slower padded); so are the per-channel constants of the element-wise ops and
batch norm that follow it alone (the epilogue its kernel fuses), and the slice comes after them: sliced
right after the convolution, a batch norm behind the slice was a second pass over the output (the `gemm`
rule does not inline another shape into its accumulator). Measured on this project's 2-core Zen 5
(2026-11-26, `experiments/cpu_rules.py --without channel_padding`): squeezenet 3.47 → 3.24 ms, randwire
17.2 → 9.6 ms, nasnet and googlenet unchanged.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import tvm
from tvm import relax

from tvmsched.lower import is_op, with_main_mutated

MOST_EXTRA = 1 / 8  # padding filters allowed, as a share of the convolution's own
FEWEST = 96  # channels of the convolutions padded at least, unless their vectors would have NARROW lanes
NARROW = 2
# element-wise ops a padded epilogue may hold, with the value their per-channel constants are padded with
PADDED_WITH = {"relax.add": 0.0, "relax.subtract": 0.0, "relax.maximum": 0.0, "relax.minimum": 0.0,
               "relax.multiply": 1.0, "relax.divide": 1.0}
UNARY = frozenset(f"relax.{name}" for name in ("nn.relu", "sigmoid", "tanh", "clip", "nn.silu", "nn.gelu",
                                                 "nn.leakyrelu", "exp", "negative", "abs", "astype"))
NORM_PADDING = (1.0, 0.0, 0.0, 1.0)  # batch norm's gamma, beta, mean, variance


def channels_padded(module: tvm.IRModule, lanes: int) -> tvm.IRModule:
    """`module` (as imported: NCHW convolutions with constant OIHW weights) with each ungrouped
    convolution whose output channels exceed `lanes` without being a multiple of it computing zero filters
    up to the next multiple, through the per-channel epilogue only it reads, then sliced back."""
    module = relax.transform.DeadCodeElimination()(module)  # a batch norm's unused statistics
    module = with_main_mutated(module, _ReshapedConstants(module))  # a bias is reshape(constant)
    constants = {binding.var.__chandle__(): binding.value for block in module["main"].body.blocks
                 for binding in block.bindings if isinstance(binding.value, tvm.ir.Constant)}
    roles = _roles(module["main"], lanes, constants)
    if not roles:
        return module
    return with_main_mutated(module, _PadChannels(module, roles, constants))


def _roles(function: relax.Function, lanes: int, constants: dict) -> dict[int, tuple[str, int, int]]:
    """By handle of each binding's value in a padded chain: ("conv" | "epilogue", channels, extra), and
    "last" for the value after which the slice goes (the convolution itself where nothing follows)."""
    bindings = [binding for block in function.body.blocks for binding in block.bindings]
    uses: Counter = Counter()
    consumer = {}  # each variable's first reader
    for binding in [*bindings, None]:  # None: the function's result
        def note(node, binding=binding):
            if isinstance(node, relax.Var):
                uses[node.__chandle__()] += 1
                consumer.setdefault(node.__chandle__(), binding)
        relax.analysis.post_order_visit(binding.value if binding else function.body.body, note)
    roles = {}
    for binding in bindings:
        channels = _paddable(binding.value, lanes)
        if channels is None:
            continue
        extra = -channels % lanes
        chain, current = [binding], binding
        while (uses[current.var.__chandle__()] == 1
               and (following := consumer.get(current.var.__chandle__()))
               and _epilogue(following.value, current.var, channels, constants)):
            chain.append(following)
            current = following
        while chain and not isinstance(chain[-1].var.ty, relax.TensorType):  # a batch norm's tuple
            chain.pop()
        for index, member in enumerate(chain):
            role = "conv" if index == 0 else "epilogue"
            roles[member.value.__chandle__()] = (role, channels, extra)
        roles[("last", chain[-1].value.__chandle__())] = ("last", channels, extra)
    return roles


def _paddable(value, lanes: int) -> int | None:
    """The output channels of an ungrouped NCHW convolution by constant OIHW weights that padding to a
    multiple of `lanes` would widen its vectors for at most MOST_EXTRA more filters; else None."""
    if not (is_op(value, "relax.nn.conv2d") and isinstance(value.args[1], tvm.ir.Constant)
            and int(value.attrs.groups) == 1 and value.attrs.data_layout == "NCHW"
            and value.attrs.kernel_layout == "OIHW" and value.attrs.out_layout == "NCHW"):
        return None
    channels = int(value.args[1].ty.shape.values[0])
    extra = -channels % lanes
    narrow = channels & -channels <= NARROW  # the largest power of two dividing the channels
    return channels if (channels >= FEWEST or narrow) and channels > lanes and extra \
        and extra <= MOST_EXTRA * channels else None


def _epilogue(value, source: relax.Var, channels: int, constants: dict) -> bool:
    """Whether `value` computes on `source` per channel: an element-wise op whose other tensors are
    constants of one value per channel (or one value), a batch norm by constants, or its result's field."""
    if isinstance(value, relax.TupleGetItem):
        return value.tuple_value.same_as(source) and value.index == 0
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return False
    others = [constants.get(arg.__chandle__(), arg) for arg in value.args if not arg.same_as(source)]
    if value.op.name == "relax.nn.batch_norm":
        return (value.args[0].same_as(source) and int(value.attrs.axis) == 1
                and all(isinstance(arg, tvm.ir.Constant) for arg in others))
    if value.op.name in UNARY:
        return value.args[0].same_as(source) and not any(isinstance(arg.ty, relax.TensorType)
                                                         for arg in others)
    return value.op.name in PADDED_WITH and len(others) == 1 and _per_channel(others[0], channels)


def _per_channel(expr, channels: int) -> bool:
    if not isinstance(expr, tvm.ir.Constant):
        return False
    shape = [int(dim) for dim in expr.ty.shape.values]
    full = [1] * (4 - len(shape)) + shape
    return len(full) == 4 and full[0] == full[2] == full[3] == 1 and full[1] in (1, channels)


@relax.expr_functor.mutator
class _ReshapedConstants(relax.PyExprMutator):
    """Replaces `reshape(constant, shape)` (as the importer gives a convolution's bias) by the reshaped
    constant, so that an epilogue's per-channel operand is a constant (bound to a variable) to pad."""

    def visit_call_(self, op: relax.Call):
        call = super().visit_call_(op)
        if is_op(call, "relax.reshape") and isinstance(call.args[0], tvm.ir.Constant) \
                and isinstance(call.ty, relax.TensorType) and isinstance(call.ty.shape, relax.ShapeExpr):
            shape = [int(dim) for dim in call.ty.shape.values]
            return relax.const(call.args[0].value.numpy().reshape(shape), str(call.ty.dtype))
        return call


@relax.expr_functor.mutator
class _PadChannels(relax.PyExprMutator):
    def __init__(self, module: tvm.IRModule, roles: dict, constants: dict):
        super().__init__(module)
        self.roles, self.constants = roles, constants

    def visit_call_(self, op: relax.Call):
        role = self.roles.get(op.__chandle__())
        if role is None:
            return self._sliced(op, super().visit_call_(op))
        _, channels, extra = role  # the arguments padded before the call is typed (their shapes must agree)
        args = [self._padded(self.constants.get(arg.__chandle__()) or self.visit_expr(arg), op, index,
                             channels, extra) for index, arg in enumerate(op.args)]
        return self._sliced(op, relax.Call(op.op, args, op.attrs, op.ty_args))

    def visit_tuple_getitem_(self, op: relax.TupleGetItem):
        return self._sliced(op, super().visit_tuple_getitem_(op))

    def _sliced(self, op, expr):
        role = self.roles.get(("last", op.__chandle__()))
        if role is None:
            return expr
        return relax.op.strided_slice(self.builder_.emit(expr), axes=[1], begin=[0], end=[role[1]])

    @staticmethod
    def _padded(arg, call: relax.Call, index: int, channels: int, extra: int):
        """A constant argument of a padded call, padded on its channel axis (a convolution's weights with
        zero filters, a batch norm's statistics, an epilogue's per-channel constants); others as they are."""
        if not isinstance(arg, tvm.ir.Constant):
            return arg
        array = arg.value.numpy()
        name = call.op.name
        if name == "relax.nn.conv2d":
            if index != 1:  # the weights (a constant data input keeps its batch)
                return arg
            axis, value = 0, 0.0
        elif name == "relax.nn.batch_norm":
            if index == 0:
                return arg
            axis, value = 0, NORM_PADDING[index - 1]
        else:
            axis, value = array.ndim - 3, PADDED_WITH[name]
            if axis < 0 or array.shape[axis] != channels:  # one value for every channel
                return arg
        widths = [(0, extra if dim == axis else 0) for dim in range(array.ndim)]
        return relax.const(np.pad(array, widths, constant_values=value), str(array.dtype))
