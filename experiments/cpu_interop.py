"""Inter-operator parallelism on the CPU (issue 29), measured before it is built: each zoo model is built
for llvm with the dp schedule, and its plan runs in one process two ways, alternating over several rounds:
`sequential`, the kernels one after another, each on TVM's thread pool of every core (intra-operator
only, what CPU builds run); and `stages`, dp's stages in order, a stage of one group as before, a stage of
several groups with each group on a worker thread of its own whose TVM pool has one thread, so that
cores are not oversubscribed (at most one worker per core; more groups than cores queue). Both executors
share the build's buffers and kernels; the staged run's outputs are compared with sequential's for the
same inputs, after a run on other inputs. Also: the sequential plan on one thread (intra-operator
speedup), and a bound from each kernel timed alone on every core and on one thread: each stage at the
better of the two ways, its groups packed on one-thread workers without any overhead.

    python -m experiments.cpu_interop --models googlenet inception_v3 --out /tmp/interop.json
"""

from __future__ import annotations

import json
import statistics
from concurrent.futures import ThreadPoolExecutor
from functools import partial
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
    inputs, others = (list(model.random_inputs(seed).values()) for seed in (0, 1))
    executor = create_executor("sequential", model.library, model.graph, model.plan, model.constants,
                               tvm.cpu())
    expected = executor.run(inputs)
    executor.run(others)  # the buffers now hold another inference's values: the staged run must redo all
    staged = Stages(executor, stages, host_cores())
    for tensor, value in zip(model.graph.inputs, inputs):
        executor.buffers[tensor.name].copyfrom(value)
    staged.launch()
    outputs = [executor.buffers[tensor.name].numpy() for tensor in model.graph.outputs]
    agree = all(np.array_equal(a, b) for a, b in zip(outputs, expected))
    times = {"sequential": [], "stages": [], "sequential_one_thread": []}
    for _ in range(rounds):
        times["sequential"].append(host_median_ms(executor.launch, repeat, warmup=2))
        times["stages"].append(host_median_ms(staged.launch, repeat, warmup=2))
        times["sequential_one_thread"].append(staged.pool.submit(
            host_median_ms, executor.launch, repeat, 2).result())
    def kernel_times() -> dict[int, float]:
        return {kernel: host_median_ms(partial(launcher, None), 20, 2)
                for kernel, launcher in executor.launchers.items()}
    pooled, alone = kernel_times(), staged.pool.submit(kernel_times).result()
    staged.pool.shutdown()
    executor.close()
    medians = {name: round(statistics.median(values), 3) for name, values in times.items()}
    return {"model": model_name, "batch": batch, "measured": now(), "kernels": len(model.graph.kernels),
            "stages": len(stages), "parallel_stages": sum(len(stage) > 1 for stage in stages),
            "most_groups": max(len(stage) for stage in stages), "outputs_equal": agree,
            "median_ms": medians, "rounds_ms": times,
            "stages_vs_sequential": round(medians["sequential"] / medians["stages"], 3),
            "intra_op_speedup": round(medians["sequential_one_thread"] / medians["sequential"], 3),
            "kernels_alone_ms": _bound(stages, pooled, alone, host_cores())}


def _bound(stages: list[list[list[int]]], pooled: dict[int, float], alone: dict[int, float],
           workers: int) -> dict:
    """From each kernel's time alone (on every core, `pooled`; on one thread, `alone`): their sum on every
    core (the sequential plan without launch overhead), and each stage at its better of the two ways with
    its groups packed longest first on `workers` one-thread workers (inter-operator parallelism without
    overhead; a bound, not a runner)."""
    best = 0.0
    for stage in stages:
        together = sum(pooled[kernel] for group in stage for kernel in group)
        loads = [0.0] * workers
        for group in sorted(stage, key=lambda group: -sum(alone[kernel] for kernel in group)):
            loads[loads.index(min(loads))] += sum(alone[kernel] for kernel in group)
        best += min(together, max(loads)) if len(stage) > 1 else together
    return {"sum_on_every_core": round(sum(pooled.values()), 3), "best_per_stage": round(best, 3)}


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
