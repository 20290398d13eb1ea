"""Chain decomposition onto at most K streams: a kernel continues the stream of its first producer whose
chain it can extend, otherwise starts a new stream while fewer than K exist, otherwise joins the stream
whose chain ended longest ago (most likely idle)."""

from tvmsched.cost import StageCost
from tvmsched.graph import KernelGraph
from tvmsched.schedule.base import Schedule, Scheduler, register_scheduler


@register_scheduler("chains")
class ChainScheduler(Scheduler):
    def schedule(self, graph: KernelGraph, cost: StageCost) -> Schedule:
        stream_of: dict[int, int] = {}
        tail: list[int] = []  # the last kernel issued on each stream
        for kernel in graph.kernels:
            extendable = [producer for producer in sorted(graph.dependencies(kernel.id))
                          if tail[stream_of[producer]] == producer]
            if extendable:
                stream = stream_of[extendable[0]]
            elif len(tail) < self.max_streams:
                stream = len(tail)
                tail.append(kernel.id)
            else:
                stream = min(range(len(tail)), key=tail.__getitem__)
            stream_of[kernel.id] = stream
            tail[stream] = kernel.id
        return Schedule(tuple((kernel.id, stream_of[kernel.id]) for kernel in graph.kernels))
