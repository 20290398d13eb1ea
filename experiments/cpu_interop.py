"""Inter-operator parallelism on the CPU (issue 29), measured before it is built: each zoo model is built
for llvm with the dp schedule, and its plan runs in one process two ways, alternating over several rounds:
`sequential`, the kernels one after another, each on TVM's thread pool of every core (intra-operator
only, what CPU builds run); and `stages`, dp's stages in order, a stage of one group as before, a stage of
several groups with each group on a worker thread of its own whose TVM pool has one thread, so that
cores are not oversubscribed (at most one worker per core; more groups than cores queue). Both executors
share the build's buffers and kernels; every output is compared with sequential's.

    python -m experiments.cpu_interop --models googlenet inception_v3 --out /tmp/interop.json
"""

from __future__ import annotations

import json
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tvm

import tvmsched
from experiments.common import argument_parser, command, host_median_ms, now
from tvmsched.executor import create_executor
from tvmsched.target import device_name, host_cores, resolve_target


class Stages:
    """The plan's stages on `workers` threads, each with a one-thread TVM pool, around `executor`'s
    kernels (its launchers and buffers)."""

    def __init__(self, executor, stages: list[list[list[int]]], workers: int):
        self.executor, self.stages = executor, stages
        configure = tvm.get_global_func("runtime.config_threadpool")
        self.pool = ThreadPoolExecutor(workers, initializer=lambda: configure(0, 1))

    def launch(self) -> None:
        for stage in self.stages:
            if len(stage) == 1:
                self._group(stage[0])
                continue
            for done in [self.pool.submit(self._group, group) for group in stage]:
                done.result()

    def _group(self, group: list[int]) -> None:
        for kernel in group:
            self.executor.launchers[kernel](None)


def measure(model_name: str, batch: int, rounds: int, repeat: int) -> dict:
    model = tvmsched.compile(model_name, target="llvm", batch=batch, schedule="dp")
    stages = model.plan.schedule["stages"]
    inputs = list(model.random_inputs().values())
    executor = create_executor("sequential", model.library, model.graph, model.plan, model.constants,
                               tvm.cpu())
    expected = executor.run(inputs)
    staged = Stages(executor, stages, host_cores())
    for tensor, value in zip(model.graph.inputs, inputs):
        executor.buffers[tensor.name].copyfrom(value)
    staged.launch()
    outputs = [executor.buffers[tensor.name].numpy() for tensor in model.graph.outputs]
    agree = all(np.array_equal(a, b) for a, b in zip(outputs, expected))
    times = {"sequential": [], "stages": []}
    for _ in range(rounds):
        times["sequential"].append(host_median_ms(executor.launch, repeat, warmup=2))
        times["stages"].append(host_median_ms(staged.launch, repeat, warmup=2))
    staged.pool.shutdown()
    executor.close()
    medians = {name: round(statistics.median(values), 3) for name, values in times.items()}
    return {"model": model_name, "batch": batch, "measured": now(), "kernels": len(model.graph.kernels),
            "stages": len(stages), "parallel_stages": sum(len(stage) > 1 for stage in stages),
            "most_groups": max(len(stage) for stage in stages), "outputs_equal": agree,
            "median_ms": medians, "rounds_ms": times,
            "stages_vs_sequential": round(medians["sequential"] / medians["stages"], 3)}


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--models", nargs="+",
                        default=["googlenet", "inception_v3", "squeezenet", "resnet50", "nasnet", "randwire"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5, help="alternations of the two executors")
    parser.add_argument("--repeat", type=int, default=10, help="inferences per median")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    for name in args.models:
        rows.append(measure(name, args.batch, args.rounds, args.repeat))
        row = rows[-1]
        print(f"{name}: sequential {row['median_ms']['sequential']} ms, stages {row['median_ms']['stages']} "
              f"ms ({row['stages_vs_sequential']}x), {row['parallel_stages']} of {row['stages']} stages "
              f"parallel, outputs equal: {row['outputs_equal']}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "experiment": "inter-operator parallelism on the CPU: dp's parallel stages on threads with "
                          "one-thread TVM pools, against intra-operator parallelism only",
            "device": device_name(resolve_target("llvm")), "cores": host_cores(), "date": now()[:10],
            "tvm": tvm.__version__, "command": command("experiments.cpu_interop"), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
