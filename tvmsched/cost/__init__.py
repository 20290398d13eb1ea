"""Cost sources: the latency of a stage (kernel groups running concurrently), measured or modeled.
Each is a file registered by name."""

from tvmsched.cost import analytic, measured  # noqa: F401  (register "analytic", "measured")
from tvmsched.cost.base import COST_MODELS, CostModel, create_cost_model

__all__ = ["COST_MODELS", "CostModel", "create_cost_model"]
