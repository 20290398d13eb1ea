"""Real models end to end: every classification network of torchvision.models and BERT-base (random
weights; experiments/torchvision_models.py), exported to ONNX at batch 1 and 16, imported and built by
tvmsched, and checked: on llvm against onnxruntime, on cuda against PyTorch (TF32 off), with the latency of
tvmsched's default build (sequential plan, one CUDA graph, the shipped tuning log where it has records)
against PyTorch + CUDA Graph.

    python -m experiments.real_models export --dir /tmp/real --batch 1 16          # needs torch
    python -m experiments.real_models check --dir /tmp/real --target llvm --out results.json
    python -m experiments.real_models check --dir /tmp/real --target cuda --out results.json --jobs 8
    python -m experiments.real_models table --results results.json cpu.json   # markdown: a row per network

`check` builds and checks `--jobs` cases at once, each step in a process of its own (a crash or a hang
costs one case: it is recorded as such); GPU timings take a lock, so each runs on an otherwise idle device.
Rows accumulate in --out: cases it already holds are skipped unless --again.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from experiments.common import ResultFile, argument_parser, command, now, relative_diff

WRONG = 1e-3  # an output whose largest difference exceeds this share of its largest magnitude is wrong


def export_all(directory: Path, names: list[str], batches: list[int], jobs: int) -> None:
    """Write NAME_bBATCH.onnx for each network and batch (skipping those already there), `jobs` at once."""
    directory.mkdir(parents=True, exist_ok=True)
    todo = [(name, batch) for name in names for batch in batches
            if not (directory / f"{name}_b{batch}.onnx").is_file()]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=context) as pool:
        for message in pool.map(_export_one, [directory] * len(todo), *zip(*todo)):
            print(message, flush=True)


def _export_one(directory: Path, name: str, batch: int) -> str:
    """Export one network at one batch; a failure is written beside the exports, not raised."""
    from experiments.torchvision_models import export, torch_network

    path, start = directory / f"{name}_b{batch}.onnx", time.perf_counter()
    try:
        module, example = torch_network(name, batch)
        export(module, example, str(path))
    except Exception as error:  # noqa: BLE001  (an export failure is recorded, not fatal)
        (directory / f"{name}_b{batch}.export-error").write_text(f"{type(error).__name__}: {error}")
        return f"export of {name} at batch {batch} failed: {error}"
    return f"exported {path.name} in {time.perf_counter() - start:.0f} s"


def build_case(path: Path, target: str, build_dir: Path) -> dict:
    """Compile one export and save the build; the row's build fields (status "built", or the refusal)."""
    import tvmsched
    from tvmsched.errors import TvmschedError

    start = time.perf_counter()
    try:
        model = tvmsched.compile(str(path), target=target)
    except TvmschedError as error:
        return {"status": "refused", "error": f"{type(error).__name__}: {error}"}
    model.save(build_dir)
    row = {"status": "built", "kernels": len(model.graph.kernels), "fallbacks": len(model.meta.fallbacks),
           "tuned_kernels": len(model.meta.tuned_kernels), "compile_s": round(time.perf_counter() - start, 1)}
    (build_dir / "row.json").write_text(json.dumps({**row, "export": _build_stamp(path)}))
    return row


def reused_build(path: Path, build_dir: Path) -> dict | None:
    """The build fields of the saved build of this very export (same size and time) by this very code (the
    same tvmsched sources), if an earlier call made one."""
    saved = build_dir / "row.json"
    if not saved.is_file():
        return None
    row = json.loads(saved.read_text())
    return row if row.pop("export", None) == _build_stamp(path) else None


def _build_stamp(path: Path) -> list:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns, _code_digest()]


@functools.cache
def _code_digest() -> str:
    """A digest of tvmsched's Python sources: a build made by other code is not reused."""
    package = Path(importlib.util.find_spec("tvmsched").origin).parent  # without importing TVM
    digest = hashlib.sha256()
    for source in sorted(package.rglob("*.py")):
        digest.update(source.relative_to(package).as_posix().encode() + source.read_bytes())
    return digest.hexdigest()[:16]


def check_case(path: Path, target: str, build_dir: Path, repeat: int) -> dict:
    """Run a saved build on the case's input against its reference: onnxruntime on llvm; on cuda PyTorch,
    whose latency with a CUDA graph is measured beside tvmsched's. Checks may run in parallel; the GPU
    timings take a lock (`_timing_alone`), so each is taken on an otherwise idle device."""
    import tvmsched

    name, batch = _case(path)
    model = tvmsched.load(build_dir)
    row = {}
    if target == "cuda":
        pytorch, reference, inputs = _pytorch(name, batch)
    else:
        inputs = _onnx_inputs(model)
        reference, row["onnxruntime_ms"] = _onnxruntime(path, inputs)
    start = time.perf_counter()
    actual = model.run(inputs)
    row["first_run_s"] = round(time.perf_counter() - start, 2)
    row["rel_diff"] = max(relative_diff(got, want) for got, want in zip(actual, reference))
    row["status"] = "wrong" if row["rel_diff"] > WRONG else "ok"
    if row["status"] == "ok" and any(np.ptp(want) == 0 for want in reference):
        row["status"] = "uninformative"  # a constant output matches whatever the network computes
    if target == "cuda":
        from experiments.common import event_median_ms

        with _timing_alone(build_dir.parent / ".timing.lock"):
            row["pytorch_cuda_graph_ms"] = event_median_ms(pytorch, repeat)
            row["tvmsched_ms"] = round(model.benchmark(warmup=10, repeat=repeat)["median_ms"], 4)
        row["speedup_vs_pytorch_cuda_graph"] = round(row["pytorch_cuda_graph_ms"] / row["tvmsched_ms"], 3)
    model.close()
    return row


@contextlib.contextmanager
def _timing_alone(lock: Path):
    """Hold an exclusive lock on `lock` (shared by the check processes) for the block."""
    with lock.open("w") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def _onnx_inputs(model) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {spec.name: (rng.integers(0, 1000, spec.shape) if np.dtype(spec.dtype).kind == "i"
                        else rng.standard_normal(spec.shape)).astype(spec.dtype) for spec in model.inputs}


def _onnxruntime(path: Path, inputs: dict) -> tuple[list[np.ndarray], float]:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    outputs = session.run(None, inputs)
    return outputs, round((time.perf_counter() - start) * 1e3, 2)


def _pytorch(name: str, batch: int):
    """A replay of PyTorch + CUDA Graph for the network, its outputs for the example input, and that input
    by ONNX name (fp32, TF32 off)."""
    import torch

    from experiments.torch_onnx import cuda_graph, fp32_settings
    from experiments.torchvision_models import torch_network

    fp32_settings()
    module, example = torch_network(name, batch)
    module, example = module.cuda(), example.cuda()
    with torch.no_grad():
        outputs = module(example)
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    reference = [output.float().cpu().numpy() for output in outputs]
    replay, _, _ = cuda_graph(module, example)
    input_name = "input_ids" if example.dtype == torch.int64 else "input"
    return replay, reference, {input_name: example.cpu().numpy()}


def _case(path: Path) -> tuple[str, int]:
    name, _, batch = path.stem.rpartition("_b")
    return name, int(batch)


def _worker(mode: str, path: Path, target: str, build_dir: Path, repeat: int) -> dict:
    """One step of one case in this process (called in a subprocess): its row fields, or the crash."""
    try:
        if mode == "build":
            return build_case(path, target, build_dir)
        return check_case(path, target, build_dir, repeat)
    except Exception as error:  # noqa: BLE001  (anything else is what the row calls a crash)
        where = traceback.extract_tb(error.__traceback__)[-1]
        return {"status": "crash", "error": f"{type(error).__name__}: {str(error).strip()[:300]} "
                                             f"({Path(where.filename).name}:{where.lineno})"}


def _in_subprocess(mode: str, path: Path, target: str, build_dir: Path, repeat: int, timeout: float) -> dict:
    """`_worker` in a fresh Python, so that a segfault, a lost CUDA context or a hang costs one case."""
    arguments = [sys.executable, "-m", "experiments.real_models", "_worker", mode, str(path), target,
                 str(build_dir), str(repeat)]
    try:
        done = subprocess.run(arguments, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"{mode} took over {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return {"status": "crash", "error": f"{mode} died: {tail[:300]}"}
    return json.loads(lines[-1])


def check_all(args) -> None:
    results = ResultFile.load(args.out, "case")
    paths = sorted(args.dir.glob("*.onnx"))
    cases = {f"{name}:{batch}": path for path in paths for name, batch in [_case(path)]
             if (not args.models or name in args.models) and batch in args.batch}
    results.commands.append(command("experiments.real_models"))
    for failed in sorted(args.dir.glob("*.export-error")):
        name, batch = _case(failed)
        if (not args.models or name in args.models) and batch in args.batch:
            results.put({"case": f"{name}:{batch}", "network": name, "batch": batch, "target": args.target,
                         "status": "export-failed", "error": failed.read_text()[:300], "measured": now()})
    todo = results.todo(list(cases), args.again)
    build_root = args.builds / args.target
    written = threading.Lock()

    def build_and_check(case: str) -> None:
        name, batch = _case(cases[case])
        directory = _build_dir(build_root, case)
        row = {"case": case, "network": name, "batch": batch, "target": args.target,
               "onnx_mb": round(sum(file.stat().st_size for file in args.dir.glob(f"{name}_b{batch}.*")
                                    if file.suffix != ".export-error") / 2**20, 1)}
        row.update(reused_build(cases[case], directory) or _in_subprocess(
            "build", cases[case], args.target, directory, args.repeat, args.timeout))
        if row["status"] == "built":
            row.update(_in_subprocess("check", cases[case], args.target, directory, args.repeat,
                                      args.timeout))
        row["measured"] = now()
        with written:
            results.put(row)
            results.write(_header(args, results.rows))
        print(f"{case:28s} {row['status']:8s} rel {row.get('rel_diff', float('nan')):.1e} "
              f"{row.get('tvmsched_ms', '')} vs {row.get('pytorch_cuda_graph_ms', '')} "
              f"{row.get('error', '')}"[:220], flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(build_and_check, todo))


def _build_dir(root: Path, case: str) -> Path:
    return root / case.replace(":", "_b")


def _header(args, rows: list[dict]) -> dict:
    import tvm

    from tvmsched.target import device_name, resolve_target

    statuses = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    return {"experiment": "real_models", "date": now(), "target": args.target, "tvm": tvm.__version__,
            "device": device_name(resolve_target(args.target)), "wrong_threshold": WRONG,
            "statuses": statuses}


def markdown(files: list[Path]) -> str:
    """One row per network, one column per (target, batch) of the result files: the rel. diff of an ok
    case (with the speedup vs PyTorch + CUDA Graph on cuda), or its status."""
    rows = [row for file in files for row in json.loads(file.read_text())["results"]]
    columns = sorted({(row["target"], row["batch"]) for row in rows}, key=lambda key: (key[0] != "llvm", key))
    cells = {(row["network"], row["target"], row["batch"]): row for row in rows}

    def cell(row: dict | None) -> str:
        if row is None:
            return "not run"
        if row["status"] != "ok":
            return row["status"]
        speedup = row.get("speedup_vs_pytorch_cuda_graph")
        return f"{row['rel_diff']:.1e}" + ("" if speedup is None else f", {speedup:.2f}x")

    header = ["network", *(f"{target} b{batch}" for target, batch in columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for network in sorted({row["network"] for row in rows}):
        values = [network, *(cell(cells.get((network, *key))) for key in columns)]
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    if sys.argv[1:2] == ["_worker"]:
        mode, path, target, build_dir, repeat = sys.argv[2:7]
        # assigned, not defaulted: `import tvmsched` (here and in the parent) already set every core; TVM
        # reads it when the first parallel kernel runs
        os.environ["TVM_NUM_THREADS"] = str(max(1, (os.cpu_count() or 2) // 2))
        print(json.dumps(_worker(mode, Path(path), target, Path(build_dir), int(repeat))))
        return
    parser = argument_parser(__doc__)
    parser.add_argument("mode", choices=("export", "check", "table"))
    parser.add_argument("--dir", type=Path, help="export, check: the ONNX exports (NAME_bBATCH.onnx)")
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--models", nargs="+", help="only these networks (default: all)")
    parser.add_argument("--target", choices=("llvm", "cuda"), default="llvm")
    parser.add_argument("--out", type=Path, help="check: the result JSON (rows accumulate)")
    parser.add_argument("--builds", type=Path, default=Path("/tmp/tvmsched-real-builds"))
    parser.add_argument("--jobs", type=int, default=1, help="exports, or cases built and checked, at once")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per build and per check")
    parser.add_argument("--repeat", type=int, default=50, help="timed inferences per latency")
    parser.add_argument("--again", action="store_true", help="check again the cases --out holds")
    parser.add_argument("--results", type=Path, nargs="+", help="table: the result JSONs to tabulate")
    args = parser.parse_args()
    if args.mode == "table":
        if not args.results:
            parser.error("table needs --results")
        print(markdown(args.results), end="")
    elif args.dir is None:
        parser.error(f"{args.mode} needs --dir")
    elif args.mode == "export":
        from experiments.torchvision_models import classification_networks

        export_all(args.dir, args.models or classification_networks(), args.batch, args.jobs)
    else:
        if args.out is None:
            parser.error("check needs --out")
        check_all(args)


if __name__ == "__main__":
    main()
