"""The `tvmsched` command line: models, build, run, bench."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from tvmsched.errors import InputError, TvmschedError

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
    return parser


def _add_compile_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="auto",
                        help="auto (cuda if a GPU is present, else llvm), llvm (CPU), cuda (the local "
                             "GPU, else cross-compile for the H100), or an NVIDIA TVM tag such as "
                             "nvidia/nvidia-a100 (default: auto)")
    parser.add_argument("--batch", type=int, default=None,
                        help="batch size: binds dim 0 of every input (zoo models default to 1)")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:1x3x224x224",
                        help="bind the whole shape of one input (repeatable)")
    from tvmsched.executor import EXECUTORS
    from tvmsched.schedule import SCHEDULERS

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
    from tvmsched.frontend import parse_input_shape

    if Path(args.model).is_dir():
        return tvmsched.load(args.model, executor=args.executor, batch=args.batch, force=args.force)
    shapes = dict(parse_input_shape(text) for text in args.input_shape)
    with console.status("compiling") as status:
        def search_progress(stats: dict) -> None:
            status.update(f"{args.model}: dp search: {stats['blocks']} blocks done "
                          f"({stats['modeled_ms']:.3f} ms so far), {stats['states']} states, "
                          f"{stats['stages_evaluated']} stages evaluated, "
                          f"{stats['stages_measured']} measured")

        options = {}
        if args.schedule == "dp":
            options = {"max_group_size": args.max_group_size, "max_groups": args.max_groups,
                       "max_states": args.max_states, "search_progress": search_progress}
        model = tvmsched.compile(args.model, target=args.target, batch=args.batch, input_shapes=shapes,
                                 schedule=args.schedule, max_streams=args.streams, executor=args.executor,
                                 cost=args.cost, **options,
                                 progress=lambda stage: status.update(f"{args.model}: {stage}"))
    console.print(f"compiled {args.model}: {len(model.graph.kernels)} kernels for {model.meta.target.key}, "
                  f"{model.plan.num_streams} stream(s), {model.plan.memory.activation_bytes / 2**20:.1f} MiB "
                  f"of activations")
    return model


def _build(args) -> None:
    model = _compiled(args)
    model.save(args.output)
    console.print(f"wrote {args.output}/ (graph {model.graph.hash}, "
                  f"{sum(tensor.nbytes for tensor in model.graph.constants) / 2**20:.1f} MiB of weights)")


def _run(args) -> None:
    model = _compiled(args)
    inputs = model.random_inputs(args.seed)
    for item in args.input:
        name, _, file = item.partition("=")
        if name not in inputs or not file:
            raise InputError(f"--input '{item}': write NAME=FILE.npy with NAME one of {', '.join(inputs)}")
        inputs[name] = np.load(file)
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
    result = {"model": args.model, "target": model.meta.target.key, "kernels": len(model.graph.kernels),
              "schedule": model.plan.scheduler, "streams": model.plan.num_streams,
              **model.benchmark(warmup=args.warmup, repeat=args.repeat)}
    Console().print(f"{args.model} on {result['device']} ({result['executor']}, {result['schedule']}, "
                    f"{result['streams']} streams): median {result['median_ms']:.3f} ms "
                    f"(min {result['min_ms']:.3f}, max {result['max_ms']:.3f}, {args.repeat} runs)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
