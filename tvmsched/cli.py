"""The `tvmsched` command line: models, build, run, bench."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from tvmsched.errors import InputError, TvmschedError
from tvmsched.frontend import parse_input_shape
from tvmsched.tuning.tune import CONCURRENT, COST_MODELS, SEARCH_STRATEGIES, TuneOptions

console = Console(stderr=True, highlight=False, soft_wrap=True)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line and exit code 2."""

    def error(self, message: str):
        console.print(f"[red]error:[/red] {message} (see: {self.prog} --help)")
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args) or 0
    except TvmschedError as error:
        console.print(f"[red]error:[/red] {error}")
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        return 130


def _build_parser() -> _Parser:
    parser = _Parser(prog="tvmsched", description=(
        "Compile ONNX models with TVM into fast GPU inference: tuned kernels (MetaSchedule) run on "
        "several CUDA streams by an inter-operator schedule. MODEL is an .onnx file or a zoo model name "
        "(tvmsched models list)."))
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)

    models = commands.add_parser("models", help="list or export the built-in model zoo")
    models_commands = models.add_subparsers(title="actions", metavar="ACTION", parser_class=_Parser)
    listing = models_commands.add_parser("list", help="list the zoo models")
    listing.set_defaults(handler=_models_list)
    export = models_commands.add_parser("export", help="write a zoo model as an .onnx file")
    export.add_argument("name", help="zoo model name")
    export.add_argument("-o", "--output", required=True, type=Path, help="the .onnx file to write")
    export.add_argument("--batch", type=int, default=None,
                        help="static batch size (default: a symbolic 'batch' dimension)")
    export.add_argument("--image-size", type=int, default=None, help="input height and width")
    export.set_defaults(handler=_models_export)

    build = commands.add_parser("build", help="compile a model into a directory (model.so, plan, metadata)")
    build.add_argument("model", help="an .onnx file or a zoo model name")
    build.add_argument("-o", "--output", required=True, type=Path, help="the build directory to write")
    _add_compile_flags(build)
    build.set_defaults(handler=_build)

    run = commands.add_parser("run", help="run one inference of a build directory or a model")
    run.add_argument("model", help="a build directory, an .onnx file or a zoo model name")
    _add_compile_flags(run)
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="an input from a .npy file (repeatable); others are random (seeded)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("--save-output", type=Path, metavar="FILE.npz", help="write the outputs to an .npz")
    run.set_defaults(handler=_run)

    bench = commands.add_parser("bench", help="time inference of a build directory or a model")
    bench.add_argument("model", help="a build directory, an .onnx file or a zoo model name")
    _add_compile_flags(bench)
    bench.add_argument("--warmup", type=int, default=10, help="untimed runs first (default 10)")
    bench.add_argument("--repeat", type=int, default=50, help="timed runs; the median is reported")
    bench.add_argument("--json", type=Path, metavar="FILE", help="also write the result as JSON")
    bench.set_defaults(handler=_bench)

    profile = commands.add_parser(
        "profile", help="per-kernel latencies, a stream timeline and a schedule plot",
        description="Time every kernel alone (median of --repeat) with its FLOPs, bytes, TFLOP/s, GB/s and "
                    "share of the GPU's roofline, trace one inference with a track per stream, and write "
                    "kernels.csv, profile.json, trace.json (open it in https://ui.perfetto.dev), "
                    "timeline.png and schedule.png/.svg into -o DIR.")
    profile.add_argument("model", help="a build directory, an .onnx file or a zoo model name")
    profile.add_argument("-o", "--output", required=True, type=Path, metavar="DIR", help="where to write")
    _add_compile_flags(profile)
    profile.add_argument("--repeat", type=int, default=50, help="timed runs per kernel (default 50)")
    profile.add_argument("--top", type=int, default=20, help="kernels shown in the table (default 20)")
    profile.set_defaults(handler=_profile)
    _add_tune_command(commands)
    return parser


def _add_tune_command(commands) -> None:
    tune = commands.add_parser(
        "tune", help="tune a model's kernels with MetaSchedule into the target's tuning log",
        description="Tune every unique kernel of the models with MetaSchedule and append the measured "
                    "records to tuning_logs/<target key>/ (or --log), which every later build for that "
                    "target applies. Rerunning continues: kernels that already have --trials trials are "
                    "skipped. Ctrl-C, SIGTERM or --time-budget stops early and keeps every measured record.")
    tune.add_argument("models", nargs="*", metavar="MODEL", help=".onnx files or zoo model names")
    tune.add_argument("--zoo", nargs="+", default=[], metavar="NAME", help="zoo models to tune (or 'all')")
    _add_model_flags(tune)
    tune.add_argument("--trials", type=int, default=64,
                      help="measured candidates per unique kernel, over all runs (default 64)")
    tune.add_argument("--time-budget", type=_duration, default=None, metavar="8m",
                      help="start no new batch of trials after this long, and no new kernel expected to "
                           "end after it (s, m or h; default: no limit); the batches in flight and saving "
                           "the log take up to a minute more")
    tune.add_argument("--search", choices=SEARCH_STRATEGIES, default="evolutionary",
                      help="MetaSchedule search strategy (default evolutionary)")
    tune.add_argument("--population", type=int, default=TuneOptions.population,
                      help=f"evolutionary search: candidates per generation (default "
                           f"{TuneOptions.population})")
    tune.add_argument("--generations", type=int, default=TuneOptions.generations,
                      help=f"evolutionary search: mutation rounds per measured batch (default "
                           f"{TuneOptions.generations})")
    tune.add_argument("--cost-model", choices=COST_MODELS, default="xgb",
                      help="the model that ranks candidates before measuring (default xgb)")
    tune.add_argument("--rpc", metavar="HOST:PORT:KEY",
                      help="measure on the devices registered with this TVM RPC tracker under KEY")
    tune.add_argument("--workers", type=int, default=None, help="parallel builds (default: every core)")
    tune.add_argument("--concurrent", type=int, default=None, metavar="N",
                      help=f"kernels tuned at once, sharing the builds and measuring one candidate at a "
                           f"time (default {CONCURRENT}; 1 when measuring on this machine's CPU, whose "
                           f"timings concurrent builds would disturb)")
    tune.set_defaults(handler=_tune)


def _duration(text: str) -> float:
    """'90s', '8m', '1.5h' or plain seconds → seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        return float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a duration such as 90s, 8m or 1h") from None


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="auto",
                        help="auto (cuda if a GPU is present, else llvm), llvm (CPU), cuda (the local "
                             "GPU, else cross-compile for the H100), or an NVIDIA TVM tag such as "
                             "nvidia/nvidia-a100 (default: auto)")
    parser.add_argument("--batch", type=int, default=None,
                        help="batch size: binds dim 0 of every input (zoo models default to 1)")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:1x3x224x224",
                        help="bind the whole shape of one input (repeatable)")
    parser.add_argument("--constant-input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="bind one input to a value when the model is built (repeatable): it becomes a "
                             "constant, no longer an input; needed where an input's value decides a shape "
                             "(a Reshape's shape, a ReduceSum's axes, ...)")
    parser.add_argument("--log", default=None, metavar="DIR",
                        help="the tuning log: a log directory or a folder of them by target key (default: "
                             "tuning_logs/ or $TVMSCHED_TUNING_LOGS)")


def _add_compile_flags(parser: argparse.ArgumentParser) -> None:
    _add_model_flags(parser)
    parser.add_argument("--untuned", action="store_true",
                        help="ignore the tuning log: every kernel gets its default schedule")
    from tvmsched.executor import EXECUTORS
    from tvmsched.schedule import SCHEDULERS
    from tvmsched.schedule.base import DEFAULT_STREAM_MAPPING, STREAM_MAPPINGS

    parser.add_argument("--schedule", default="sequential", choices=sorted(SCHEDULERS),
                        help="inter-operator schedule: which stream runs each kernel, in which order "
                             "(default: sequential)")
    parser.add_argument("--streams", type=int, default=8, help="at most this many CUDA streams (default 8)")
    parser.add_argument("--cost", choices=("measured", "analytic"), default=None,
                        help="stage latencies for the schedulers: measured on the GPU (default where the "
                             "build's GPU is present; cached) or the analytic roofline model")
    parser.add_argument("--max-group-size", type=int, default=3,
                        help="dp: at most this many kernels in one group of a stage (IOS's r, default 3)")
    parser.add_argument("--max-groups", type=int, default=8,
                        help="dp: at most this many concurrent groups in a stage (IOS's s, default 8)")
    parser.add_argument("--max-states", type=int, default=1024,
                        help="dp: split a block whose search has more sets of kernels than this (default "
                             "1024; larger searches longer for schedules that are rarely better)")
    parser.add_argument("--stage-sums", action="store_true",
                        help="dp: choose each part's searched or greedy's stages by the sum of their "
                             "stage latencies, as IOS, instead of timing the whole plan on the GPU (the "
                             "executed plan has no barriers between stages; docs/schedulers.md)")
    parser.add_argument("--stream-mapping", choices=STREAM_MAPPINGS, default=DEFAULT_STREAM_MAPPING,
                        help="greedy and dp: the stream of each group of a stage; affinity (default): a "
                             "stream whose last kernel the group reads, else the one idle longest, so fewer "
                             "groups queue behind unrelated ones; index: group i on stream i")
    parser.add_argument("--executor", choices=sorted(EXECUTORS), default=None,
                        help="cuda-graph (default on GPU): the plan captured into one CUDA Graph; streams: "
                             "the same launches live, for debugging; sequential (default on CPU): one "
                             "stream, in order")
    parser.add_argument("--force", action="store_true",
                        help="load a build directory made by another TVM version or for another GPU")


def _models_list(args) -> None:
    from tvmsched import zoo

    table = Table("model", "input", "description")
    for name in zoo.list_models():
        model = zoo.MODELS[name]
        table.add_row(name, f"3x{model.image_size}x{model.image_size}", model.description)
    Console().print(table)


def _models_export(args) -> None:
    from tvmsched import zoo

    kwargs = {"image_size": args.image_size} if args.image_size else {}
    path = zoo.export(args.name, args.output, batch=args.batch or "batch", **kwargs)
    console.print(f"wrote {path}")


def _compiled(args):
    """Load a build directory, or compile a model with the command's flags, showing progress."""
    import tvmsched
    from tvmsched.schedule import options_for
    constants = dict(_npy_arrays("--constant-input", args.constant_input))
    if Path(args.model).is_dir():
        return tvmsched.load(args.model, executor=args.executor, batch=args.batch, force=args.force,
                             constant_inputs=constants)
    shapes = dict(parse_input_shape(text) for text in args.input_shape)
    with console.status("compiling") as status:
        def search_progress(stats: dict) -> None:
            status.update(f"{args.model}: dp search: {stats['blocks']} blocks done "
                          f"({stats['modeled_ms']:.3f} ms so far), {stats['states']} states, "
                          f"{stats['stages_evaluated']} stages evaluated, "
                          f"{stats['measurements']} measurements")

        options = options_for(args.schedule, stream_mapping=args.stream_mapping,
                              max_group_size=args.max_group_size, max_groups=args.max_groups,
                              max_states=args.max_states, time_orders=not args.stage_sums,
                              search_progress=search_progress)
        model = tvmsched.compile(args.model, target=args.target, batch=args.batch, input_shapes=shapes,
                                 schedule=args.schedule, max_streams=args.streams, executor=args.executor,
                                 cost=args.cost, tuning_log=args.log, tuned=not args.untuned,
                                 constant_inputs=constants, **options,
                                 progress=lambda stage: status.update(f"{args.model}: {stage}"))
    tuned = (f"{len(model.meta.tuned_kernels)} tuned from {model.meta.tuning_log}" if model.meta.tuning_log
             else "none tuned" + (", --untuned" if args.untuned else f", no tuning log for "
                                                                      f"{model.meta.target.key}"))
    console.print(f"compiled {args.model}: {len(model.graph.kernels)} kernels for {model.meta.target.key} "
                  f"({tuned}), {model.plan.num_streams} stream(s), "
                  f"{model.plan.memory.activation_bytes / 2**20:.1f} MiB of activations")
    for symbol, why in model.meta.fallbacks:
        console.print(f"  kernel {symbol}: {why}")
    return model


def _npy_arrays(flag: str, items: list[str]) -> list[tuple[str, np.ndarray]]:
    """(name, array) of each NAME=FILE.npy of `flag`."""
    arrays = []
    for item in items:
        name, _, file = item.partition("=")
        if not name or not file:
            raise InputError(f"{flag} '{item}': write NAME=FILE.npy")
        try:
            arrays.append((name, np.load(file)))
        except (OSError, ValueError) as error:
            raise InputError(f"{flag} '{item}': cannot read '{file}' as a .npy array ({error}); save it "
                             f"with numpy.save") from error
    return arrays


def _build(args) -> None:
    model = _compiled(args)
    model.save(args.output)
    console.print(f"wrote {args.output}/ (graph {model.graph.hash}, "
                  f"{sum(tensor.nbytes for tensor in model.graph.constants) / 2**20:.1f} MiB of weights)")


def _run(args) -> None:
    model = _compiled(args)
    inputs = model.random_inputs(args.seed)
    inputs.update(_npy_arrays("--input", args.input))
    with model:  # releases its executor's streams, events and CUDA graph (main may run in a longer process)
        outputs = model.run(inputs)
    table = Table("output", "shape", "dtype", "min", "max", "mean", "argmax (first row)")
    for spec, value in zip(model.outputs, outputs):
        first = value.reshape(value.shape[0], -1)[0] if value.ndim else value.reshape(1)
        table.add_row(spec.name, "x".join(map(str, value.shape)), str(value.dtype), f"{value.min():.4g}",
                      f"{value.max():.4g}", f"{value.mean():.4g}", str(int(np.argmax(first))))
    Console().print(table)
    if args.save_output:
        np.savez(args.save_output, **{spec.name: value for spec, value in zip(model.outputs, outputs)})


def _bench(args) -> None:
    model = _compiled(args)
    with model:
        result = {"model": args.model, "target": model.meta.target.key, "kernels": len(model.graph.kernels),
                  "schedule": model.plan.scheduler, "streams": model.plan.num_streams,
                  **model.benchmark(warmup=args.warmup, repeat=args.repeat)}
    Console().print(f"{args.model} on {result['device']} ({result['executor']}, {result['schedule']}, "
                    f"{result['streams']} streams): median {result['median_ms']:.3f} ms "
                    f"(min {result['min_ms']:.3f}, max {result['max_ms']:.3f}, {args.repeat} runs)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))



def _profile(args) -> None:
    from tvmsched import plot

    model = _compiled(args)
    with model, console.status(f"profiling {len(model.graph.kernels)} kernels"):
        result = model.profile(repeat=args.repeat)
    table = Table("kernel", "ops", "output", "ms", "%", "TFLOP/s", "GB/s", "roofline %", "tuned",
                  title=f"{args.model} on {result.device} ({result.schedule}): inference "
                        f"{result.benchmark_ms:.3f} ms ({result.inference_ms:.3f} ms traced), kernels "
                        f"alone {result.kernel_ms:.3f} ms")
    for kernel in result.by_time()[:args.top]:
        roofline = "" if kernel.roofline_pct is None else f"{kernel.roofline_pct:.0f}"
        table.add_row(f"{kernel.id} {kernel.symbol}", "+".join(kernel.op_kinds), kernel.output,
                      f"{kernel.ms:.4f}", f"{100 * kernel.ms / result.kernel_ms:.1f}", f"{kernel.tflops:.2f}",
                      f"{kernel.gbps:.1f}", roofline, "yes" if kernel.tuned else "")
    Console().print(table)
    written = result.save(args.output)
    written.append(plot.timeline(result, args.output / "timeline.png"))
    written += [plot.schedule(model.graph, model.plan, args.output / f"schedule.{suffix}")
                for suffix in ("png", "svg")]
    console.print(f"wrote {', '.join(path.name for path in written)} to {args.output}/")


def _tune(args) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from tvmsched import frontend, zoo
    from tvmsched.api import model_proto
    from tvmsched.lower import lower
    from tvmsched.target import resolve_target
    from tvmsched.tuning import TuningLog, tune

    names = [*args.models, *(zoo.list_models() if args.zoo == ["all"] else args.zoo)]
    if not names:
        raise InputError("name the models to tune: tvmsched tune MODEL... or --zoo NAME... (--zoo all)")
    spec = resolve_target(args.target)
    log = TuningLog.for_target(spec, args.log)
    shapes = dict(parse_input_shape(text) for text in args.input_shape)
    constants = dict(_npy_arrays("--constant-input", args.constant_input))
    started = time.monotonic()  # the budget covers lowering too
    options = TuneOptions(trials=args.trials, search=args.search,
                          population=args.population, generations=args.generations,
                          cost_model=args.cost_model, rpc=args.rpc, workers=args.workers,
                          concurrent=args.concurrent)
    modules = []
    for name in names:
        with console.status(f"{name}: importing and lowering"):
            proto = model_proto(name, args.batch)
            inputs = frontend.bind_input_shapes(proto, args.batch, shapes, constants)
            modules.append(lower(frontend.to_relax(proto, inputs, constants)))
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} "
               "trials"), TimeElapsedColumn(), TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=console) as bar:
        row = bar.add_task(", ".join(names), total=None, status="extracting tasks")
        report = _tune_reporter(bar, row, args.trials)
        if args.time_budget is not None:
            options = replace(options, time_budget_s=max(0.0, args.time_budget - time.monotonic() + started))
        try:
            result = tune(modules, spec, log, options, progress=report)
        except KeyboardInterrupt:
            console.print(f"stopped: the records measured so far are in {log.directory}")
            raise
        report(result, finished=True)
    stopped = " (time budget spent)" if result.stopped_by_budget else ""
    console.print(f"{result.trials} trials on {len(result.tasks)} kernels in {result.seconds:.0f} s"
                  f"{stopped}; {result.skipped} kernels already had {args.trials} trials; "
                  f"{result.failed_builds} failed builds, {result.failed_runs} failed runs; "
                  f"log {log.directory}")
    for message in result.messages:
        console.print(f"  failure: {message}")


def _tune_reporter(bar, row, trials: int):
    """A `tune` progress callback that updates one row of a rich Progress (trials, kernels done and being
    tuned, the estimated kernel time of one inference against the defaults', failed builds) and prints a
    line per finished kernel."""
    printed = set()

    def report(result, finished: bool = False) -> None:
        for index, task in enumerate(result.tasks):
            ended = task.state in ("done", "stopped") or finished
            if ended and index not in printed and (task.trials or task.exhausted):
                printed.add(index)
                bar.console.print(_kernel_line(task))
        done = sum(task.state == "done" for task in result.tasks)
        tuning = sum(task.state == "tuning" for task in result.tasks)
        status = f"{done}/{len(result.tasks)} kernels done, {tuning} tuning"
        if result.estimated_ms:
            status += f"; est. {result.estimated_ms:.3f} ms (default {result.default_ms or 0:.3f})"
        if result.failed_builds:
            status += f"; {result.failed_builds} failed builds"
        bar.update(row, completed=result.trials, status=status,
                   total=sum(trials - task.trials_before for task in result.tasks))
    return report


def _kernel_line(task) -> str:
    """How one kernel's tuning ended, for the run's output."""
    default = f" (default {task.default_ms:.4f} ms)" if task.default_ms is not None else ""
    total = task.trials_before + task.trials
    if not total:  # exhausted before its first batch
        return (f"  {task.name} (x{task.weight}): the search found no candidate to measure in "
                f"{task.seconds:.0f} s; it keeps the default schedule{default} and later runs skip it")
    best = f"best {task.best_ms:.4f} ms" if task.best_ms is not None else "no valid candidate"
    return f"  {task.name} (x{task.weight}): {total} trials, {best}{default}"


if __name__ == "__main__":
    sys.exit(main())
