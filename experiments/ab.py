"""A/B of two values of one scheduler option on the same build: the same kernels, the two plans timed
alternately over several rounds (each one CUDA Graph), outputs checked against the sequential executor.
Prints a table and writes JSON.

    python -m experiments.ab --out experiments/results/stream_mapping_h100.json      # index vs affinity
    python -m experiments.ab --out /tmp/ab.json --option time_orders=false,true --models inception_v3

`stream_mapping` is the streams stage schedules (greedy, dp) give their groups: `index` (group i on stream
i) or `affinity` (docs/schedulers.md); `time_orders` is whether dp chooses between each part's searched
stages and greedy's by timing the whole plan (else by stage sums, as IOS). The stream_mapping*_h100.json
results were written by this module under its former name, experiments.stream_mapping, which compared
the stream mappings only.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
from contextlib import ExitStack

import numpy as np
import tvm

from experiments.common import argument_parser, command, compiled, median_ms, relative_diff
from tvmsched.schedule import SCHEDULERS, options_for
from tvmsched.target import device_name, resolve_target


def parse_option(text: str) -> tuple[str, list[str], list]:
    """'name=a,b' as (name, the two labels, the two values: true/false in any case as bools, numbers as
    ints or floats, anything else as strings)."""
    name, _, values = text.partition("=")
    labels = values.split(",")
    if not name or len(labels) != 2 or labels[0] == labels[1]:
        raise SystemExit(f"--option wants NAME=A,B (two different values), got '{text}'")
    return name, labels, [_value(label) for label in labels]


def _value(label: str):
    booleans = {"true": True, "false": False}
    if label.lower() in booleans:
        return booleans[label.lower()]
    for number in (int, float):
        try:
            return number(label)
        except ValueError:
            pass
    return label


def taking(option: str) -> list[str]:
    """The schedulers that take `option`."""
    return sorted(name for name in SCHEDULERS if options_for(name, **{option: None}))


def measure(name: str, schedule: str, option: str, labels: list[str], values: list, args) -> dict:
    base, _ = compiled(name, args.batch, args.target, args.builds)
    x = np.random.default_rng(0).standard_normal(base.inputs[0].shape).astype("float32")
    expected = base.reschedule("sequential", executor="sequential")(x)
    row = {"model": name, "batch": args.batch, "schedule": schedule, "option": option,
           "tuned_kernels": len(base.meta.tuned_kernels), "kernels": len(base.graph.kernels)}
    with ExitStack() as closer:
        models = {label: closer.enter_context(base.reschedule(schedule, max_streams=args.streams,
                                                                     **{option: value}))
                  for label, value in zip(labels, values)}
        times: dict[str, list[float]] = {label: [] for label in labels}
        for _ in range(args.rounds):  # alternating, so drift of the clocks or the host hits both alike
            for label, model in models.items():
                times[label].append(median_ms(model, args.repeat, runs=1)[0])
        for label, model in models.items():
            row[label] = {"median_ms": round(statistics.median(times[label]), 4), "rounds_ms": times[label],
                          "streams": model.plan.num_streams,
                          "waits": sum(len(launch.waits) for launch in model.plan.launches),
                          "schedule_stats": {key: value for key, value in model.plan.schedule.items()
                                             if key != "stages"},
                          "max_rel_diff_vs_sequential": relative_diff(model(x), expected)}
    first, second = labels
    row[f"{second}_speedup"] = round(row[first]["median_ms"] / row[second]["median_ms"], 3)
    print(f"  {name:13s} {schedule:7s} {first} {row[first]['median_ms']:.3f} ms  {second} "
          f"{row[second]['median_ms']:.3f} ms  ({row[f'{second}_speedup']:.3f}x)", flush=True)
    return row


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--option", default="stream_mapping=index,affinity", metavar="NAME=A,B",
                        help="the scheduler option and its two values (default: %(default)s)")
    parser.add_argument("--models", nargs="+", default=["inception_v3", "randwire", "nasnet"],
                        help="zoo models (default: the three whose plans the stream mappings make differ)")
    parser.add_argument("--schedules", nargs="+", help="default: every scheduler that takes the option")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--builds", default=None, help="reuse/save compiled models here")
    args = parser.parse_args()
    option, labels, values = parse_option(args.option)
    if option == "max_streams":
        raise SystemExit("the stream count is --streams; compare two counts with two runs")
    schedules = args.schedules or taking(option)
    if not schedules or set(schedules) - set(taking(option)):
        raise SystemExit(f"'{option}' is an option of: {', '.join(taking(option)) or 'no scheduler'}")
    rows = []
    for name in args.models:
        for schedule in schedules:
            rows.append(measure(name, schedule, option, labels, values, args))
            with open(args.out, "w") as file:  # after every row, so a cut-off run keeps what it measured
                json.dump({"experiment": "ab", "option": option, "values": labels,
                           "device": device_name(resolve_target(args.target)),
                           "date": datetime.date.today().isoformat(), "tvm": tvm.__version__,
                           "command": command("experiments.ab"),
                           "timing": "median over rounds of tvmsched's benchmark median (`repeat` runs)",
                           "results": rows}, file, indent=1)
    wrong = [(row["model"], row["schedule"], label) for row in rows for label in labels
             if row[label]["max_rel_diff_vs_sequential"] > 1e-5]
    if wrong:
        print(f"outputs off the sequential executor's: {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
