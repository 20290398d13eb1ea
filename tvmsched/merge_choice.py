"""IOS-Both's choice (`--merge auto`): each group of convolutions reading one tensor is merged only where the
merged convolution with its slices runs faster than the members as dp would run them.

The groups (`merge.convolution_groups`) are costed together in two modules, each group reading a parameter
of its own: one holds the members, each with the element-wise epilogue that follows it in the model (bias
add, batch norm, activation), and the other is the same module merged (`merge.merge_convolutions`: per
group the merged convolution, then per member a slice with its epilogue). The build's `latencies` lowers,
compiles and times each module as it does the model and returns, per parameter, dp's stage sum for the
kernels that depend on it. The epilogues keep each member's kernel the model's kernel, so its tuning
records and vendor plans apply; the merged side pays its slices as the model pays them where no injective
consumer (a concat) absorbs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import relax

from tvmsched.merge import Convolution, convolution_groups, merge_convolutions

SCHEMA = 1
# Ops that FuseOps fuses into a convolution after it, as the importer emits them (batch norm as a tuple
# whose first field is taken).
EPILOGUE_OPS = frozenset({"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.nn.relu",
                          "relax.clip", "relax.sigmoid", "relax.tanh", "relax.nn.silu", "relax.nn.gelu",
                          "relax.nn.gelu_tanh", "relax.nn.leakyrelu", "relax.nn.batch_norm"})


@dataclass(frozen=True)
class MergeChoice:
    """One group of convolutions reading one tensor: how many, the latency (ms, dp's stage sum) of its
    members and of them merged, and whether the group was merged (where merged is faster)."""

    members: int
    members_ms: float
    merged_ms: float

    @property
    def merged(self) -> bool:
        return self.merged_ms < self.members_ms

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "members": self.members, "members_ms": self.members_ms,
                "merged_ms": self.merged_ms}

    @classmethod
    def from_json(cls, data: dict) -> MergeChoice:
        return cls(data["members"], data["members_ms"], data["merged_ms"])


def choose_merges(module: tvm.IRModule, latencies: Callable[[tvm.IRModule], tuple[float, ...]]
                  ) -> tuple[MergeChoice, ...]:
    """For each group of `convolution_groups(module)`, in order, the latency of its members and merged, from
    `latencies` (per parameter of a module's `main`) of `groups_module` and of it merged."""
    groups = convolution_groups(module)
    if not groups:
        return ()
    members = groups_module(module, groups)
    merged, _ = merge_convolutions(members)
    return tuple(MergeChoice(len(group), alone, together)
                 for group, alone, together in zip(groups, latencies(members), latencies(merged)))


def merge_chosen(module: tvm.IRModule, choices: tuple[MergeChoice, ...]
                 ) -> tuple[tvm.IRModule, tuple[int, ...]]:
    """`module` with the groups merged that `choices` (of `choose_merges(module)`) merge."""
    return merge_convolutions(module, keep=lambda index: choices[index].merged)


def groups_module(module: tvm.IRModule, groups: list[list[Convolution]]) -> tvm.IRModule:
    """A module whose `main` takes one parameter per group, its shared input, and returns each member's
    result after the element-wise epilogue that follows it in `module`."""
    main = module["main"]
    bindings = [binding for block in main.body.blocks for binding in block.bindings]
    users = _users(main, bindings)
    constant = _constant_vars(bindings)
    builder = relax.BlockBuilder()
    parameters = [relax.Var(f"group{index}", group[0].call.args[0].ty) for index, group in enumerate(groups)]
    with builder.function("main", parameters, attrs={"num_input": len(parameters)}):
        with builder.dataflow():
            ends = [renamed for group, parameter in zip(groups, parameters)
                    for renamed in _emit_group(builder, group, parameter, bindings, users, constant)]
            output = builder.emit_output(relax.Tuple(ends))
        builder.emit_func_output(output)
    return builder.get()


def _emit_group(builder: relax.BlockBuilder, group: list[Convolution], parameter: relax.Var, bindings: list,
                users: dict, constant: set) -> list[relax.Var]:
    """Emit the group's members with their epilogues (and the constants those read), reading `parameter`
    for the shared input; the variables of the members' final results."""
    keep, ends = set(), []
    for convolution in group:
        end = convolution.var
        keep.add(end.__chandle__())
        while (following := _epilogue_step(end, users, constant)) is not None:
            end = following.var
            keep.add(end.__chandle__())
        ends.append(end)
    keep |= _constant_operands(bindings, keep, constant)
    renamed = {group[0].call.args[0].__chandle__(): parameter}
    for binding in bindings:
        if binding.var.__chandle__() in keep:
            renamed[binding.var.__chandle__()] = builder.emit(_renamed(binding.value, renamed))
    return [renamed[end.__chandle__()] for end in ends]


def _users(main: relax.Function, bindings: list) -> dict:
    """For each variable (by object), the bindings that use it, ignoring those nothing uses (a batch norm's
    unused mean and variance)."""
    used = {var.__chandle__() for var in relax.analysis.free_vars(main.body.body)}
    for binding in bindings:
        used |= {var.__chandle__() for var in relax.analysis.free_vars(binding.value)}
    users = {}
    for binding in bindings:
        if binding.var.__chandle__() in used:
            for var in relax.analysis.free_vars(binding.value):
                users.setdefault(var.__chandle__(), []).append(binding)
    return users


def _constant_vars(bindings: list) -> set:
    """Variables (by object) bound to values computed from constants alone (a bias's reshape)."""
    constant = set()
    for binding in bindings:
        inputs = relax.analysis.free_vars(binding.value)
        if isinstance(binding.value, (tvm.ir.Constant, relax.Call)) and all(
                var.__chandle__() in constant for var in inputs):
            constant.add(binding.var.__chandle__())
    return constant


def _epilogue_step(var: relax.Var, users: dict, constant: set):
    """The one binding after `var` that applies an epilogue op to it and constants, else None."""
    following = users.get(var.__chandle__(), [])
    if len(following) != 1:
        return None
    binding = following[0]
    value = binding.value
    if isinstance(value, relax.TupleGetItem):
        return binding if value.index == 0 else None
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name in EPILOGUE_OPS):
        return None
    others = [other for other in relax.analysis.free_vars(value) if not other.same_as(var)]
    return binding if all(other.__chandle__() in constant for other in others) else None


def _constant_operands(bindings: list, keep: set, constant: set) -> set:
    """The constant variables that the kept bindings read, directly or through other constant ones."""
    needed = set()
    for binding in reversed(bindings):
        handle = binding.var.__chandle__()
        if handle in keep or handle in needed:
            needed |= {var.__chandle__() for var in relax.analysis.free_vars(binding.value)
                       if var.__chandle__() in constant}
    return needed


def _renamed(value, renamed: dict):
    """`value` (a call, tuple item or constant) reading the renamed variables."""
    if isinstance(value, relax.Var):
        return renamed.get(value.__chandle__(), value)
    if isinstance(value, relax.TupleGetItem):
        return relax.TupleGetItem(_renamed(value.tuple_value, renamed), value.index)
    if isinstance(value, relax.Tuple):
        return relax.Tuple([_renamed(field, renamed) for field in value.fields])
    if isinstance(value, relax.Call):
        return relax.Call(value.op, [_renamed(arg, renamed) for arg in value.args], value.attrs,
                          value.ty_args)
    return value
