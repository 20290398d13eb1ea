"""Compile a graph's PrimFuncs into one kernel library for a target: tuned schedules from a MetaSchedule
database where it has them, dlight's defaults for the other GPU kernels, and the scratch buffers in global
memory that a schedule allocates turned into parameters (the kernel's workspace tensors).

Why the workspace is hoisted: TVM allocates such scratch per call from one pool per device and hands the
same memory to the next kernel launched, whatever its stream, so two such kernels running at once on two
streams would share it (a race), and a CUDA Graph would keep addresses the pool may free later."""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax, s_tir
from tvm.s_tir import dlight

from tvmsched.errors import GraphError
from tvmsched.target import TargetSpec


def default_schedules(kernels: tvm.IRModule, spec: TargetSpec) -> tvm.IRModule:
    """Give every unscheduled GPU kernel dlight's default schedule; CPU kernels compile as they are. dlight
    replaces the functions of the module it is given, so it gets a copy: `kernels` stays as it was."""
    if spec.kind != "cuda":
        return kernels
    gpu = dlight.gpu
    with spec.tvm_target:
        return dlight.ApplyDefaultSchedule(gpu.Matmul(), gpu.GEMV(), gpu.Reduction(), gpu.GeneralReduction(),
                                           gpu.Fallback())(tvm.IRModule(dict(kernels.functions),
                                                                        attrs=kernels.attrs))


def tuned_schedules(kernels: tvm.IRModule, spec: TargetSpec, database,
                    keep_default: frozenset[str] = frozenset()) -> tuple[tvm.IRModule, list[str]]:
    """The kernels with the best schedule `database` records for each, except the symbols in `keep_default`,
    and the symbols it scheduled. Kernels are looked up as tuning stores them, named "main" (`anonymous`)."""
    candidates = tvm.IRModule({global_var: anonymous(function) for global_var, function
                               in kernels.functions.items() if global_var.name_hint not in keep_default})
    with spec.tvm_target, database:
        scheduled = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(candidates)
    kernels = tvm.IRModule({**kernels.functions, **{
        global_var: function.with_attr("global_symbol", kernels[global_var].attrs["global_symbol"])
        for global_var, function in scheduled.functions.items()}})
    tuned = sorted(global_var.name_hint for global_var, function in scheduled.functions.items()
                   if function.attrs and function.attrs.get("tirx.is_scheduled", False))
    return kernels, tuned


def anonymous(function: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """A kernel under the symbol "main": a tuning record then applies to the same kernel whatever a model
    names it (MetaSchedule's workload includes the symbol)."""
    return function.with_attr("global_symbol", "main")


Workspace = tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype) of each scratch buffer of a kernel


@dataclass(frozen=True)
class Library:
    """The compiled kernels, callable by symbol (`executable[symbol](*inputs, *outputs, *workspace)`), the
    symbols whose schedules came from the tuning database, the workspace of each symbol that has one, and
    a content hash of the scheduled kernels."""

    executable: tvm.runtime.Executable
    tuned: list[str]
    workspace: dict[str, Workspace]
    kernels_hash: str  # of the scheduled kernels: measured latencies hold for this build only


def build_library(kernels: tvm.IRModule, spec: TargetSpec, database=None,
                  keep_default: frozenset[str] = frozenset()) -> Library:
    """One library with every kernel, scheduled from `database` (all but the symbols in `keep_default`)
    where it has a record, else by dlight, with its scratch memory hoisted (`hoist_workspace`)."""
    tuned: list[str] = []
    if database is not None:
        kernels, tuned = tuned_schedules(kernels, spec, database, keep_default)
    kernels, workspace = hoist_workspace(default_schedules(kernels, spec))
    executable = tvm.compile(kernels, target=spec.tvm_target)
    if spec.kind == "cuda":
        _check_no_pooled_workspace(executable, [global_var.name_hint for global_var in kernels.functions])
    return Library(executable, tuned, workspace, f"{tvm_ffi.structural_hash(kernels) & (2**64 - 1):016x}")


def hoist_workspace(kernels: tvm.IRModule) -> tuple[tvm.IRModule, dict[str, Workspace]]:
    """The scheduled kernels with each compact scratch buffer in global memory taken from the root block's
    allocations to a trailing parameter, and {symbol: its buffers} for the kernels that had any."""
    functions, workspace = {}, {}
    for global_var, function in kernels.functions.items():
        root = function.body.block if isinstance(function.body, s_tir.SBlockRealize) else None
        scratch = [buffer for buffer in root.alloc_buffers if _hoistable(buffer)] if root else []
        if scratch:
            functions[global_var] = _with_parameters(function, scratch)
            symbol = global_var.name_hint
            workspace[symbol] = tuple((_static_shape(buffer, symbol), buffer.dtype) for buffer in scratch)
        else:
            functions[global_var] = function
    return tvm.IRModule(functions, attrs=kernels.attrs), workspace


def _hoistable(buffer) -> bool:
    """A buffer in global memory that a compact tensor of its shape can stand for (what executors pass)."""
    return (buffer.scope() == "global" and not buffer.strides
            and isinstance(buffer.elem_offset, tvm.tirx.IntImm) and int(buffer.elem_offset) == 0)


def _with_parameters(function: tvm.tirx.PrimFunc, scratch: list) -> tvm.tirx.PrimFunc:
    """`function` taking the root block's buffers `scratch` as trailing parameters instead."""
    realize, root = function.body, function.body.block
    kept = [buffer for buffer in root.alloc_buffers if not any(buffer.same_as(other) for other in scratch)]
    block = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, root.body, root.init, kept,
                         root.match_buffers, root.annotations)
    return tvm.tirx.PrimFunc([*function.params, *scratch],
                             s_tir.SBlockRealize(realize.iter_values, realize.predicate, block),
                             function.ret_type, function.attrs)


def _static_shape(buffer, symbol: str) -> tuple[int, ...]:
    if not all(isinstance(dim, tvm.tirx.IntImm) for dim in buffer.shape):
        raise GraphError(f"kernel '{symbol}' allocates scratch buffer '{buffer.name}' of symbolic shape "
                         f"{list(buffer.shape)}; bind every input dimension statically")
    return tuple(int(dim) for dim in buffer.shape)


def _check_no_pooled_workspace(executable, symbols: list[str]) -> None:
    """Raise GraphError naming the kernels whose compiled host code still takes memory from TVM's workspace
    pool: scratch `hoist_workspace` could not hoist (in a nested block, strided, or a local or shared
    buffer that two thread-bound loop nests use), which kernels on parallel streams would share."""
    pooled = set()
    for module in _modules(executable.mod):
        if module.kind == "llvm":
            for function in module.inspect_source("ll").split("\ndefine ")[1:]:
                if "TVMBackendAllocWorkspace" in function:
                    at = function.index("@")
                    name = function[at + 1:function.index("(", at)]  # e.g. __tvm_ffi_SYMBOL
                    pooled.add(max((symbol for symbol in symbols if symbol in name), key=len, default=name))
    if pooled:
        raise GraphError(f"kernels {sorted(pooled)} take scratch memory from TVM's shared workspace pool, "
                         f"which kernels on parallel streams would share; if they are tuned, build without "
                         f"their records (--untuned, or another --log)")


def _modules(module):
    yield module
    for imported in module.imports:
        yield from _modules(imported)
