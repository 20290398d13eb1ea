"""KernelGraph: the fused kernels of a lowered model as plain data, shared by every later stage.

Nodes are kernels (one `call_tir` each) with their input and output tensors, FLOPs and bytes estimates;
edges are the tensors between them. Ids follow the program order, which is a topological order. A kernel
whose compiled schedule needs scratch memory in global memory also has workspace tensors (`with_workspace`,
after the build): device buffers only it uses, planned like its outputs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir.analysis import estimate_tir_flops

from tvmsched.errors import GraphError
from tvmsched.lower import LoweredModule, is_call_tir
from tvmsched.tactics import tail
from tvmsched.tactics.library import Tactic
from tvmsched.tactics.vendor_op import VendorOp

# 2: kernels have workspace tensors; 3: and vendor ops and tactics (a graph of schema 2 has none); 4: a kernel
# with a tactic keeps TVM's workspace before the tactic's (in 3 it had the tactic's alone: such a graph is
# refused, since TVM's function could not run on it)
SCHEMA = 4
TENSOR_KINDS = ("input", "param", "constant", "kernel")


@dataclass(frozen=True)
class TensorRef:
    """A tensor: a graph input, a constant (weights), or output `index` of kernel `producer`."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str
    producer: int | None = None
    index: int = 0

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "kind": self.kind,
                "producer": self.producer, "index": self.index}

    @classmethod
    def from_json(cls, data: dict) -> TensorRef:
        return cls(data["name"], tuple(data["shape"]), data["dtype"], data["kind"], data["producer"],
                   data["index"])


@dataclass(frozen=True)
class Kernel:
    """One fused kernel: the PrimFunc `symbol` applied to `inputs`, writing `outputs`, with the scratch
    tensors of its implementations in `workspace` (TVM's function is called as `symbol(*inputs, *outputs,
    *tvm_workspace)`); `vendor_op` says what a vendor library would compute for it, where one could, and
    `tactic` which vendor plan runs instead of TVM's function, where one was chosen (its workspace then
    follows TVM's)."""

    id: int
    symbol: str
    workload: str
    inputs: tuple[TensorRef, ...]
    outputs: tuple[TensorRef, ...]
    flops: int
    bytes: int
    op_kinds: tuple[str, ...]
    workspace: tuple[TensorRef, ...] = ()
    vendor_op: VendorOp | None = None
    tactic: Tactic | None = None

    @property
    def implementation(self) -> str:
        """Who computes the kernel: "tvm", the tactic's library, or both ("cudnn+tvm": a split tactic)."""
        if self.tactic is None:
            return "tvm"
        return self.tactic.library + "+tvm" * (self.tactic.split is not None)

    def implementation_in(self, tvm_kernels: tuple[int, ...]) -> str:
        """Who computes the kernel in a plan whose `tvm_kernels` (`ExecutionPlan.tvm_kernels`) run TVM's
        function instead of their tactic."""
        return "tvm" if self.id in tvm_kernels else self.implementation

    @property
    def tvm_workspace(self) -> tuple[TensorRef, ...]:
        """The workspace TVM's function takes: all of it without a tactic, else what precedes the tactic's
        (`tactics.tail.workspace`), which a kernel keeps so that either implementation can run."""
        if self.tactic is None:
            return self.workspace
        return self.workspace[:len(self.workspace) - len(tail.workspace(self, self.tactic))]

    @property
    def written(self) -> tuple[TensorRef, ...]:
        """Every tensor the kernel writes, each needing a buffer: its outputs, then its workspace."""
        return self.outputs + self.workspace

    def to_json(self) -> dict:
        return {"id": self.id, "symbol": self.symbol, "workload": self.workload,
                "inputs": [tensor.to_json() for tensor in self.inputs],
                "outputs": [tensor.to_json() for tensor in self.outputs],
                "flops": self.flops, "bytes": self.bytes, "op_kinds": list(self.op_kinds),
                "workspace": [tensor.to_json() for tensor in self.workspace],
                "vendor_op": self.vendor_op and self.vendor_op.to_json(),
                "tactic": self.tactic and self.tactic.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> Kernel:
        return cls(data["id"], data["symbol"], data["workload"],
                   tuple(TensorRef.from_json(tensor) for tensor in data["inputs"]),
                   tuple(TensorRef.from_json(tensor) for tensor in data["outputs"]),
                   data["flops"], data["bytes"], tuple(data["op_kinds"]),
                   tuple(TensorRef.from_json(tensor) for tensor in data["workspace"]),
                   data.get("vendor_op") and VendorOp.from_json(data["vendor_op"]),
                   data.get("tactic") and Tactic.from_json(data["tactic"]))


@dataclass(frozen=True)
class KernelGraph:
    """The kernels in topological order, the graph's inputs and outputs, and its constants' specs."""

    kernels: tuple[Kernel, ...]
    inputs: tuple[TensorRef, ...]
    outputs: tuple[TensorRef, ...]
    constants: tuple[TensorRef, ...]

    @cached_property
    def hash(self) -> str:
        """Content hash of structure, shapes, kernel workloads and tactics (not constant values, nor vendor
        ops: they follow from the workloads and constants; a graph without tactics hashes as graph schema 2
        did, so plans and measurements keyed by the hash before vendor ops were recognized stay valid)."""
        data = {**self.to_json(), "schema": 2}
        for kernel in data["kernels"]:
            del kernel["vendor_op"]
            if kernel["tactic"] is None:
                del kernel["tactic"]
        payload = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(payload).hexdigest()[:16]

    def with_workspace(self, workspace: dict[str, tuple[tuple[tuple[int, ...], str], ...]]) -> KernelGraph:
        """The graph with workspace tensors for the kernels whose symbol `workspace` lists, as the build
        found them: (shape, dtype) of each scratch buffer its schedule allocates in global memory."""
        def tensors(kernel: Kernel) -> tuple[TensorRef, ...]:
            return tuple(TensorRef(f"k{kernel.id}.workspace{index}", shape, dtype, "kernel", kernel.id,
                                   len(kernel.outputs) + index)
                         for index, (shape, dtype) in enumerate(workspace.get(kernel.symbol, ())))
        kernels = tuple(replace(kernel, workspace=tensors(kernel)) for kernel in self.kernels)
        return replace(self, kernels=kernels)

    def implementations(self, tvm_kernels: tuple[int, ...] = ()) -> dict[str, int]:
        """How many kernels each implementation computes ("tvm", or a vendor library's name), the kernels
        `tvm_kernels` (a plan's, `ExecutionPlan.tvm_kernels`) counted as TVM's."""
        counts: dict[str, int] = {}
        for kernel in self.kernels:
            implementation = kernel.implementation_in(tvm_kernels)
            counts[implementation] = counts.get(implementation, 0) + 1
        return counts

    def with_tactics(self, tactics: dict[int, Tactic]) -> KernelGraph:
        """The graph with the kernels `tactics` names running their tactic, each keeping TVM's workspace and
        given the tactic's after it (`tactics.tail.workspace`: the plan's bytes, a split's head value)."""
        def chosen(kernel: Kernel) -> Kernel:
            tactic, kept = tactics[kernel.id], kernel.tvm_workspace
            shapes = enumerate(tail.workspace(kernel, tactic), len(kept))
            workspace = tuple(TensorRef(f"k{kernel.id}.workspace{index}", shape, dtype, "kernel", kernel.id,
                                        len(kernel.outputs) + index) for index, (shape, dtype) in shapes)
            return replace(kernel, tactic=tactic, workspace=kept + workspace)
        kernels = tuple(chosen(kernel) if kernel.id in tactics else kernel for kernel in self.kernels)
        return replace(self, kernels=kernels)

    def dependencies(self, kernel_id: int) -> set[int]:
        """Ids of the kernels whose outputs `kernel_id` reads."""
        return {tensor.producer for tensor in self.kernels[kernel_id].inputs if tensor.kind == "kernel"}

    def reading(self, name: str) -> list[int]:
        """Ids, in order, of the kernels that depend on tensor `name` (a graph input or a kernel's output),
        directly or not."""
        found: set[int] = set()
        for kernel in self.kernels:
            if any(tensor.kind != "constant" and tensor.name == name for tensor in kernel.inputs) or (
                    self.dependencies(kernel.id) & found):
                found.add(kernel.id)
        return sorted(found)

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "kernels": [kernel.to_json() for kernel in self.kernels],
                "inputs": [tensor.to_json() for tensor in self.inputs],
                "outputs": [tensor.to_json() for tensor in self.outputs],
                "constants": [tensor.to_json() for tensor in self.constants]}

    @classmethod
    def from_json(cls, data: dict) -> KernelGraph:
        schema = data.get("schema")
        if schema not in (2, 3, SCHEMA) or (schema == 3 and any(kernel.get("tactic")
                                                                 for kernel in data["kernels"])):
            raise GraphError(f"kernel graph schema {schema} is not {SCHEMA}; rebuild the model")
        return cls(tuple(Kernel.from_json(kernel) for kernel in data["kernels"]),
                   tuple(TensorRef.from_json(tensor) for tensor in data["inputs"]),
                   tuple(TensorRef.from_json(tensor) for tensor in data["outputs"]),
                   tuple(TensorRef.from_json(tensor) for tensor in data["constants"]))


def extract(lowered: LoweredModule, input_names: list[str]) -> tuple[KernelGraph, dict[str, np.ndarray]]:
    """Build the KernelGraph of `lowered.module["main"]`, and the values of its constants by name."""
    return _Extractor(lowered, input_names).run()


class _Extractor:
    """Walks `main`'s bindings once, resolving aliases, tuples and constants to the tensors they are."""

    def __init__(self, lowered: LoweredModule, input_names: list[str]):
        self.lowered = lowered
        self.main = lowered.module["main"]
        if len(input_names) != len(self.main.params):
            raise GraphError(f"main takes {len(self.main.params)} inputs but {len(input_names)} names given")
        self.input_names = input_names
        self.env: dict = {}
        self.kernels: list[Kernel] = []
        self.constants: dict[str, tuple[TensorRef, np.ndarray]] = {}
        self.constant_names: dict = {}
        self.function_info: dict[str, tuple[str, int]] = {}

    def run(self) -> tuple[KernelGraph, dict[str, np.ndarray]]:
        inputs = []
        for name, param in zip(self.input_names, self.main.params):
            shape, dtype = _tensor_type(param.ty, name)
            self.env[param] = TensorRef(name, shape, dtype, "input")
            inputs.append(self.env[param])
        body = self.main.body
        for block in body.blocks:
            for binding in block.bindings:
                if not isinstance(binding, relax.VarBinding):  # a match_cast: a shape found at run time
                    raise GraphError(_run_time_shape(f"tensor '{binding.var.name}'"))
                self.env[binding.var] = self._bind(binding.var, binding.value)
        outputs = self._flatten(self._resolve(body.body, "the return value"))
        graph = KernelGraph(tuple(self.kernels), tuple(inputs), tuple(outputs),
                            tuple(ref for ref, _ in self.constants.values()))
        return graph, {name: value for name, (_, value) in self.constants.items()}

    def _bind(self, var, value):
        if is_call_tir(value):
            return self._kernel(var, value)
        if isinstance(value, relax.Var | tvm.ir.Constant | relax.Tuple | relax.TupleGetItem):
            return self._resolve(value, var.name)
        raise GraphError(_not_a_kernel(f"'{var.name}'", value))

    def _resolve(self, expr, where: str):
        """The TensorRef (or tuple of them) an expression denotes."""
        if isinstance(expr, relax.Var):
            return self.env[expr]
        if isinstance(expr, tvm.ir.Constant):
            return self._constant(expr)
        if isinstance(expr, relax.Tuple):
            return tuple(self._resolve(field, where) for field in expr.fields)
        if isinstance(expr, relax.TupleGetItem):
            return self._resolve(expr.tuple_value, where)[expr.index]
        raise GraphError(_not_a_kernel(where, expr))

    def _constant(self, constant) -> TensorRef:
        for known, name in self.constant_names.items():
            if known.same_as(constant):
                return self.constants[name][0]
        value = constant.value.numpy()
        name = f"const{len(self.constants)}"
        ref = TensorRef(name, tuple(value.shape), str(value.dtype), "constant")
        self.constants[name] = (ref, value)
        self.constant_names[constant] = name
        return ref

    def _kernel(self, var, call) -> TensorRef | tuple[TensorRef, ...]:
        symbol = call.args[0].name_hint
        if len(call.args) > 2:
            raise GraphError(_run_time_shape(f"kernel '{symbol}'"))
        inputs = tuple(self._flatten(self._resolve(arg, var.name)) for arg in call.args[1].fields)
        inputs = tuple(ref for group in inputs for ref in group)
        kernel_id = len(self.kernels)
        types = var.ty.fields if isinstance(var.ty, relax.TupleType) else [var.ty]
        outputs = []
        for index, tensor_type in enumerate(types):
            shape, dtype = _tensor_type(tensor_type, var.name)
            name = f"k{kernel_id}" if len(types) == 1 else f"k{kernel_id}.{index}"
            outputs.append(TensorRef(name, shape, dtype, "kernel", kernel_id, index))
        workload, flops = self._function_info(symbol)
        traffic = sum(ref.nbytes for ref in inputs) + sum(ref.nbytes for ref in outputs)
        self.kernels.append(Kernel(kernel_id, symbol, workload, inputs, tuple(outputs), flops, traffic,
                                   self.lowered.op_kinds.get(symbol, (symbol,)),
                                   vendor_op=self.lowered.vendor_ops.get(symbol)))
        return outputs[0] if len(types) == 1 else tuple(outputs)

    def _function_info(self, symbol: str) -> tuple[str, int]:
        """(structural hash, estimated FLOPs) of a PrimFunc, computed once per symbol."""
        if symbol not in self.function_info:
            function = self.lowered.module[symbol]
            workload = f"{tvm_ffi.structural_hash(function.without_attr('global_symbol')) & (2**64 - 1):016x}"
            flops = int(estimate_tir_flops(tvm.IRModule({"main": function})))
            self.function_info[symbol] = (workload, flops)
        return self.function_info[symbol]

    @staticmethod
    def _flatten(value) -> list[TensorRef]:
        if isinstance(value, TensorRef):
            return [value]
        return [ref for item in value for ref in _Extractor._flatten(item)]


def _tensor_type(tensor_type, where: str) -> tuple[tuple[int, ...], str]:
    try:
        shape = tuple(int(dim) for dim in tensor_type.shape)
    except (TypeError, ValueError, AttributeError) as error:
        raise GraphError(_run_time_shape(f"tensor '{where}'")) from error
    return shape, str(tensor_type.dtype)


# The import refuses, naming the ONNX node, what these two catch: they are the last line of defence.
def _run_time_shape(what: str) -> str:
    return (f"{what} of the lowered model has a shape known only at run time (an op whose output size "
            f"depends on its input values), and tvmsched compiles static shapes only; replace that op in the "
            f"exporter")


def _not_a_kernel(what: str, expr) -> str:
    """Why a value of the lowered model that is no kernel's output cannot run, and the fix."""
    if isinstance(expr, relax.Call):
        name = getattr(expr.op, "name", None) or getattr(expr.op, "global_symbol", type(expr.op).__name__)
        kind = f"the operation '{name.removeprefix('relax.')}'"
    else:
        kind = {"ShapeExpr": "a shape, not a tensor", "If": "a branch taken at run time (ONNX If)"}.get(
            type(expr).__name__, f"a {type(expr).__name__}")
    return (f"{what} in the lowered model is {kind}, which tvmsched cannot run as a kernel; replace the ONNX "
            f"op that computes it in the exporter (or compute it outside the model)")
