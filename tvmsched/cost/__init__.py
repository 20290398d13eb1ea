"""Cost sources: the latency of a stage (kernel groups running concurrently), measured or modeled.
Each is a file registered by name."""

from tvmsched.cost import analytic, measured  # noqa: F401  (register "analytic", "measured")
from tvmsched.cost.base import STAGE_COSTS, StageCost, create_stage_cost

__all__ = ["STAGE_COSTS", "StageCost", "create_stage_cost"]
