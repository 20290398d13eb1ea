"""The sequential schedule: topological order on one stream, the baseline of every speedup."""

from tvmsched.cost import StageCost
from tvmsched.graph import KernelGraph
from tvmsched.schedule.base import Schedule, Scheduler, Stage, register_scheduler


@register_scheduler("sequential")
class SequentialScheduler(Scheduler):
    def schedule(self, graph: KernelGraph, cost: StageCost) -> Schedule:
        return Schedule.from_stages([Stage(((kernel.id,),)) for kernel in graph.kernels])
