"""Executors run an ExecutionPlan with a compiled kernel library; each one is a file registered by name."""

from tvmsched.executor import sequential, streams  # noqa: F401  (register "sequential", "streams", ...)
from tvmsched.executor.base import EXECUTORS, Executor, create_executor, register_executor

__all__ = ["EXECUTORS", "Executor", "create_executor", "register_executor"]
