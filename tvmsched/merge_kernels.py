"""Which kernels of a model's kernel graph are each merge group's, so that dp can weigh merging a group
inside its search (IOS-Both, `schedule.dp.MergeOption`).

Kernels keep no trace of the Relax bindings they came from, so a group's kernels are found by structure.
`merge_choice.groups_module` holds every group alone, reading a parameter of its own; lowered as the model
is, the kernels that depend on group g's parameter (its members with their epilogues, and the concat that
joins exactly them) form a small graph. It is matched in the model's graph: a tensor of the parameter's
shape and dtype, then kernel by kernel in order one of the same workload reading the matched tensors in
the same places (and a constant where it reads one), backtracking over equal candidates. The model may
fuse a member's last steps with what follows (inception_v3's relus join the concat of all its branches):
a kernel after the members that matches nowhere is left out, with what depends on it. Groups are matched
in order, each to the first place that no earlier group took; a group whose members match nowhere is left
out. Where one kernel alone reads a group's parameter (its layout transform to NHWC, which the model does
not repeat between NHWC kernels), the group's tensor is that kernel's result.
"""

from __future__ import annotations

from collections import defaultdict

from tvmsched.graph import Kernel, KernelGraph, TensorRef

CONSTANT_KINDS = ("constant", "param")


def group_kernels(groups: KernelGraph, graph: KernelGraph) -> list[frozenset[int] | None]:
    """Per input of `groups` (the kernel graph of a lowered `groups_module`, one input per group, in order),
    the ids of the kernels of `graph` that compute that group, or None where none match."""
    readers: dict[str, list[int]] = defaultdict(list)
    for kernel in graph.kernels:
        for name in dict.fromkeys(ref.name for ref in kernel.inputs if ref.kind not in CONSTANT_KINDS):
            readers[name].append(kernel.id)
    tensors = list(graph.inputs) + [ref for kernel in graph.kernels for ref in kernel.outputs]
    taken: set[int] = set()
    found: list[frozenset[int] | None] = []
    for parameter in groups.inputs:
        source = _read_tensor(groups, parameter)
        own = _depending(groups, source)
        match = next((kernels for root in tensors if (root.shape, root.dtype) == (source.shape, source.dtype)
                      for kernels in [_match(own, {source.name: root}, graph, readers, taken, source.name)]
                      if kernels is not None), None)
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


def _depending(graph: KernelGraph, source: TensorRef) -> list[Kernel]:
    """The kernels of `graph` that depend on `source`, in order."""
    reached, kernels = {source.name}, []
    for kernel in graph.kernels:
        if any(ref.name in reached for ref in kernel.inputs):
            kernels.append(kernel)
            reached |= {ref.name for ref in kernel.outputs}
    return kernels


def _match(own: list[Kernel], tensors: dict[str, TensorRef], graph: KernelGraph,
           readers: dict[str, list[int]], taken: set[int], source: str) -> frozenset[int] | None:
    """Kernels of `graph` (none in `taken`) that compute `own` in order, `tensors` mapping the names of
    `own`'s graph to the tensors of `graph` matched so far: every kernel that reads `source` (a member)
    and each later one that matches somewhere; None where a member matches nowhere."""
    if not own:
        return frozenset()
    kernel, rest = own[0], own[1:]
    first = next((ref for ref in kernel.inputs if ref.name in tensors), None)
    for candidate in readers.get(tensors[first.name].name, ()) if first else ():
        other = graph.kernels[candidate]
        if candidate in taken or not _same(kernel, other, tensors):
            continue
        mapped = {**tensors, **{mine.name: theirs for mine, theirs in zip(kernel.outputs, other.outputs)}}
        matched = _match(rest, mapped, graph, readers, taken | {candidate}, source)
        if matched is not None:
            return matched | {candidate}
    if any(ref.name == source for ref in kernel.inputs):
        return None
    return _match(rest, tensors, graph, readers, taken, source)


def _same(kernel: Kernel, other: Kernel, tensors: dict[str, TensorRef]) -> bool:
    """Whether `other` computes what `kernel` does on the tensors matched to its inputs."""
    if (kernel.workload, len(kernel.inputs), len(kernel.outputs)) != (
            other.workload, len(other.inputs), len(other.outputs)):
        return False
    for mine, theirs in zip(kernel.inputs, other.inputs):
        if mine.name in tensors:
            if tensors[mine.name].name != theirs.name:
                return False
        elif mine.shape != theirs.shape or {mine.kind, theirs.kind} - set(CONSTANT_KINDS):
            return False
    return True
