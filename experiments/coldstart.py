"""Cold start (issue 28, "measure first"): the time from a saved build to its first result, broken down, in
a fresh process and again in the same process once the files are in memory, beside the steady-state
latency, the weights' size and the host-to-device bandwidth.

A saved build of each model is made once (in --builds). Each measurement runs in a fresh Python process
that times, by the host clock: importing tvmsched, `tvmsched.load` with its parts (checking the files'
digests where not remembered, mapping and page-locking the weights, loading the kernel library), making
the executor (buffers, the weights' copies issued, the vendor plans), and the first inference (live, each
kernel after its weights); then a second `load` and first
inference in the same process ("warm": files and libraries already in memory); the first inference of
that model after `close()` released everything it had on the GPU, its weights uploaded first (`naive_ms`)
or pipelined with it (`pipelined_ms`); the steady-state median, the bandwidth of copying 256 MiB of
pageable memory and of the page-locked weights file (`pcie_gbps`) to the device, and the bound
max(weights / pcie_gbps, steady state) (`bound_ms`); and the first inference after `offload()` (the
executor kept, its memory freed) with every weight uploaded in the reload graph (`resident_ms`) and with the
load plan's kernels reading their weights in place (`dha_ms`, `tvmsched.load_plan`).

    python -m experiments.coldstart --models resnet50 googlenet --target cuda --out /tmp/cold.json
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from experiments.common import ResultFile, argument_parser, command, now


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--models", nargs="+", default=["resnet50", "inception_v3", "googlenet"],
                        help="zoo models or .onnx files")
    parser.add_argument("--target", default="auto")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--builds", type=Path, default=Path("/tmp/tvmsched-coldstart"))
    parser.add_argument("--out", type=Path, required=True, help="the result JSON (rows accumulate)")
    args = parser.parse_args()
    results = ResultFile.load(args.out, "model")
    results.commands.append(command("experiments.coldstart"))
    for model in args.models:
        directory = args.builds / f"{Path(model).stem}_b{args.batch}_{args.target}"
        if not (directory / "meta.json").is_file():
            _run([sys.executable, "-m", "tvmsched", "build", model, "-o", str(directory), "--target",
                  args.target, "--batch", str(args.batch)])
        probe = _run([sys.executable, "-m", "experiments.coldstart_probe", str(directory)])
        row = json.loads(probe.strip().splitlines()[-1])
        results.put({"model": model, "batch": args.batch, "measured": now(), **row})
        results.write({"experiment": "coldstart"})
        print(json.dumps(results.rows[-1]), flush=True)


def _run(arguments: list[str]) -> str:
    done = subprocess.run(arguments, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(arguments)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


if __name__ == "__main__":
    main()
