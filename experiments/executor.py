"""Executor comparison on a GPU, same kernels in every row: Relax VM, sequential launches, a 1-stream CUDA
Graph, and multi-stream CUDA Graphs from the chain scheduler; prints a table and writes JSON.

    python -m experiments.executor --out experiments/results/executor_h100.json
"""

from __future__ import annotations

import datetime
import json
import sys

import numpy as np
import tvm
from tvm import relax

from experiments.common import argument_parser, command, compiled, median_ms
from tvmsched import frontend, zoo
from tvmsched.codegen import default_schedules
from tvmsched.lower import lower
from tvmsched.target import resolve_target

VARIANTS = [("sequential", 1, "sequential"), ("sequential", 1, "cuda-graph"),
            ("chains", 2, "cuda-graph"), ("chains", 4, "cuda-graph"), ("chains", 8, "cuda-graph")]


def relax_vm_ms(proto, x: np.ndarray, repeat: int) -> float:
    """Median latency of TVM's Relax VM running the same lowered module with the same dlight kernels."""
    spec = resolve_target("cuda")
    inputs = frontend.bind_input_shapes(proto)
    module = default_schedules(lower(frontend.to_relax(proto, inputs)).module, spec)
    machine = relax.VirtualMachine(tvm.compile(module, target=spec.tvm_target), tvm.cuda(0))
    timer = machine.time_evaluator("main", tvm.cuda(0), number=10, repeat=repeat)
    return timer(tvm.runtime.tensor(x, tvm.cuda(0))).median * 1e3


def measure(name: str, batch: int, repeat: int, builds: str | None) -> dict:
    base, compile_s = compiled(name, batch, "cuda", builds)
    base = base.reschedule("sequential", executor="sequential")
    x = np.random.default_rng(0).standard_normal(base.inputs[0].shape).astype("float32")
    expected = base(x)
    row = {"model": name, "batch": batch, "kernels": len(base.graph.kernels),
           "compile_s": round(compile_s, 1),
           "relax_vm_ms": round(relax_vm_ms(zoo.build(name, batch=batch), x, repeat), 4), "variants": []}
    for schedule, streams, executor in VARIANTS:
        with base.reschedule(schedule, max_streams=streams, executor=executor) as model:
            error = float(np.abs(model(x) - expected).max())
            median, spread = median_ms(model, repeat)
        row["variants"].append({
            "schedule": schedule, "max_streams": streams, "streams": model.plan.num_streams,
            "executor": executor, "median_ms": median, "spread_ms": spread, "max_abs_diff": error,
            "activation_mib": round(model.plan.memory.activation_bytes / 2**20, 2)})
    row["device"] = base.benchmark(warmup=1, repeat=1)["device"]
    return row


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--builds", help="load/save compiled models here (saves recompiling across runs)")
    parser.add_argument("--models", nargs="*",
                        default=["googlenet", "inception_v3", "squeezenet", "randwire"])
    args = parser.parse_args()
    rows = []
    for name in args.models:
        row = measure(name, args.batch, args.repeat, args.builds)
        rows.append(row)
        cells = "  ".join(f"{v['schedule']}/{v['max_streams']}/{v['executor']} {v['median_ms']:.3f}"
                          for v in row["variants"])
        print(f"{name:13s} vm {row['relax_vm_ms']:.3f}  {cells}", flush=True)
    result = {"experiment": "executor", "device": rows[0]["device"] if rows else None,
              "date": datetime.date.today().isoformat(), "tvm": tvm.__version__,
              "command": command("experiments.executor"),
              "kernels": "dlight defaults (untuned), the same library in every variant",
              "timing": "CUDA events around each inference (host clock for the sequential executor and the "
                        "VM's time_evaluator), median of `repeat`, median of 3 such runs",
              "results": rows}
    with open(args.out, "w") as file:
        json.dump(result, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
