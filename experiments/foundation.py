"""Foundation check on a GPU: every zoo model at full size, compiled for CUDA with the sequential
executor, against onnxruntime on the CPU; prints a table and writes JSON.

    python -m experiments.foundation --out experiments/results/foundation_h100.json
"""

from __future__ import annotations

import datetime
import json
import sys
import time

import numpy as np
import onnxruntime
import tvm

import tvmsched
from experiments.common import argument_parser
from tvmsched import zoo


def check(name: str, batch: int, target: str) -> dict:
    proto = zoo.build(name, batch=batch)
    start = time.perf_counter()
    model = tvmsched.compile(proto, target=target)
    compile_s = time.perf_counter() - start
    x = np.random.default_rng(0).standard_normal(model.inputs[0].shape).astype("float32")
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = session.run(None, {"input": x})[0]
    with model:
        output = model(x)
        bench = model.benchmark(warmup=20, repeat=100)
    scale = float(np.abs(reference).max())
    error = float(np.abs(output - reference).max())
    matches = bool(np.allclose(output, reference, rtol=1e-4, atol=1e-4 * scale))
    return {"model": name, "batch": batch, "kernels": len(model.graph.kernels),
            "compile_s": round(compile_s, 2),
            "max_abs_error": error, "max_abs_reference": scale, "relative_error": error / scale,
            "matches_rtol_1e-4": matches, "sequential_median_ms": round(bench["median_ms"], 4),
            "device": bench["device"]}


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--models", nargs="*", default=zoo.list_models())
    args = parser.parse_args()
    rows = []
    for name in args.models:
        row = check(name, args.batch, args.target)
        rows.append(row)
        print(f"{name:14s} kernels {row['kernels']:4d}  compile {row['compile_s']:6.1f} s  "
              f"rel.err {row['relative_error']:.2e}  match {row['matches_rtol_1e-4']}  "
              f"sequential {row['sequential_median_ms']:.3f} ms", flush=True)
    result = {"experiment": "foundation", "device": rows[0]["device"] if rows else None,
              "date": datetime.date.today().isoformat(), "tvm": tvm.__version__,
              "tvmsched": tvmsched.__version__, "command": " ".join(["python -m experiments.foundation",
                                                                     *sys.argv[1:]]),
              "kernels": "dlight defaults (untuned)", "executor": "sequential, one stream, no CUDA graph",
              "reference": "onnxruntime CPUExecutionProvider", "results": rows}
    with open(args.out, "w") as file:
        json.dump(result, file, indent=1)
    return 0 if all(row["matches_rtol_1e-4"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
