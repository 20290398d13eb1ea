"""Untuned CPU builds against onnxruntime: each zoo model compiled for llvm without tuning records
(sequential plan), its compile time, first call and median latency, next to onnxruntime (default threads)
running the same ONNX model in the same process; prints a markdown table and writes JSON.

    python -m experiments.cpu_speed --out experiments/results/cpu_2026-11-25.json --label after

`--label` names the build measured (e.g. `before` and `after` a change, the `before` call run with the older
tvmsched first on PYTHONPATH): its figures go in the row's `<label>_*` fields, next to those of other labels.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

import onnxruntime
import tvm

import tvmsched
from experiments.common import ResultFile, argument_parser, command, host_median_ms, now, relative_diff
from tvmsched import zoo
from tvmsched.target import device_name, resolve_target


def measure(name: str, args, earlier: dict) -> dict:
    proto = zoo.build(name, batch=args.batch)
    start = time.perf_counter()
    model = tvmsched.compile(proto, target="llvm", batch=args.batch, tuned=False)
    compile_s = time.perf_counter() - start
    inputs = model.random_inputs()
    with model:
        first_ms, outputs = _timed(lambda: model.run(inputs))
        latency = host_median_ms(lambda: model.run(inputs), args.repeat, warmup=2)
    session = onnxruntime.InferenceSession(proto.SerializeToString())
    expected = session.run(None, inputs)
    label = args.label
    row = {**earlier, "model": name, "batch": args.batch, f"{label}_measured": now(),
           f"{label}_compile_s": round(compile_s, 2), f"{label}_first_ms": round(first_ms, 3),
           f"{label}_ms": latency,
           "onnxruntime_ms": host_median_ms(lambda: session.run(None, inputs), 50, warmup=2),
           f"{label}_max_rel_diff": max(map(relative_diff, outputs, expected))}
    row[f"{label}_vs_onnxruntime"] = round(row[f"{label}_ms"] / row["onnxruntime_ms"], 2)
    print(f"  {name:13s} {label} {latency:9.3f} ms (first {first_ms:9.3f} ms, compile {compile_s:5.1f} s)  "
          f"onnxruntime {row['onnxruntime_ms']:7.3f} ms", flush=True)
    return row


def _timed(run) -> tuple[float, object]:
    start = time.perf_counter()
    result = run()
    return (time.perf_counter() - start) * 1e3, result


def table(rows: list[dict]) -> str:
    labels = sorted({key.removesuffix("_compile_s") for row in rows for key in row
                     if key.endswith("_compile_s")})
    head = ["model", *(f"{label} ms (x onnxruntime)" for label in labels),
            *(f"{label} compile s / first call ms" for label in labels), "onnxruntime ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["model"],
                 *(f"{row[f'{label}_ms']:.1f} ({row[f'{label}_vs_onnxruntime']:.1f}x)"
                   if f"{label}_ms" in row else "" for label in labels),
                 *(f"{row[f'{label}_compile_s']:.1f} / {row[f'{label}_first_ms']:.0f}"
                   if f"{label}_ms" in row else "" for label in labels),
                 f"{row['onnxruntime_ms']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--label", required=True, help="the build measured, e.g. before or after")
    parser.add_argument("--models", nargs="+", default=zoo.list_models())
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    path = Path(args.out)
    results = ResultFile.load(path, "model")
    results.commands.append(command("experiments.cpu_speed"))
    for name in args.models:
        earlier = next((row for row in results.rows if row["model"] == name), {})
        results.put(measure(name, args, earlier))
        results.write(header())  # after every model
    print(table(results.rows))
    return 0


def header() -> dict:
    return {"experiment": "cpu_speed", "device": device_name(resolve_target("llvm")), "cores": os.cpu_count(),
            "date": datetime.date.today().isoformat(), "tvm": tvm.__version__,
            "onnxruntime": onnxruntime.__version__,
            "plan": "untuned llvm build (tuned=False), sequential schedule; onnxruntime's default session "
                    "options (all cores) on the same ONNX model",
            "timing": "wall clock around each run with numpy inputs and outputs, median of `repeat` after 2 "
                      "warm-up runs; `<label>_vs_onnxruntime` against onnxruntime timed in the same call, "
                      "`onnxruntime_ms` from the last call; the machine was shared with other jobs (2 "
                      "cores), so figures are noisy"}


if __name__ == "__main__":
    sys.exit(main())
