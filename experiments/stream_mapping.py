"""A/B of the streams that stage schedules (greedy, dp) give their groups: `index` (group i on stream i)
against `affinity` (a stream whose last kernel the group reads, else the one idle longest). Same build and
same stages for both; the two plans are timed alternately, several rounds, each one CUDA Graph; outputs
are checked against the sequential executor. Prints a table and writes JSON.

    python -m experiments.stream_mapping --out experiments/results/stream_mapping_h100.json
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys

import numpy as np
import tvm

from experiments.common import argument_parser, command, compiled, median_ms, relative_diff
from tvmsched.schedule import MAPPED_SCHEDULERS
from tvmsched.schedule.base import STREAM_MAPPINGS
from tvmsched.target import device_name, resolve_target


def measure(name: str, schedule: str, args) -> dict:
    base, _ = compiled(name, args.batch, args.target, args.builds)
    x = np.random.default_rng(0).standard_normal(base.inputs[0].shape).astype("float32")
    expected = base.reschedule("sequential", executor="sequential")(x)
    models = {mapping: base.reschedule(schedule, max_streams=args.streams, stream_mapping=mapping)
              for mapping in STREAM_MAPPINGS}
    times: dict[str, list[float]] = {mapping: [] for mapping in STREAM_MAPPINGS}
    for _ in range(args.rounds):  # alternating, so drift of the clocks or the host hits both alike
        for mapping, model in models.items():
            times[mapping].append(median_ms(model, args.repeat, runs=1)[0])
    row = {"model": name, "batch": args.batch, "schedule": schedule,
           "tuned_kernels": len(base.meta.tuned_kernels), "kernels": len(base.graph.kernels)}
    for mapping, model in models.items():
        row[mapping] = {"median_ms": round(statistics.median(times[mapping]), 4), "rounds_ms": times[mapping],
                        "streams": model.plan.num_streams,
                        "waits": sum(len(launch.waits) for launch in model.plan.launches),
                        "max_rel_diff_vs_sequential": relative_diff(model(x), expected)}
    row["affinity_speedup"] = round(row["index"]["median_ms"] / row["affinity"]["median_ms"], 3)
    print(f"  {name:13s} {schedule:7s} index {row['index']['median_ms']:.3f} ms  affinity "
          f"{row['affinity']['median_ms']:.3f} ms  ({row['affinity_speedup']:.3f}x)", flush=True)
    return row


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", nargs="+", default=["inception_v3", "randwire", "nasnet"],
                        help="zoo models (default: the three whose plans the mappings make differ)")
    parser.add_argument("--schedules", nargs="+", default=list(MAPPED_SCHEDULERS),
                        choices=MAPPED_SCHEDULERS)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--builds", default=None, help="reuse/save compiled models here")
    args = parser.parse_args()
    rows = []
    for name in args.models:
        for schedule in args.schedules:
            rows.append(measure(name, schedule, args))
            with open(args.out, "w") as file:  # after every row, so a cut-off run keeps what it measured
                json.dump({"experiment": "stream_mapping", "device": device_name(resolve_target(args.target)),
                           "date": datetime.date.today().isoformat(), "tvm": tvm.__version__,
                           "command": command("experiments.stream_mapping"),
                           "timing": "median over rounds of tvmsched's benchmark median (`repeat` runs)",
                           "results": rows}, file, indent=1)
    wrong = [(row["model"], row["schedule"], mapping) for row in rows for mapping in STREAM_MAPPINGS
             if row[mapping]["max_rel_diff_vs_sequential"] > 1e-5]
    if wrong:
        print(f"outputs off the sequential executor's: {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
