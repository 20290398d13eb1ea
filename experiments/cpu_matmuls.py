"""Matrix products of a transformer on the CPU, each alone as a one-node ONNX model: tvmsched's default llvm
schedule against onnxruntime (its default threads) in the same process; median of --repeat runs, and the
largest difference from onnxruntime. ViT-B/16's shapes at batch 1 by default (12 heads, 197 tokens).

    python -m experiments.cpu_matmuls --label batched --out experiments/results/cpu_matmuls_2026-11-25.json

Rows accumulate in --out under --label (run it on two code states to compare them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

import tvmsched
from experiments.common import argument_parser, command, host_median_ms, now

SHAPES = {"scores (q @ k^T)": ([1, 12, 197, 64], [1, 12, 64, 197]),
          "context (p @ v)": ([1, 12, 197, 197], [1, 12, 197, 64]),
          "projection (x @ W)": ([1, 197, 768], [768, 768]),
          "MLP in (GELU(x @ W + b))": ([1, 197, 768], [768, 3072])}
GELU = [helper.make_node("Add", ["y0", "bias"], ["z"]), helper.make_node("Div", ["z", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["f"]),
        helper.make_node("Mul", ["z", "f"], ["g"]), helper.make_node("Mul", ["g", "half"], ["y"])]


def measure(name: str, a_shape: list[int], b_shape: list[int], repeat: int) -> dict:
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape),
              helper.make_tensor_value_info("b", TensorProto.FLOAT, b_shape)]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [*a_shape[:-1], b_shape[-1]])
    gelu = "GELU" in name  # the product then gets a bias and GELU, as exported
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y0" if gelu else "y"]), *(GELU if gelu else [])]
    values = {"bias": np.linspace(-1, 1, b_shape[-1]), "sqrt2": 2 ** 0.5, "one": 1.0, "half": 0.5}
    constants = [numpy_helper.from_array(np.array(value, "float32"), key) for key, value in values.items()]
    graph = helper.make_graph(nodes, "matmul", inputs, [output], constants if gelu else [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    rng = np.random.default_rng(0)
    feed = {"a": rng.standard_normal(a_shape).astype("float32"),
            "b": rng.standard_normal(b_shape).astype("float32")}
    compiled = tvmsched.compile(model, target="llvm", schedule="sequential")
    session = onnxruntime.InferenceSession(model.SerializeToString())
    expected = session.run(None, feed)[0]
    got = compiled.run(feed)[0]
    return {"matmul": name, "a": a_shape, "b": b_shape, "fallbacks": len(compiled.meta.fallbacks),
            "tvmsched_ms": host_median_ms(lambda: compiled.run(feed), repeat, warmup=1),
            "onnxruntime_ms": host_median_ms(lambda: session.run(None, feed), repeat, warmup=1),
            "max_abs_diff": float(np.abs(got - expected).max())}


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--label", required=True, help="the code state measured, e.g. a commit")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = json.loads(args.out.read_text()) if args.out.is_file() else {
        "experiment": "transformer matmuls on llvm, tvmsched default schedules vs onnxruntime", "runs": {}}
    rows = []
    for name, (a_shape, b_shape) in SHAPES.items():
        rows.append(measure(name, a_shape, b_shape, args.repeat))
        print(f"  {name:20s} tvmsched {rows[-1]['tvmsched_ms']:8.3f} ms   onnxruntime "
              f"{rows[-1]['onnxruntime_ms']:7.3f} ms", flush=True)
    result["runs"][args.label] = {"measured": now(), "command": command("experiments.cpu_matmuls"),
                                  "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
