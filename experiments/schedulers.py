"""Scheduler comparison on a GPU, same kernels in every row: sequential, greedy, opara, nimble and dp,
each as one CUDA Graph, with stage costs measured on the GPU from a cold cache (so the search time
includes every measurement); prints a table and writes JSON.

    python -m experiments.schedulers --out experiments/results/schedulers_h100.json
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
import time

import numpy as np
import tvm

from experiments.common import argument_parser, command, compiled, median_ms
from tvmsched.target import device_name, resolve_target

SCHEDULES = ("sequential", "greedy", "opara", "nimble", "dp")


def measure(name: str, batch: int, args) -> dict:
    base, compile_s = compiled(name, batch, args.target, args.builds)
    reference = base.reschedule("sequential", executor="sequential")
    x = np.random.default_rng(0).standard_normal(base.inputs[0].shape).astype("float32")
    expected = reference(x)
    row = {"model": name, "batch": batch, "kernels": len(base.graph.kernels),
           "compile_s": round(compile_s, 1),
           "schedules": []}
    for schedule in SCHEDULES:
        with tempfile.TemporaryDirectory() as cache:  # a cold measurement cache for every search
            os.environ["TVMSCHED_CACHE"] = cache
            start = time.perf_counter()
            model = base.reschedule(schedule, max_streams=args.streams, executor=args.executor,
                                    cost=args.cost)
            search_s = time.perf_counter() - start
        with model:
            error = float(np.abs(model(x) - expected).max())
            median, spread = median_ms(model, args.repeat)
        stats = {key: value for key, value in model.plan.schedule.items() if key != "stages"}
        row["schedules"].append({
            "schedule": schedule, "median_ms": median, "spread_ms": spread, "search_s": round(search_s, 2),
            "streams": model.plan.num_streams, "stages": len(model.plan.schedule.get("stages") or []) or None,
            "cross_stream_waits": sum(len(launch.waits) for launch in model.plan.launches),
            "max_abs_diff_vs_sequential": error, "stats": stats})
        print(f"  {name} b{batch} {schedule:10s} {median:8.3f} ms  search {search_s:6.1f} s  "
              f"streams {model.plan.num_streams}  diff {error:.1e}", flush=True)
    sequential = row["schedules"][0]["median_ms"]
    for entry in row["schedules"]:
        entry["speedup_vs_sequential"] = round(sequential / entry["median_ms"], 3)
    return row


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", nargs="*", default=["googlenet:1", "inception_v3:1", "squeezenet:1",
                                                       "randwire:1", "nasnet:1", "resnet50:1",
                                                       "inception_v3:16"],
                        help="MODEL:BATCH pairs")
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--executor", default="cuda-graph")
    parser.add_argument("--cost", default="measured")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--builds", help="load/save compiled models here (saves recompiling across runs)")
    args = parser.parse_args()
    rows = []
    for case in args.cases:
        name, batch = case.split(":")
        rows.append(measure(name, int(batch), args))
        with open(args.out, "w") as file:  # after every model, so a cut-off run keeps what it measured
            json.dump(result(rows, args), file, indent=1)
    for row in rows:
        cells = "  ".join(f"{s['schedule']} {s['median_ms']:.3f} ({s['speedup_vs_sequential']:.2f}x)"
                          for s in row["schedules"])
        print(f"{row['model']:13s} b{row['batch']:<3d} {cells}")
    return 0


def result(rows: list[dict], args) -> dict:
    return {"experiment": "schedulers", "device": device_name(resolve_target(args.target)),
            "date": datetime.date.today().isoformat(), "tvm": tvm.__version__,
            "command": command("experiments.schedulers"),
            "kernels": "dlight defaults (untuned), the same library in every row",
            "executor": args.executor, "cost": args.cost, "max_streams": args.streams,
            "timing": "CUDA events around each inference, median of `repeat`, median of 3 such runs; "
                      "search_s includes every stage measurement (cold cache)",
            "results": rows}


if __name__ == "__main__":
    sys.exit(main())
