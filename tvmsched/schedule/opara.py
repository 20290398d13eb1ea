"""Opara's schedule (TC'24): streams from a minimum path cover of the DAG (as Nimble's), and a
resource-aware launch order that alternates, among the ready kernels, the heaviest (most busy work:
time x utilization) with the lightest, so kernels that need few SMs run beside heavy ones instead of
queuing behind them. No stage barriers: only the cross-stream waits make_plan adds.
"""

import heapq

from tvmsched.cost import StageCost
from tvmsched.graph import KernelGraph
from tvmsched.schedule.base import Schedule, Scheduler, register_scheduler
from tvmsched.schedule.nimble import chain_streams, minimum_path_cover


@register_scheduler("opara")
class OparaScheduler(Scheduler):
    def schedule(self, graph: KernelGraph, cost: StageCost) -> Schedule:
        stream_of = chain_streams(minimum_path_cover(graph), self.max_streams)
        order = tuple((kernel, stream_of[kernel]) for kernel in launch_order(graph, busy_work(graph, cost)))
        return Schedule(order, None, {"streams": 1 + max(stream_of.values(), default=-1)})


def busy_work(graph: KernelGraph, cost: StageCost) -> list[float]:
    """Each kernel's time alone x the share of the GPU it keeps busy: the analytic model's utilization
    where the cost source has one, else the kernel's time relative to the longest kernel's."""
    times = [cost.kernel_latency(kernel.id) for kernel in graph.kernels]
    alone = getattr(cost, "alone", None)
    if alone is not None:
        return [time * alone[kernel][1] for kernel, time in enumerate(times)]
    longest = max(times, default=0.0) or 1.0
    return [time * min(1.0, time / longest) for time in times]


def launch_order(graph: KernelGraph, work: list[float]) -> list[int]:
    """A topological order taking, in turn, the ready kernel with the most work and the one with the
    least (ties to the lower id)."""
    waiting_on = {kernel.id: len(graph.dependencies(kernel.id)) for kernel in graph.kernels}
    consumers: dict[int, list[int]] = {}
    for kernel in graph.kernels:
        for producer in graph.dependencies(kernel.id):
            consumers.setdefault(producer, []).append(kernel.id)
    heaviest: list[tuple[float, int]] = []
    lightest: list[tuple[float, int]] = []
    issued: set[int] = set()
    order: list[int] = []

    def make_ready(kernel: int) -> None:
        heapq.heappush(heaviest, (-work[kernel], kernel))
        heapq.heappush(lightest, (work[kernel], kernel))

    for kernel, count in waiting_on.items():
        if count == 0:
            make_ready(kernel)
    while len(order) < len(graph.kernels):
        ready = heaviest if len(order) % 2 == 0 else lightest
        while ready[0][1] in issued:  # issued from the other heap already
            heapq.heappop(ready)
        kernel = heapq.heappop(ready)[1]
        issued.add(kernel)
        order.append(kernel)
        for consumer in consumers.get(kernel, ()):
            waiting_on[consumer] -= 1
            if waiting_on[consumer] == 0:
                make_ready(consumer)
    return order
