"""Which kernels of a model's kernel graph are each merge group's, so that dp can weigh merging a group
inside its search (IOS-Both, `schedule.dp.MergeOption`).

Kernels keep no trace of the Relax bindings they came from, so a group's kernels are found by structure.
`merge_choice.groups_module` holds every group alone, reading a parameter of its own; lowered as the model
is, the kernels that depend on group g's parameter (its members with their epilogues, and the concat that
joins exactly them) form a small graph. It is matched in the model's graph: a tensor of the parameter's
shape and dtype, then kernel by kernel in order one of the same workload reading the matched tensors in
the same places (and a constant of the same value where it reads one: groups of one shape are told apart
by their weights), backtracking over equal candidates. The model may
fuse a member's last steps with what follows (inception_v3's relus join the concat of all its branches):
a kernel after the members that matches nowhere is left out, with what depends on it. Groups are matched
in order, each to the first place that no earlier group took; a group whose members match nowhere is left
out. Where one kernel alone reads a group's parameter (its layout transform to NHWC, which the model does
not repeat between NHWC kernels), the group's tensor is that kernel's result (`merge_choice.as_computed`
drops such transforms from the groups module; a module not so rewritten still matches).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from tvmsched.graph import Kernel, KernelGraph, TensorRef


@dataclass(frozen=True)
class Lowered:
    """A kernel graph and the values of its constants by name (`graph.extract`)."""

    graph: KernelGraph
    constants: dict[str, np.ndarray]


def group_kernels(groups: Lowered, model: Lowered) -> list[frozenset[int] | None]:
    """Per input of `groups` (a lowered `groups_module`, one input per group, in order), the ids of the
    kernels of `model` that compute that group, or None where none match."""
    graph = model.graph
    readers: dict[str, list[int]] = defaultdict(list)
    for kernel in graph.kernels:
        for name in dict.fromkeys(ref.name for ref in kernel.inputs if ref.kind != "constant"):
            readers[name].append(kernel.id)
    tensors = list(graph.inputs) + [ref for kernel in graph.kernels for ref in kernel.outputs]
    taken: set[int] = set()
    found: list[frozenset[int] | None] = []
    for parameter in groups.graph.inputs:
        source = _read_tensor(groups.graph, parameter)
        own = [groups.graph.kernels[kernel] for kernel in groups.graph.reading(source.name)]
        search = _Search(own, source.name, groups, model, readers)
        match = next((kernels for root in tensors if (root.shape, root.dtype) == (source.shape, source.dtype)
                      for kernels in [search.match(0, {source.name: root}, taken)] if kernels is not None),
                     None)
        found.append(match)
        taken |= match or set()
    return found


def _read_tensor(graph: KernelGraph, source: TensorRef) -> TensorRef:
    """`source`, or while one kernel of one result alone reads it, that result."""
    while True:
        readers = [kernel for kernel in graph.kernels
                   if any(ref.name == source.name for ref in kernel.inputs)]
        if len(readers) != 1 or len(readers[0].outputs) != 1:
            return source
        source = readers[0].outputs[0]


class _Search:
    """Matching one group's kernels (`own`, in order, depending on tensor `source` of `groups`) in `model`."""

    def __init__(self, own: list[Kernel], source: str, groups: Lowered, model: Lowered,
                 readers: dict[str, list[int]]):
        self.own, self.source, self.groups, self.model, self.readers = own, source, groups, model, readers

    def match(self, index: int, tensors: dict[str, TensorRef], taken: set[int]) -> frozenset[int] | None:
        """Kernels of the model (none in `taken`) that compute `own[index:]` in order, `tensors` mapping the
        names of the group's graph to the model's tensors matched so far: every kernel that reads `source`
        (a member) and each later one that matches somewhere; None where a member matches nowhere."""
        if index == len(self.own):
            return frozenset()
        kernel = self.own[index]
        first = next((ref for ref in kernel.inputs if ref.name in tensors), None)
        for candidate in self.readers.get(tensors[first.name].name, ()) if first else ():
            other = self.model.graph.kernels[candidate]
            if candidate in taken or not self.same(kernel, other, tensors):
                continue
            mapped = {**tensors, **{mine.name: theirs for mine, theirs in zip(kernel.outputs, other.outputs)}}
            matched = self.match(index + 1, mapped, taken | {candidate})
            if matched is not None:
                return matched | {candidate}
        if any(ref.name == self.source for ref in kernel.inputs):
            return None
        return self.match(index + 1, tensors, taken)

    def same(self, kernel: Kernel, other: Kernel, tensors: dict[str, TensorRef]) -> bool:
        """Whether `other` computes what `kernel` does on the tensors matched to its inputs."""
        if (kernel.workload, len(kernel.inputs), len(kernel.outputs)) != (
                other.workload, len(other.inputs), len(other.outputs)):
            return False
        for mine, theirs in zip(kernel.inputs, other.inputs):
            if mine.name in tensors:
                if tensors[mine.name].name != theirs.name:
                    return False
            elif mine.kind != "constant" or theirs.kind != "constant" or not np.array_equal(
                    self.groups.constants[mine.name], self.model.constants[theirs.name]):
                return False
        return True
