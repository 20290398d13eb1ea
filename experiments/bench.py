"""The benchmark suite against the peers, one model and batch at a time in one process: PyTorch eager,
PyTorch + CUDA Graph, torch.compile (reduce-overhead), TVM's Relax VM with the same tuned kernels, and
tvmsched with every scheduler (one CUDA Graph each); every tvmsched output is checked against PyTorch's.
fp32 everywhere, TF32 off. Writes JSON, a markdown table and a bar chart.

    python -m experiments.bench --out-dir experiments/results                 # zoo models, batch 1 and 16
    python -m experiments.bench --out-dir /tmp/b --cases googlenet:1 tv:resnet50:16
    python -m experiments.bench --out-dir /tmp/b --cases tv:resnet50:1 --kernels tvm --untuned \
        --schedules sequential dp --skip torch_compile relax_vm

Results accumulate in the JSON of --out-dir (today's, or --date's): cases it already holds are skipped
(--again measures them again), so the suite can be run in several calls under a time limit.

A case is MODEL:BATCH for a zoo model (PyTorch runs its ONNX graph, experiments/torch_onnx.py) or
tv:MODEL:BATCH for a torchvision classification network (random weights, exported to ONNX for tvmsched;
PyTorch runs the torchvision module itself); a trailing :fp16 (googlenet:1:fp16) measures both in half
precision: tvmsched --precision fp16, PyTorch's module in float16 and channels_last. Outputs are checked
against PyTorch's fp32 output, within --tolerance (fp32) or --fp16-tolerance.
"""

from __future__ import annotations

import datetime
import importlib.util
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import tvm
from tvm import relax

import tvmsched
from experiments.common import (
    ResultFile,
    argument_parser,
    command,
    event_median_ms,
    host_median_ms,
    median_ms,
    now,
    relative_diff,
)
from experiments.torchvision_models import TORCHVISION, network
from tvmsched import frontend, zoo
from tvmsched.codegen import default_schedules, tuned_schedules
from tvmsched.graph import extract
from tvmsched.layout import CHOICES as LAYOUT_CHOICES
from tvmsched.layout import chosen
from tvmsched.lower import kernel_module, lower
from tvmsched.precision import PRECISIONS
from tvmsched.rewrite import MERGES, rewrite
from tvmsched.schedule import options_for
from tvmsched.schedule.base import DEFAULT_STREAM_MAPPING, STREAM_MAPPINGS
from tvmsched.target import device_name, resolve_target
from tvmsched.tuning import applied, build_logs

SCHEDULES = ("sequential", "greedy", "opara", "nimble", "dp")
DEFAULT_CASES = [f"{name}:{batch}" for batch in (1, 16) for name in zoo.list_models()] + \
                [f"tv:{name}:{batch}" for batch in (1, 16) for name in TORCHVISION]


def measure(case: str, args) -> dict:
    source, name, batch, precision = _parse(case)
    proto, module = (network(name, batch) if source == "tv" else (zoo.build(name, batch=batch), None))
    x = np.random.default_rng(0).standard_normal(_input_shape(proto)).astype("float32")
    row = {"case": case, "model": name, "source": source, "batch": batch, "precision": precision,
           "measured": now(), "systems": {}, "seconds": {}}
    clock = _Laps(row["seconds"])  # where the case's device time goes
    reference = _pytorch(row, proto, module, x, args, precision)
    clock.lap("pytorch")
    if not args.schedules:  # the peers alone
        if reference is None:
            raise SystemExit(f"{case}: PyTorch's peers were not measured ({row['pytorch']})")
        return row | row_options(args, precision)
    tolerance = args.tolerance if precision == "fp32" else args.fp16_tolerance
    # --merge auto checks the merged model against the unmerged one as the rows' dp schedules them
    dp = dict(schedule="dp", max_streams=args.streams,
              **options_for("dp", stream_mapping=args.stream_mapping, time_orders=not args.stage_sums))
    model = tvmsched.compile(proto, target=args.target, tuned=not args.untuned, kernels=args.kernels,
                             precision=precision, layout=args.layout, merge=args.merge,
                             **(dp if args.merge == "auto" else {}))
    clock.lap("tvmsched_build")
    row["tuned_kernels"], row["kernels"] = len(model.meta.tuned_kernels), len(model.graph.kernels)
    row["implementations"] = model.graph.implementations()
    if args.merge != "off":
        row["merged_convolutions"] = list(model.meta.merged_convolutions)
        row["merged_matmuls"] = list(model.meta.merged_matmuls)
        row["merge_choices"] = [choice.to_json() for choice in model.meta.merge_choices]
        row["merge_check_ms"] = dict(model.meta.merge_check)
    if reference is None:  # no PyTorch: check against tvmsched's own sequential kernels
        reference = model.reschedule("sequential", executor="sequential")(x)
    row["output_absmax"] = float(np.abs(reference).max())  # a zero output would make every check pass
    if "relax_vm" not in args.skip:
        row["systems"]["relax_vm"] = {"median_ms": _relax_vm_ms(proto, args, precision)}
        clock.lap("relax_vm")
    row |= row_options(args, precision)
    for schedule in args.schedules:
        start = time.perf_counter()
        options = options_for(schedule, stream_mapping=args.stream_mapping, time_orders=not args.stage_sums)
        with model.reschedule(schedule, max_streams=args.streams, **options) as scheduled:
            search_s = time.perf_counter() - start
            diff = relative_diff(scheduled(x), reference)
            row["systems"][f"tvmsched_{schedule}"] = {
                "median_ms": median_ms(scheduled, args.repeat)[0], "search_s": round(search_s, 2),
                "streams": scheduled.plan.num_streams, "max_rel_diff_vs_reference": diff,
                "matches": diff <= tolerance,
                **{key: value for key, value in scheduled.plan.schedule.items()
                   if key.startswith(("blocks_", "baseline", "tvm_in_stage", "in_plan")) or key == "plan_ms"}}
    clock.lap("tvmsched_schedules")
    best_peer = min((entry["median_ms"], system) for system, entry in row["systems"].items()
                    if not system.startswith("tvmsched") and entry.get("median_ms"))
    row["best_peer"] = {"system": best_peer[1], "median_ms": best_peer[0],
                        "dp_speedup": round(best_peer[0] / row["systems"]["tvmsched_dp"]["median_ms"], 3)}
    print(f"  {case:22s} " + "  ".join(f"{system} {entry['median_ms']:.3f}" for system, entry
                                        in row["systems"].items() if entry.get("median_ms")), flush=True)
    return row


class _Laps:
    """Seconds since the previous lap, into `seconds[name]`."""

    def __init__(self, seconds: dict):
        self.seconds, self.last = seconds, time.perf_counter()

    def lap(self, name: str) -> None:
        now_ = time.perf_counter()
        self.seconds[name], self.last = round(now_ - self.last, 1), now_


def row_options(args, precision: str) -> dict:
    """The options a row in `precision` is measured with (rows with others are not mixed in), its layout
    the one --layout gives it: a row of PyTorch's peers alone (--schedules with none) uses none of
    tvmsched's."""
    if not args.schedules:
        return {"peers_only": True}
    layout = chosen(args.layout, precision, resolve_target(args.target).kind)
    return {"peers_only": False, "stream_mapping": args.stream_mapping, "dp_time_orders": not args.stage_sums,
            "kernel_choice": args.kernels, "untuned": args.untuned, "layout": layout, "merge": args.merge}


def _mixed(row: dict, options: dict) -> bool:
    """Whether `row` was measured with options other than `options` (a row from before `peers_only` was
    recorded is a peers-only one where it has no tvmsched system)."""
    recorded = {"peers_only": not any(system.startswith("tvmsched_") for system in row["systems"]), **row}
    if recorded["peers_only"]:
        recorded = {"peers_only": True}  # such rows' other options were not used
    return any(key in recorded and recorded[key] != value for key, value in options.items())


def _parse(case: str) -> tuple[str, str, int, str]:
    """(source, model, batch, precision) of MODEL:BATCH[:fp16] or tv:MODEL:BATCH[:fp16]."""
    parts = case.split(":")
    precision = parts.pop() if parts[-1] in PRECISIONS else "fp32"
    source, name, batch = parts if len(parts) == 3 else ("zoo", *parts, "")[:3]
    if source not in ("zoo", "tv") or len(parts) not in (2, 3) or not batch.isdigit():
        raise SystemExit(f"bad case '{case}': MODEL:BATCH (zoo) or tv:MODEL:BATCH with MODEL a torchvision "
                         f"classification network, then :fp16 for half precision")
    return source, name, int(batch), precision


def _input_shape(proto: onnx.ModelProto) -> tuple[int, ...]:
    return tuple(dim.dim_value for dim in proto.graph.input[0].type.tensor_type.shape.dim)


def _pytorch(row: dict, proto, module, x: np.ndarray, args, precision: str) -> np.ndarray | None:
    """PyTorch eager, + CUDA Graph and torch.compile latencies into `row`, in `precision` (fp16: the module
    in float16 and channels_last); returns eager's fp32 output, the reference of every check."""
    try:
        import torch

        from experiments.torch_onnx import OnnxModule, cuda_graph, fp32_settings
    except ImportError as error:
        row["pytorch"] = f"not measured: {error}"
        return None
    fp32_settings()
    cuda = args.target != "llvm"
    device = "cuda" if cuda else "cpu"
    module = (module or OnnxModule(proto)).to(device).eval()
    example = torch.from_numpy(x).to(device)
    timer = event_median_ms if cuda else partial(host_median_ms, warmup=3)
    row["pytorch"] = torch.__version__
    with torch.no_grad():
        expected = module(example).cpu().numpy()
        if precision == "fp16":
            layout = torch.channels_last if example.dim() == 4 else torch.contiguous_format
            module = module.half().to(memory_format=layout)
            example = example.half().contiguous(memory_format=layout)
            row["pytorch_fp16_max_rel_diff_vs_fp32"] = relative_diff(module(example).float().cpu().numpy(),
                                                                     expected)
        row["systems"]["pytorch_eager"] = {"median_ms": timer(lambda: module(example), args.repeat)}
        if cuda:
            replay, _, output = cuda_graph(module, example)
            replay()
            row["systems"]["pytorch_cuda_graph"] = {
                "median_ms": timer(replay, args.repeat),
                "max_rel_diff_vs_eager": relative_diff(output.float().cpu().numpy(), expected)}
        start = time.perf_counter()
        # Every zoo case runs OnnxModule.forward: without a reset, Dynamo would recompile the earlier
        # cases' code with shapes made dynamic (and stop at its recompile limit), so a case's figure
        # would depend on the cases before it in the same call.
        if "torch_compile" in args.skip:
            return expected
        torch._dynamo.reset()
        compiled = torch.compile(module, mode="reduce-overhead" if cuda else "default", dynamic=False)
        try:
            output = compiled(example).float().cpu().numpy()
        except Exception as error:  # a compiler failure is a result, not the end of the suite
            row["torch_compile"] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:300]}"
            return expected
        row["systems"]["torch_compile"] = {
            "median_ms": timer(lambda: compiled(example), args.repeat),
            "compile_s": round(time.perf_counter() - start, 1),
            "max_rel_diff_vs_eager": relative_diff(output, expected)}
    return expected


def _relax_vm_ms(proto, args, precision: str) -> float:
    """Median latency of TVM's Relax VM running the same lowered module with the same kernels (tuned from
    the same log where tvmsched's build uses a record, dlight defaults elsewhere)."""
    spec = resolve_target(args.target)
    inputs = frontend.bind_input_shapes(proto)
    merge = "all" if args.merge == "all" else "off"  # "auto"'s choice needs tvmsched's build
    imported = frontend.to_relax(proto, inputs)
    layout = chosen(args.layout, precision, spec.kind)
    lowered = lower(rewrite(imported, precision, layout, merge, spec=spec).module)
    module = tvm.IRModule(dict(lowered.module.functions), attrs=lowered.module.attrs)
    graph, _ = extract(lowered, [item.name for item in inputs])
    workloads = {kernel.symbol: kernel.workload for kernel in graph.kernels}
    with applied(build_logs(spec), workloads) as (database, keep_default, _):
        if database is not None:
            kernels, _ = tuned_schedules(kernel_module(lowered), spec, database, keep_default)
            for global_var, function in kernels.functions.items():
                module[global_var.name_hint] = function
    device = tvm.cuda(0) if spec.kind == "cuda" else tvm.cpu(0)
    machine = relax.VirtualMachine(tvm.compile(default_schedules(module, spec), target=spec.tvm_target),
                                   device)
    x = tvm.runtime.tensor(np.zeros([item.shape for item in inputs][0], "float32"), device)
    timer = machine.time_evaluator("main", device, number=10, repeat=args.repeat)
    return round(timer(x).median * 1e3, 4)


def markdown(rows: list[dict]) -> str:
    """One line per case: each system's median latency (✗: output off PyTorch's), and dp's speedup over the
    best peer."""
    systems = list(dict.fromkeys(system for row in rows for system in row["systems"]))
    lines = ["| case | " + " | ".join(systems) + " | dp vs best peer |",
             "|---|" + "---|" * (len(systems) + 1)]
    for row in rows:
        cells = [_cell(row["systems"].get(system)) for system in systems]
        best = row.get("best_peer")  # the speedup from the medians: its stored value is rounded already
        dp = row["systems"].get("tvmsched_dp", {}).get("median_ms")
        speedup = f"{best['median_ms'] / dp:.2f}x ({best['system']})" if best else "—"
        lines.append(f"| {row['case']} | " + " | ".join(cells) + f" | {speedup} |")
    return "\n".join(lines) + "\n"


def _cell(entry: dict | None) -> str:
    """A latency, marked ✗ where the output did not match PyTorch's."""
    if entry is None:
        return "—"
    return f"{entry['median_ms']:.3f}" + (" ✗" if entry.get("matches") is False else "")


def chart(rows: list[dict], path: Path) -> None:
    """Grouped bars on a log scale from 1x: each system's speedup over PyTorch + CUDA Graph (over the case's
    slowest system where that did not run; higher is better); hatched where the output did not match
    PyTorch's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    systems = list(dict.fromkeys(system for row in rows for system in row["systems"]))
    references = [_reference(row) for row in rows]
    width = 0.8 / len(systems)
    figure, axes = plt.subplots(figsize=(max(8, 1.2 * len(rows)), 4.5))
    for index, system in enumerate(systems):
        speedups = [reference_ms / row["systems"][system]["median_ms"]
                    if row["systems"].get(system, {}).get("median_ms") else float("nan")
                    for row, (reference_ms, _) in zip(rows, references)]
        bars = axes.bar([case + index * width for case in range(len(rows))], [s - 1 for s in speedups], width,
                        bottom=1.0, label=system)  # from 1x, up where faster, down where slower
        for bar, row in zip(bars, rows):
            if row["systems"].get(system, {}).get("matches") is False:
                bar.set_hatch("xx")  # the output did not match PyTorch's
    axes.set_yscale("log", base=2)
    axes.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}x"))
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks([case + 0.4 - width / 2 for case in range(len(rows))], [row["case"] for row in rows],
                    rotation=30, ha="right")
    axes.set_ylabel("speedup over " + " / ".join(dict.fromkeys(name for _, name in references)))
    axes.legend(fontsize=7, ncol=3)
    figure.tight_layout()
    figure.savefig(path, dpi=150)
    plt.close(figure)


def _reference(row: dict) -> tuple[float, str]:
    """The latency the chart divides by, and what it is: PyTorch + CUDA Graph's, else the slowest system's."""
    graph = row["systems"].get("pytorch_cuda_graph", {}).get("median_ms")
    if graph:
        return graph, "PyTorch + CUDA Graph"
    slowest = max(entry["median_ms"] for entry in row["systems"].values() if entry.get("median_ms"))
    return slowest, "the slowest system"


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--out-dir", required=True, help="where bench_<device>_<date>.json/.md/.png go")
    parser.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help="MODEL:BATCH or tv:MODEL:BATCH")
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--stream-mapping", choices=STREAM_MAPPINGS, default=DEFAULT_STREAM_MAPPING,
                        help="streams of greedy's and dp's groups (docs/schedulers.md)")
    parser.add_argument("--stage-sums", action="store_true",
                        help="dp chooses between its parts' stages and greedy's by stage sums, as IOS, "
                             "instead of by timing the whole plan on the GPU (docs/schedulers.md)")
    parser.add_argument("--kernels", choices=("auto", "tvm", "vendor"), default="auto",
                        help="tvmsched's kernel implementations (tvmsched build --kernels)")
    parser.add_argument("--untuned", action="store_true", help="build with no tuning log applied")
    parser.add_argument("--layout", choices=LAYOUT_CHOICES, default="auto",
                        help="tvmsched's convolution layout (tvmsched build --layout)")
    parser.add_argument("--merge", choices=MERGES, nargs="?", const="all", default="off",
                        help="tvmsched's IOS-Merge (tvmsched build --merge); the Relax VM runs the model "
                             "merged with all, unmerged otherwise")
    parser.add_argument("--schedules", nargs="*", choices=SCHEDULES, default=list(SCHEDULES),
                        help="tvmsched's schedulers to measure (dp is needed for the speedup); none: the "
                             "PyTorch peers alone, nothing built")
    parser.add_argument("--skip", nargs="+", choices=("torch_compile", "relax_vm"), default=[],
                        help="peers not to measure (each costs a compile)")
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest relative difference from PyTorch's output that counts as a match")
    parser.add_argument("--fp16-tolerance", type=float, default=1e-2,
                        help="the same for fp16 cases, against PyTorch's fp32 output")
    parser.add_argument("--name", default="h100", help="device name in the file names")
    parser.add_argument("--date", default=datetime.date.today().isoformat(),
                        help="the date in the file names (default today; an earlier run's to add to it)")
    parser.add_argument("--again", action="store_true",
                        help="measure cases again that the JSON in --out-dir already holds (by default "
                             "they are kept and skipped, so a long suite can run over several calls)")
    args = parser.parse_args()
    if not args.schedules and importlib.util.find_spec("torch") is None:
        raise SystemExit("--schedules with none measures PyTorch alone, and torch is not installed")
    stem = Path(args.out_dir) / f"bench_{args.name}_{args.date}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    path = stem.with_suffix(".json")
    results = ResultFile.load(path, "case")
    cases = results.todo(args.cases, args.again)
    other = [row["case"] for row in results.rows if row["case"] in args.cases and not args.again
             and _mixed(row, row_options(args, row.get("precision", "fp32")))]
    if other:
        raise SystemExit(f"{path} holds {', '.join(other)} measured with other options than these "
                         f"({row_options(args, 'fp32')} in fp32); measure them --again, or write to another "
                         f"--out-dir or --date")
    results.commands.append(command("experiments.bench"))
    header = {"experiment": "bench", "device": device_name(resolve_target(args.target)), "date": args.date,
              "tvm": tvm.__version__,
              "precision": "fp32 (TF32 off in cuDNN and matmul) unless a row says fp16",
              "timing": "CUDA events around each inference (PyTorch), tvmsched's benchmark (median of 3 runs "
                        "of `repeat`), Relax VM time_evaluator; medians in ms",
              "tolerance": args.tolerance}
    for case in cases:
        results.put(measure(case, args))
        results.write(header)  # after every case: a later call goes on from here
    rows = results.rows
    stem.with_suffix(".md").write_text(markdown(rows))
    chart(rows, stem.with_suffix(".png"))
    print(markdown(rows))
    mismatches = [(row["case"], system) for row in rows for system, entry in row["systems"].items()
                  if entry.get("matches") is False or row.get("output_absmax") == 0]
    if mismatches:
        print(f"outputs off PyTorch's by more than {args.tolerance}: {mismatches}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
