"""The sequential executor: the plan's kernels one after another on the device's default stream."""

from __future__ import annotations

from tvmsched.executor.base import Executor, register_executor


@register_executor("sequential")
class SequentialExecutor(Executor):
    """Launches in plan order on one stream; the reference every faster executor must agree with."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ordered = [self.launchers[launch.kernel] for launch in self.plan.launches]

    def launch(self) -> None:
        for launcher in self.ordered:
            launcher(None)
