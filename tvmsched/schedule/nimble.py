"""Nimble's stream assignment (NeurIPS'20): a minimum path cover of the DAG, one stream per path.

A maximum matching on the bipartite graph of (producer out, consumer in) for every edge keeps as many
direct dependencies as possible on one stream, so the cover has the fewest paths and the plan the fewest
cross-stream waits. Paths beyond max_streams share streams.
"""

from tvmsched.cost import StageCost
from tvmsched.graph import KernelGraph
from tvmsched.schedule.base import Schedule, Scheduler, register_scheduler


@register_scheduler("nimble")
class NimbleScheduler(Scheduler):
    def schedule(self, graph: KernelGraph, cost: StageCost) -> Schedule:
        chains = minimum_path_cover(graph)
        stream_of = chain_streams(chains, self.max_streams)
        order = tuple((kernel.id, stream_of[kernel.id]) for kernel in graph.kernels)
        return Schedule(order, None, {"chains": len(chains), "streams": min(len(chains), self.max_streams)})


def minimum_path_cover(graph: KernelGraph) -> list[list[int]]:
    """The fewest vertex-disjoint paths of `graph`'s edges covering every kernel, ordered by first kernel."""
    successors: list[list[int]] = [[] for _ in graph.kernels]
    for kernel in graph.kernels:
        for producer in graph.dependencies(kernel.id):
            successors[producer].append(kernel.id)
    for targets in successors:
        targets.sort()
    successor_of = maximum_matching(successors)
    has_predecessor = {successor for successor in successor_of if successor != -1}
    chains = []
    for start in (kernel.id for kernel in graph.kernels if kernel.id not in has_predecessor):
        chain = [start]
        while successor_of[chain[-1]] != -1:
            chain.append(successor_of[chain[-1]])
        chains.append(chain)
    return chains


def maximum_matching(successors: list[list[int]]) -> list[int]:
    """Hopcroft–Karp on the bipartite graph (u, v) for v in successors[u]: the partner of each u, or -1."""
    size = len(successors)
    partner_of_left, partner_of_right = [-1] * size, [-1] * size
    while True:
        layer = _alternating_layers(successors, partner_of_left, partner_of_right)
        if layer is None:
            return partner_of_left
        for root in range(size):
            if partner_of_left[root] == -1:
                _augment_from(root, successors, layer, partner_of_left, partner_of_right)


def _alternating_layers(successors, partner_of_left, partner_of_right) -> list[int] | None:
    """BFS layers of left vertices along alternating paths from the free ones; None if no path ends free."""
    layer = [-1] * len(successors)
    queue = [left for left in range(len(successors)) if partner_of_left[left] == -1]
    for left in queue:
        layer[left] = 0
    reaches_free = False
    for left in queue:  # the queue grows while it is walked
        for right in successors[left]:
            matched = partner_of_right[right]
            if matched == -1:
                reaches_free = True
            elif layer[matched] == -1:
                layer[matched] = layer[left] + 1
                queue.append(matched)
    return layer if reaches_free else None


def _augment_from(root, successors, layer, partner_of_left, partner_of_right) -> None:
    """Depth-first (without recursion: long chains are common) along the layers to a free right vertex,
    then flip the path; left vertices found to lead nowhere leave the layering for this phase."""
    next_edge = {root: 0}
    path = [root]
    while path:
        left = path[-1]
        if next_edge[left] == len(successors[left]):
            layer[left] = -1
            path.pop()
            continue
        right = successors[left][next_edge[left]]
        next_edge[left] += 1
        matched = partner_of_right[right]
        if matched == -1:
            for step in path:
                chosen = successors[step][next_edge[step] - 1]
                partner_of_left[step], partner_of_right[chosen] = chosen, step
            return
        if layer[matched] == layer[left] + 1:
            next_edge[matched] = 0
            path.append(matched)


def chain_streams(chains: list[list[int]], max_streams: int) -> dict[int, int]:
    """The stream of each kernel: a stream per chain while fewer than max_streams exist, then each further
    chain (by first kernel) joins the stream whose last kernel is earliest, the one most likely idle."""
    stream_of: dict[int, int] = {}
    last_kernel: list[int] = []
    for chain in chains:
        if len(last_kernel) < max_streams:
            stream = len(last_kernel)
            last_kernel.append(chain[-1])
        else:
            stream = min(range(len(last_kernel)), key=last_kernel.__getitem__)
            last_kernel[stream] = max(last_kernel[stream], chain[-1])
        stream_of.update((kernel, stream) for kernel in chain)
    return stream_of
