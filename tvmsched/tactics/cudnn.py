"""cuDNN through its Python frontend (`nvidia-cudnn-frontend`): a fused conv2d kernel, or a half-precision
matmul kernel, as one cuDNN graph, the anchor followed by its epilogue as pointwise nodes.

The candidates are the first plans cuDNN's heuristics (modes A, then FALLBACK) rank for the graph that
build; plans are built one at a time as they are needed, since building one of a runtime-fusion engine
compiles its kernel. A plan is named by cuDNN's engine-and-knobs string, which a later run finds again in
the same ranking. cuDNN decides
what it fuses: in fp32 it takes conv2d alone, with a bias, and with a bias and then relu (not relu alone: a
relu straight after the convolution gets a bias of zeros), and declines a residual add, a sigmoid or a
per-channel scale. cuDNN keeps float32 inside the graph and rounds once, to the output's type: casts to
that type or to float32 are left out of the graph, a kernel that rounds to another type on the way is
declined (`VendorOp.rounds_between`).
In fp32 the engines with cuDNN's tensor-core numerical note (TF32) are deselected, as PyTorch does with TF32
off: heuristics rank them first, so without the filter every candidate was one the selection's numeric
check rejects (measured: resnet50 at batch 16, all eight best plans 3e-4 off, 53 convolutions left to TVM).
The check still rejects any plan whose result differs from TVM's kernel. Why cuDNN declines a graph is
logged at DEBUG level (logger `tvmsched.tactics`).
"""

from __future__ import annotations

import logging
import threading
from contextlib import ExitStack

import numpy as np
import tvm

from tvmsched.tactics.library import Candidate, Launcher, VendorLibrary, register_library
from tvmsched.tactics.vendor_op import BatchedMatmul, Conv2d, EpilogueOp, Matmul, VendorOp

TYPES = {"float32": "FLOAT", "float16": "HALF", "bfloat16": "BFLOAT16"}  # cuDNN's data_type names
LOWEST = -3.4e38  # a clip without a lower bound
ZEROS = -1  # the operand position of the zero bias that precedes a relu or clip straight after the conv
LOGGER = logging.getLogger("tvmsched.tactics")


def _cudnn():
    import cudnn

    return cudnn


@register_library("cudnn")
class CudnnLibrary(VendorLibrary):
    """cuDNN on the current device: one handle, and each VendorOp's graph built once with all its plans."""

    def __init__(self):
        self.handle = _cudnn().create_handle()
        self.lock = threading.Lock()  # a handle's stream is set, then used: one launch at a time
        self.graphs: dict[VendorOp, _Graph | None] = {}
        self.zeros: dict[tuple, object] = {}  # zero biases by (channels, dtype, device)

    @staticmethod
    def version() -> str | None:
        try:
            return str(_cudnn().backend_version())
        except Exception:  # noqa: BLE001  (not installed, or its shared library is missing)
            return None

    def candidates(self, vendor_op: VendorOp, limit: int) -> list[Candidate]:
        graph = self._graph(vendor_op)
        return graph.candidates(limit) if graph else []

    def launcher(self, vendor_op: VendorOp, plan: str, arguments: list, workspace,
                 owner: ExitStack) -> Launcher:
        graph = self._graph(vendor_op)
        index = graph.index_of(plan) if graph else None
        if index is None:
            raise LookupError(f"cuDNN offers no plan '{plan}' for {vendor_op.name} here; rebuild the model")
        pack = {tensor: (self._zeros(vendor_op.anchor, arguments[0].device) if position == ZEROS
                         else arguments[position]).data_ptr() for position, tensor in graph.operands.items()}
        workspace_pointer = workspace.data_ptr() if workspace is not None else None
        cudnn, handle, lock = _cudnn(), self.handle, self.lock

        def launch(stream) -> None:
            with lock:
                cudnn.set_stream(handle, int(stream or 0))  # None: the default stream, as TVM's functions
                graph.graph.execute_plan_at_index(pack, workspace_pointer, index, handle)
        return launch

    def _zeros(self, anchor: Conv2d, device):
        """A zero bias for the anchor's output channels on `device` (kept for the library's lifetime)."""
        channels = anchor.out_shape[anchor.channel_axis]
        key = (channels, anchor.accumulate_dtype, str(device))
        if key not in self.zeros:
            self.zeros[key] = tvm.runtime.tensor(np.zeros(channels, anchor.accumulate_dtype), device)
        return self.zeros[key]

    def _graph(self, vendor_op: VendorOp) -> _Graph | None:
        if vendor_op not in self.graphs:
            self.graphs[vendor_op] = _Graph.build(vendor_op, self.handle)
        return self.graphs[vendor_op]


class _Graph:
    """A VendorOp's cuDNN graph with its plans ranked (built on first use: a plan of a runtime-fusion engine
    compiles a kernel): its operand tensors by kernel parameter position, its plans by name."""

    def __init__(self, graph, operands: dict, indices: dict[str, int]):
        self.graph = graph
        self.operands = operands
        self.indices = indices  # in the heuristics' order
        self.built: dict[int, Candidate | None] = {}

    def candidates(self, limit: int) -> list[Candidate]:
        """The first `limit` plans that build, in the heuristics' order."""
        found = []
        for index in self.indices.values():
            if len(found) == limit:
                break
            candidate = self.build_plan(index)
            if candidate is not None:
                found.append(candidate)
        return found

    def index_of(self, plan: str) -> int | None:
        """The index of plan `plan`, built; None where the graph has no such plan or it does not build."""
        index = self.indices.get(plan)
        return index if index is not None and self.build_plan(index) else None

    def build_plan(self, index: int) -> Candidate | None:
        if index not in self.built:
            try:
                self.graph.build_plan_at_index(index)
                self.built[index] = Candidate(self.graph.get_plan_name_at_index(index),
                                              int(self.graph.get_workspace_size_plan_at_index(index)))
            except Exception:  # noqa: BLE001  (a plan that does not build)
                self.built[index] = None
        return self.built[index]

    @classmethod
    def build(cls, vendor_op: VendorOp, handle) -> _Graph | None:
        """The graph, or None where cuDNN does not take the op (unsupported anchor, epilogue or dtype)."""
        cudnn = _cudnn()
        anchor = vendor_op.anchor
        if anchor.dtype not in TYPES or vendor_op.out_dtype not in TYPES or vendor_op.rounds_between:
            return None
        layout = _Layout(anchor) if isinstance(anchor, Conv2d) else _MatmulLayout.of(anchor)
        if layout is None:
            return None
        try:
            graph, operands = _describe(vendor_op, layout, handle)
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            graph.check_support()
        except Exception as error:  # noqa: BLE001  (cuDNN raises its own error types for a graph it declines)
            LOGGER.debug("cuDNN declines %s: %s", vendor_op.name, str(error).strip()[:300])
            return None
        indices = {}
        for index in range(graph.get_execution_plan_count()):
            try:
                indices.setdefault(graph.get_plan_name_at_index(index), index)
            except Exception:  # noqa: BLE001  (a plan check_support dropped)
                continue
        return cls(graph, operands, indices) if indices else None


def _describe(vendor_op: VendorOp, layout, handle) -> tuple[object, dict]:
    """The VendorOp's cuDNN graph (not yet validated) and its tensors by kernel parameter position."""
    cudnn = _cudnn()
    anchor = vendor_op.anchor
    types = {dtype: getattr(cudnn.data_type, name) for dtype, name in TYPES.items()}
    graph = cudnn.pygraph(io_data_type=types[anchor.dtype], intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    operands = {}

    def operand(position: int, dims: list[int], strides: list[int], dtype: str):
        if position in operands:  # one buffer in two roles: the variant pack binds a tensor per parameter
            raise ValueError(f"kernel parameter {position} is read twice")
        operands[position] = graph.tensor(dim=dims, stride=strides, data_type=types[dtype],
                                          name=f"param{position}")
        return operands[position]

    image = operand(vendor_op.data, *layout.image, anchor.dtype)
    weight = operand(vendor_op.weight, *layout.weight, anchor.dtype)
    if isinstance(anchor, Matmul):
        value = graph.matmul(A=image, B=weight, compute_data_type=cudnn.data_type.FLOAT, name="matmul")
    else:
        value = graph.conv_fprop(image=image, weight=weight, pre_padding=list(anchor.padding[:2]),
                                 post_padding=list(anchor.padding[2:]), stride=list(anchor.strides),
                                 dilation=list(anchor.dilation), compute_data_type=cudnn.data_type.FLOAT,
                                 name="conv")
    leading = vendor_op.epilogue[0].kind if vendor_op.epilogue else None
    if isinstance(anchor, Conv2d) and leading in ("relu", "clip"):
        zeros = operand(ZEROS, *layout.operand(EpilogueOp("bias", anchor.accumulate_dtype, ZEROS, 1)),
                        anchor.accumulate_dtype)
        value = graph.add(a=value, b=zeros, name="zero_bias")
    for step, op in enumerate(vendor_op.epilogue):
        if op.kind == "cast":
            continue  # between floats: cuDNN's intermediates stay float32; the last gives the output's
        other = None if op.operand is None else operand(op.operand, *layout.operand(op), op.dtype)
        value = _pointwise(graph, op, value, other, f"op{step}")
    value.set_output(True).set_data_type(types[vendor_op.out_dtype]).set_stride(layout.output[1])
    operands[vendor_op.output] = value
    if anchor.dtype == "float32":
        graph.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE])  # TF32
    return graph, operands


class _Layout:
    """cuDNN describes every conv tensor by NCHW-ordered dims with the strides of its real layout."""

    def __init__(self, anchor: Conv2d):
        self.anchor = anchor
        self.channels_last = anchor.layout == "NHWC"
        self.image = self._describe(anchor.data_shape)
        self.weight = self._describe(anchor.weight_shape)
        self.output = self._describe(anchor.out_shape)

    def _describe(self, shape: tuple[int, ...]) -> tuple[list[int], list[int]]:
        """(dims, strides) in N, C, H, W order of a tensor stored as `shape` in the anchor's layout."""
        strides = [1] * len(shape)
        for axis in range(len(shape) - 2, -1, -1):
            strides[axis] = strides[axis + 1] * shape[axis + 1]
        if not self.channels_last:
            return list(shape), strides
        order = (0, 3, 1, 2)  # NHWC (or OHWI) positions of N, C, H, W
        return [shape[axis] for axis in order], [strides[axis] for axis in order]

    def operand(self, op: EpilogueOp) -> tuple[list[int], list[int]]:
        """A bias varies along the channel axis only; any other operand has the output's shape."""
        if op.axis is None:
            return self.output
        channels = self.output[0][1]
        return [1, channels, 1, 1], [channels, 1, 1, 1]


class _MatmulLayout:
    """A matmul's tensors as cuDNN's batched matrices [batch, rows, columns] (`Matmul.batched`). In fp32
    cuDNN's one matmul engine was 2.9e-4 off exact (TF32-like, with tensor-core plans deselected) and it
    declined a bias (H100, 2026-11-26): fp32 matmuls are declined here, cuBLASLt computes them."""

    def __init__(self, product: BatchedMatmul):
        batch, m, k, n = product.batch, product.m, product.k, product.n
        self.image = [batch, m, k], [product.a_stride, k, 1]
        self.weight = [batch, k, n], [product.b_stride, n, 1]
        self.output = [batch, m, n], [m * n, n, 1]
        self.columns = n

    @classmethod
    def of(cls, anchor: Matmul) -> _MatmulLayout | None:
        product = anchor.batched()
        return cls(product) if anchor.dtype != "float32" and product is not None else None

    def operand(self, op: EpilogueOp) -> tuple[list[int], list[int]]:
        """A bias varies along the last axis only; any other operand has the output's shape."""
        if op.axis is None:
            return self.output
        return [1, 1, self.columns], [self.columns, self.columns, 1]


def _pointwise(graph, op: EpilogueOp, value, other, name: str):
    """The cuDNN node of one epilogue op on `value` (and its operand tensor `other`)."""
    if op.kind in ("bias", "residual"):
        return graph.add(a=value, b=other, name=name)
    if op.kind in ("subtract", "multiply", "divide"):
        return getattr(graph, {"subtract": "sub", "multiply": "mul", "divide": "div"}[op.kind])(
            a=value, b=other, name=name)
    if op.kind == "relu":
        return graph.relu(input=value, name=name)
    if op.kind == "clip":
        low, high = op.bounds
        return graph.relu(input=value, lower_clip=LOWEST if low is None else low, upper_clip=high, name=name)
    if op.kind == "sigmoid":
        return graph.sigmoid(input=value, name=name)
    if op.kind == "silu":
        return graph.swish(input=value, name=name)
    if op.kind == "gelu":
        return graph.gelu(input=value, name=name)
    raise ValueError(f"no cuDNN node for epilogue op '{op.kind}'")
