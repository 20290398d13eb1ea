"""IOS-Both's choice (`--merge auto`): each group of convolutions (or of matrix products) reading one tensor
is merged only where the merged kernel with its slices runs faster than the members as dp would run them,
or, where dp schedules the build, where dp's search of the unmerged model chose a stage of it merged
(`chosen_in_dp`).

The groups (`parallel_groups`: `merge.convolution_groups`, then `merge_products.matmul_groups`) are costed
together in two modules, each group reading a parameter of its own: one holds the members, each with the
element-wise epilogue that follows it in the model (`tvmsched.epilogues`), and the concat that joins
exactly their results where there is one; the other is the same module with every group merged
(`merge_chosen`), each rewritten and lowered as the model is, once (`group_modules`). The
build's `latencies` compiles and times each module as it does the model and returns, per parameter, dp's
stage sum for the kernels that depend on it. The epilogues keep each member's kernel the model's kernel,
so its tuning records and vendor plans apply; a slice that the model's concat of several branches would
absorb is a copy here, which leans the choice towards not merging.

`chosen_in_dp` then lets dp weigh each group in context (IOS-Both proper): dp's search of the unmerged
model's kernel graph (`DynamicProgrammingScheduler.merge_search`), where a stage made of exactly a group's
kernels (`merge_kernels.group_kernels`) may run at the group's merged latency instead, so that a group's
members may also share stages with other branches. The groups it chose merged are merged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import tvm
from tvm import relax

from tvmsched.cost import StageCost
from tvmsched.epilogues import Bindings, renamed
from tvmsched.graph import extract
from tvmsched.lower import LoweredModule, is_op, lower
from tvmsched.merge import Convolution, Member, convolution_groups, merge_convolutions
from tvmsched.merge_kernels import Lowered, group_kernels
from tvmsched.merge_products import matmul_groups, merge_matmuls
from tvmsched.schedule.dp import DynamicProgrammingScheduler, MergeOption

SCHEMA = 3  # 2: dp_merged (a choice of schema 1 was the group's own); 3: kind (before, convolutions only)
# a groups module main's attribute: the results that the model returns and no kernel of it reads
MODEL_OUTPUTS = "tvmsched_model_outputs"


@dataclass(frozen=True)
class MergeChoice:
    """One group of convolutions or matrix products (`kind`: "conv2d" or "matmul") reading one tensor: how
    many, the latency (ms, dp's stage sum) of its members and of them merged, and what dp's search of the
    whole model chose (`dp_merged`, set by `chosen_in_dp`; None where it did not weigh the group). `merged`:
    dp's choice, else the group's own (`faster_merged`); what a build merged is its meta's `merged_*`, since
    its whole-model check may keep another candidate (`api._merge_candidates`)."""

    members: int
    members_ms: float
    merged_ms: float
    dp_merged: bool | None = None
    kind: str = "conv2d"

    @property
    def faster_merged(self) -> bool:
        return self.merged_ms < self.members_ms

    @property
    def merged(self) -> bool:
        return self.faster_merged if self.dp_merged is None else self.dp_merged

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "members": self.members, "members_ms": self.members_ms,
                "merged_ms": self.merged_ms, "dp_merged": self.dp_merged, "kind": self.kind}

    @classmethod
    def from_json(cls, data: dict) -> MergeChoice:
        return cls(data["members"], data["members_ms"], data["merged_ms"], data.get("dp_merged"),
                   data.get("kind", "conv2d"))


@dataclass(frozen=True)
class GroupModules:
    """A model's groups (`parallel_groups`) costed apart, each reading a parameter of its own: the members
    (`groups_module`) and them merged, each rewritten as the model is, as computed (`as_computed`) and
    lowered; `choose_merges` times both, `chosen_in_dp` finds the members' kernels in the model."""

    groups: tuple[tuple[Member, ...], ...]
    members: LoweredModule
    merged: LoweredModule


def group_modules(module: tvm.IRModule, prepared: Callable[[tvm.IRModule], tvm.IRModule]
                  ) -> GroupModules | None:
    """The `GroupModules` of `module`, rewritten by `prepared`; None where it has no group."""
    groups = parallel_groups(module)
    if not groups:
        return None
    members = groups_module(module, groups)
    merged = merge_chosen(members)[0]
    return GroupModules(tuple(map(tuple, groups)),
                        *(lower(as_computed(prepared(part))) for part in (members, merged)))


def choose_merges(modules: GroupModules, latencies: Callable[[LoweredModule], tuple[float, ...]]
                  ) -> tuple[MergeChoice, ...]:
    """For each group, in order, the latency of its members and merged, from `latencies` (per parameter of
    a lowered module's `main`) of the two modules."""
    alone, together = latencies(modules.members), latencies(modules.merged)
    return tuple(MergeChoice(len(group), *times, kind=_kind(group))
                 for group, *times in zip(modules.groups, alone, together))


def parallel_groups(module: tvm.IRModule) -> list[list[Member]]:
    """The groups that `--merge all` merges: those of convolutions, then those of matrix products, each in
    program order (the order of `MergeChoice`s)."""
    return [*convolution_groups(module), *matmul_groups(module)]


def _kind(group: tuple[Member, ...]) -> str:
    return "conv2d" if isinstance(group[0], Convolution) else "matmul"


def chosen_in_dp(modules: GroupModules, choices: tuple[MergeChoice, ...], model: Lowered, cost: StageCost,
                 scheduler: DynamicProgrammingScheduler) -> tuple[MergeChoice, ...]:
    """`choices` (of `choose_merges(modules)`) with `dp_merged` set for each group that `scheduler`'s
    IOS-Both search of `model` (the unmerged model, rewritten and lowered as the modules are) with `cost`
    weighed: whether it ran a stage of the group's kernels (`group_kernels`) merged. A group whose kernels
    were not found, or fell in two parts of a block too large to search whole, keeps its own choice."""
    members = modules.members
    found = group_kernels(Lowered(*extract(members, [param.name for param in members.module["main"].params])),
                          model)
    options = tuple(MergeOption(index, kernels, choice.merged_ms)
                    for index, (kernels, choice) in enumerate(zip(found, choices)) if kernels)
    if not options:
        return choices
    stages, weighed = scheduler.merge_search(model.graph, cost, options)
    merged = {option.group for _, option in stages if option}
    return tuple(replace(choice, dp_merged=index in merged) if index in weighed else choice
                 for index, choice in enumerate(choices))


def merge_chosen(module: tvm.IRModule, choices: tuple[MergeChoice, ...] | None = None
                 ) -> tuple[tvm.IRModule, tuple[int, ...], tuple[int, ...]]:
    """`module` with the groups merged that `choices` (of `choose_merges(module)`) merge, every group of
    `parallel_groups` where `choices` is None, and the size of each group of convolutions and of matrix
    products merged."""
    def merged(index: int) -> bool:
        return choices is None or choices[index].merged
    convolutions = sum(choice.kind == "conv2d" for choice in choices or ())
    module, merged_convolutions = merge_convolutions(module, keep=merged)
    module, merged_matmuls = merge_matmuls(module, keep=lambda index: merged(convolutions + index))
    return module, merged_convolutions, merged_matmuls


def as_computed(module: tvm.IRModule) -> tvm.IRModule:
    """`module` (a `groups_module` rewritten as a model is) reading and returning each tensor as the model's
    kernels do: without the casts to float16 and the layout changes to NHWC that the precision and layout
    rewrites put after `main`'s parameters, nor those back to float32 and NCHW before its outputs, but for
    the results that the model only returns (`MODEL_OUTPUTS`), which keep them as in the model (where that
    cast fuses into the kernel that computes the result). The model has neither between its kernels; a
    cast before an output, fused into a member's kernel, made it another kernel than the model's, and a
    parameter's own transform was timed with its group."""
    main = module["main"]
    blocks = list(main.body.blocks)
    last = blocks[-1].bindings[-1] if blocks and blocks[-1].bindings else None
    if len(blocks) != 1 or last is None or not last.var.same_as(main.body.body) or not isinstance(
            last.value, relax.Tuple):
        return module
    bindings = Bindings(main)
    returned_by_model = set(main.attrs.get(MODEL_OUTPUTS, []) if main.attrs else [])
    names, dropped, params = {}, set(), []
    for param in main.params:
        chain = _read_as(param, bindings)
        dropped |= {var.__chandle__() for var in chain}
        params.append(relax.Var(param.name, chain[-1].ty) if chain else param)
        if chain:
            names[chain[-1].__chandle__()] = params[-1]
    fields = [field if index in returned_by_model else _as_computed(field, bindings)
              for index, field in enumerate(last.value.fields)]
    if not names and all(field.same_as(original) for field, original in zip(fields, last.value.fields)):
        return module
    returned = relax.Var(last.var.name, relax.TupleType([field.ty for field in fields]))
    kept = [relax.VarBinding(binding.var, renamed(binding.value, names))
            for binding in blocks[0].bindings[:-1] if binding.var.__chandle__() not in dropped]
    body = relax.SeqExpr([relax.DataflowBlock([*kept, relax.VarBinding(returned, relax.Tuple(
        [renamed(field, names) for field in fields]))])], returned)
    result = tvm.IRModule(dict(module.functions), attrs=module.attrs)
    result["main"] = relax.Function(params, body, returned.ty, attrs=main.attrs)
    return relax.transform.DeadCodeElimination()(result)


TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def _layout_or_cast(value, source: str, target: str, axes: list[int]) -> bool:
    """Whether `value` is a change the precision and layout rewrites make at a module's edge: a cast from
    dtype `source` to `target`, or a layout change (a `permute_dims` by `axes`, TO_NHWC or TO_NCHW). A
    member's own transpose after it (BERT's into heads, `Bindings.moves`) is the model's and stays."""
    if is_op(value, "relax.permute_dims"):
        return value.attrs.axes is not None and [int(axis) for axis in value.attrs.axes] == axes
    return is_op(value, "relax.layout_transform") or (
        is_op(value, "relax.astype") and str(value.args[0].ty.dtype) == source
        and str(value.attrs.dtype) == target)


def _read_as(param: relax.Var, bindings: Bindings) -> list[relax.Var]:
    """The variables of the layout changes and float32-to-float16 casts that alone read `param`, in turn."""
    chain, var = [], param
    while len(users := bindings.users.get(var.__chandle__(), [])) == 1 and _layout_or_cast(
            users[0].value, "float32", "float16", TO_NHWC):
        var = users[0].var
        chain.append(var)
    return chain


def _as_computed(var: relax.Expr, bindings: Bindings) -> relax.Expr:
    """`var` before the layout changes and float16-to-float32 casts that compute it."""
    while isinstance(var, relax.Var) and (value := bindings.values.get(var.__chandle__())) is not None:
        if not _layout_or_cast(value, "float16", "float32", TO_NCHW):
            break
        var = value.args[0]
    return var


def groups_module(module: tvm.IRModule, groups: list[list[Member]]) -> tvm.IRModule:
    """A module whose `main` takes one parameter per group, its shared input, and returns each member's
    result after the element-wise epilogue and the moves that follow it in `module` (`Bindings.chain`,
    `Bindings.moves`), or the concat of those results where one concat joins exactly them."""
    bindings = Bindings(module["main"])
    outputs = _only_returned(module["main"], bindings)
    builder = relax.BlockBuilder()
    parameters = [relax.Var(f"group{index}", group[0].call.args[0].ty) for index, group in enumerate(groups)]
    with builder.function("main", parameters, attrs={"num_input": len(parameters)}):
        with builder.dataflow():
            ends = [pair for group, parameter in zip(groups, parameters)
                    for pair in _emit_group(builder, group, parameter, bindings)]
            output = builder.emit_output(relax.Tuple([emitted for _, emitted in ends]))
        builder.emit_func_output(output)
    result = builder.get()
    result["main"] = result["main"].with_attr(
        MODEL_OUTPUTS, [index for index, (end, _) in enumerate(ends) if end.__chandle__() in outputs])
    return result


def _only_returned(main: relax.Function, bindings: Bindings) -> set:
    """The variables (by handle) whose values `main` returns, directly or through tuples and aliases that
    nothing else reads either: a rewrite's cast before such an output fuses into the kernel that computes
    it, but is a kernel of its own after one that other kernels read too (a scaled attention head that a
    model also returns)."""
    returned = {var.__chandle__() for var in relax.analysis.free_vars(main.body.body)}
    only: set = set()
    for binding in reversed(bindings.bindings):  # a variable's users come after it
        handle = binding.var.__chandle__()
        users = bindings.users.get(handle, [])
        if (handle in returned or users) and all(
                isinstance(user.value, relax.Var | relax.Tuple) and user.var.__chandle__() in only
                for user in users):
            only.add(handle)
    return only


def _emit_group(builder: relax.BlockBuilder, group: list[Member], parameter: relax.Var,
                bindings: Bindings) -> list[tuple[relax.Var, relax.Var]]:
    """Emit the group's members with their epilogues and the moves after those (`Bindings.moves`; and the
    constants those read), and the concat that joins exactly their results if there is one, reading
    `parameter` for the shared input; for each result the group computes for the rest of the model, its
    variable in the model and the one emitted."""
    kept, ends = set(), []
    for member in group:
        chain = [member.var] + [binding.var for binding in bindings.chain(member.var)]
        chain += [binding.var for binding in bindings.moves(chain[-1])]
        kept |= {var.__chandle__() for var in chain}
        ends.append(chain[-1])
    joined = _joining_concat(ends, bindings)
    if joined is not None:
        kept.add(joined.var.__chandle__())
        ends = [joined.var]
    kept |= bindings.constant_operands(kept)
    names = {group[0].call.args[0].__chandle__(): parameter}
    for binding in bindings.bindings:
        if binding.var.__chandle__() in kept:
            names[binding.var.__chandle__()] = builder.emit(renamed(binding.value, names))
    return [(end, names[end.__chandle__()]) for end in ends]


def _joining_concat(ends: list[relax.Var], bindings: Bindings):
    """The binding of the concat whose operands are exactly `ends`, each used by it alone, else None."""
    users = [bindings.users.get(end.__chandle__(), []) for end in ends]
    if any(len(using) != 1 for using in users) or len({using[0].var.__chandle__() for using in users}) != 1:
        return None
    binding = users[0][0]
    value = binding.value
    if not (is_op(value, "relax.concat") and isinstance(value.args[0], relax.Tuple)):
        return None
    fields = [field.__chandle__() for field in value.args[0].fields if isinstance(field, relax.Var)]
    exactly = len(fields) == len(value.args[0].fields) == len(ends) and set(fields) == {
        end.__chandle__() for end in ends}
    return binding if exactly else None
