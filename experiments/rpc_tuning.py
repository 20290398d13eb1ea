"""Tuning through a TVM RPC tracker with 1 and with N GPUs behind it: for each run a tracker and one RPC
server per GPU (`CUDA_VISIBLE_DEVICES=i`) start on this host, and `tvmsched tune --rpc` tunes the same zoo
models from an empty log with the same trials per kernel and time budget; writes trials per minute, each
kernel's best latency, and the host's CPU and each GPU's utilization (sampled every second) per run, and
compares every run with the first on the kernels both finished.

    python -m experiments.rpc_tuning --zoo squeezenet googlenet --batch 16 --time-budget 200 \\
        --runs 1:8 2:8 --out experiments/results/rpc_tuning_2026-11-26.json

A run is GPUS[:CONCURRENT[:SEEDS]] (kernels tuned at once; tune's --seeds, default its own). The trials
per kernel default to tune's: a search yields one batch of up to 64 candidates, so fewer trials spend
more search per candidate measured. Logs
and each run's console output go to --work. Runs accumulate in --out: a later call adds its runs after
those already there (same setup expected).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from experiments.common import argument_parser, command, now
from tvmsched.errors import TvmschedError
from tvmsched.target import device_name, host_cores, resolve_target
from tvmsched.tuning.log import MANIFEST
from tvmsched.tuning.rpc import TrackerAddress, registered_servers
from tvmsched.tuning.tune import SEARCH_STRATEGIES, TuneOptions

KEY = "tvmsched-gpu"


class Tracker:
    """A tracker on 127.0.0.1:`port` with one RPC server per GPU; stops them on exit."""

    def __init__(self, port: int, gpus: int, work: Path):
        self.address = TrackerAddress("127.0.0.1", port, KEY)
        self.gpus, self.work, self.processes = gpus, work, []

    def __enter__(self) -> TrackerAddress:
        python = [sys.executable, "-m"]
        self._start([*python, "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(self.address.port),
                     "--port-end", str(self.address.port + 1), "--silent"], os.environ, "tracker")
        for gpu in range(self.gpus):
            port = self.address.port + 10 * (gpu + 1)
            self._start([*python, "tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{self.address.port}",
                         "--key", KEY, "--host", "127.0.0.1", "--port", str(port),
                         "--port-end", str(port + 9), "--no-fork"],
                        {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(gpu)},
                        f"server{gpu}")
        deadline = time.monotonic() + 60
        while True:
            try:
                if registered_servers(self.address) == self.gpus:
                    return self.address
            except TvmschedError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.gpus} RPC servers did not register within 60 s; see {self.work}")
            time.sleep(1)

    def _start(self, argv: list[str], env, name: str) -> None:
        with (self.work / f"{name}.log").open("w") as log:  # the process writes to its own copy
            self.processes.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                   start_new_session=True))

    def __exit__(self, *exc) -> None:
        """Stops the tracker and the servers with the processes they started (a server listens in a child)."""
        for process in self.processes:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


class Utilization:
    """The host's CPU utilization over the block (psutil), the CPU seconds each part of the run spent in it
    (`ProcessCpu`), and each GPU's utilization, sampled every second by `nvidia-smi` where there is one
    (GPUs in PCI order, as the servers number them)."""

    def __init__(self, work: Path):
        self.path = work / "gpu_utilization.csv"
        self.cpu_percent: float | None = None
        self.processes = ProcessCpu()

    def __enter__(self) -> Utilization:
        psutil.cpu_percent(None)  # the next call answers for the time since this one
        self.processes.start()
        with self.path.open("w") as out:
            try:
                self.smi = subprocess.Popen(["nvidia-smi", "--query-gpu=index,utilization.gpu",
                                             "--format=csv,noheader,nounits", "-lms", "1000"], stdout=out)
            except FileNotFoundError:
                self.smi = None
        return self

    def __exit__(self, *exc) -> None:
        self.cpu_percent = psutil.cpu_percent(None)
        self.processes.stop()
        if self.smi is not None:
            self.smi.terminate()
            self.smi.wait()

    def summary(self) -> dict:
        """Mean utilization in percent: the host's CPU (all cores) and each GPU's, by index; CPU seconds by
        part of the run."""
        gpus: dict[str, list[float]] = {}
        for line in self.path.read_text().splitlines():
            index, _, percent = line.partition(",")
            if percent.strip().isdigit():
                gpus.setdefault(index.strip(), []).append(float(percent))
        return {"host_cpu_percent": self.cpu_percent,
                "gpu_percent": {index: round(statistics.mean(values), 1) for index, values in gpus.items()},
                "cpu_s": self.processes.seconds()}


# What marks a process's command line (or an ancestor's) as a part of the run; the first match names it.
PARTS = (("tvm.exec.rpc_server", "servers"), ("tvm.exec.rpc_tracker", "tracker"), ("tvmsched tune", "tune"))


class ProcessCpu:
    """CPU seconds (user and system) that the run's processes spent between `start` and `stop`, by part:
    `tune` (the tuning process: search, cost model), `tune_workers` (its builder's and runner's worker
    processes), `servers` (the RPC servers and their session processes), `tracker`. Every process is
    sampled every second (a process that ends between samples loses its last second)."""

    def __init__(self):
        self.first: dict[tuple, float] = {}  # by (pid, start time): a reused pid is another process
        self.last: dict[tuple, tuple[str, float]] = {}
        self.done = threading.Event()

    def start(self) -> None:
        self._sample(initial=True)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self._sample()

    def seconds(self) -> dict[str, float]:
        parts: dict[str, float] = {}
        for key, (part, cpu) in self.last.items():
            parts[part] = parts.get(part, 0.0) + cpu - self.first.get(key, 0.0)
        return {part: round(value, 1) for part, value in sorted(parts.items())}

    def _run(self) -> None:
        while not self.done.wait(1.0):
            self._sample()

    def _sample(self, initial: bool = False) -> None:
        """Each process's CPU seconds now; a process first seen after `start` counts from zero. At `start`
        every process's seconds are the baseline, also where its part cannot be read yet."""
        for process in psutil.process_iter():
            try:
                key = (process.pid, process.create_time())
                times = process.cpu_times()
                cpu = times.user + times.system
                if initial:
                    self.first[key] = cpu
                part = run_part(process)
            except psutil.Error:
                continue
            if part is not None:
                self.first.setdefault(key, 0.0)
                self.last[key] = (part, cpu)


def run_part(process: psutil.Process) -> str | None:
    """The part of the run (`PARTS`) that `process` belongs to, or None; a child of the tuning process is
    one of its workers."""
    for depth, each in enumerate([process, *process.parents()]):
        line = " ".join(each.cmdline())
        for mark, part in PARTS:
            if mark in line:
                return "tune_workers" if part == "tune" and depth else part
    return None


def tune_run(gpus: int, concurrent: int, seeds: int, index: int, args, work: Path) -> dict:
    """One `tvmsched tune --rpc` run with `gpus` servers behind a fresh tracker, into an empty log."""
    run_dir = work / f"run{index}_{gpus}gpu_c{concurrent}_s{seeds}"
    run_dir.mkdir(parents=True)
    with Tracker(free_port(), gpus, run_dir) as address:
        argv = [sys.executable, "-m", "tvmsched", "tune", "--zoo", *args.zoo, "--batch", str(args.batch),
                "--target", args.target, "--trials", str(args.trials), "--concurrent", str(concurrent),
                "--seeds", str(seeds),
                "--time-budget", f"{args.time_budget}s", "--search", args.search, "--rpc", str(address),
                "--log", str(run_dir / "log")]
        start = time.perf_counter()
        with (run_dir / "tune.log").open("w") as out, Utilization(run_dir) as utilization:
            try:
                returncode = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT,
                                            timeout=args.time_budget + 180).returncode
            except subprocess.TimeoutExpired:
                returncode = "timed out"
        wall_s = time.perf_counter() - start
    manifests = list((run_dir / "log").rglob(MANIFEST))
    kernels = json.loads(manifests[0].read_text())["workloads"] if manifests else {}
    trials = sum(entry.get("trials", 0) for entry in kernels.values())
    finished = [key for key, entry in kernels.items() if is_finished(entry, args.trials)]
    logs = [(run_dir / f"server{gpu}.log").read_text() for gpu in range(gpus)]
    console = (run_dir / "tune.log").read_text()
    tuning_s = tuning_seconds(console)
    row = {"gpus": gpus, "concurrent": concurrent, "seeds": seeds, "time_budget": args.time_budget,
           "measured": now(), "returncode": returncode,
           "wall_s": round(wall_s, 1), "tuning_s": tuning_s, "trials": trials,
           "trials_per_min": round(60 * trials / wall_s, 1),
           "trials_per_min_tuning": round(60 * trials / tuning_s, 1) if tuning_s else None,
           "kernels_finished": len(finished),
           "sessions_per_gpu": [log.count("start serving") for log in logs],
           "modules_run_per_gpu": [log.count("load_module") for log in logs],
           "utilization": utilization.summary(),
           "console_tail": console[-600:],
           "kernels": kernels}
    print(f"  {gpus} GPU(s), {concurrent} at once, {seeds} seeds: {trials} trials in {tuning_s} s of tuning,"
          f" {wall_s:.0f} s"
          f" wall ({row['trials_per_min_tuning']} a minute of tuning), {len(finished)} kernels finished;"
          f" utilization {row['utilization']}", flush=True)
    return row


def tuning_seconds(console: str) -> float | None:
    """The seconds `tune` reports for its run (defaults and search; the wall time adds the import and task
    extraction, the same with 1 or N GPUs), or None if it did not get there."""
    found = re.search(r"\d+ trials on \d+ kernels in (\d+) s", console)
    return float(found.group(1)) if found else None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for the tracker (each server takes the first free port of ten
    after it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def is_finished(entry: dict, trials: int) -> bool:
    """A manifest entry with its trials (or an exhausted search) and a measured best."""
    return entry.get("best_ms") is not None and (entry.get("trials", 0) >= trials or entry.get("exhausted"))


def compare(base: dict, run: dict, trials: int) -> dict:
    """`run` against `base`: trials per minute, and best latencies on the kernels both finished."""
    common = [key for key, entry in run["kernels"].items()
              if is_finished(entry, trials) and is_finished(base["kernels"].get(key, {}), trials)]
    ratios = [run["kernels"][key]["best_ms"] / base["kernels"][key]["best_ms"] for key in common]
    rates = [each["trials_per_min_tuning"] for each in (run, base)]
    def name(row: dict) -> str:
        return f"{row['gpus']}:{row['concurrent']}:{row.get('seeds', 50)}"

    return {"runs": f"{name(run)} vs {name(base)}",
            "trials_per_min_tuning_ratio": round(rates[0] / rates[1], 3) if all(rates) else None,
            "common_finished_kernels": len(common),
            "best_ms_sum": [round(sum(base["kernels"][k]["best_ms"] for k in common), 4),
                            round(sum(run["kernels"][k]["best_ms"] for k in common), 4)],
            "best_ms_geomean_ratio": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3)
            if ratios else None}


def run_spec(text: str) -> tuple[int, int, int]:
    """GPUS[:CONCURRENT[:SEEDS]] as numbers, 4 kernels at once and tune's seeds where left out."""
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(part.isdigit() for part in parts):
        raise SystemExit(f"--runs: '{text}' is not GPUS[:CONCURRENT[:SEEDS]]")
    numbers = [int(part) for part in parts]
    return tuple(numbers + [4, TuneOptions.seeds][len(numbers) - 1:])


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--zoo", nargs="+", default=["squeezenet", "googlenet"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--trials", type=int, default=TuneOptions.trials)
    parser.add_argument("--time-budget", type=int, default=200, help="seconds per run")
    parser.add_argument("--search", choices=SEARCH_STRATEGIES, default="evolutionary", help="tune's --search")
    parser.add_argument("--runs", nargs="+", default=["1:4", "2:4", "2:8"], help="GPUS[:CONCURRENT[:SEEDS]]")
    parser.add_argument("--work", default=None, help="logs and console output (default: a temporary folder)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="tvmsched-rpc-"))
    runs = json.loads(args.out.read_text())["runs"] if args.out.is_file() else []
    for text in args.runs:
        runs.append(tune_run(*run_spec(text), len(runs), args, work))
        setup = {**{key: getattr(args, key)
                    for key in ("zoo", "batch", "target", "trials", "time_budget", "search")},
                 "host_cores": [host_cores(), host_cores(physical=False)]}
        result = {"experiment": "tvmsched tune --rpc with 1 and N GPUs behind a local TVM RPC tracker",
                  "device": device_name(resolve_target(args.target)), "date": now(),
                  "command": command("experiments.rpc_tuning"), "setup": setup,
                  "runs": runs, "against_first": [compare(runs[0], run, args.trials) for run in runs[1:]]}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))  # after every run: a killed call keeps the others
        print(json.dumps(result["against_first"], indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
