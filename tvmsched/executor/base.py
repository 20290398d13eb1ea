"""The Executor interface, the registry of executors, and the device buffers every executor needs."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
import tvm_ffi

from tvmsched import measure
from tvmsched.errors import TargetError
from tvmsched.graph import Kernel, KernelGraph
from tvmsched.plan import ExecutionPlan
from tvmsched.registry import registrar
from tvmsched.tactics.affine import vendor_call
from tvmsched.tactics.library import Launcher, Tactic, VendorLibrary, open_library
from tvmsched.tactics.tail import tail_symbol

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


register_executor = registrar(EXECUTORS)  # class decorator: @register_executor("name")


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
    Each kernel has a launcher, called with the stream to issue it on (None: the device's default stream):
    TVM's function, or its tactic's vendor plan, on the kernel's buffers.
    Input buffers start as zeros, not as whatever the allocator hands back: an executor may launch the plan
    before the first inputs arrive (the CUDA graph's warm-up), and garbage indices would fault on the GPU.
    Constants given as numpy arrays are uploaded; ones given as tensors already on the device are shared.
    """

    name = "executor"

    def __init__(self, library, graph: KernelGraph, plan: ExecutionPlan,
                 constants: dict[str, np.ndarray | tvm.runtime.Tensor], device: tvm.runtime.Device):
        self.library = library
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
        self.resources = ExitStack()  # releases what the vendor launchers made (and subclasses' own)
        self.libraries: dict[str, VendorLibrary] = {}
        self.vendor_arguments: dict[int, list] = {}  # by kernel: what its plan reads, folded weights too
        host = {name: value for name, value in constants.items() if isinstance(value, np.ndarray)}
        try:
            self.launchers = {kernel.id: self._launcher(kernel, host) for kernel in graph.kernels}
        except BaseException:
            self.resources.close()
            raise

    def _launcher(self, kernel: Kernel, host: dict[str, np.ndarray]) -> Launcher:
        """The kernel on its buffers (inputs, outputs, workspace): TVM's function (where it has no tactic,
        or the plan runs TVM's for it) or the tactic's plan (its folded weights, `tactics.affine`, from the
        `host` constants where given, else read from the device)."""
        workspace = [self.buffers[tensor.name] for tensor in kernel.workspace]
        if kernel.implementation_in(self.plan.tvm_kernels) == "tvm":
            arguments = [self.buffers[tensor.name] for tensor in kernel.inputs + kernel.outputs]
            tvm_workspace = workspace[:len(kernel.tvm_workspace)]
            return tvm_launcher(self.device, self.library[kernel.symbol], arguments + tvm_workspace)
        tactic = kernel.tactic
        if tactic.library not in self.libraries:
            self.libraries[tactic.library] = open_library(tactic)
        return self.tactic_launcher(kernel, tactic, self.libraries[tactic.library],
                                    lambda name: host[name] if name in host else self.buffers[name].numpy(),
                                    *workspace[len(kernel.tvm_workspace):])

    def tactic_launcher(self, kernel: Kernel, tactic: Tactic, library: VendorLibrary,
                        value: Callable[[str], np.ndarray], *workspace: tvm.runtime.Tensor) -> Launcher:
        """`tactic`'s plan from `library` on the kernel's buffers, its folded weights (`tactics.affine`) made
        from the constants' host values `value(name)`, with `workspace` as `tactics.tail.workspace` lists it:
        the plan's (where it needs one), then a split's head value, which the plan writes and the kernel's
        tail function reads, both on the launcher's stream."""
        arguments = [self.buffers[tensor.name] for tensor in kernel.inputs + kernel.outputs]
        vendor_op, folded = vendor_call(kernel, value, tactic.split)
        head = workspace[-1] if tactic.split is not None else None  # a split: the plan writes, the tail reads
        tail_arguments = [head, *arguments]
        if head is not None:
            arguments[vendor_op.output] = head
        arguments += [tvm.runtime.tensor(array, self.device) for array in folded]
        self.vendor_arguments[kernel.id] = arguments
        plan = library.launcher(vendor_op, tactic.plan, arguments, workspace[0] if tactic.workspace else None,
                                self.resources)
        if head is None:
            return plan
        tail = tvm_launcher(self.device, self.library[tail_symbol(kernel.symbol)], tail_arguments)

        def launch(stream) -> None:
            plan(stream)
            tail(stream)
        return launch

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

    def close(self) -> None:
        """Release the device handles the executor made besides its buffers (its vendor launchers'
        descriptors, the CUDA executors' streams, events and graphs); a second call does nothing."""
        self.resources.close()

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
            start = time.perf_counter()
            self.launchers[launch.kernel](None)
            self.device.sync()
            events.append(TraceEvent(launch.kernel, launch.stream, start * 1e3, time.perf_counter() * 1e3))
        return events


def tvm_launcher(device: tvm.runtime.Device, function, arguments: list) -> Launcher:
    """A launcher of TVM's compiled `function` on `arguments`: on the given stream, or the device's
    default stream for None."""
    def launch(stream) -> None:
        if stream is None:
            function(*arguments)
            return
        with tvm_ffi.use_raw_stream(device, int(stream)):
            function(*arguments)
    return launch
