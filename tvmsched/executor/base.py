"""The Executor interface, the registry of executors, and the device buffers every executor needs."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Mapping

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
from tvmsched.tactics.vendor_op import VendorOp

EXECUTORS: dict[str, type[Executor]] = {}


@dataclass(frozen=True)
class VendorCall:
    """What a kernel's vendor plan computes (`tactics.affine.vendor_call`): its VendorOp, and the folded
    weights it reads after the kernel's parameters, on the host and in their device buffers."""

    vendor_op: VendorOp
    arrays: tuple[np.ndarray, ...]
    buffers: tuple[tvm.runtime.Tensor, ...]


@dataclass(frozen=True)
class Uploads:
    """A kernel's place in the upload order (`Executor._upload_order`): the (host value, device buffer)
    copies made for it, and whether its first launch must wait for uploads (it reads a weight uploaded,
    here or for an earlier kernel); kernel None: copies no kernel of the plan waits for."""

    kernel: int | None
    copies: list[tuple[np.ndarray, tvm.runtime.Tensor]]
    waits: bool


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
                    constants: dict[str, np.ndarray], device: tvm.runtime.Device, folded: dict | None = None,
                    pipelined: bool = True, offloadable: bool = False) -> Executor:
    if name not in EXECUTORS:
        raise TargetError(f"unknown executor '{name}'; available: {', '.join(sorted(EXECUTORS))}")
    plan.validate(graph)
    return EXECUTORS[name](library, graph, plan, constants, device, folded=folded, pipelined=pipelined,
                           offloadable=offloadable)


class Executor(ABC):
    """Runs one inference of `graph` by `plan`: inputs in, outputs out, as numpy arrays.

    Every tensor lives in a device buffer made once at construction (kernel outputs in the plan's pooled
    buffers); `run` copies the inputs into their buffers, launches the kernels and copies the outputs back.
    Each kernel has a launcher, called with the stream to issue it on (None: the device's default stream):
    TVM's function, or its tactic's vendor plan, on the kernel's buffers.
    Input buffers start as zeros, not as whatever the allocator hands back: an executor may launch the plan
    before the first inputs arrive, and garbage indices would fault on the GPU.
    Constants given as numpy arrays are uploaded (`upload`), each kernel's in the order the plan first reads
    them, before the launchers are made, and only those the plan reads; ones given as tensors already on
    the device are shared. A vendor
    plan's folded weights (`tactics.affine`) are taken from `folded`, a cache by kernel that the executor
    fills with what it folds, so that the model's next executor folds nothing. `pipelined` (executors with
    streams): the first inference's kernels each wait for their own weights alone, so that the transfer
    overlaps the computation; otherwise every upload ends before the first inference starts.
    `offloadable` (the `cuda-graph` executor): its device memory can be released while it is kept
    (`CudaGraphExecutor.offload`).
    """

    name = "executor"
    keeps_every_constant = False  # a constant no kernel of the plan reads gets no device buffer

    def __init__(self, library, graph: KernelGraph, plan: ExecutionPlan,
                 constants: dict[str, np.ndarray | tvm.runtime.Tensor], device: tvm.runtime.Device,
                 folded: dict | None = None, pipelined: bool = True, offloadable: bool = False):
        self.library = library
        self.graph = graph
        self.plan = plan
        self.device = device
        self.pipelined = pipelined
        self.offloadable = offloadable
        host = {name: value for name, value in constants.items() if isinstance(value, np.ndarray)}
        self.buffers: dict[str, tvm.runtime.Tensor] = {
            name: value for name, value in constants.items() if name not in host}  # shared; `host`: uploaded
        self.resources = ExitStack()  # releases what the vendor launchers made (and subclasses' own)
        self.libraries: dict[str, VendorLibrary] = {}
        self.vendor_arguments: dict[int, list] = {}  # by kernel: what its plan reads, folded weights too
        try:
            self.empty = self._allocator(host)
            for tensor in graph.inputs:
                self.buffers[tensor.name] = self.empty(tensor.shape, tensor.dtype)
                self.buffers[tensor.name].copyfrom(np.zeros(tensor.shape, tensor.dtype))
            pool = [self.empty((size,), "uint8") for size in plan.memory.buffer_sizes]
            for kernel in graph.kernels:
                for tensor in kernel.written:
                    buffer = pool[plan.memory.tensor_buffers[tensor.name]]
                    self.buffers[tensor.name] = buffer._create_view(tensor.shape, tensor.dtype)
            self.folded = {} if folded is None else folded
            self.calls = {kernel.id: self._folded_call(kernel, host)
                          for kernel in graph.kernels if kernel.implementation_in(plan.tvm_kernels) != "tvm"}
            self.upload(self._upload_order(host, self.calls))
            self.launchers = {kernel.id: self._launcher(kernel, self.calls.get(kernel.id))
                              for kernel in graph.kernels}
        except BaseException:
            self.resources.close()
            raise

    def _allocator(self, host: dict[str, np.ndarray]) -> Callable[[tuple, str], tvm.runtime.Tensor]:
        """What makes the executor's device tensors, `(shape, dtype) -> tensor`: an allocation each."""
        if self.offloadable:
            raise TargetError(f"the '{self.name}' executor cannot release its memory and keep its plan; "
                              f"use the 'cuda-graph' executor")
        return lambda shape, dtype: tvm.runtime.empty(shape, dtype, self.device)

    def _folded_call(self, kernel: Kernel, host: dict[str, np.ndarray]) -> VendorCall:
        """The kernel's tactic's `VendorCall`, its folded weights from `self.folded` (or folded now, from
        the `host` constants where given, else read from the device, and kept there) in new device
        buffers."""
        key = (kernel.id, kernel.tactic.split)
        if key not in self.folded:
            self.folded[key] = vendor_call(kernel, lambda name: host[name] if name in host else
                                           self.buffers[name].numpy(), kernel.tactic.split)
        vendor_op, arrays = self.folded[key]
        return VendorCall(vendor_op, tuple(arrays), tuple(self.empty_like(array) for array in arrays))

    def _upload_order(self, host: dict[str, np.ndarray], calls: dict[int, VendorCall]) -> list[Uploads]:
        """Per kernel in the plan's order, the copies of the weights it reads that no kernel before it
        reads, each constant's buffer made here, and whether it reads any weight uploaded (its own or an
        earlier kernel's); last, under None, the constants no kernel of the plan reads that are outputs of
        the graph (or all, where the executor keeps every constant, `keeps_every_constant`). A constant
        that only a vendor plan's folded weights replace gets no buffer otherwise."""
        order, done = [], set()
        for launch in self.plan.launches:
            kernel = self.graph.kernels[launch.kernel]
            call = calls.get(kernel.id)
            read = kernel.inputs if call is None or kernel.tactic.split is not None else [
                kernel.inputs[position] for position in call.vendor_op.parameters
                if position < len(kernel.inputs)]
            names = list(dict.fromkeys(tensor.name for tensor in read if tensor.name in host))
            folded = list(zip(call.arrays, call.buffers)) if call else []
            copies = [self._placed(name, host[name]) for name in names if name not in done] + folded
            done.update(names)
            order.append(Uploads(kernel.id, copies, bool(names or folded)))
        outputs = {tensor.name for tensor in self.graph.outputs}  # a constant output is read by `run`
        order.append(Uploads(None, [self._placed(name, value) for name, value in host.items()
                                    if name not in done and (self.keeps_every_constant or name in outputs)],
                             False))
        return order

    def _placed(self, name: str, value: np.ndarray) -> tuple[np.ndarray, tvm.runtime.Tensor]:
        """A new device buffer for constant `name`, paired with its host value."""
        self.buffers[name] = self.empty_like(value)
        return value, self.buffers[name]

    def empty_like(self, value: np.ndarray) -> tvm.runtime.Tensor:
        """A new device tensor for the host value `value` (a weight or a folded weight)."""
        return self.empty(value.shape, str(value.dtype))

    def upload(self, order: list[Uploads]) -> None:
        """Copy each host value of `_upload_order` into its device buffer; here one after another, each
        waited for."""
        for uploads in order:
            for value, buffer in uploads.copies:
                buffer.copyfrom(value)

    def _launcher(self, kernel: Kernel, call: VendorCall | None,
                  buffers: Mapping[str, tvm.runtime.Tensor] | None = None) -> Launcher:
        """The kernel on its buffers (inputs, outputs, workspace; `buffers`: by tensor name, default the
        executor's): TVM's function (where it has no tactic, or the plan runs TVM's for it) or the tactic's
        plan for `call`."""
        buffers = self.buffers if buffers is None else buffers
        workspace = [buffers[tensor.name] for tensor in kernel.workspace]
        if call is None:
            arguments = [buffers[tensor.name] for tensor in kernel.inputs + kernel.outputs]
            tvm_workspace = workspace[:len(kernel.tvm_workspace)]
            return tvm_launcher(self.device, self.library[kernel.symbol], arguments + tvm_workspace)
        tactic = kernel.tactic
        if tactic.library not in self.libraries:
            self.libraries[tactic.library] = open_library(tactic)
        return self.tactic_launcher(kernel, tactic, self.libraries[tactic.library], call,
                                    *workspace[len(kernel.tvm_workspace):], buffers=buffers)

    def uploaded_call(self, kernel: Kernel, tactic: Tactic, value: Callable[[str], np.ndarray]) -> VendorCall:
        """`tactic`'s `VendorCall` for the kernel, its weights folded from the constants' host values
        `value(name)` and uploaded now."""
        vendor_op, arrays = vendor_call(kernel, value, tactic.split)
        return VendorCall(vendor_op, tuple(arrays), tuple(tvm.runtime.tensor(array, self.device)
                                                           for array in arrays))

    def tactic_launcher(self, kernel: Kernel, tactic: Tactic, library: VendorLibrary, call: VendorCall,
                        *workspace: tvm.runtime.Tensor,
                        buffers: Mapping[str, tvm.runtime.Tensor] | None = None) -> Launcher:
        """`tactic`'s plan from `library` on the kernel's buffers (`buffers`, default the executor's) and
        `call`'s folded weights, with `workspace` as `tactics.tail.workspace` lists it: the plan's (where it
        needs one), then a split's head value, which the plan writes and the kernel's tail function reads,
        both on the launcher's stream."""
        buffers = self.buffers if buffers is None else buffers
        arguments = [buffers.get(tensor.name)  # None: a constant that its folded weights replace
                     for tensor in kernel.inputs + kernel.outputs]
        head = workspace[-1] if tactic.split is not None else None  # a split: the plan writes, the tail reads
        tail_arguments = [head, *arguments]
        if head is not None:
            arguments[call.vendor_op.output] = head
        arguments += call.buffers
        if buffers is self.buffers:
            self.vendor_arguments[kernel.id] = arguments
        plan = library.launcher(call.vendor_op, tactic.plan, arguments,
                                workspace[0] if tactic.workspace else None, self.resources)
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
        """The constants' device tensors (those the plan reads, unless `keeps_every_constant`), for another
        executor of the graph to share instead of uploading."""
        return {tensor.name: self.buffers[tensor.name] for tensor in self.graph.constants
                if tensor.name in self.buffers}

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
