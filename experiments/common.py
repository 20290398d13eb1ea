"""What the experiments share: compiled zoo models cached as saved builds, timing helpers, and result files
that several calls add to."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import tvmsched
from tvmsched import zoo
from tvmsched.target import resolve_target
from tvmsched.tuning.log import MANIFEST, build_logs


def compiled(name: str, batch: int, target: str, builds: str | None) -> tuple[tvmsched.CompiledModel, float]:
    """The zoo model `name` compiled for `target` (sequential plan) and the seconds compiling took; with
    `builds`, a build saved there by an earlier run with the same tuning log is loaded instead, and a new
    one is saved there (a build from before the log last changed is never reused)."""
    directory = Path(builds) / f"{name}-b{batch}-{target}-log{log_digest(target)}" if builds else None
    if directory and (directory / "meta.json").is_file():
        return tvmsched.load(directory), 0.0
    start = time.perf_counter()
    model = tvmsched.compile(zoo.build(name, batch=batch), target=target)
    seconds = time.perf_counter() - start
    if directory:
        model.save(directory)
    return model, seconds


def log_digest(target: str) -> str:
    """A short digest of the manifests of the tuning logs a build for `target` applies (they change with
    every tuning run), or "none" where there is no log."""
    manifests = [log.directory / MANIFEST for log in build_logs(resolve_target(target))]
    contents = b"".join(path.read_bytes() for path in manifests if path.is_file())
    return hashlib.sha256(contents).hexdigest()[:12] if contents else "none"


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """An experiment's argument parser, with its module docstring as the --help text."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def median_ms(model: tvmsched.CompiledModel, repeat: int, runs: int = 3) -> tuple[float, float]:
    """Median over `runs` of the benchmark's median, and the spread of the runs, in milliseconds."""
    times = [model.benchmark(warmup=20, repeat=repeat)["median_ms"] for _ in range(runs)]
    return round(statistics.median(times), 4), round(max(times) - min(times), 4)


def command(module: str) -> str:
    return " ".join([f"python -m {module}", *sys.argv[1:]])


@dataclass
class ResultFile:
    """A result file that several calls add to, so a suite can run over several calls under a time limit:
    its rows (one per `key`), the commands that measured them, and the rows later measurements replaced
    (`superseded`, so a figure cited from one stays traceable). What else an earlier file holds is kept."""

    path: Path
    key: str
    rows: list[dict] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    superseded: list[dict] = field(default_factory=list)
    other: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, key: str) -> ResultFile:
        """What an earlier call left at `path` (an empty file's contents where there is none); a file that
        is not JSON stops the call before anything is measured, and is left as it is."""
        try:
            earlier = json.loads(path.read_text()) if path.is_file() else {}
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise SystemExit(f"{path} is not a result file ({error}); repair or move it, or write the "
                             f"results elsewhere") from None
        commands = earlier.pop("commands", [earlier.pop("command")] if "command" in earlier else [])
        return cls(path, key, earlier.pop("results", []), commands, earlier.pop("superseded", []), earlier)

    def todo(self, measuring: list[str], again: bool) -> list[str]:
        """The items of `measuring` to measure: all with `again`, else those the file does not hold."""
        held = {row[self.key] for row in self.rows}
        skipped = [] if again else [item for item in measuring if item in held]
        for item in skipped:
            print(f"  {item:22s} measured earlier (in {self.path}; --again to measure it again)")
        return [item for item in measuring if item not in skipped]

    def put(self, row: dict) -> None:
        """`row` in place of the row with its key (which moves to `superseded`), else after the others: an
        item measured again is replaced only when its new row lands, so a call cut off loses no row."""
        index = next((index for index, old in enumerate(self.rows) if old[self.key] == row[self.key]),
                     len(self.rows))
        self.superseded.extend(self.rows[index:index + 1])
        self.rows[index:index + 1] = [row]

    def write(self, header: dict) -> None:
        """The file: the earlier file's other fields, `header`, the commands, the rows, what they replaced."""
        report = {**self.other, **header, "commands": self.commands, "results": self.rows}
        if self.superseded:
            report["superseded"] = self.superseded
        self.path.write_text(json.dumps(report, indent=1))


def now() -> str:
    """When a result row was measured."""
    return datetime.datetime.now().isoformat(timespec="minutes")


def host_median_ms(run, repeat: int, warmup: int) -> float:
    """Median of wall-clock times of `run()` (a call that returns when its work is done), after `warmup`
    runs."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return round(statistics.median(times), 4)


def event_median_ms(run, repeat: int) -> float:
    """Median of CUDA-event times around `run()` (PyTorch), after 20 warm-up runs."""
    import torch

    for _ in range(20):
        run()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times), 4)


def relative_diff(actual: np.ndarray, expected: np.ndarray) -> float:
    """Largest absolute difference relative to the largest expected magnitude."""
    return float(np.abs(actual - expected).max() / max(float(np.abs(expected).max()), 1e-30))
