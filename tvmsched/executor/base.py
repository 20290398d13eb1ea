"""The Executor interface, the registry of executors, and the device buffers every executor needs."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import tvm

from tvmsched import measure
from tvmsched.errors import TargetError
from tvmsched.graph import KernelGraph
from tvmsched.plan import ExecutionPlan

EXECUTORS: dict[str, type[Executor]] = {}


@dataclass(frozen=True)
class TraceEvent:
    """When one kernel ran in a traced inference, in milliseconds on one clock."""

    kernel: int
    stream: int
    start_ms: float
    end_ms: float


def sample_value(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """A stand-in input: standard-normal floats; zeros for integers and booleans, which may be indices or
    shapes that only in-range values keep valid (a gather of an index out of range faults on the GPU)."""
    if np.dtype(dtype).kind == "f" or dtype.startswith("bfloat"):
        return rng.standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype)


def register_executor(name: str):
    """Class decorator: make an Executor available as `name`."""
    def register(cls: type[Executor]) -> type[Executor]:
        EXECUTORS[name] = cls
        cls.name = name
        return cls
    return register


def create_executor(name: str, library, graph: KernelGraph, plan: ExecutionPlan,
                    constants: dict[str, np.ndarray], device: tvm.runtime.Device) -> Executor:
    if name not in EXECUTORS:
        raise TargetError(f"unknown executor '{name}'; available: {', '.join(sorted(EXECUTORS))}")
    plan.validate(graph)
    return EXECUTORS[name](library, graph, plan, constants, device)


class Executor(ABC):
    """Runs one inference of `graph` by `plan`: inputs in, outputs out, as numpy arrays.

    Every tensor lives in a device buffer made once at construction (kernel outputs in the plan's pooled
    buffers); `run` copies the inputs into their buffers, launches the kernels and copies the outputs back.
    Input buffers start as zeros, not as whatever the allocator hands back: an executor may launch the plan
    before the first inputs arrive (the CUDA graph's warm-up), and garbage indices would fault on the GPU.
    Constants given as numpy arrays are uploaded; ones given as tensors already on the device are shared.
    """

    name = "executor"

    def __init__(self, library, graph: KernelGraph, plan: ExecutionPlan,
                 constants: dict[str, np.ndarray | tvm.runtime.Tensor], device: tvm.runtime.Device):
        self.graph = graph
        self.plan = plan
        self.device = device
        self.buffers: dict[str, tvm.runtime.Tensor] = {
            name: value if isinstance(value, tvm.runtime.Tensor) else tvm.runtime.tensor(value, device)
            for name, value in constants.items()}
        for tensor in graph.inputs:
            self.buffers[tensor.name] = tvm.runtime.empty(tensor.shape, tensor.dtype, device)
            self.buffers[tensor.name].copyfrom(np.zeros(tensor.shape, tensor.dtype))
        pool = [tvm.runtime.empty((size,), "uint8", device) for size in plan.memory.buffer_sizes]
        for kernel in graph.kernels:
            for tensor in kernel.written:
                buffer = pool[plan.memory.tensor_buffers[tensor.name]]
                self.buffers[tensor.name] = buffer._create_view(tensor.shape, tensor.dtype)
        self.functions = {symbol: library[symbol] for symbol in {kernel.symbol for kernel in graph.kernels}}

    def kernel_call(self, kernel_id: int) -> tuple[object, list[tvm.runtime.Tensor]]:
        """The kernel's compiled function and the buffers it is called with (inputs, outputs, workspace)."""
        kernel = self.graph.kernels[kernel_id]
        arguments = [self.buffers[tensor.name] for tensor in kernel.inputs + kernel.written]
        return self.functions[kernel.symbol], arguments

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        for tensor, value in zip(self.graph.inputs, inputs):
            self.buffers[tensor.name].copyfrom(value)
        self.launch()
        self.synchronize()
        return [self.buffers[tensor.name].numpy() for tensor in self.graph.outputs]

    @property
    def device_constants(self) -> dict[str, tvm.runtime.Tensor]:
        """The constants' device tensors, for another executor of the graph to share instead of uploading."""
        return {tensor.name: self.buffers[tensor.name] for tensor in self.graph.constants}

    def close(self) -> None:  # noqa: B027  (not abstract: device buffers are freed with the executor)
        """Release the device handles the executor made besides its buffers (the CUDA executors' streams,
        events and graphs); a second call does nothing."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *error) -> None:
        self.close()

    @abstractmethod
    def launch(self) -> None:
        """Issue every kernel of the plan once (asynchronously on GPU)."""

    def synchronize(self) -> None:
        """Wait until everything `launch` issued has completed."""
        self.device.sync()

    def time_launches(self, repeat: int) -> list[float]:
        """Milliseconds of each of `repeat` inferences (host clock around launch and synchronize)."""
        def inference() -> None:
            self.launch()
            self.synchronize()
        return measure.host_times(inference, repeat)

    def trace(self) -> list[TraceEvent]:
        """One inference with each kernel timed by the host clock, in plan order (waiting for each)."""
        events = []
        for launch in self.plan.launches:
            function, arguments = self.kernel_call(launch.kernel)
            start = time.perf_counter()
            function(*arguments)
            self.device.sync()
            events.append(TraceEvent(launch.kernel, launch.stream, start * 1e3, time.perf_counter() * 1e3))
        return events
