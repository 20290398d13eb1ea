"""The Python API: `compile` a model into a `CompiledModel`, run it, benchmark it, `save` and `load` it."""

from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import tvm

from tvmsched import digests, frontend, measure, nvrtc_source, weights, zoo
from tvmsched.codegen import anonymous, build_library
from tvmsched.cost import StageCost, create_stage_cost
from tvmsched.cost.analytic import AnalyticCost, device_model
from tvmsched.cost.measured import MeasuredCost
from tvmsched.errors import ArtifactError, InputError, TargetError, UnknownModel, check_choice
from tvmsched.executor import create_executor
from tvmsched.executor.base import sample_value
from tvmsched.executor.streams import StageTimer
from tvmsched.frontend import ConstantInput, TensorSpec
from tvmsched.graph import KernelGraph, extract
from tvmsched.layout import chosen
from tvmsched.load_plan import LoadPlan, plan_load, time_reloads
from tvmsched.lower import LoweredModule, kernel_module, lower
from tvmsched.merge import Merged
from tvmsched.merge_choice import GroupModules, MergeChoice, choose_merges, chosen_in_dp, group_modules
from tvmsched.merge_kernels import Lowered
from tvmsched.pinned import pin_mapping
from tvmsched.plan import ExecutionPlan, make_plan
from tvmsched.precision import PRECISIONS
from tvmsched.rewrite import MERGES, prepared, rewrite
from tvmsched.schedule import Scheduler, create_scheduler
from tvmsched.tactics import tail
from tvmsched.tactics.affine import folds, vendor_call, vendor_op_of
from tvmsched.tactics.in_plan import choose_in_plan
from tvmsched.tactics.library import open_in_background
from tvmsched.tactics.select import MODES, Selection, select_tactics
from tvmsched.target import (
    TargetSpec,
    default_executor,
    device_for,
    device_name,
    gpu_present,
    on_gpu,
    resolve_target,
    target_device_name,
)
from tvmsched.tuning import applied, build_logs, database_key

META_SCHEMA = 1
DIGESTED = ("model.so", weights.BINARY, weights.INDEX)  # checked before they are read
DESCRIPTIONS = ("graph.json", "plan.json", "meta.json")
ARTIFACTS = (*DIGESTED, *DESCRIPTIONS)


@dataclass(frozen=True)
class ModelMeta:
    """What a build was made for: its inputs and outputs, the graph inputs bound to values when it was built,
    target, device and versions."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    target: TargetSpec
    tvm_version: str
    tuned_kernels: tuple[str, ...] = ()  # symbols scheduled from the tuning log; the rest use defaults
    tuning_log: str | None = None  # the logs applied, comma-separated
    kernels_hash: str = ""  # of the scheduled kernels, so stage latencies measured for them stay theirs
    fallbacks: tuple[tuple[str, str], ...] = ()  # (symbol, why) of kernels whose first schedule failed
    constant_inputs: tuple[ConstantInput, ...] = ()
    precision: str = "fp32"  # "fp16": float16 with float32 accumulation (builds before it are fp32)
    layout: str = "nchw"  # of the convolutions: "nhwc" is channels-last (builds before it are nchw)
    merge: str = "off"  # which convolutions and matmuls reading one tensor were merged (`rewrite.MERGES`)
    merged_convolutions: tuple[int, ...] = ()  # how many convolutions each merged one replaced
    merged_matmuls: tuple[int, ...] = ()  # how many matmuls each merged one replaced
    # with merge "auto", what each group measured and what dp's search chose (built: merged_*, merge_check)
    merge_choices: tuple[MergeChoice, ...] = ()
    merge_check: tuple[tuple[str, float], ...] = ()  # with merge "auto": each candidate's name and ms

    def to_json(self) -> dict:
        return {"schema": META_SCHEMA, "inputs": [spec.to_json() for spec in self.inputs],
                "outputs": [spec.to_json() for spec in self.outputs], "target": self.target.to_json(),
                "tvm_version": self.tvm_version, "tuned_kernels": list(self.tuned_kernels),
                "tuning_log": self.tuning_log, "kernels_hash": self.kernels_hash,
                "fallbacks": dict(self.fallbacks),
                "constant_inputs": [constant.to_json() for constant in self.constant_inputs],
                "precision": self.precision, "layout": self.layout,
                "merge": self.merge, "merged_convolutions": list(self.merged_convolutions),
                "merged_matmuls": list(self.merged_matmuls),
                "merge_choices": [choice.to_json() for choice in self.merge_choices],
                "merge_check": [list(pair) for pair in self.merge_check]}

    @classmethod
    def from_json(cls, data: dict) -> ModelMeta:
        if data.get("schema") != META_SCHEMA:
            raise ArtifactError(f"meta.json schema {data.get('schema')} is not {META_SCHEMA}; rebuild")
        return cls(tuple(TensorSpec.from_json(spec) for spec in data["inputs"]),
                   tuple(TensorSpec.from_json(spec) for spec in data["outputs"]),
                   TargetSpec.from_json(data["target"]), data["tvm_version"],
                   tuple(data.get("tuned_kernels", ())), data.get("tuning_log"), data.get("kernels_hash", ""),
                   tuple(data.get("fallbacks", {}).items()),
                   tuple(ConstantInput.from_json(constant) for constant in data.get("constant_inputs", ())),
                   data.get("precision", "fp32"), data.get("layout", "nchw"),
                   _merge_mode(data.get("merge", "off")), tuple(data.get("merged_convolutions", ())),
                   tuple(data.get("merged_matmuls", ())),
                   tuple(MergeChoice.from_json(choice) for choice in data.get("merge_choices", ())),
                   _merge_check(data.get("merge_check")))


def _merge_check(data: list | None) -> tuple[tuple[str, float], ...]:
    """The candidates' times: builds before "dp" and "own" were told apart recorded (merged, unmerged ms)."""
    if not data:
        return ()
    if all(isinstance(item, float | int) for item in data):
        return (("merged", data[0]), ("unmerged", data[1]))
    return tuple((name, ms) for name, ms in data)


def _merge_mode(merge: str | bool) -> str:
    """A merge mode: before "auto", builds recorded (and `compile` took) whether all were merged."""
    return {True: "all", False: "off"}[merge] if isinstance(merge, bool) else merge


def model_proto(model: str | Path | onnx.ModelProto, batch: int | None = None) -> onnx.ModelProto:
    """An ONNX model from a ModelProto, an .onnx path, or a zoo model name (built at `batch`, default 1)."""
    if isinstance(model, str) and model in zoo.MODELS:
        return zoo.build(model, batch=batch or 1)
    if isinstance(model, str) and not Path(model).exists() and not model.endswith(".onnx"):
        raise UnknownModel(f"'{model}' is neither a file nor a zoo model; zoo models: "
                           f"{', '.join(zoo.list_models())}")
    return frontend.load_model(model)


def compile(model: str | Path | onnx.ModelProto, target: str = "auto", batch: int | None = None,
            input_shapes: dict[str, tuple[int, ...]] | None = None, schedule: str = "sequential",
            max_streams: int = 8, executor: str | None = None, cost: str | None = None,
            tuning_log: str | Path | None = None, tuned: bool = True,
            constant_inputs: dict[str, np.ndarray] | None = None, kernels: str = "auto",
            precision: str = "fp32", layout: str = "auto", merge: str | bool = "off",
            progress: Callable[[str], None] = lambda stage: None, **schedule_options) -> CompiledModel:
    """Import, lower and compile `model` (ONNX path, ModelProto or zoo name) for `target`, scheduled by
    `schedule` onto at most `max_streams` streams with stage costs from `cost` (see `reschedule`);
    `executor` defaults to the target's best.

    Kernels take their schedules from the target's tuning logs where they have records, unless `tuned` is
    False; the others get defaults. The logs are the one at `tuning_log` (a log directory or a root of them)
    if given, else the user's (where `tune` writes) and then the shipped one.

    `constant_inputs` binds graph inputs to values when the model is built: they become constants and are
    no longer inputs of the compiled model (needed where an input's value decides a shape, e.g. the axes
    of a ReduceSum or the shape of a Reshape).

    `kernels` chooses who computes the kernels a vendor library could (`tactics.select`): "auto" the
    fastest by measurement on this build's GPU, "vendor" a vendor plan wherever one works, "tvm" TVM alone.
    Without the GPU or the vendor libraries, "auto" is TVM alone.

    `precision` "fp16" computes in float16 with float32 accumulation (`tvmsched.precision`); inputs and
    outputs keep the model's dtypes. `layout` "nhwc" computes convolutions channels-last, "nchw" as the
    model is, "auto" nhwc in fp16 on a GPU and nchw elsewhere (`tvmsched.layout`).

    `merge` "all" merges the convolutions, and the matmuls, that read the same tensor into one each
    (`tvmsched.merge`); "auto" times each group of convolutions (or matmuls) merged and not, its kernels
    compiled and scheduled as the model's (on the GPU, else by the analytic cost; `tvmsched.merge_choice`),
    and merges the groups that run faster merged, or with `schedule` "dp" those that dp's search of the
    unmerged model runs merged (IOS-Both); on the GPU the unmerged model and, where they differ, dp's
    choice, each group's own and every group merged are built, and the one whose plan benchmarks fastest
    is kept
    (`whole_model_check`); "off" merges nothing (True and False, as before the modes, are all and off).

    `progress` is called with the name of each stage as it starts.
    """
    spec = resolve_target(target)
    check_choice("kernel choice", kernels, MODES)
    check_choice("precision", precision, PRECISIONS)
    layout = chosen(layout, precision, spec.kind)
    merge = _merge_mode(merge)
    check_choice("merge", merge, MERGES)
    if kernels == "vendor" and not on_gpu(spec):
        raise TargetError("--kernels vendor chooses vendor plans by running them: it needs a CUDA target and "
                          "its GPU; use --kernels tvm (or auto) here")
    progress("loading the model")
    proto = model_proto(model, batch)
    constant_inputs = constant_inputs or {}
    inputs = frontend.bind_input_shapes(proto, batch, input_shapes, constant_inputs)
    progress("importing ONNX into Relax")
    relax_module = frontend.to_relax(proto, inputs, constant_inputs)
    logs = build_logs(spec, tuning_log) if tuned else []
    progress("rewriting (" + ", ".join([precision, layout] + [f"merge {merge}"] * (merge != "off")) + ")")
    output_names = [value.name for value in proto.graph.output]

    def built(rewritten: Merged, lowered: LoweredModule | None = None) -> CompiledModel:
        """`rewritten` compiled and scheduled (`lowered`: its module lowered already)."""
        progress("lowering and fusing")
        lowered = lower(rewritten.module) if lowered is None else lowered
        graph, constants = extract(lowered, [spec.name for spec in inputs])
        progress(f"compiling {len(graph.kernels)} kernels for {spec.key}")
        library, graph, used = _compiled_kernels(lowered, graph, spec, logs, kernels)
        outputs = tuple(TensorSpec(name, tensor.shape, tensor.dtype)
                        for name, tensor in zip(output_names, graph.outputs))
        meta = ModelMeta(tuple(inputs), outputs, spec, tvm.__version__, tuple(library.tuned),
                         ", ".join(str(log.directory) for log in used) or None, library.kernels_hash,
                         tuple(sorted(library.fallbacks.items())),
                         tuple(ConstantInput.of(name, value) for name, value in constant_inputs.items()),
                         precision, layout, merge, rewritten.convolutions, rewritten.matmuls,
                         rewritten.choices)
        context = {"target": spec.key, "device": target_device_name(spec), "batch": _batch(inputs)}
        model = _with_tactics(library, graph, constants, meta, context, kernels, executor, progress)
        if schedule == "sequential":
            return model
        progress(f"scheduling ({schedule})")
        return model.reschedule(schedule, max_streams, executor, cost, **schedule_options)

    def in_build(part: tvm.IRModule) -> tvm.IRModule:
        return prepared(part, precision, layout, spec)
    modules = group_modules(relax_module, in_build) if merge == "auto" else None
    choices = ()
    if modules is not None:
        progress("choosing the groups to merge (each timed merged and not)")
        choices = choose_merges(modules, lambda part: alternative_ms(part, spec, logs, kernels, cost))
    if not choices:
        return _ready(built(rewrite(relax_module, precision, layout, merge, spec=spec)))
    gpu = on_gpu(spec)
    plain = built(Merged(in_build(relax_module), choices=choices)) if gpu else None
    unmerged = None  # without a GPU, the unmerged model lowered for dp's search (and the build if it stays)
    if schedule == "dp":
        progress("weighing each group merged inside dp's search of the unmerged model (IOS-Both)")
        unmerged = None if gpu else lower(in_build(relax_module))
        choices = _chosen_in_dp(modules, choices, plain, unmerged, [item.name for item in inputs], cost,
                                dict(max_streams=max_streams, **schedule_options), spec)
    if plain is None:
        merged = rewrite(relax_module, precision, layout, merge, choices, spec)
        return _ready(built(merged, None if merged.convolutions or merged.matmuls else unmerged))
    candidates = []
    for name, candidate in _merge_candidates(choices):
        merged = rewrite(relax_module, precision, layout, merge, candidate, spec)
        if merged.convolutions or merged.matmuls:
            candidates.append((name, built(merged)))
    if candidates:
        progress("checking the merged models against the unmerged one (each built, scheduled and timed)")
        plain = whole_model_check([*candidates, ("unmerged", plain)])
    return _ready(plain.with_meta(replace(plain.meta, merge_choices=choices)))


def _merge_candidates(choices: tuple[MergeChoice, ...]) -> list[tuple[str, tuple[MergeChoice, ...]]]:
    """The ways to merge that `whole_model_check` weighs, by name, each where it merges other groups than
    those before it: "dp" where dp's search chose (`choices` with `dp_merged`), each group's own choice
    ("own"; the same choices without dp's), and where either merges some group, every group ("all"). dp's
    stage sums do not see what a plan's streams overlap across stages, and a group timed alone differs
    from it in the model by a few microseconds either way: torchvision's googlenet at batch 16 ran 2.3%
    faster with 3 groups merged by their own timings than unmerged, where dp's choice was none, and
    BERT-base at batch 1 4.7% faster with all 12 merged, where its own timings merged 4 and dp none."""
    own = tuple(replace(choice, dp_merged=None) for choice in choices)
    named = [("dp", choices)] * (own != choices) + [("own", own)]
    if any(choice.merged for _, way in named for choice in way):
        named.append(("all", tuple(replace(choice, dp_merged=True) for choice in choices)))
    candidates, seen = [], set()
    for name, way in named:
        merged = tuple(choice.merged for choice in way)
        if merged not in seen:
            seen.add(merged)
            candidates.append((name, way))
    return candidates


def _chosen_in_dp(modules: GroupModules, choices: tuple[MergeChoice, ...], plain: CompiledModel | None,
                  unmerged: LoweredModule | None, input_names: list[str], cost: str | None, options: dict,
                  spec: TargetSpec) -> tuple[MergeChoice, ...]:
    """`merge_choice.chosen_in_dp` on the unmerged model: `plain`'s graph with its cost source `cost` (the
    GPU's measurements by default), or without a GPU (no `plain`) the analytic cost (of `spec`'s kind of
    device) of the graph of `unmerged` (the model rewritten as built, lowered)."""
    scheduler = create_scheduler("dp", **options)
    if plain is None:
        model = Lowered(*extract(unmerged, input_names))
        return chosen_in_dp(modules, choices, model, AnalyticCost(model.graph, device_model(spec.kind)),
                            scheduler)
    with plain.stage_cost(cost, options["max_streams"]) as stage_cost:
        return chosen_in_dp(modules, choices, Lowered(plain.graph, plain.constants), stage_cost, scheduler)


def _ready(model: CompiledModel) -> CompiledModel:
    """`model`, its executor made where it runs on the CPU by the CPU's executor, so that its first call
    costs about what later ones do (nasnet's executor: 33 ms); a GPU build makes its executor, which holds
    device memory and a CUDA Graph, on first use, and so does a CPU build given another executor (one that
    needs a GPU fails there, not in a build that only saves it)."""
    if model.meta.target.kind == "llvm" and model.executor_name == default_executor(model.meta.target):
        with model.exclusive():
            pass
    return model


def whole_model_check(candidates: list[tuple[str, CompiledModel]]) -> CompiledModel:
    """Of `candidates` (by name: models merged as `--merge auto` chose, `_merge_candidates`, and the
    unmerged one), the one whose plan benchmarks fastest (each benchmarked alone, its executor closed
    after), its meta recording every time (`merge_check`). A group that is faster merged alone need not
    make the whole plan faster."""
    times = []
    for name, model in candidates:
        with model:  # one executor at a time, closed after its benchmark
            times.append((name, model.benchmark()["median_ms"]))
    _, kept = candidates[min(range(len(times)), key=lambda index: times[index][1])]
    return kept.with_meta(replace(kept.meta, merge_check=tuple(times)))


def _with_tactics(built, graph: KernelGraph, constants: dict, meta: ModelMeta, context: dict, kernels: str,
                  executor: str | None = None, progress: Callable[[str], None] = lambda stage: None
                  ) -> CompiledModel:
    """The compiled model planned sequentially, its kernels' implementations chosen (`choose_tactics`) and
    planned again where a vendor plan was chosen (its workspace follows TVM's)."""
    plan = plan_schedule(graph, create_scheduler("sequential"), AnalyticCost(graph), context)
    model = CompiledModel(built.executable, graph, plan, constants, meta, executor)
    selection = choose_tactics(model, kernels, progress)
    if selection.timings:
        graph = selection.graph
        plan = plan_schedule(graph, create_scheduler("sequential"), AnalyticCost(graph), context)
    return CompiledModel(built.executable, graph, plan, constants, meta, executor, selection)


def _compiled_kernels(lowered: LoweredModule, graph: KernelGraph, spec: TargetSpec, logs: list, kernels: str):
    """The library of `lowered`'s kernels with schedules from `logs` where they have records, and the tails
    of split tactics where `kernels` may choose a library's (`tactics.tail`); `graph` with the kernels'
    workspace, and the logs used."""
    workloads = {kernel.symbol: kernel.workload for kernel in graph.kernels}
    module = kernel_module(lowered)
    if tail.wanted(kernels, spec):
        module = tail.with_tails(module, graph)
    keys = {database_key(tvm.IRModule({"main": anonymous(function)}))
            for function in module.functions.values() if isinstance(function, tvm.tirx.PrimFunc)}
    with applied(logs, workloads, keys) as (database, keep_default, used):
        built = build_library(module, spec, database, keep_default)
    return built, graph.with_workspace(built.workspace), used


def alternative_ms(lowered: LoweredModule, spec: TargetSpec, logs: list, kernels: str, cost: str | None = None
                   ) -> tuple[float, ...]:
    """Per parameter of a lowered module's `main` (the groups of a merge choice,
    `merge_choice.GroupModules`), dp's stage sum (ms) for the kernels that depend on it: its kernels
    compiled and chosen (`kernels`) as a model's and its stages timed on the GPU; without the GPU or where
    the build's `cost` is "analytic" (so that dp weighs the groups in the units of its other stages), the
    analytic cost's model (of the target's kind of device) of its uncompiled kernels."""
    names = [param.name for param in lowered.module["main"].params]
    graph, constants = extract(lowered, names)
    if not on_gpu(spec) or cost == "analytic":
        return _part_latencies(graph, names, AnalyticCost(graph, device_model(spec.kind)))
    built, graph, _ = _compiled_kernels(lowered, graph, spec, logs, kernels)
    meta = ModelMeta((), (), spec, tvm.__version__, kernels_hash=built.kernels_hash)
    context = {"target": spec.key, "device": target_device_name(spec), "batch": graph.inputs[0].shape[0]}
    model = _with_tactics(built, graph, constants, meta, context, kernels)
    with model.stage_cost("measured") as cost:
        return _part_latencies(model.graph, names, cost)


def _part_latencies(graph: KernelGraph, input_names: list[str], cost: StageCost) -> tuple[float, ...]:
    """Per graph input, dp's stage sum for the kernels that depend on it (`part_latency`)."""
    scheduler = create_scheduler("dp", time_orders=False)
    return tuple(scheduler.part_latency(graph, graph.reading(name), cost) for name in input_names)


def choose_tactics(model: CompiledModel, kernels: str, progress: Callable[[str], None]) -> Selection:
    """`tactics.select_tactics` for a freshly compiled model, timed on its GPU; TVM alone without one."""
    if not on_gpu(model.meta.target):
        return Selection(model.graph, {})
    device = device_for(model.meta.target)

    def make_timer() -> StageTimer:
        return StageTimer(model.library, model.graph, model.plan, model.constants, device, max_groups=1)

    def report(done: int, total: int) -> None:
        progress(f"choosing kernel implementations ({done}/{total} kernels timed)")
    return select_tactics(model.graph, kernels, make_timer, device_name(model.meta.target),
                          model.meta.kernels_hash, model.constants, progress=report)


def plan_schedule(graph: KernelGraph, scheduler: Scheduler, cost: StageCost, context: dict) -> ExecutionPlan:
    """The validated ExecutionPlan of what `scheduler` decides for `graph` with stage costs from `cost`."""
    result = scheduler.schedule(graph, cost)
    return make_plan(graph, list(result.order), scheduler.name, context, result.to_json())


class CompiledModel:
    """A compiled model: call it with numpy arrays to run one inference on its target's device.

    Calls from several threads are serialized by a lock, since they share the device buffers. `compile` and
    `load` make a CPU build's executor (also where it is then only saved or rescheduled: one copy of the
    weights, tens of milliseconds), a GPU build's first call makes its own; `close()` (or leaving a `with`
    block) releases it, and a later call makes a new one.

    A new GPU executor uploads the weights on a stream of its own; with `pipelined` its first inference
    starts at once, each kernel waiting for its own weights alone, else after the last upload. The vendor
    plans' folded weights are kept (`folded`) for the model's next executor.
    """

    def __init__(self, library, graph: KernelGraph, plan: ExecutionPlan, constants: dict[str, np.ndarray],
                 meta: ModelMeta, executor: str | None = None, selection: Selection | None = None,
                 pipelined: bool = True, folded: dict | None = None):
        self.library = library
        self.graph = graph
        self.plan = plan
        self.constants = constants
        self.meta = meta
        self.executor_name = executor or default_executor(meta.target)
        self.pipelined = pipelined
        self._executor = None
        self._lock = threading.Lock()
        self.selection = selection  # what tactic selection measured, on a fresh compile
        self.folded = {} if folded is None else folded  # vendor plans' folded weights, for the next executor

    def reschedule(self, schedule: str, max_streams: int = 8, executor: str | None = None,
                   cost: str | None = None, **schedule_options) -> CompiledModel:
        """The same compiled kernels under another schedule and executor (nothing is recompiled).

        `cost` is the stage-latency source: `measured` (on the GPU, cached) or `analytic`; the default is
        measured where this build's GPU is present, analytic otherwise. With dp and measured costs, a
        kernel that a vendor plan runs in a stage of several groups runs TVM's function where that makes the
        whole plan faster (`tactics.in_plan`).
        """
        scheduler = create_scheduler(schedule, max_streams=max_streams, **schedule_options)
        with self.stage_cost(cost, max_streams) as stage_cost:  # saves measurements also when interrupted
            plan = plan_schedule(self.graph, scheduler, stage_cost, self.plan.context)
            if scheduler.name == "dp" and scheduler.time_orders:  # each vendor kernel's, in its stage
                tvm_ms = self.selection.tvm_ms if self.selection else {}
                plan = choose_in_plan(self.graph, plan, stage_cost, tvm_ms)
        return CompiledModel(self.library, self.graph, plan, self.constants, self.meta, executor,
                             self.selection, self.pipelined, self.folded)

    def with_meta(self, meta: ModelMeta) -> CompiledModel:
        """The same build, described by `meta`."""
        return CompiledModel(self.library, self.graph, self.plan, self.constants, meta, self.executor_name,
                             self.selection, self.pipelined, self.folded)

    def close(self) -> None:
        """Close the executor, if one was made (destroying its CUDA streams, events and graph), and drop it
        with its device buffers. The model stays usable: its next run makes a new executor. A run in progress
        is waited for; a second call does nothing."""
        with self._lock:
            executor, self._executor = self._executor, None
            if executor is not None:
                executor.close()

    def offload(self, load_plan: LoadPlan | None = None) -> None:
        """Free the model's GPU memory and keep its executor (`cuda-graph` only), as a server does with a
        model it may need again: the next run maps the memory back at the same addresses and is one CUDA
        graph that uploads the weights (from page-locked memory: a loaded build's mapping; other values
        are copied into page-locked memory once) while the plan runs, each kernel after its own weights,
        or, where `load_plan` (`plan_load`) says so, reading them in place from that memory (their copies
        then follow every other one, after the first result); later runs replay the plan's graph. The
        first call makes an executor whose memory can be freed (where the model's executor cannot, it is
        closed first) and captures the graphs."""
        if load_plan is not None and load_plan.graph_hash != self.graph.hash:
            raise ArtifactError(f"the load plan was made for kernel graph {load_plan.graph_hash}, not this "
                                f"model's {self.graph.hash}; plan again with tvmsched plan-load")
        with self._lock:
            self._offloadable().offload(load_plan.direct if load_plan else frozenset())

    def plan_load(self, rounds: int = 5) -> LoadPlan:
        """Which kernels read their weights in place after `offload` (`tvmsched.load_plan`): modelled from
        each kernel's times measured now on this GPU with its weights on the device and read in place,
        and its weights' copy time; then the model's choice is checked, the first inference after an
        offload timed with it and with every weight uploaded (medians of `rounds`), and kept only where
        faster. Makes the offloadable executor, as `offload` does; leaves the model on the GPU."""
        with self._lock:
            kernels = self._offloadable().load_timings()
        plan = plan_load(device_name(self.meta.target), self.graph.hash, kernels)
        if not plan.modelled:
            return plan
        inputs = self.random_inputs()
        expected = self.run(inputs)
        upload, planned = (time_reloads(self, chosen, inputs, expected, rounds) for chosen in (None, plan))
        if not (upload["equal"] and planned["equal"]):
            raise TargetError("a first inference after offload() differed from a resident one; report this "
                              "with the build")
        return plan.checked(upload["median_ms"], planned["median_ms"])

    def _offloadable(self):
        """The model's executor, made offloadable (`cuda-graph` only; where it is not, it is closed and
        a new one made)."""
        if self.executor_name != "cuda-graph":
            raise TargetError(f"offload keeps the model's CUDA graphs: use the 'cuda-graph' executor, not "
                              f"'{self.executor_name}'")
        if self._executor is not None and not self._executor.offloadable:
            self._executor.close()
            self._executor = None
        if self._executor is None:
            self._executor = create_executor(self.executor_name, self.library, self.graph, self.plan,
                                             self.constants, device_for(self.meta.target), self.folded,
                                             self.pipelined, offloadable=True)
        return self._executor

    def __enter__(self) -> CompiledModel:
        return self

    def __exit__(self, *error) -> None:
        self.close()

    def stage_cost(self, name: str | None = None, max_streams: int = 8) -> StageCost:
        """A stage-latency source for this model's graph (see `reschedule`). Close it when done, e.g. by a
        `with` block: a measured one holds a GPU timer and saves its measurements on closing."""
        here = on_gpu(self.meta.target)
        name = name or ("measured" if here else "analytic")
        if name != "measured":  # computed, for the build's kind of device (a CPU runs one kernel at a time)
            return create_stage_cost(name, self.graph, device=device_model(self.meta.target.kind))
        if not here:
            raise TargetError("measured stage costs need this build's GPU; use cost='analytic' "
                              "(--cost analytic)")
        device = device_for(self.meta.target)
        # stages are timed with selection's implementations, whatever this plan chose in its stages
        return MeasuredCost.on_device(self.library, self.graph, replace(self.plan, tvm_kernels=()),
                                      self.constants, device, self.meta.kernels_hash, max_groups=max_streams)

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.meta.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.meta.outputs

    @property
    def executor(self):
        """The executor, created on first use after construction or `close` (a cross-compiled build never
        needs a device); use it inside `exclusive()`."""
        if self._executor is None:
            self._executor = create_executor(self.executor_name, self.library, self.graph, self.plan,
                                             self.constants, device_for(self.meta.target), self.folded,
                                             self.pipelined)
        return self._executor

    @contextmanager
    def exclusive(self):
        """The executor, for this block alone: runs, benchmarks, profiles and `close` in other threads wait
        until it ends, since they share its device buffers (and timings must not overlap)."""
        with self._lock:
            yield self.executor

    def __call__(self, *args: np.ndarray, **kwargs: np.ndarray) -> np.ndarray | list[np.ndarray]:
        """Run with positional arrays, one dict of arrays, or keyword arrays; one output → one array."""
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            named = args[0]
        elif args and kwargs:
            raise InputError("pass inputs either positionally or by name, not both")
        elif args:
            if len(args) != len(self.inputs):
                raise InputError(f"the model takes {len(self.inputs)} inputs "
                                 f"({', '.join(spec.name for spec in self.inputs)}), got {len(args)}")
            named = {spec.name: value for spec, value in zip(self.inputs, args)}
        else:
            named = kwargs
        outputs = self.run(named)
        return outputs[0] if len(outputs) == 1 else outputs

    def run(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run one inference; inputs by name, outputs in the model's output order."""
        arrays = self.check_inputs(inputs)
        with self.exclusive() as executor:
            return executor.run(arrays)

    def check_inputs(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The inputs in order as contiguous arrays; raises InputError naming any mismatch."""
        expected = [spec.name for spec in self.inputs]
        bound = [constant.spec.name for constant in self.meta.constant_inputs if constant.spec.name in inputs]
        if bound:
            raise InputError(f"input '{bound[0]}' was bound to a value when the model was built "
                             f"(--constant-input), so it is no longer an input; rebuild to give another "
                             f"value")
        unknown = sorted(set(inputs) - set(expected))
        missing = [name for name in expected if name not in inputs]
        if unknown or missing:
            problem = f"unknown: {', '.join(unknown)}" if unknown else f"missing: {', '.join(missing)}"
            raise InputError(f"the model's inputs are {', '.join(expected)}; {problem}")
        arrays = []
        for spec in self.inputs:
            value = np.asarray(inputs[spec.name])
            if value.shape != spec.shape:
                raise InputError(f"input '{spec.name}' must have shape {_dims(spec.shape)}, got "
                                 f"{_dims(value.shape)}; rebuild with --batch / --input-shape for another "
                                 f"shape")
            if value.dtype != np.dtype(spec.dtype):
                raise InputError(f"input '{spec.name}' must be {spec.dtype}, got {value.dtype}; "
                                 f"convert it with .astype('{spec.dtype}')")
            arrays.append(np.require(value, requirements="C"))  # ascontiguousarray makes () into (1,)
        return arrays

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs of the right shapes and dtypes: standard-normal floats, zero integers (`sample_value`)."""
        rng = np.random.default_rng(seed)
        return {spec.name: sample_value(spec.shape, spec.dtype, rng) for spec in self.inputs}

    def benchmark(self, warmup: int = 10, repeat: int | None = None, budget_s: float = measure.BUDGET_S,
                  progress: Callable[[int, int], None] = lambda done, total: None) -> dict:
        """Median, min and max milliseconds of `repeat` inferences after up to `warmup` ones, inputs already
        on the device (CUDA events on GPU executors with streams, the host clock otherwise); `repeat` None:
        as many as `budget_s` seconds allow (`measure.benchmark`), `progress(done, repeat)` follows them."""
        with self.exclusive() as executor:
            executor.run(self.check_inputs(self.random_inputs()))
            timings = measure.benchmark(executor, warmup, repeat, budget_s, progress)
        return {**timings, "executor": self.executor_name, "device": device_name(self.meta.target)}

    def profile(self, repeat: int = 50):
        """Per-kernel latencies and one inference's stream timeline (a `tvmsched.profile.Profile`)."""
        from tvmsched.profile import profile

        return profile(self, repeat)

    def folded_weights(self) -> dict:
        """`folded`, completed with every kernel that has a tactic: (kernel, split) -> (VendorOp, arrays)
        (`tactics.affine.vendor_call`)."""
        for kernel in self.graph.kernels:
            if kernel.tactic is not None and (kernel.id, kernel.tactic.split) not in self.folded:
                self.folded[kernel.id, kernel.tactic.split] = vendor_call(kernel, self.constants.__getitem__,
                                                                          kernel.tactic.split)
        return self.folded

    def save(self, directory: str | Path) -> Path:
        """Write model.so, the weights (`tvmsched.weights`), graph.json, plan.json, then meta.json with the
        digests of the library and the weights.

        Each file is written beside its final name and renamed into place, so an interrupted save never
        leaves a truncated file, and a library that a loaded model still maps is never overwritten.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        _write_atomically(directory / "model.so", lambda path: self.library.export_library(str(path)))
        folded = {key: arrays for key, (_, arrays) in self.folded_weights().items()}
        index = weights.layout(self.constants, folded)
        _write_atomically(directory / weights.BINARY,
                          lambda path: weights.write_binary(path, index, self.constants, folded))
        _write_json(directory / weights.INDEX, index.to_json())
        (directory / weights.ARCHIVE).unlink(missing_ok=True)  # an older save's weights
        _write_json(directory / "graph.json", self.graph.to_json())
        _write_json(directory / "plan.json", self.plan.to_json())
        sums = {name: digests.checked_sha256(directory / name, written_here=True) for name in DIGESTED}
        _write_json(directory / "meta.json", {**self.meta.to_json(), "digests": sums})
        return directory


def load(directory: str | Path, executor: str | None = None, batch: int | None = None,
         force: bool = False, constant_inputs: dict[str, np.ndarray] | None = None,
         pipelined: bool = True) -> CompiledModel:
    """Load a saved build. Refuses, unless `force`, one made by another TVM version or for another GPU or
    CPU than this machine's; always refuses one made for another `batch` (when given) or with other values
    of its constant inputs (those in `constant_inputs`): rebuild for that. A CUDA build's mapped weights are
    page-locked (`tvmsched.pinned`); `pipelined`: see `CompiledModel`."""
    directory = Path(directory)
    stored = weights.files(directory)
    digested = ("model.so", *stored)
    missing = [name for name in (*digested, *DESCRIPTIONS) if not (directory / name).is_file()]
    if missing:
        raise ArtifactError(f"'{directory}' is not a tvmsched build (missing {', '.join(missing)}); "
                            f"create one with: tvmsched build MODEL -o {directory}")
    meta_json = _read_json(directory / "meta.json")
    meta = ModelMeta.from_json(meta_json)
    if meta.target.kind == "cuda" and not gpu_present():  # its library would not even load here
        raise TargetError(f"'{directory}' was built for CUDA ({meta.target.key}) and no CUDA device is "
                          f"present; rebuild with --target llvm to run on the CPU")
    if meta.tvm_version != tvm.__version__ and not force:
        raise ArtifactError(f"'{directory}' was built with TVM {meta.tvm_version}, this is TVM "
                            f"{tvm.__version__}; rebuild it (or load with force=True / --force)")
    _check_constant_inputs(directory, meta, constant_inputs or {})
    graph = KernelGraph.from_json(_read_json(directory / "graph.json"))
    plan = ExecutionPlan.from_json(_read_json(directory / "plan.json"))
    _check_plan_context(directory, plan, meta, batch, force)
    open_in_background({kernel.tactic.library for kernel in graph.kernels
                        if kernel.implementation_in(plan.tvm_kernels) != "tvm"})
    for name in digested:  # a truncated library would crash dlopen, a bad index mapping: check first
        if not digests.matches(directory / name, meta_json.get("digests", {}).get(name)):
            raise ArtifactError(f"'{directory / name}' is corrupt or was replaced (its digest differs from "
                                f"meta.json); rebuild the model")
    if meta.target.kind == "cuda":
        nvrtc_source.install()  # a library built without a GPU holds CUDA source, compiled when loaded
    try:
        constants, folded = weights.read(directory)
        library = tvm.runtime.load_module(str(directory / "model.so"))
    except Exception as error:  # zipfile, numpy, the weights and TVM each raise their own types
        raise ArtifactError(f"'{directory}' has a corrupt file ({type(error).__name__}: {error}); "
                            f"rebuild it") from error
    if meta.target.kind == "cuda":
        pin_mapping(constants)
    ops = {(kernel.id, kernel.tactic.split): kernel for kernel in graph.kernels if kernel.tactic is not None}
    if set(folded) - set(ops):
        raise ArtifactError(f"'{directory / weights.INDEX}' holds folded weights of kernels without a vendor "
                            f"plan; rebuild the model")
    # the saved folds, and the plans that fold nothing; a build saved without them folds at its executor
    calls = {key: (vendor_op_of(kernel, key[1]), folded.get(key, [])) for key, kernel in ops.items()
             if key in folded or not folds(kernel, key[1])}
    return _ready(CompiledModel(library, graph, plan, constants, meta, executor, pipelined=pipelined,
                                folded=calls))


def _check_constant_inputs(directory: Path, meta: ModelMeta, values: dict[str, np.ndarray]) -> None:
    """Refuse values for constant inputs that differ from those the build was made with."""
    built = {constant.spec.name: constant for constant in meta.constant_inputs}
    for name, value in values.items():
        if name not in built:
            raise ArtifactError(f"'{directory}' was built with input '{name}' as an input, not bound to a "
                                f"value; drop --constant-input {name}=..., or rebuild with it")
        if ConstantInput.of(name, np.asarray(value)) != built[name]:
            raise ArtifactError(f"'{directory}' was built with another value of input '{name}' "
                                f"({_dims(built[name].spec.shape)} {built[name].spec.dtype}); rebuild with "
                                f"--constant-input {name}=FILE.npy")


def _check_plan_context(directory: Path, plan: ExecutionPlan, meta: ModelMeta, batch: int | None,
                        force: bool) -> None:
    """Refuse a plan made for another target than the build's library, or for another batch, or (unless
    forced) for another GPU than the local one or another CPU (a CPU build uses its CPU's instructions:
    `target.resolve_target`)."""
    planned_target = plan.context.get("target", meta.target.key)
    if planned_target != meta.target.key:
        raise ArtifactError(f"'{directory}' holds a plan made for {planned_target} beside a library built "
                            f"for {meta.target.key} (plan.json from another build?); rebuild it")
    planned_batch = plan.context.get("batch")
    if batch is not None and planned_batch != batch:
        raise ArtifactError(f"'{directory}' was built for batch {planned_batch}, not {batch}; rebuild with "
                            f"--batch {batch} (plans are specialized per batch)")
    built_cpu = meta.target.config.get("mcpu")
    if meta.target.kind == "llvm" and built_cpu and not force:
        local_cpu = resolve_target("llvm").config["mcpu"]
        if built_cpu != local_cpu:
            raise ArtifactError(f"'{directory}' was built for the CPU '{built_cpu}', whose instructions this "
                                f"CPU ('{local_cpu}') may lack; rebuild it here (or load with force=True / "
                                f"--force)")
    if meta.target.kind == "cuda" and gpu_present() and not force:
        local = resolve_target("cuda").key
        if plan.context.get("target") != local:
            raise ArtifactError(f"'{directory}' was built and scheduled for {plan.context.get('target')} "
                                f"({plan.context.get('device')}), but this GPU is {local}; rebuild it here "
                                f"(or load with force=True / --force)")


def _batch(inputs: list[TensorSpec]) -> int:
    """The batch size a build is specialized for: dim 0 of the first input (1 for a scalar input or none)."""
    return inputs[0].shape[0] if inputs and inputs[0].shape else 1


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ArtifactError(f"'{path}' is corrupt ({error}); rebuild the model") from error


def _write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """`write` a temporary file of the same suffix beside `path`, then rename it to `path`."""
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _write_json(path: Path, data: dict) -> None:
    _write_atomically(path, lambda temporary: temporary.write_text(json.dumps(data, indent=1)))


def _dims(shape) -> str:
    return "x".join(str(dim) for dim in shape) or "scalar"
