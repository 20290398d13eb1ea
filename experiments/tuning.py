"""Tuned against default kernels on a GPU: each zoo model compiled twice for one stream (sequential plan, one
CUDA Graph), with dlight defaults and with the shipped tuning log, next to PyTorch running the same ONNX
graph (cuDNN, eager and one CUDA Graph, TF32 off) in the same process; prints a table and writes JSON.

    python -m experiments.tuning --out experiments/results/tuning_h100.json --models squeezenet googlenet

Rows accumulate in --out: models it already holds are skipped unless --again.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import numpy as np
import tvm

import tvmsched
from experiments.common import (
    ResultFile,
    argument_parser,
    command,
    event_median_ms,
    median_ms,
    now,
    relative_diff,
)
from tvmsched import zoo
from tvmsched.target import device_name, resolve_target
from tvmsched.tuning import TuningLog, shipped_root


def measure(name: str, args) -> dict:
    proto = zoo.build(name, batch=args.batch)
    default = tvmsched.compile(proto, target=args.target, batch=args.batch, tuned=False)
    tuned = tvmsched.compile(proto, target=args.target, batch=args.batch, tuning_log=shipped_root())
    x = np.random.default_rng(0).standard_normal(default.inputs[0].shape).astype("float32")
    workloads = {kernel.workload for kernel in tuned.graph.kernels}
    entries = TuningLog.for_target(resolve_target(args.target), shipped_root()).manifest()["workloads"]
    tuned_entries = [entries[w] for w in workloads if w in entries]
    with default, tuned:
        expected = default(x)
        row = {"model": name, "batch": args.batch, "measured": now(), "kernels": len(tuned.graph.kernels),
               "unique_kernels": len(workloads), "tuned_kernels": len(tuned.meta.tuned_kernels),
               "trials": sum(entry["trials"] for entry in tuned_entries),
               "tuning_s": round(sum(entry.get("seconds", 0.0) for entry in tuned_entries), 1),
               "default_ms": median_ms(default, args.repeat)[0],
               "tuned_ms": median_ms(tuned, args.repeat)[0],
               "max_rel_diff_tuned_vs_default": relative_diff(tuned(x), expected)}
    row["speedup"] = round(row["default_ms"] / row["tuned_ms"], 3)
    row.update(_pytorch(proto, x, expected, args.repeat))
    print(f"  {name:13s} default {row['default_ms']:7.3f} ms  tuned {row['tuned_ms']:7.3f} ms "
          f"({row['speedup']:.2f}x, {row['tuned_kernels']} kernels tuned)  pytorch graph "
          f"{row.get('pytorch_graph_ms', float('nan')):7.3f} ms", flush=True)
    return row


def _pytorch(proto, x: np.ndarray, expected: np.ndarray, repeat: int) -> dict:
    """PyTorch eager and CUDA Graph latency of the same graph and weights (median of per-inference CUDA
    event times), and its difference from tvmsched's output."""
    try:
        import torch

        from experiments.torch_onnx import OnnxModule, cuda_graph, fp32_settings
    except ImportError as error:
        return {"pytorch": f"not measured: {error}"}
    fp32_settings()
    module = OnnxModule(proto).cuda().eval()
    example = torch.from_numpy(x).cuda()
    replay, _, output = cuda_graph(module, example)
    replay()
    with torch.no_grad():
        eager = event_median_ms(lambda: module(example), repeat)
    return {"pytorch": torch.__version__, "pytorch_eager_ms": eager,
            "pytorch_graph_ms": event_median_ms(replay, repeat),
            "max_rel_diff_pytorch_vs_default": relative_diff(output.cpu().numpy(), expected)}


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", nargs="+", default=zoo.list_models())
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--again", action="store_true", help="measure models again that --out holds")
    args = parser.parse_args()
    path = Path(args.out)
    results = ResultFile.load(path, "model")
    names = results.todo(args.models, args.again)
    results.commands.append(command("experiments.tuning"))
    for name in names:
        results.put(measure(name, args))
        results.write(header(args))  # after every model
    return 0


def header(args) -> dict:
    return {"experiment": "tuning", "device": device_name(resolve_target(args.target)),
            "date": datetime.date.today().isoformat(), "tvm": tvm.__version__,
            "plan": "sequential schedule, one stream, one CUDA Graph (tvmsched); PyTorch runs the same ONNX "
                    "graph with torch.nn.functional (cuDNN), TF32 off, cudnn.benchmark on",
            "timing": "CUDA events around each inference, median of `repeat` (tvmsched: median of 3 runs)"}


if __name__ == "__main__":
    sys.exit(main())
