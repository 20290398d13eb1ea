"""The element-wise epilogue chains of an imported module: the bias adds, batch norms and activations that
follow a binding and that FuseOps fuses into the convolution (or matrix product) before them.
`tvmsched.merge` merges the chains of merged convolutions and products; `tvmsched.merge_choice` costs each
member of a group with its chain.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvmsched.lower import is_op

# Ops applied to a tensor and constants that FuseOps fuses into a convolution or product before them, as
# the importer emits them (a batch norm as a tuple whose first field is taken).
EPILOGUE_OPS = frozenset({"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.nn.relu",
                          "relax.clip", "relax.sigmoid", "relax.tanh", "relax.nn.silu", "relax.nn.gelu",
                          "relax.nn.gelu_tanh", "relax.nn.leakyrelu", "relax.nn.batch_norm"})

# The epilogue ops computed element by element, which FuseOps also fuses after a move.
ELEMENTWISE_OPS = EPILOGUE_OPS - {"relax.nn.batch_norm"}

# Ops that only move a tensor's elements, fused into one kernel with the slice or copy before them.
MOVE_OPS = frozenset({"relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze",
                      "relax.flatten"})


class Bindings:
    """The bindings of a function's body in order, who uses each variable (live users only: a batch norm's
    unused mean and variance do not count) and which variables hold values of constants alone."""

    def __init__(self, function: relax.Function):
        self.bindings = [binding for block in function.body.blocks for binding in block.bindings]
        self.values = {binding.var.__chandle__(): binding.value for binding in self.bindings}
        used = {var.__chandle__() for var in relax.analysis.free_vars(function.body.body)}
        for binding in self.bindings:
            used |= {var.__chandle__() for var in relax.analysis.free_vars(binding.value)}
        self.users: dict = {}
        self.constant: set = set()
        for binding in self.bindings:
            inputs = relax.analysis.free_vars(binding.value)
            if binding.var.__chandle__() in used:
                for var in inputs:
                    self.users.setdefault(var.__chandle__(), []).append(binding)
            if isinstance(binding.value, (tvm.ir.Constant, relax.Call)) and all(
                    var.__chandle__() in self.constant for var in inputs):
                self.constant.add(binding.var.__chandle__())

    def chain(self, var: relax.Var) -> list:
        """The bindings of the epilogue after `var`, in order: each the one live user of the one before,
        applying an epilogue op to it and constants (or taking a batch norm's first field)."""
        chain = []
        while (following := self._step(var)) is not None:
            chain.append(following)
            var = following.var
        return chain

    def moves(self, var: relax.Var) -> list:
        """The bindings after `var` that FuseOps fuses into one kernel with a slice of it: those that only
        move its elements (`MOVE_OPS`: BERT's reshape and transpose of a projection into heads) and the
        element-wise ops with constants after them (the attention's scale, as PyTorch exports it), in order,
        each the one live user of the one before. A slice of a merged result fuses with them in the model;
        timed with them, a group's slices are not counted as copies, and its kernels are the model's."""
        moves: list = []
        while len(following := self.users.get(var.__chandle__(), [])) == 1 and (
                self._moves(following[0], var) or (moves and self._elementwise(following[0], var))):
            moves.append(following[0])
            var = following[0].var
        return moves

    @staticmethod
    def _moves(binding, var: relax.Var) -> bool:
        value = binding.value
        return any(is_op(value, name) for name in MOVE_OPS) and value.args[0].same_as(var)

    def _step(self, var: relax.Var):
        following = self.users.get(var.__chandle__(), [])
        if len(following) != 1:
            return None
        binding = following[0]
        if isinstance(binding.value, relax.TupleGetItem):
            return binding if binding.value.index == 0 else None
        return binding if self._elementwise(binding, var, EPILOGUE_OPS) else None

    def _elementwise(self, binding, var: relax.Var, ops: frozenset = ELEMENTWISE_OPS) -> bool:
        """Whether `binding` applies one of `ops` to `var` and constants alone."""
        value = binding.value
        if not any(is_op(value, name) for name in ops):
            return False
        others = [other for other in relax.analysis.free_vars(value) if not other.same_as(var)]
        return all(other.__chandle__() in self.constant for other in others)

    def constant_operands(self, kept: set) -> set:
        """The constant variables (by object) that the `kept` bindings read, directly or through others."""
        needed = set()
        for binding in reversed(self.bindings):
            handle = binding.var.__chandle__()
            if handle in kept or handle in needed:
                needed |= {var.__chandle__() for var in relax.analysis.free_vars(binding.value)
                           if var.__chandle__() in self.constant}
        return needed

    def array(self, expr) -> np.ndarray | None:
        """The value of `expr` if it is a constant or a variable bound to a reshape of one, else None."""
        if isinstance(expr, relax.Var):
            expr = self.values.get(expr.__chandle__())
        if isinstance(expr, tvm.ir.Constant):
            return expr.value.numpy()
        if is_op(expr, "relax.reshape") and isinstance(expr.args[0], tvm.ir.Constant):
            return expr.args[0].value.numpy().reshape([int(dim) for dim in expr.ty.shape.values])
        return None


def renamed(value, names: dict):
    """`value` (a call, tuple, tuple item, variable or constant) reading `names[variable]` for each variable
    (by object) it names there."""
    if isinstance(value, relax.Var):
        return names.get(value.__chandle__(), value)
    if isinstance(value, relax.TupleGetItem):
        return relax.TupleGetItem(renamed(value.tuple_value, names), value.index)
    if isinstance(value, relax.Tuple):
        return relax.Tuple([renamed(field, names) for field in value.fields])
    if isinstance(value, relax.Call):
        return relax.Call(value.op, [renamed(arg, names) for arg in value.args], value.attrs, value.ty_args)
    return value
