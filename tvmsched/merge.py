"""IOS-Merge: convolutions (and matrix products) that read the same tensor become one, over all their outputs.

Before lowering, the `relax.nn.conv2d` calls of `main` that read one data tensor with constant weights and
the same strides, dilation, layouts (NCHW data, OIHW weights), output dtype and output shape, with
`groups=1`, are replaced by a single convolution whose weights are theirs concatenated along the output
channels. The element-wise epilogue steps that every member shares (`tvmsched.epilogues`: the same op and
attributes, constants per output channel or equal: bias adds, batch norms, activations) are merged too,
over the concatenated channels; each member's result after them becomes a channel slice (`strided_slice`)
of the merged one, so whatever followed (a differing epilogue, another convolution) reads its slice and
fuses there as before, and a concat of slices that cover the merged tensor in order is that tensor.

A smaller kernel joins a larger one when its taps fit inside the larger one's window: it is padded with zero
taps and its padding grown to match (a 1x1 convolution without padding beside a 3x3 one with padding 1 becomes
a 3x3 with its tap in the middle). This computes the same sums with extra zero terms: the same values for
finite inputs (an infinite input under a zero tap gives NaN).

A convolution whose weights are constant depends on its data alone, so convolutions reading the same tensor
never depend on one another: the merged one is placed where the first of them was.

Matrix products of one left operand by constant right operands are merged too (`tvmsched.merge_products`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from tvmsched.epilogues import Bindings
from tvmsched.lower import is_op


@dataclass(frozen=True)
class Merged:
    """A module after merging, for each merged convolution (matmul) how many it replaced, and the choices."""

    module: tvm.IRModule
    convolutions: tuple[int, ...] = ()
    matmuls: tuple[int, ...] = ()
    choices: tuple = ()  # with --merge auto, a `merge_choice.MergeChoice` per group that could merge


@dataclass(frozen=True)
class Member:
    """One binding that merges with others of its `key` (`merge_groups`): its variable, its call and the
    constant weights it applies, whose `channels` it contributes to the merged result."""

    var: relax.Var
    call: relax.Call
    weight: np.ndarray

    @property
    def key(self) -> tuple:
        raise NotImplementedError

    @property
    def channels(self) -> int:
        raise NotImplementedError


@dataclass(frozen=True)
class Convolution(Member):
    """A mergeable `conv2d`, its weights OIHW."""

    @property
    def key(self) -> tuple:
        """What convolutions merged together must share (padding and kernel size are checked apart)."""
        attrs = self.call.attrs
        batch, _, *spatial = (int(dim) for dim in self.call.ty.shape.values)
        return (self.call.args[0].__chandle__(), tuple(int(step) for step in attrs.strides), self.dilation,
                str(attrs.out_dtype), str(self.weight.dtype), batch, *spatial)

    @property
    def channels(self) -> int:
        return self.weight.shape[0]

    @property
    def dilation(self) -> tuple[int, int]:
        return tuple(int(step) for step in self.call.attrs.dilation)

    def window(self, axis: int) -> tuple[int, int, int]:
        """Padding before, padding after and kernel size along spatial axis 0 (height) or 1 (width)."""
        padding = self.call.attrs.padding  # top, left, bottom, right
        return int(padding[axis]), int(padding[axis + 2]), self.weight.shape[axis + 2]

    def padded_weight(self, windows: tuple[_Window, _Window]) -> np.ndarray:
        """The weights with zero taps around them, filling the merged windows."""
        pads = [(0, 0), (0, 0)]
        for axis, window in enumerate(windows):
            offset = window.offset(self.window(axis)[0], self.dilation[axis])
            pads.append((offset, window.size - offset - self.weight.shape[axis + 2]))
        return np.pad(self.weight, pads)


@dataclass(frozen=True)
class _Window:
    """The merged convolution's geometry along one spatial axis: its padding before and after and its
    kernel size; a member's kernel starts `offset` taps into it."""

    before: int
    after: int
    size: int

    @staticmethod
    def of(members: list[tuple[int, int, int]], dilation: int) -> _Window | None:
        """The largest member's window if every member's (padding before, padding after, kernel size) fits
        inside it, else None: a member's taps must read the positions the window's taps at a whole offset
        read, and its kernel end where the window ends (counting padding), so the output size is the same."""
        before = max(pad_before for pad_before, _, _ in members)
        size = max(kernel for _, _, kernel in members)
        afters = set()
        for pad_before, pad_after, kernel in members:
            offset, shift = divmod(before - pad_before, dilation)
            if shift or offset + kernel > size:
                return None
            afters.add(pad_after + (size - kernel - offset) * dilation)
        return _Window(before, afters.pop(), size) if len(afters) == 1 else None

    def offset(self, pad_before: int, dilation: int) -> int:
        return (self.before - pad_before) // dilation


def convolution_groups(module: tvm.IRModule) -> list[list[Convolution]]:
    """The groups of convolutions of `main` that `merge_convolutions` would merge, in its order."""
    return found_groups(module, _block_groups)


def found_groups(module: tvm.IRModule, groups_of_block: Callable) -> list[list[Member]]:
    """The groups of `main` that `merge_groups` with `groups_of_block` would consider, in its order."""
    values = Bindings(module["main"]).values
    return [group for block in module["main"].body.blocks for group in groups_of_block(block, values)]


def merge_convolutions(module: tvm.IRModule, keep: Callable[[int], bool] = lambda index: True
                       ) -> tuple[tvm.IRModule, tuple[int, ...]]:
    """`module` with the convolutions of `main` that read one tensor merged, those of the groups whose index
    (in `convolution_groups`' order) `keep` accepts, and the size of each group merged."""
    return merge_groups(module, _block_groups, _merged_convolution, keep)


def merge_groups(module: tvm.IRModule, groups_of_block: Callable, merged_call: Callable,
                 keep: Callable[[int], bool]) -> tuple[tvm.IRModule, tuple[int, ...]]:
    """`module` with the groups of `main` merged that `groups_of_block(block, values)` finds (members with a
    `var`, a `call` and `channels`; `values`: what each variable of `main` is bound to, by object) and whose
    index in block order `keep` accepts: each group's `merged_call(group)` (the merged call and how far
    from the right its channel axis is) with the epilogue steps its members share, then a slice per
    member; and the size of each group merged."""
    main = module["main"]
    found = Bindings(main)
    replacements, slices, sizes, index = {}, {}, [], 0
    for block in main.body.blocks:
        var_type = relax.DataflowVar if isinstance(block, relax.DataflowBlock) else relax.Var
        for group in groups_of_block(block, found.values):
            if keep(index):
                replaced, sliced = _merged_bindings(group, *merged_call(group), var_type, found)
                replacements.update(replaced)
                slices.update(sliced)
                sizes.append(len(group))
            index += 1
    blocks = [type(block)(_joined(_replaced(block.bindings, replacements), slices))
              for block in main.body.blocks]
    if not sizes:
        return module, ()
    module = tvm.IRModule(dict(module.functions), attrs=module.attrs)
    module["main"] = relax.Function(main.params, relax.SeqExpr(blocks, main.body.body), main.ret_ty,
                                    main.is_pure, main.attrs)
    return module, tuple(sizes)


def _replaced(bindings, replacements: dict) -> list:
    """`bindings` with each replaced as `replacements` says, and those that read a dropped variable dropped
    (nothing uses them: a dropped batch norm's mean and variance)."""
    dropped, result = set(), []
    for binding in bindings:
        handle = binding.var.__chandle__()
        if handle in replacements:
            result += replacements[handle]
            if not any(replaced.var.same_as(binding.var) for replaced in replacements[handle]):
                dropped.add(handle)
        elif any(var.__chandle__() in dropped for var in relax.analysis.free_vars(binding.value)):
            dropped.add(handle)
        else:
            result.append(binding)
    return result


def _joined(bindings: list, slices: dict) -> list:
    """`bindings` with each channel concat of slices that cover one merged tensor in order (`slices`:
    variable → (merged variable, channel axis, first channel, end channel)) bound to that tensor itself: a
    squeezenet fire module's concat of its two expands is the merged convolution's result."""
    result = []
    for binding in bindings:
        value = binding.value
        if is_op(value, "relax.concat") and isinstance(value.args[0], relax.Tuple):
            parts = [slices.get(field.__chandle__()) if isinstance(field, relax.Var) else None
                     for field in value.args[0].fields]
            source, axis = parts[0][:2] if parts[0] else (None, None)
            rank = len(value.ty.shape.values)
            if (source is not None and int(value.attrs.axis) % rank == axis and all(parts)
                    and all(part[0].same_as(source) for part in parts)
                    and [part[2] for part in parts] == [0] + [part[3] for part in parts[:-1]]
                    and parts[-1][3] == int(source.ty.shape.values[axis])):
                binding = relax.VarBinding(binding.var, source)
        result.append(binding)
    return result


def keyed(block, values: dict, mergeable: Callable) -> list[list[Member]]:
    """The members of `block` (each binding that `mergeable(binding, values)` makes one; `values`: what each
    variable of `main` is bound to, by object) by key, in program order."""
    by_key: dict = {}
    for binding in block.bindings:
        member = mergeable(binding, values)
        if member is not None:
            by_key.setdefault(member.key, []).append(member)
    return list(by_key.values())


def _block_groups(block, values: dict) -> list[list[Convolution]]:
    """The groups of mergeable convolutions of `block`, each of two or more."""
    return [group for candidates in keyed(block, values, _mergeable)
            for group in _compatible_groups(candidates)]


def _mergeable(binding, values: dict) -> Convolution | None:
    """The binding as a `Convolution` if it is a conv2d this pass can merge."""
    call = binding.value
    if not (isinstance(binding, relax.VarBinding) and is_op(call, "relax.nn.conv2d")):
        return None
    attrs, (data, weight) = call.attrs, call.args
    weight = values.get(weight.__chandle__()) if isinstance(weight, relax.Var) else weight
    if not (isinstance(data, relax.Var) and isinstance(weight, tvm.ir.Constant) and attrs.groups == 1
            and (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) == ("NCHW", "OIHW", "NCHW")):
        return None
    return Convolution(binding.var, call, weight.value.numpy())


def _compatible_groups(candidates: list[Convolution]) -> list[list[Convolution]]:
    """`candidates` (of one key) split into groups whose windows line up, in program order; groups of two
    or more."""
    groups = []
    for convolution in candidates:
        group = next((group for group in groups if _windows([*group, convolution])), None)
        if group is None:
            groups.append([convolution])
        else:
            group.append(convolution)
    return [group for group in groups if len(group) > 1]


def _windows(group: list[Convolution]) -> tuple[_Window, _Window] | None:
    """The merged windows along height and width, or None if the group's kernels do not fit the kernel of
    one of them (a 1x3 and a 3x1 would both grow to 3x3: three times their work)."""
    windows = tuple(_Window.of([conv.window(axis) for conv in group], group[0].dilation[axis])
                    for axis in (0, 1))
    if None in windows or all(conv.weight.shape[2:] != tuple(window.size for window in windows)
                              for conv in group):
        return None
    return windows


def _merged_convolution(group: list[Convolution]) -> tuple[relax.Call, int]:
    """The convolution of a group's data by its members' weights (padded to one window) concatenated along
    the output channels, and how far its channel axis is from the right (NCHW: 3)."""
    height, width = windows = _windows(group)
    attrs = group[0].call.attrs
    weights = np.concatenate([conv.padded_weight(windows) for conv in group])
    return relax.op.nn.conv2d(group[0].call.args[0], relax.const(weights), attrs.strides,
                              (height.before, width.before, height.after, width.after), attrs.dilation,
                              out_dtype=attrs.out_dtype), 3


def _merged_bindings(group: list, call: relax.Call, from_right: int, var_type: type, bindings: Bindings
                     ) -> tuple[dict, dict]:
    """For each member's variable (by object) the bindings that replace its own, and the slices made.

    The first member's call becomes `call` (the group merged, its channel axis `from_right` axes from the
    right) followed by the steps of the members' epilogues that every member shares (the same op and
    attributes, constants per output channel or equal), merged over the concatenated channels; each
    member's variable after those steps becomes its channel slice of the merged result, and its bindings
    before them are dropped (an empty list). `slices` maps each slice's variable to (merged variable,
    channel axis, first channel, end channel)."""
    builder = relax.BlockBuilder()
    call = builder.normalize(call)
    end = var_type(f"merged_{call.op.name.split('.')[-1]}", call.ty)
    merged = [relax.VarBinding(end, call)]
    chains = [[member.var] + [binding.var for binding in bindings.chain(member.var)] for member in group]
    channels = [member.channels for member in group]
    for depth in range(min(map(len, chains)) - 1):
        value = _merged_step([bindings.values[chain[depth + 1].__chandle__()] for chain in chains],
                             [chain[depth] for chain in chains], end, channels, from_right, bindings)
        if value is None:
            break
        value = builder.normalize(value)
        end = var_type("merged_epilogue", value.ty)
        merged.append(relax.VarBinding(end, value))
    while _rank(merged[-1].var) is None:  # a batch norm's tuple whose first field was not merged
        merged.pop()
    end, depth = merged[-1].var, len(merged) - 1
    axis = _rank(end) - from_right
    replacements, slices, start = {}, {}, 0
    for chain, count in zip(chains, channels):
        replacements.update({var.__chandle__(): [] for var in chain[:depth]})
        sliced = builder.normalize(relax.op.strided_slice(end, axes=[axis], begin=[start],
                                                          end=[start + count]))
        replacements[chain[depth].__chandle__()] = [relax.VarBinding(chain[depth], sliced)]
        slices[chain[depth].__chandle__()] = (end, axis, start, start + count)
        start += count
    first = group[0].var.__chandle__()
    replacements[first] = merged + replacements[first]
    return replacements, slices


def _merged_step(values: list, inputs: list[relax.Var], merged: relax.Var, channels: list[int],
                 from_right: int, bindings: Bindings):
    """One epilogue step of every member (`values`, applied to `inputs`) as one step applied to `merged`,
    or None if the members' steps differ or a constant is neither per output channel nor the same."""
    first = values[0]
    if all(isinstance(value, relax.TupleGetItem) and value.index == first.index for value in values):
        return relax.TupleGetItem(merged, first.index)
    if not all(isinstance(value, relax.Call) and value.op.same_as(first.op)
               and len(value.args) == len(first.args) and tvm_ffi.structural_equal(value.attrs, first.attrs)
               and _rank(value) in (None, _rank(member))  # a constant of more dimensions adds axes
               for value, member in zip(values, inputs)):
        return None
    rank = _rank(inputs[0])
    if is_op(first, "relax.nn.batch_norm") and int(first.attrs.axis) % rank != rank - from_right:
        return None  # normalizing another axis than the channels
    args = []
    for operands in zip(*(value.args for value in values)):
        if all(operand.same_as(member) for operand, member in zip(operands, inputs)):
            args.append(merged)
            continue
        arrays = [bindings.array(operand) for operand in operands]
        joined = None if any(array is None for array in arrays) else _per_channel(
            arrays, channels, from_right, vector=is_op(first, "relax.nn.batch_norm"))
        if joined is None:
            return None
        args.append(relax.const(joined))
    return relax.Call(first.op, args, first.attrs, first.ty_args)


def _rank(expr) -> int | None:
    """The rank of a tensor-typed expression, None for a tuple (a batch norm's)."""
    shape = getattr(expr.ty, "shape", None)
    return None if shape is None else len(shape.values)


def _per_channel(arrays: list[np.ndarray], channels: list[int], from_right: int, vector: bool
                 ) -> np.ndarray | None:
    """The members' constants of one epilogue operand as one for the merged channels: concatenated where
    each has its member's channels on the channel axis (of a batch norm's vectors, or `from_right` axes
    from the right of an operand broadcast against the result) and 1 elsewhere, or the one constant they
    all share without channels."""
    rank = arrays[0].ndim
    axis = 0 if vector else rank - from_right
    if any(array.ndim != rank or array.dtype != arrays[0].dtype for array in arrays):
        return None
    if axis >= 0 and all(array.shape[axis] == count == array.size for array, count in zip(arrays, channels)):
        return np.concatenate(arrays, axis=axis)
    if (axis < 0 or arrays[0].shape[axis] == 1) and all(np.array_equal(array, arrays[0]) for array in arrays):
        return arrays[0]
    return None
