"""One cold start of a saved build, in this process (run it in a fresh one): prints one JSON line with the
seconds of each part, the first output's agreement with the steady state's, the warm repeat (a second
`load`), and the first inference of the loaded model after `close()` released everything it had on the
GPU (DeepPlan's case: library and weights in host memory, nothing on the device), with the weights
uploaded before it (`naive_ms`) and pipelined with it (`pipelined_ms`), alternating, and after
`offload()` freed its memory but kept its executor (`resident_ms`: one CUDA graph of uploads and plan;
`dha_ms`: the same with the load plan's kernels reading their weights in place)
(`experiments.coldstart` runs it and keeps the rows).

    python -m experiments.coldstart_probe BUILD_DIR
"""

import time

STARTED = time.perf_counter()

import json  # noqa: E402  (the imports are part of what is timed)
import statistics  # noqa: E402
import sys  # noqa: E402
from collections import defaultdict  # noqa: E402

import tvmsched  # noqa: E402  (before tvm, as a user imports it: it imports TVM without torch)

# isort: split
import numpy as np  # noqa: E402
import tvm  # noqa: E402

from tvmsched import api, cuda, digests, load_plan  # noqa: E402
from tvmsched.executor import base, streams  # noqa: E402
from tvmsched.tactics.library import LIBRARIES  # noqa: E402
from tvmsched.target import device_name  # noqa: E402

IMPORTED = time.perf_counter()
BANDWIDTH_BYTES = 256 * 2**20
OFFLOADED_ROUNDS = 7


def main(directory: str) -> dict:
    seconds = defaultdict(float)
    _time_calls(seconds)
    row = {"import_s": round(IMPORTED - STARTED, 3)}
    cold = _start(directory, seconds)
    row.update(cold["times"])
    row["parts_s"] = {name: round(value, 3) for name, value in seconds.items()}
    model, first = cold["model"], cold["first"]
    inputs = model.random_inputs()
    steady = model.run(inputs)
    row["first_equals_steady"] = all(np.array_equal(a, b) for a, b in zip(first, steady))
    row["steady_ms"] = round(model.benchmark(warmup=10, repeat=50)["median_ms"], 4)
    row["weights_mb"] = round(sum(value.nbytes for value in model.constants.values()) / 2**20, 2)
    row["device"] = device_name(model.meta.target)
    model.close()
    seconds.clear()
    warm = _start(directory, seconds)
    row["warm"] = {**warm["times"],
                   "parts_s": {name: round(value, 3) for name, value in seconds.items()}}
    row.update(_offloaded(warm["model"], inputs, steady))
    row.update(_resident(warm["model"], inputs, steady))
    row["host_to_device_gbps"] = _bandwidth(model)
    row["pcie_gbps"] = _pinned_bandwidth(warm["model"])
    if row["pcie_gbps"]:
        row["bound_ms"] = round(max(row["weights_mb"] * 2**20 / row["pcie_gbps"] / 1e6, row["steady_ms"]), 4)
    warm["model"].close()
    return row


def _offloaded(model, inputs: dict, steady: list) -> dict:
    """The first inference after `model.close()`, alternating the weights uploaded before it (naive) and
    pipelined with it: milliseconds to make the executor, of the first run, and of both (medians)."""
    times = {False: [], True: []}
    equal = True
    for _ in range(OFFLOADED_ROUNDS):
        for pipelined in (False, True):
            model.close()
            model.pipelined = pipelined
            start = time.perf_counter()
            with model.exclusive():
                pass
            made = time.perf_counter()
            outputs = model.run(inputs)
            end = time.perf_counter()
            times[pipelined].append(((made - start) * 1e3, (end - made) * 1e3, (end - start) * 1e3))
            equal = equal and all(np.array_equal(a, b) for a, b in zip(outputs, steady))
    row = {"offloaded_equals_steady": equal}
    for pipelined, name in ((False, "naive"), (True, "pipelined")):
        executor_ms, run_ms, total_ms = (statistics.median(column) for column in zip(*times[pipelined]))
        row[f"{name}_ms"] = round(total_ms, 3)
        row[f"{name}_parts_ms"] = {"executor": round(executor_ms, 3), "first_run": round(run_ms, 3)}
    return row


def _resident(model, inputs: dict, steady: list) -> dict:
    """The first inference after `model.offload()` freed its GPU memory and kept its executor (one CUDA
    graph of the uploads and the plan), every weight uploaded and with the load plan (`plan_load`: some
    kernels read their weights in place): milliseconds of the run (medians), the outputs' agreement, and
    the plan."""
    uploaded = load_plan.time_reloads(model, None, inputs, steady, OFFLOADED_ROUNDS)
    plan = model.plan_load()
    direct = load_plan.time_reloads(model, plan, inputs, steady, OFFLOADED_ROUNDS)
    return {"resident_ms": uploaded["median_ms"], "resident_equals_steady": uploaded["equal"],
            "dha_ms": direct["median_ms"], "dha_equals_steady": direct["equal"],
            "load_plan": {"direct_kernels": len(plan.direct), "modelled_direct_kernels": len(plan.modelled),
                          "modelled_upload_ms": plan.upload_ms, "modelled_planned_ms": plan.planned_ms,
                          "checked_upload_ms": plan.measured_upload_ms,
                          "checked_planned_ms": plan.measured_planned_ms,
                          "direct_mb": round(sum(row.weight_bytes for row in plan.kernels if row.direct)
                                             / 2**20, 2),
                          "kernels": [row.to_json() for row in plan.kernels if row.weight_bytes]}}


def _start(directory: str, seconds: dict) -> dict:
    """load, make the executor, run once: the seconds of each, and the model and its first outputs."""
    times = {}
    start = time.perf_counter()
    model = tvmsched.load(directory)
    times["load_s"] = time.perf_counter() - start
    start = time.perf_counter()
    with model.exclusive():  # makes the executor: device buffers, weights uploaded, the plan captured
        pass
    times["executor_s"] = time.perf_counter() - start
    start = time.perf_counter()
    first = model.run(model.random_inputs())
    times["first_run_s"] = time.perf_counter() - start
    times["to_first_result_s"] = sum(times.values())
    return {"times": {name: round(value, 4) for name, value in times.items()}, "model": model, "first": first}


def _time_calls(seconds: dict) -> None:
    """Accumulate the seconds spent in the parts of `load` and of making the executor into `seconds` by
    name: digests, weights, pinning, library (load); uploads (issuing the copies of the constants and
    folded weights: from page-locked memory the host does not wait for them), vendor_handles (cuDNN's and
    cuBLASLt's handles), vendor_folding (batch norms folded into a vendor plan's weights, where the build
    did not save them), vendor_plans (each plan made ready to launch), graph_capture (the CUDA Graph
    captured and instantiated); the rest of `executor_s` is buffers, streams and events. The libraries
    are the process's (`tactics.library.shared_library`): a second load in one process finds the handles
    and the plans built, so only a fresh process measures them cold."""
    def timed(name, function):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - start
        return call
    digests.sha256 = timed("digests", digests.sha256)  # files not remembered as checked (tvmsched.digests)
    api.weights.read = timed("weights", api.weights.read)  # mapping the file (reading an older archive)
    api.pin_mapping = timed("pinning", api.pin_mapping)
    tvm.runtime.load_module = timed("library", tvm.runtime.load_module)
    streams.StreamsExecutor.upload = timed("uploads", streams.StreamsExecutor.upload)
    base.open_library = timed("vendor_handles", base.open_library)
    base.vendor_call = timed("vendor_folding", base.vendor_call)
    for library in LIBRARIES.values():
        library.launcher = timed("vendor_plans", library.launcher)
    cuda.capture = timed("graph_capture", cuda.capture)


def _bandwidth(model) -> float | None:
    """GB/s of copying BANDWIDTH_BYTES of pageable host memory to the device (best of 3); None on a CPU."""
    if model.meta.target.kind != "cuda":
        return None
    data = np.ones(BANDWIDTH_BYTES, "uint8")
    device = tvm.cuda(0)
    target = tvm.runtime.empty(data.shape, "uint8", device)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        target.copyfrom(data)
        device.sync()
        best = min(best, time.perf_counter() - start)
    return round(BANDWIDTH_BYTES / best / 1e9, 2)


def _pinned_bandwidth(model) -> float | None:
    """GB/s of copying the loaded build's page-locked weights file to the device (best of 3); None where it
    was not page-locked (a CPU build)."""
    if model.meta.target.kind != "cuda":
        return None
    mapping = next(iter(model.constants.values())).base
    cudart = cuda.runtime()
    if cuda.check(cudart.cudaPointerGetAttributes(mapping.ctypes.data)).type != \
            cudart.cudaMemoryType.cudaMemoryTypeHost:
        return None
    target = tvm.runtime.empty((mapping.nbytes,), "uint8", tvm.cuda(0))
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        cuda.check(cudart.cudaMemcpy(target.data_ptr(), mapping.ctypes.data, mapping.nbytes,
                                     cudart.cudaMemcpyKind.cudaMemcpyHostToDevice))
        best = min(best, time.perf_counter() - start)
    return round(mapping.nbytes / best / 1e9, 2)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
