"""What the experiments share: compiled zoo models cached as saved builds, and timing helpers."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import tvmsched
from tvmsched import zoo


def compiled(name: str, batch: int, target: str, builds: str | None) -> tuple[tvmsched.CompiledModel, float]:
    """The zoo model `name` compiled for `target` (sequential plan) and the seconds compiling took; with
    `builds`, a build saved there by an earlier run is loaded instead, and a new one is saved there."""
    directory = Path(builds) / f"{name}-b{batch}-{target}" if builds else None
    if directory and (directory / "meta.json").is_file():
        return tvmsched.load(directory), 0.0
    start = time.perf_counter()
    model = tvmsched.compile(zoo.build(name, batch=batch), target=target)
    seconds = time.perf_counter() - start
    if directory:
        model.save(directory)
    return model, seconds


def median_ms(model: tvmsched.CompiledModel, repeat: int, runs: int = 3) -> tuple[float, float]:
    """Median over `runs` of the benchmark's median, and the spread of the runs, in milliseconds."""
    times = [model.benchmark(warmup=20, repeat=repeat)["median_ms"] for _ in range(runs)]
    return round(statistics.median(times), 4), round(max(times) - min(times), 4)


def command(module: str) -> str:
    return " ".join([f"python -m {module}", *sys.argv[1:]])
