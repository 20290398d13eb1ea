"""The `tvmsched` command line: models, build, run, bench, profile, tune.

Every error is one line naming the problem, the object and the fix, with exit code 2: flags are checked as
they are parsed (numbers in range, output paths writable in kind) and everything else raises a
`TvmschedError`, so a wrong flag or file is reported before anything is compiled where it can be.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tvmsched.cost import STAGE_COSTS
from tvmsched.errors import InputError, OutputError, TvmschedError, UsageError
from tvmsched.frontend import parse_input_shape
from tvmsched.layout import CHOICES as LAYOUT_CHOICES
from tvmsched.layout import chosen
from tvmsched.precision import PRECISIONS
from tvmsched.rewrite import MERGES
from tvmsched.tuning.tune import (
    CONCURRENT,
    COST_MODELS,
    SEARCH_STRATEGIES,
    VENDOR_PROBE,
    VENDOR_REACH,
    TuneOptions,
)

console = Console(stderr=True, highlight=False, soft_wrap=True)

SAVED_BUILD_HELP = ("Given a build directory, the scheduling flags (--schedule, --streams, --cost, "
                    "--stream-mapping and dp's) reschedule its kernels (nothing is recompiled; --schedule "
                    "defaults to the build's), the flags that apply when compiling (--target, "
                    "--input-shape, --log, --untuned, --kernels, --precision, --layout, --merge) are "
                    "refused: rebuild instead, and --constant-input values must be those the build was made "
                    "with.")
COMPILE_FLAGS = {"target": "--target", "input_shape": "--input-shape", "log": "--log", "untuned": "--untuned",
                 "kernels": "--kernels", "precision": "--precision", "layout": "--layout", "merge": "--merge"}
PRECISION_HELP = ("fp32, or fp16: float16 weights and activations with float32 accumulation in convolutions "
                  "and matrix products; inputs and outputs keep the model's dtypes")
LAYOUT_HELP = ("the convolutions' data layout: nchw as the model is, nhwc (channels-last, weights OHWI), or "
               "auto: nhwc in fp16 on a GPU (cuDNN's half-precision convolutions want it), else nchw; inputs "
               "and outputs keep the model's layout")
# The scheduling flags that every scheduler takes: their keyword arguments of `compile` and `reschedule` and
# the flags (the schedulers declare their own, `Scheduler.flags`).
COMMON_SCHEDULE_FLAGS = {"max_streams": "--streams", "cost": "--cost"}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line and exit code 2, and takes flags only in full (`tune
    --seed 7` is refused, not read as `--seeds 7`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        console.print(f"[red]error:[/red] {message} (see: {self.prog} --help)")
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    with _noting_interrupts() as interrupted:
        try:
            return args.handler(args) or 0
        except TvmschedError as error:
            console.print(f"[red]error:[/red] {escape(str(error))}")
            return 2
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/yellow]")
            return 130
        except Exception as error:  # a bug, not the user's error: one line too (TVMSCHED_DEBUG=1: raised)
            if interrupted:  # TVM turns an interrupt inside Python code it called into a RuntimeError
                console.print("[yellow]interrupted[/yellow]")
                return 130
            if os.environ.get("TVMSCHED_DEBUG", "0") != "0":
                raise
            console.print(f"[red]error:[/red] internal error ({type(error).__name__}: {escape(str(error))}); "
                          f"this is a bug in tvmsched: rerun with TVMSCHED_DEBUG=1 for the traceback and "
                          f"report it")
            return 2


@contextmanager
def _noting_interrupts():
    """A list that becomes non-empty once Ctrl-C is pressed within the block (which still raises
    KeyboardInterrupt where Python code runs); in the main thread only, where signals arrive, and not
    where Ctrl-C is ignored (a process started in the background)."""
    interrupted: list[bool] = []
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield interrupted
        return

    def note(signum, frame):
        interrupted.append(True)
        signal.default_int_handler(signum, frame)
    previous = signal.signal(signal.SIGINT, note)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def _build_parser() -> _Parser:
    import tvm

    import tvmsched

    parser = _Parser(prog="tvmsched", description=(
        "Compile ONNX models with TVM into fast GPU inference: tuned kernels (MetaSchedule) run on "
        "several CUDA streams by an inter-operator schedule. MODEL is an .onnx file or a zoo model name "
        "(tvmsched models list)."))
    parser.add_argument("--version", action="version",
                        version=f"tvmsched {tvmsched.__version__} (TVM {tvm.__version__})")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command",
                                     parser_class=_Parser)

    models = commands.add_parser("models", help="list or export the built-in model zoo")
    models_commands = models.add_subparsers(title="actions", metavar="ACTION", parser_class=_Parser)
    listing = models_commands.add_parser("list", help="list the zoo models")
    listing.set_defaults(handler=_models_list)
    export = models_commands.add_parser("export", help="write a zoo model as an .onnx file")
    export.add_argument("name", help="zoo model name")
    export.add_argument("-o", "--output", required=True, type=_output("file"), help="the .onnx file to write")
    export.add_argument("--batch", type=_positive, default=None,
                        help="static batch size (default: a symbolic 'batch' dimension)")
    export.add_argument("--image-size", type=_positive, default=None, help="input height and width")
    export.set_defaults(handler=_models_export)

    build = commands.add_parser("build", help="compile a model into a directory (model.so, plan, metadata)")
    build.add_argument("model", help="an .onnx file or a zoo model name")
    build.add_argument("-o", "--output", required=True, type=_output("directory"),
                       help="the build directory to write")
    _add_compile_flags(build)
    build.set_defaults(handler=_build)

    run = commands.add_parser("run", help="run one inference of a build directory or a model",
                              description=SAVED_BUILD_HELP)
    run.add_argument("model", help="a build directory, an .onnx file or a zoo model name")
    _add_compile_flags(run)
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="an input from a .npy file (repeatable); others are random (seeded)")
    run.add_argument("--seed", type=_count, default=0, help="seed of the random inputs")
    run.add_argument("--save-output", type=_output("file"), metavar="FILE.npz",
                     help="write the outputs to an .npz")
    run.set_defaults(handler=_run)

    bench = commands.add_parser("bench", help="time inference of a build directory or a model",
                                description=SAVED_BUILD_HELP)
    bench.add_argument("model", help="a build directory, an .onnx file or a zoo model name")
    _add_compile_flags(bench)
    bench.add_argument("--warmup", type=_count, default=10,
                       help="untimed runs first (default 10, fewer where they would take over a quarter of "
                            "--budget)")
    bench.add_argument("--repeat", type=_positive, default=None,
                       help="timed runs; the median is reported (default: as many as --budget allows, 3 to "
                            "200)")
    bench.add_argument("--budget", type=_duration, default=2.0, metavar="2s",
                       help="about how long the timing may take where --repeat is not given (default 2s)")
    bench.add_argument("--json", type=_output("file"), metavar="FILE", help="also write the result as JSON")
    bench.set_defaults(handler=_bench)

    profile = commands.add_parser(
        "profile", help="per-kernel latencies, a stream timeline and a schedule plot",
        description="Time every kernel alone (median of --repeat) with its FLOPs, bytes, TFLOP/s, GB/s and "
                    "share of the GPU's roofline, trace one inference with a track per stream, and write "
                    "kernels.csv, profile.json, trace.json (open it in https://ui.perfetto.dev), "
                    f"timeline.png and schedule.png/.svg into -o DIR. {SAVED_BUILD_HELP}")
    profile.add_argument("model", help="a build directory, an .onnx file or a zoo model name")
    profile.add_argument("-o", "--output", required=True, type=_output("directory"), metavar="DIR",
                         help="where to write")
    _add_compile_flags(profile)
    profile.add_argument("--repeat", type=_positive, default=50, help="timed runs per kernel (default 50)")
    profile.add_argument("--top", type=_positive, default=20, help="kernels shown in the table (default 20)")
    profile.set_defaults(handler=_profile)

    load = commands.add_parser(
        "plan-load", help="plan the first inference after offload: which kernels read weights in place",
        description="Plan the model's first inference after CompiledModel.offload() freed its GPU memory "
                    "(DeepPlan's direct host access): time every kernel with its weights on the GPU and "
                    "read in place from page-locked host memory, and the weights' copies, then choose per "
                    "kernel; the choice is kept only where the first inference after offload() measures "
                    "faster with it than with every weight uploaded (median of --rounds, outputs checked "
                    f"against a resident run). Prints the table. Needs the build's GPU. {SAVED_BUILD_HELP}")
    load.add_argument("model", help="a build directory, an .onnx file or a zoo model name")
    _add_compile_flags(load)
    load.add_argument("--rounds", type=_positive, default=7,
                      help="first inferences after offload timed each way (default 7; medians)")
    load.add_argument("--json", type=_output("file"), metavar="FILE",
                      help="also write the plan (LoadPlan.from_json reads its 'plan') with its timings")
    load.set_defaults(handler=_plan_load)
    _add_tune_command(commands)
    return parser


def _add_tune_command(commands) -> None:
    tune = commands.add_parser(
        "tune", help="tune a model's kernels with MetaSchedule into the target's tuning log",
        description="Tune every unique kernel of the models with MetaSchedule and append the measured "
                    "records to your tuning log (--log DIR, else $TVMSCHED_TUNING_LOGS, else "
                    "~/.cache/tvmsched/tuning_logs), in <target key>/, which every later build for that "
                    "target applies before the logs shipped in tuning_logs/. Rerunning continues: kernels "
                    "that already have --trials trials are skipped. Ctrl-C, SIGTERM or --time-budget stops "
                    "early and keeps every measured record.")
    tune.add_argument("models", nargs="*", metavar="MODEL", help=".onnx files or zoo model names")
    tune.add_argument("--zoo", nargs="+", default=[], metavar="NAME", help="zoo models to tune (or 'all')")
    _add_model_flags(tune)
    tune.add_argument("--log", type=_output("directory"), default=None, metavar="DIR",
                      help="the tuning log to write: a log directory or a folder of them by target key "
                           "(default: $TVMSCHED_TUNING_LOGS, else ~/.cache/tvmsched/tuning_logs; "
                           "--log tuning_logs writes the repository's shipped logs)")
    tune.add_argument("--precision", choices=PRECISIONS, default="fp32",
                      help=PRECISION_HELP + ": fp16 kernels are other kernels, tuned for fp16 builds "
                           "(default fp32)")
    tune.add_argument("--layout", choices=LAYOUT_CHOICES, default="auto",
                      help=LAYOUT_HELP + ": tune the kernels of the layout your builds use (default auto)")
    tune.add_argument("--trials", type=_positive, default=64,
                      help="measured candidates per unique kernel, over all runs (default 64)")
    tune.add_argument("--time-budget", type=_duration, default=None, metavar="8m",
                      help="start no new batch of trials after this long, and no new kernel expected to "
                           "end after it (s, m or h; default: no limit); the batches in flight and saving "
                           "the log take up to a minute more")
    tune.add_argument("--search", choices=SEARCH_STRATEGIES, default="evolutionary",
                      help="MetaSchedule search strategy (default evolutionary)")
    tune.add_argument("--population", type=_positive, default=TuneOptions.population,
                      help=f"evolutionary search: candidates per generation (default "
                           f"{TuneOptions.population})")
    tune.add_argument("--generations", type=_positive, default=TuneOptions.generations,
                      help=f"evolutionary search: mutation rounds per measured batch (default "
                           f"{TuneOptions.generations})")
    tune.add_argument("--seeds", type=_positive, default=TuneOptions.seeds,
                      help=f"evolutionary search: valid random candidates a search starts from; fewer "
                           f"cost less search time per batch (default {TuneOptions.seeds})")
    tune.add_argument("--cost-model", choices=COST_MODELS, default="xgb",
                      help="the model that ranks candidates before measuring (default xgb)")
    tune.add_argument("--ignore-vendor-plans", action="store_true",
                      help=f"tune every kernel to --trials, also those a cuDNN or cuBLASLt plan (as a build "
                           f"on this GPU timed it) runs faster; by default such a kernel gets {VENDOR_PROBE} "
                           f"trials, and the rest only where TVM came within {VENDOR_REACH}x of the plan "
                           f"(use it for logs meant for builds without the vendor libraries)")
    tune.add_argument("--rpc", metavar="HOST:PORT:KEY",
                      help="measure on the devices registered with this TVM RPC tracker under KEY")
    tune.add_argument("--workers", type=_positive, default=None, help="parallel builds (default: every core)")
    tune.add_argument("--concurrent", type=_positive, default=None, metavar="N",
                      help=f"kernels tuned at once, sharing the builds and measuring one candidate at a "
                           f"time (default {CONCURRENT}; 1 when measuring on this machine's CPU, whose "
                           f"timings concurrent builds would disturb)")
    tune.set_defaults(handler=_tune)


def _duration(text: str) -> float:
    """'90s', '8m', '1.5h' or plain seconds → seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a duration such as 90s, 8m or 1h")
    return seconds


def _integer(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer >= {least}")
    return value


def _positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _integer(text, 1)


def _count(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _integer(text, 0)


def _output(kind: str):
    """An argparse type for a path the command writes, a "file" or a "directory": refused before any work
    if something of the other kind is there, or if a file stands where one of its folders would go."""
    def path(text: str) -> Path:
        path = Path(text)
        if path.exists() and path.is_dir() != (kind == "directory"):
            other = "a file" if kind == "directory" else "a directory"
            raise argparse.ArgumentTypeError(f"'{text}' is {other}; give the path of a {kind} to write")
        folder = next(parent for parent in path.absolute().parents if parent.exists())
        if not folder.is_dir():
            raise argparse.ArgumentTypeError(f"'{text}' cannot be written: '{folder}' is a file")
        return path
    return path


def _tuning_log(text: str) -> Path:
    """An argparse type: a tuning log to apply, which must exist."""
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"there is no tuning log '{text}'; give a directory that tvmsched "
                                         f"tune wrote (tvmsched tune MODEL --log {text})")
    return Path(text)


@contextmanager
def _writing(path: Path):
    """Report a failed write under `path` as one error naming the file."""
    try:
        yield
    except OSError as error:
        raise OutputError(f"cannot write '{error.filename or path}' ({error.strerror or error}); choose "
                          f"another path") from error


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=None,
                        help="auto (cuda if a GPU is present, else llvm), llvm (CPU), cuda (the local "
                             "GPU, else cross-compile for the H100), or an NVIDIA TVM tag such as "
                             "nvidia/nvidia-a100 (default: auto)")
    parser.add_argument("--batch", type=_positive, default=None,
                        help="batch size: binds dim 0 of every input (zoo models default to 1)")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:1x3x224x224",
                        help="bind the whole shape of one input (repeatable)")
    parser.add_argument("--constant-input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="bind one input to a value when the model is built (repeatable): it becomes a "
                             "constant, no longer an input; needed where an input's value decides a shape "
                             "(a Reshape's shape, a ReduceSum's axes, ...)")
    parser.add_argument("--merge", choices=MERGES, nargs="?", const="all", default=None,
                        help="IOS-Merge: convolutions that read the same tensor (same strides, dilation, "
                             "output size; kernels that fit one window) become one convolution, and matmuls "
                             "by constants that share an input one matmul: all merges every such group, "
                             "auto only the groups that run faster merged, each timed merged and not on the "
                             "GPU (the analytic cost without one); with --schedule dp, those that dp's "
                             "search of the unmerged model runs merged (IOS-Both); then on the GPU the "
                             "unmerged model, dp's choice, each group's own and (where one merges) every "
                             "group merged are built and the one whose plan runs fastest kept; off none "
                             "(default off; --merge alone: all)")


def _add_compile_flags(parser: argparse.ArgumentParser) -> None:
    _add_model_flags(parser)
    parser.add_argument("--log", type=_tuning_log, default=None, metavar="DIR",
                        help="the only tuning log to apply: a log directory or a folder of them by target "
                             "key (default: yours, where tvmsched tune writes, then the shipped ones)")
    parser.add_argument("--untuned", action="store_true",
                        help="ignore the tuning logs: every kernel gets its default schedule")
    parser.add_argument("--kernels", choices=("auto", "tvm", "vendor"), default=None,
                        help="who computes the kernels a vendor library could (a convolution with its "
                             "bias and activation, ...): auto (default) the fastest, timed on the GPU, of "
                             "TVM's kernel and the vendor plans (cuDNN; pip install \"tvmsched[cuda]\"); "
                             "vendor: a vendor plan wherever one works; tvm: TVM alone")
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help=PRECISION_HELP + " (default fp32)")
    parser.add_argument("--layout", choices=LAYOUT_CHOICES, default=None,
                        help=LAYOUT_HELP + " (default auto)")
    from tvmsched.executor import EXECUTORS
    from tvmsched.schedule import SCHEDULERS, scheduler_flags

    parser.add_argument("--schedule", default=None, choices=sorted(SCHEDULERS),
                        help="inter-operator schedule: which stream runs each kernel, in which order "
                             "(default: sequential)")
    parser.add_argument("--streams", dest="max_streams", type=_positive, default=None,
                        help="at most this many CUDA streams (default 8)")
    parser.add_argument("--cost", choices=sorted(STAGE_COSTS), default=None,
                        help="stage latencies for the schedulers: measured on the GPU (default where the "
                             "build's GPU is present; cached) or the analytic roofline model")
    for flag, schedulers in scheduler_flags().items():  # each scheduler's own, as it declares them
        help = f"{' and '.join(schedulers)}: {flag.help}"
        if flag.switch is not None:
            parser.add_argument(flag.flag, dest=flag.keyword, action="store_const", const=flag.switch,
                                default=None, help=help)
        else:
            parser.add_argument(flag.flag, dest=flag.keyword, type=None if flag.choices else _positive,
                                choices=flag.choices or None, default=None, help=help)
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
    with _writing(args.output):
        path = zoo.export(args.name, args.output, batch=args.batch or "batch", **kwargs)
    console.print(f"wrote {path}")


def _compiled(args):
    """Compile a model with the command's flags, showing progress, or load a build directory."""
    import tvmsched

    constants = _npy_arrays("--constant-input", args.constant_input)  # before any work: files fail at once
    if Path(args.model).is_dir():
        return _loaded(args, constants)
    shapes = dict(parse_input_shape(text) for text in args.input_shape)
    schedule = args.schedule or "sequential"
    with console.status("compiling") as status:
        options = _schedule_options(args, schedule, status)
        model = tvmsched.compile(args.model, target=args.target or "auto", batch=args.batch,
                                 input_shapes=shapes, schedule=schedule, executor=args.executor,
                                 tuning_log=args.log, tuned=not args.untuned, constant_inputs=constants,
                                 kernels=args.kernels or "auto", precision=args.precision or "fp32",
                                 layout=args.layout or "auto", merge=args.merge or "off", **options,
                                 progress=lambda stage: status.update(f"{args.model}: {stage}"))
    tuned = (f"{len(model.meta.tuned_kernels)} tuned from {model.meta.tuning_log}" if model.meta.tuning_log
             else "none tuned" + (", --untuned" if args.untuned else f", no tuning log for "
                                                                      f"{model.meta.target.key}"))
    console.print(f"compiled {args.model}: {len(model.graph.kernels)} kernels for {model.meta.target.key} "
                  f"in {model.meta.precision}, {model.meta.layout} ({tuned}), "
                  f"{model.plan.num_streams} stream(s), "
                  f"{model.plan.memory.activation_bytes / 2**20:.1f} MiB of activations")
    if model.meta.merge != "off":
        convolutions, matmuls = model.meta.merged_convolutions, model.meta.merged_matmuls
        for choice in model.meta.merge_choices:
            kind = "convolutions" if choice.kind == "conv2d" else "matmuls"
            dp = {True: "merges it", False: "keeps it apart"}.get(choice.dp_merged)
            alone = "merged" if choice.faster_merged else "apart"
            console.print(f"  {choice.members} {kind} of one tensor: {choice.members_ms:.4f} ms, merged "
                          f"{choice.merged_ms:.4f} ms: faster {alone} alone"
                          + (f"; dp's search of the whole model {dp}" if dp else ""))
        if model.meta.merge_check:
            names = {"dp": "dp's choice", "own": "each group's own choice", "all": "every group merged"}
            times = [(names.get(name, name), ms) for name, ms in model.meta.merge_check]
            console.print("  the whole model: " + ", ".join(f"{name} {ms:.4f} ms" for name, ms in times)
                          + f": kept {min(times, key=lambda pair: pair[1])[0]}")
        console.print(f"  merged {sum(convolutions)} convolutions into {len(convolutions)}, {sum(matmuls)} "
                      f"matmuls into {len(matmuls)}")
    for symbol, why in model.meta.fallbacks:
        console.print(f"  kernel {symbol}: {why}")
    console.print(f"  {_implementations(model)}")
    return model


def _implementations(model) -> str:
    """Who computes the kernels: the count per implementation, and what selection measured."""
    counts = model.graph.implementations(model.plan.tvm_kernels)
    recognized = sum(kernel.vendor_op is not None for kernel in model.graph.kernels)
    line = (f"kernels by implementation: {', '.join(f'{count} {name}' for name, count in counts.items())} "
            f"({recognized} a vendor library could compute")
    if model.plan.tvm_kernels:
        line += f"; {len(model.plan.tvm_kernels)} run TVM's function in dp's stages, faster there"
    line += ")"
    timings = model.selection.timings.values() if model.selection else ()
    measured = [(tvm_ms, ms) for tvm_ms, ms in timings if tvm_ms is not None]
    if measured:
        line += (f"; on the chosen ones TVM's kernels took {sum(tvm_ms for tvm_ms, _ in measured):.3f} ms, "
                 f"the vendor plans {sum(ms for _, ms in measured):.3f} ms")
    return line


def _loaded(args, constants: dict[str, np.ndarray]):
    """The build directory `args.model` (refused if made with other `constants`), rescheduled if scheduling
    flags are given (SAVED_BUILD_HELP)."""
    import tvmsched

    refused = [flag for name, flag in COMPILE_FLAGS.items() if getattr(args, name)]
    if refused:
        many = len(refused) > 1
        raise UsageError(f"'{args.model}' is a saved build, and {', '.join(refused)} "
                         f"{'apply' if many else 'applies'} when compiling; rebuild it (tvmsched build MODEL "
                         f"-o {args.model} {' '.join(refused)} ...) or leave {'them' if many else 'it'} out")
    model = tvmsched.load(args.model, executor=args.executor, batch=args.batch, force=args.force,
                          constant_inputs=constants)
    schedule = args.schedule or model.plan.scheduler
    with console.status(f"{args.model}: scheduling ({schedule})") as status:
        options = _schedule_options(args, schedule, status)
        if args.schedule is None and not _schedule_flags_given(args):
            return model
        model = model.reschedule(schedule, executor=args.executor, **options)
    console.print(f"rescheduled {args.model} ({schedule}): {model.plan.num_streams} stream(s)")
    return model


def _schedule_options(args, schedule: str, status) -> dict:
    """The scheduling flags given, as keyword arguments of `compile` and `reschedule` (the others keep their
    defaults), and dp's progress shown in `status`; a flag that `schedule` does not take is refused."""
    from tvmsched.schedule import SCHEDULERS, options_for

    def search_progress(stats: dict) -> None:
        status.update(f"{args.model}: dp search: {stats['blocks']} blocks done "
                      f"({stats['modeled_ms']:.3f} ms so far), {stats['states']} states, "
                      f"{stats['stages_evaluated']} stages evaluated, {stats['measurements']} measurements")

    given = _schedule_flags_given(args)
    taken = COMMON_SCHEDULE_FLAGS.keys() | {flag.keyword for flag in SCHEDULERS[schedule].flags}
    ignored = sorted(flag for keyword, (flag, _) in given.items() if keyword not in taken)
    if ignored:
        raise UsageError(f"--schedule {schedule} does not take {', '.join(ignored)}; leave "
                         f"{'them' if len(ignored) > 1 else 'it'} out or choose a scheduler that does "
                         f"(tvmsched {args.command} --help)")
    return {**{keyword: value for keyword, (_, value) in given.items()},
            **options_for(schedule, search_progress=search_progress)}


def _schedule_flags_given(args) -> dict[str, tuple[str, object]]:
    """The scheduling flags given: for each, its keyword argument of `compile` and `reschedule`, the flag and
    its value."""
    from tvmsched.schedule import scheduler_flags

    flags = {**COMMON_SCHEDULE_FLAGS, **{flag.keyword: flag.flag for flag in scheduler_flags()}}
    return {keyword: (flag, getattr(args, keyword)) for keyword, flag in flags.items()
            if getattr(args, keyword) is not None}


def _build(args) -> None:
    model = _compiled(args)
    with _writing(args.output):
        model.save(args.output)
    console.print(f"wrote {args.output}/ (graph {model.graph.hash}, "
                  f"{sum(tensor.nbytes for tensor in model.graph.constants) / 2**20:.1f} MiB of weights)")


def _run(args) -> None:
    given = _npy_arrays("--input", args.input)  # before compiling: a wrong file is reported at once
    model = _compiled(args)
    inputs = model.random_inputs(args.seed)
    inputs.update(given)
    with model:  # releases its executor's streams, events and CUDA graph (main may run in a longer process)
        outputs = model.run(inputs)
    table = Table("output", "shape", "dtype", "min", "max", "mean", "argmax (first row)")
    for spec, value in zip(model.outputs, outputs):
        first = value.reshape(value.shape[0], -1)[0] if value.ndim else value.reshape(1)
        table.add_row(spec.name, "x".join(map(str, value.shape)), str(value.dtype), f"{value.min():.4g}",
                      f"{value.max():.4g}", f"{value.mean():.4g}", str(int(np.argmax(first))))
    Console().print(table)
    if args.save_output:
        with _writing(args.save_output):
            np.savez(args.save_output, **{spec.name: value for spec, value in zip(model.outputs, outputs)})


def _npy_arrays(flag: str, items: list[str]) -> dict[str, np.ndarray]:
    """The arrays of `flag`'s NAME=FILE.npy items, by name."""
    arrays = {}
    for item in items:
        name, _, file = item.partition("=")
        if not name or not file:
            raise UsageError(f"{flag} '{item}': write NAME=FILE.npy")
        arrays[name] = _read_array(f"{flag} {item}", Path(file))
    return arrays


def _read_array(where: str, path: Path) -> np.ndarray:
    """The array a .npy file holds; a missing file, another kind of file or an .npz archive is an error."""
    if not path.is_file():
        problem = "is not a file" if path.exists() else "does not exist"
        raise InputError(f"{where}: '{path}' {problem}; write the array with numpy.save")
    try:
        value = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise InputError(f"{where}: '{path}' is not a NumPy .npy file; write the array with "
                         f"numpy.save('{path}', array)") from error
    if isinstance(value, np.lib.npyio.NpzFile):
        with value:
            keys = value.files
        raise InputError(f"{where}: '{path}' is an .npz archive (of {', '.join(keys) or 'nothing'}), not one "
                         f"array; save the input alone: numpy.save('input.npy', "
                         f"numpy.load('{path}')['{keys[0] if keys else 'NAME'}'])")
    return value


def _bench(args) -> None:
    model = _compiled(args)
    with model, console.status(f"{args.model}: warming up") as status:
        def progress(done: int, total: int) -> None:
            status.update(f"{args.model}: {done}/{total} inferences timed")
        result = {"model": args.model, "target": model.meta.target.key, "kernels": len(model.graph.kernels),
                  "schedule": model.plan.scheduler, "streams": model.plan.num_streams,
                  **model.benchmark(args.warmup, args.repeat, args.budget, progress)}
    Console().print(f"{args.model} on {result['device']} ({result['executor']}, {result['schedule']}, "
                    f"{result['streams']} streams): median {result['median_ms']:.3f} ms "
                    f"(min {result['min_ms']:.3f}, max {result['max_ms']:.3f}, {result['repeat']} runs)")
    if args.json:
        with _writing(args.json):
            args.json.write_text(json.dumps(result, indent=1))


def _profile(args) -> None:
    from tvmsched import plot

    model = _compiled(args)
    with model, console.status(f"profiling {len(model.graph.kernels)} kernels"):
        result = model.profile(repeat=args.repeat)
    table = Table("kernel", "ops", "output", "ms", "%", "TFLOP/s", "GB/s", "roofline %", "tuned", "by",
                  title=f"{args.model} on {result.device} ({result.schedule}): inference "
                        f"{result.benchmark_ms:.3f} ms ({result.inference_ms:.3f} ms traced), kernels "
                        f"alone {result.kernel_ms:.3f} ms")
    for kernel in result.by_time()[:args.top]:
        roofline = "" if kernel.roofline_pct is None else f"{kernel.roofline_pct:.0f}"
        table.add_row(f"{kernel.id} {kernel.symbol}", "+".join(kernel.op_kinds), kernel.output,
                      f"{kernel.ms:.4f}", f"{100 * kernel.ms / result.kernel_ms:.1f}", f"{kernel.tflops:.2f}",
                      f"{kernel.gbps:.1f}", roofline, "yes" if kernel.tuned else "", kernel.implementation)
    Console().print(table)
    with _writing(args.output):
        written = result.save(args.output)
        written.append(plot.timeline(result, args.output / "timeline.png"))
        written += [plot.schedule(model.graph, model.plan, args.output / f"schedule.{suffix}")
                    for suffix in ("png", "svg")]
    console.print(f"wrote {', '.join(path.name for path in written)} to {args.output}/")


def _plan_load(args) -> None:
    from tvmsched.errors import TargetError
    from tvmsched.load_plan import table, time_reloads
    from tvmsched.target import gpu_present

    if not gpu_present():
        raise TargetError("plan-load times the model on a GPU, and this machine has none; run it where the "
                          "build runs")
    model = _compiled(args)
    if model.meta.target.kind != "cuda":
        raise TargetError(f"'{args.model}' is built for {model.meta.target.key}; plan-load needs a CUDA "
                          f"build (--target cuda)")
    with model, console.status(f"timing {len(model.graph.kernels)} kernels' weights on the GPU and in place"):
        plan = model.plan_load(rounds=args.rounds)
        uploaded = None
        if not plan.modelled:  # nothing was checked: time the first inference once
            inputs = model.random_inputs()
            uploaded = time_reloads(model, None, inputs, model.run(inputs), args.rounds)
    header, *rows = table(plan)
    view = Table(*header, title=f"{args.model} on {plan.device}: {len(plan.direct)} of {len(rows)} kernels "
                                f"with weights read them in place")
    for row in rows:
        view.add_row(*row)
    Console().print(view)
    if plan.modelled:
        verdict = "kept" if plan.direct else "dropped: every weight is uploaded"
        console.print(f"first inference after offload (median of {args.rounds}; outputs equal to a resident "
                      f"run's): every weight uploaded {plan.measured_upload_ms:.3f} ms (modelled "
                      f"{plan.upload_ms:.3f}), {len(plan.modelled)} kernels in place "
                      f"{plan.measured_planned_ms:.3f} ms (modelled {plan.planned_ms:.3f}): {verdict}")
    else:
        console.print(f"no kernel gains reading in place (modelled); first inference after offload (median "
                      f"of {args.rounds}): {uploaded['median_ms']:.3f} ms (modelled {plan.upload_ms:.3f}); "
                      f"outputs equal to a resident run's: {'yes' if uploaded['equal'] else 'NO'}")
    if args.json:
        with _writing(args.json):
            args.json.write_text(json.dumps({"plan": plan.to_json(), "uploaded": uploaded}, indent=1))
        console.print(f"wrote {args.json}")


def _tune(args) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from tvmsched import frontend, zoo
    from tvmsched.api import model_proto
    from tvmsched.graph import extract
    from tvmsched.lower import lower
    from tvmsched.rewrite import rewrite
    from tvmsched.tactics.select import vendor_latencies
    from tvmsched.target import device_name, on_gpu, resolve_target
    from tvmsched.tuning import TuningLog, tune

    names = [*args.models, *(zoo.list_models() if args.zoo == ["all"] else args.zoo)]
    if not names:
        raise UsageError("name the models to tune: tvmsched tune MODEL... or --zoo NAME... (--zoo all)")
    spec = resolve_target(args.target or "auto")
    log = TuningLog.for_target(spec, args.log)
    layout = chosen(args.layout, args.precision, spec.kind)
    shapes = dict(parse_input_shape(text) for text in args.input_shape)
    constants = _npy_arrays("--constant-input", args.constant_input)
    started = time.monotonic()  # the budget covers lowering too
    options = TuneOptions(trials=args.trials, search=args.search,
                          population=args.population, generations=args.generations, seeds=args.seeds,
                          cost_model=args.cost_model, rpc=args.rpc, workers=args.workers,
                          concurrent=args.concurrent)
    modules, graphs = [], []
    vendor_plans = on_gpu(spec) and not args.ignore_vendor_plans
    for name in names:
        with console.status(f"{name}: importing and lowering"):
            proto = model_proto(name, args.batch)
            inputs = frontend.bind_input_shapes(proto, args.batch, shapes, constants)
            module = frontend.to_relax(proto, inputs, constants)
            lowered = [lower(rewrite(module, args.precision, layout, merge, spec=spec).module)
                       for merge in _tuned_merges(args.merge)]
            modules += lowered
            if vendor_plans:  # what builds measured of the vendor plans here (`tune` measures none)
                graphs += [extract(part, [tensor.name for tensor in inputs])[0] for part in lowered]
    vendor_ms = vendor_latencies(graphs, device_name(spec)) if graphs else {}
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} "
               "trials"), TimeElapsedColumn(), TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=console) as bar:
        row = bar.add_task(", ".join(names), total=None, status="extracting tasks")
        report = _tune_reporter(bar, row)
        lowering_s = time.monotonic() - started
        if args.time_budget is not None:
            options = replace(options, time_budget_s=max(0.0, args.time_budget - lowering_s))
        try:
            result = tune(modules, spec, log, options, progress=report, vendor_ms=vendor_ms)
        except KeyboardInterrupt:
            console.print(f"stopped: the records measured so far are in {log.directory}")
            raise
        report(result, finished=True)
    stopped = ""
    if result.stopped_by_budget:
        budget = args.time_budget
        stopped = (f" (time budget spent, {lowering_s:.0f} s of it importing and lowering before tuning)"
                   if lowering_s < budget else
                   f" (time budget spent importing and lowering: {lowering_s:.0f} s of {budget:.0f})")
    vendor = (f" ({result.left_to_vendor} left to their vendor plan: TVM's best stayed more than "
              f"{VENDOR_REACH}x its time)" if result.left_to_vendor else "")
    console.print(f"{result.trials} trials on {len(result.tasks)} kernels in {result.seconds:.0f} s"
                  f"{stopped}; {result.skipped} kernels already had their trials{vendor}; "
                  f"{result.failed_builds} failed builds, {result.failed_runs} failed runs; "
                  f"log {log.directory}")
    if vendor_ms:
        console.print(f"  {len(vendor_ms)} kernels have a vendor plan timed by a build: one faster than TVM "
                      f"gets {VENDOR_PROBE} trials, the rest of --trials in a later run only if TVM comes "
                      f"within {VENDOR_REACH}x of it (--ignore-vendor-plans: every trial)")
    for message in result.messages:
        console.print(f"  failure: {message}")


def _tuned_merges(merge: str | None) -> tuple[str, ...]:
    """The merges whose kernels `tune --merge` tunes: auto chooses per group when building, so both."""
    return {"auto": ("off", "all"), None: ("off",)}.get(merge, (merge,))


def _tune_reporter(bar, row):
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
                   total=sum(task.wanted - task.trials_before for task in result.tasks))
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
