"""Compile a graph's PrimFuncs into one kernel library for a target: tuned schedules from a MetaSchedule
database where it has them, dlight's defaults for the other GPU kernels, and the scratch buffers in global
memory that a schedule allocates turned into parameters (the kernel's workspace tensors).

Why the workspace is hoisted: TVM allocates such scratch per call from one pool per device and hands the
same memory to the next kernel launched, whatever its stream, so two such kernels running at once on two
streams would share it (a race), and a CUDA Graph would keep addresses the pool may free later.

On the CPU the kernels compile in parts on threads, one per core (TVM's lowering and LLVM release the GIL),
and the parts' modules are imported into the first: one library, exported and loaded as one file.
googlenet's 103 kernels took 21 s in one part on this project's 2-core machine.

A process keeps the last `CACHED_LIBRARIES` compiled libraries by what they compiled (the scheduled module,
structurally equal, the target, the parts and the PassContext's options): building the same kernels
again, as a rebuild of a model does, compiles nothing."""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import relax, s_tir
from tvm.s_tir import dlight

from tvmsched import cpu_schedules, gpu_schedules, nvrtc_source
from tvmsched.errors import GraphError
from tvmsched.shared_memory import built_retrying_merged
from tvmsched.target import TargetSpec, gpu_present, host_cores
from tvmsched.windows import is_window_kernel

# dlight's and ours, in the order tried
GPU_RULES = ("Matmul", "GEMV", "Reduction", "rows", "GeneralReduction", "Fallback")
KERNELS_PER_PART = 8  # fewer kernels than this per part compile in fewer parts: a thread costs more
CACHED_LIBRARIES = 32
_compiled: OrderedDict[str, tuple[tvm.IRModule, tvm.runtime.Executable]] = OrderedDict()
_compiled_lock = threading.Lock()


def schedule_candidates(function: tvm.tirx.PrimFunc, spec: TargetSpec, notes: list[str]):
    """The schedules a kernel may compile with, best first, as (rule, scheduled function): each rule that
    applies, dlight's on a GPU (`gpu_rules`), `cpu_schedules.RULES` on the CPU and then the kernel as it is
    (which always compiles). A rule that raises is noted in `notes` and skipped."""
    target = spec.tvm_target
    rules = ({rule: gpu_schedules.RULES.get(rule) or getattr(dlight.gpu, rule)()
              for rule in gpu_rules(function)} if spec.kind == "cuda" else cpu_schedules.RULES)
    for rule, schedule_rule in rules.items():
        try:
            with target:
                space = schedule_rule.apply(function, target, False)
        except Exception as error:  # noqa: BLE001  (a rule's failure is any exception; the next rule runs)
            notes.append(f"{rule} failed ({type(error).__name__}: {_first_line(error)})")
            continue
        if space is not None:
            schedule = space[0] if isinstance(space, list) else space
            yield rule, schedule.mod["main"].with_attr("tirx.is_scheduled", True)
    if spec.kind != "cuda":
        yield "unscheduled", function


def gpu_rules(function: tvm.tirx.PrimFunc) -> tuple[str, ...]:
    """The rules in the order tried on `function`: dlight's, but a window kernel (`windows`: a pool, a
    depthwise convolution) gets a thread per output first, `gpu_schedules.window`'s, then Fallback's.
    dlight's GeneralReduction, which took them before, gives each output a block of 256 threads for its 9
    to 64 elements (a depthwise 3x3 convolution of 16x96x112x112: 19.3 million blocks)."""
    if not is_window_kernel(function):
        return GPU_RULES
    return ("window", "Fallback", *(rule for rule in GPU_RULES if rule != "Fallback"))


def default_schedules(kernels: tvm.IRModule, spec: TargetSpec) -> tvm.IRModule:
    """Every unscheduled kernel of `kernels` with the first schedule of `schedule_candidates` (dlight's
    default on a GPU), other functions as they are; `kernels` itself stays as it was."""
    functions = dict(kernels.functions)
    for global_var, function in kernels.functions.items():
        if isinstance(function, tvm.tirx.PrimFunc) and not function.attrs.get("tirx.is_scheduled", False):
            candidate = next(schedule_candidates(function, spec, []), None)
            if candidate is None:
                raise GraphError(f"kernel '{global_var.name_hint}' has no default schedule: every dlight "
                                 f"rule failed on it")
            functions[global_var] = candidate[1]
    return tvm.IRModule(functions, attrs=kernels.attrs)


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
    symbols whose schedules came from the tuning database, the workspace of each symbol that has one, a
    content hash of the scheduled kernels, and for each kernel whose first schedule failed, what failed
    and which schedule it runs instead."""

    executable: tvm.runtime.Executable
    tuned: list[str]
    workspace: dict[str, Workspace]
    kernels_hash: str  # of the scheduled kernels: measured latencies hold for this build only
    fallbacks: dict[str, str] = field(default_factory=dict)


def build_library(kernels: tvm.IRModule, spec: TargetSpec, database=None,
                  keep_default: frozenset[str] = frozenset()) -> Library:
    """One library with every kernel, scheduled from `database` (all but the symbols in `keep_default`)
    where it has a record, else by dlight, with its scratch memory hoisted (`hoist_workspace`).

    A kernel whose schedule fails (a dlight rule that raises, or a schedule that does not compile) takes
    the next one of `schedule_candidates`; it is reported in `fallbacks`, and only a kernel left with no
    schedule that compiles fails the build."""
    nvrtc_source.install()
    tuned = tuned_schedules(kernels, spec, database, keep_default)[0] if database is not None else kernels
    choices = {global_var.name_hint: _KernelChoice(function, tuned[global_var], spec)
               for global_var, function in kernels.functions.items()}
    while True:
        module, workspace = hoist_workspace(tvm.IRModule(
            {kernels.get_global_var(symbol): choice.function for symbol, choice in choices.items()},
            attrs=kernels.attrs))
        try:
            key = f"{tvm_ffi.structural_hash(module) & (2**64 - 1):016x}/{spec.key}"
            executable = built_retrying_merged(lambda: _cached_compile(module, spec), spec.kind,  # noqa: B023
                                               key)
            break
        except Exception as error:  # noqa: BLE001  (TVM's passes raise many types; found per kernel below)
            failing = {symbol: failure for symbol in choices
                       if (failure := _compile_error(module, symbol, spec)) is not None}
            if not failing:
                raise error
            for symbol, failure in failing.items():
                choices[symbol].next(failure)
    if spec.kind == "cuda":
        _check_no_pooled_workspace(executable, list(choices))
    fallbacks = {symbol: choice.report for symbol, choice in choices.items() if choice.notes}
    return Library(executable, sorted(symbol for symbol, choice in choices.items() if choice.rule == "tuned"),
                   workspace, f"{tvm_ffi.structural_hash(module) & (2**64 - 1):016x}", fallbacks)


class _KernelChoice:
    """The schedule a kernel compiles with: its tuned one if any, else the first of `schedule_candidates`;
    `next` moves on to the following one after a failure, noting why."""

    def __init__(self, function: tvm.tirx.PrimFunc, tuned: tvm.tirx.PrimFunc, spec: TargetSpec):
        self.symbol = function.attrs["global_symbol"]
        self.notes: list[str] = []
        scheduled = tuned.attrs.get("tirx.is_scheduled", False)
        self.candidates = itertools.chain([("tuned", tuned)] if scheduled else [],
                                          schedule_candidates(function, spec, self.notes))
        self.next()

    def next(self, failure: str | None = None) -> None:
        if failure is not None:
            self.notes.append(f"{self.rule} did not compile ({failure})")
        candidate = next(self.candidates, None)
        if candidate is None:
            raise GraphError(f"kernel '{self.symbol}' cannot be compiled with any schedule: "
                             f"{'; '.join(self.notes)}")
        self.rule, self.function = candidate

    @property
    def report(self) -> str:
        return f"{'; '.join(self.notes)}; runs the {self.rule} schedule"


def _cached_compile(module: tvm.IRModule, spec: TargetSpec) -> tvm.runtime.Executable:
    """`_compile_in_parts(module, spec)`, or the library this process compiled last for the same content."""
    symbols = [global_var.name_hint for global_var in module.functions]
    parts = _parts(symbols, spec)
    context = tvm.transform.PassContext.current()
    key = (f"{tvm_ffi.structural_hash(module)}/{spec.tvm_target}/{parts}/{context.opt_level}/"
           f"{sorted((str(name), str(value)) for name, value in context.config.items())}/"
           f"{list(context.required_pass)}/{list(context.disabled_pass)}")
    with _compiled_lock:
        if key in _compiled and tvm_ffi.structural_equal(_compiled[key][0], module):
            _compiled.move_to_end(key)
            return _compiled[key][1]
    executable = _compile_in_parts(module, spec, parts)
    with _compiled_lock:
        _compiled[key] = (module, executable)
        while len(_compiled) > CACHED_LIBRARIES:
            _compiled.popitem(last=False)
    return executable


def _parts(symbols: list[str], spec: TargetSpec) -> int:
    """In how many parts to compile kernels `symbols`: on the CPU up to one per core, else one."""
    if spec.kind != "llvm":
        return 1
    return max(1, min(host_cores(physical=False), len(symbols) // KERNELS_PER_PART))


def _compile_in_parts(module: tvm.IRModule, spec: TargetSpec, count: int) -> tvm.runtime.Executable:
    """`module` compiled for `spec`, every kernel ready to call (LLVM's JIT and CUDA's linking run at the
    first look-up of a function: here, not at the first call), in `count` parts, each on a thread of its
    own (under the caller's PassContext), imported into the first part's module."""
    symbols = [global_var.name_hint for global_var in module.functions]
    context = tvm.transform.PassContext.current()

    def compile_part(part: list[str]) -> tvm.runtime.Module:
        with context:
            executable = tvm.compile(tvm.IRModule({module.get_global_var(symbol): module[symbol]
                                                   for symbol in part}, attrs=module.attrs),
                                     target=spec.tvm_target)
            if part and (spec.kind != "cuda" or gpu_present()):
                executable[part[0]]
            return executable.mod

    if count == 1:
        return tvm.runtime.Executable(compile_part(symbols))
    with ThreadPoolExecutor(count) as pool:
        first, *others = pool.map(compile_part, [symbols[index::count] for index in range(count)])
    for other in others:
        first.import_module(other)
    return tvm.runtime.Executable(first)


def _compile_error(module: tvm.IRModule, symbol: str, spec: TargetSpec) -> str | None:
    """Why the kernel `symbol` of `module` does not compile on its own, or None where it does."""
    alone = tvm.IRModule({module.get_global_var(symbol): module[symbol]})
    try:
        built_retrying_merged(lambda: tvm.compile(alone, target=spec.tvm_target), spec.kind)
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {_first_line(error)}"
    return None


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return (text.splitlines()[-1] if text else type(error).__name__)[:200]


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
