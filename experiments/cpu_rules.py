"""A/B of one default CPU schedule rule: each model built for llvm without tuning records twice, with every
rule of `cpu_schedules.RULES` and with one left out (its kernels then take the next rule that applies), or
with and without one of the CPU rewrites (`--without channel_padding`, `tvmsched.pad_channels`;
`--without packed_weights`, `tvmsched.packed_weights`),
and both builds timed alternately with onnxruntime over several rounds in one process: this machine's
load changes within minutes, and alternating keeps the three comparable. Every output is checked against
onnxruntime's. Prints a table and writes JSON.

    python -m experiments.cpu_rules --without window --out experiments/results/cpu_window_2026-11-25.json
    python -m experiments.cpu_rules --without window --models inception_v3 /tmp/b0.onnx --out /tmp/w.json

A model is a zoo name (built at --batch), an ONNX file (its own shapes), or one of KERNELS, a one-kernel
model (`kernel:avg_pool`, ...).
"""

from __future__ import annotations

import statistics
import sys
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import tvm
from onnx import TensorProto, helper, numpy_helper

import tvmsched
from experiments.common import ResultFile, argument_parser, command, host_median_ms, now, relative_diff
from tvmsched import cpu_schedules, rewrite, zoo
from tvmsched.target import device_name, resolve_target


def _depthwise(channels: int, size: int, kernel: int, silu: bool) -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w"], ["y" if not silu else "c"], group=channels,
                              pads=[kernel // 2] * 4)]
    if silu:
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    weight = np.random.default_rng(0).standard_normal((channels, 1, kernel, kernel)).astype("float32")
    return _one_kernel(nodes, [1, channels, size, size], [numpy_helper.from_array(weight, "w")])


def _avg_pool(shape: list[int]) -> onnx.ModelProto:
    pool = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    return _one_kernel([pool], shape, [])


def _one_kernel(nodes, shape: list[int], initializers) -> onnx.ModelProto:
    """A model of `nodes` from input x to output y, both of `shape`."""
    graph = helper.make_graph(nodes, "kernel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# inception_v3's average pool, at batch 1 and 16; convnext's 7x7 and efficientnet's 5x5 + SiLU depthwise
KERNELS = {"kernel:avg_pool": lambda: _avg_pool([1, 288, 35, 35]),
           "kernel:avg_pool_b16": lambda: _avg_pool([16, 288, 35, 35]),
           "kernel:depthwise7x7": lambda: _depthwise(96, 56, 7, silu=False),
           "kernel:depthwise5x5_silu": lambda: _depthwise(672, 14, 5, silu=True)}


# the CPU rewrites of `tvmsched.rewrite`, left out as a rule is: name → the function `rewrite` calls
REWRITES = {"channel_padding": "channels_padded", "packed_weights": "weights_packed"}


def build(proto: onnx.ModelProto, without: str | None) -> tvmsched.CompiledModel:
    """An untuned llvm build, with rule `without` left out of the CPU rules, or without one of the CPU
    rewrites (REWRITES); None: everything."""
    rules, functions = dict(cpu_schedules.RULES), {name: getattr(rewrite, name) for name in REWRITES.values()}
    try:
        if without in REWRITES:
            setattr(rewrite, REWRITES[without], lambda module, *args: module)
        elif without:
            del cpu_schedules.RULES[without]
        return tvmsched.compile(proto, target="llvm", tuned=False)
    finally:
        cpu_schedules.RULES.clear()
        cpu_schedules.RULES.update(rules)
        for name, function in functions.items():
            setattr(rewrite, name, function)


def measure(name: str, args) -> dict:
    proto = (KERNELS[name]() if name in KERNELS else onnx.load(name) if name.endswith(".onnx")
             else zoo.build(name, batch=args.batch))
    builds = {"with": build(proto, None), "without": build(proto, args.without)}
    inputs = builds["with"].random_inputs()
    session = onnxruntime.InferenceSession(proto.SerializeToString())
    expected = session.run(None, inputs)
    runs = {"onnxruntime": partial(session.run, None, inputs)}
    row = {"model": name, "measured": now(), "rounds": args.rounds,
           "kernels": len(builds["with"].graph.kernels)}
    times = {label: [] for label in ("onnxruntime", *builds)}
    with ExitStack() as stack:
        for label, model in builds.items():
            runs[label] = partial(stack.enter_context(model).run, inputs)
            row[f"{label}_max_rel_diff"] = max(map(relative_diff, runs[label](), expected))
            row[f"{label}_fallbacks"] = len(model.meta.fallbacks)
        for _ in range(args.rounds):
            for label, run in runs.items():
                times[label].append(host_median_ms(run, args.repeat, warmup=1))
    for label, values in times.items():
        row[f"{label}_ms"] = round(statistics.median(values), 3)
        row[f"{label}_rounds_ms"] = values
    row["without_over_with"] = round(row["without_ms"] / row["with_ms"], 3)
    row["with_vs_onnxruntime"] = round(row["with_ms"] / row["onnxruntime_ms"], 3)
    row["without_vs_onnxruntime"] = round(row["without_ms"] / row["onnxruntime_ms"], 3)
    print(f"  {Path(name).stem:22s} with {row['with_ms']:9.3f} ms  without {row['without_ms']:9.3f} ms  "
          f"onnxruntime {row['onnxruntime_ms']:8.3f} ms", flush=True)
    return row


def table(rows: list[dict], without: str) -> str:
    lines = [f"| model | every rule ms (x onnxruntime) | without {without} ms (x onnxruntime) | "
             f"onnxruntime ms |", "|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {Path(row['model']).stem} | {row['with_ms']:.2f} ({row['with_vs_onnxruntime']:.2f}x)"
                     f" | {row['without_ms']:.2f} ({row['without_vs_onnxruntime']:.2f}x) | "
                     f"{row['onnxruntime_ms']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--without", required=True, choices=[*cpu_schedules.RULES, *REWRITES])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", nargs="+", default=zoo.list_models(),
                        help=f"zoo names, .onnx files or one-kernel models ({', '.join(KERNELS)})")
    parser.add_argument("--batch", type=int, default=1, help="zoo models' batch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5, help="runs per round (their median is the round's)")
    args = parser.parse_args()
    results = ResultFile.load(Path(args.out), "model")
    results.commands.append(command("experiments.cpu_rules"))
    header = {"experiment": f"CPU builds with and without '{args.without}' (a default schedule rule, or a "
                            f"CPU rewrite), untuned",
              "device": device_name(resolve_target("llvm")), "tvm": tvm.__version__,
              "onnxruntime": onnxruntime.__version__,
              "timing": "per round the median of --repeat runs of each build and of onnxruntime (default "
                        "threads), alternating; the median over the rounds"}
    for name in results.todo(args.models, again=True):
        results.put(measure(name, args))
        results.write(header)
    print(table(results.rows, args.without))
    return 0


if __name__ == "__main__":
    sys.exit(main())
