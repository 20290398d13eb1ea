"""Measurement: how tvmsched times work on the device, in milliseconds. Every timing goes through here: the
benchmark (`CompiledModel.benchmark`), the plan and stage timer of the measured cost source (`StageTimer`)
and the profile's kernel latencies.

On a GPU, time is read from two CUDA events recorded on a stream around the work. Short work (a stage, a
kernel) is captured into a CUDA graph and replayed back to back between the events, so that one graph
launch is spread over the replays; the mean of the replays is one round, and the result is the median of
the rounds (`time_captured`). Whole inferences are timed one at a time, each waited for, after a warm-up
(`benchmark`). Without events (the CPU), the host clock times each call, which waits for its work.
"""

from __future__ import annotations

import statistics
import time
from contextlib import ExitStack
from typing import Callable

from tvmsched import cuda

BUDGET_S = 2.0  # a benchmark's time budget, warm-up included, where the caller sets no repeat count
MIN_REPEAT, MAX_REPEAT = 3, 200
PROGRESS_EVERY = 10  # timed inferences between progress reports

def summary(times: list[float], warmup: int, repeat: int) -> dict:
    """The statistics of `repeat` timed runs after `warmup` ones: median, min and max milliseconds."""
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "repeat": repeat, "warmup": warmup}


def benchmark(executor, warmup: int = 10, repeat: int | None = None, budget_s: float = BUDGET_S,
              progress: Callable[[int, int], None] = lambda done, total: None) -> dict:
    """The `summary` of `repeat` inferences by `executor` after a warm-up (timed alike, and dropped), each
    launched on an idle device and waited for, by the executor's clock (`Executor.time_launches`).

    The first warm-up inference sets the pace: the warm-up stops short of `warmup` inferences where they
    would take over a quarter of `budget_s` seconds, and `repeat` None times as many as the other three
    quarters allow (from MIN_REPEAT to MAX_REPEAT), so a slow model on a CPU is not timed for minutes.
    `progress(done, repeat)` follows the timed inferences, every PROGRESS_EVERY."""
    start = time.perf_counter()
    executor.time_launches(1)
    pace = max(time.perf_counter() - start, 1e-6)  # seconds per inference
    rest = min(warmup - 1, int(budget_s / 4 / pace))
    if rest > 0:
        executor.time_launches(rest)
    if repeat is None:
        repeat = min(max(int(budget_s * 3 / 4 / pace), MIN_REPEAT), MAX_REPEAT)
    times: list[float] = []
    while len(times) < repeat:
        times += executor.time_launches(min(PROGRESS_EVERY, repeat - len(times)))
        progress(len(times), repeat)
    return summary(times, 1 + max(rest, 0), repeat)


def host_times(run: Callable[[], None], repeat: int) -> list[float]:
    """Milliseconds of each of `repeat` calls of `run` by the host clock; `run` waits for its work."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return times


class EventClock:
    """Two CUDA timing events, destroyed when `owner` closes: the time between them on a stream."""

    def __init__(self, owner: ExitStack):
        self.start, self.end = (cuda.event(owner, timing=True) for _ in range(2))

    def elapsed(self, stream, issue: Callable[[], None], calls: int = 1) -> float:
        """Mean milliseconds of `calls` back-to-back calls of `issue()` on `stream`, waited for once."""
        cudart = cuda.runtime()
        cuda.check(cudart.cudaEventRecord(self.start, stream))
        for _ in range(calls):
            issue()
        cuda.check(cudart.cudaEventRecord(self.end, stream))
        cuda.check(cudart.cudaEventSynchronize(self.end))
        return cuda.check(cudart.cudaEventElapsedTime(self.start, self.end)) / calls


def event_times(stream, issue: Callable[[], None], repeat: int) -> list[float]:
    """Milliseconds of each of `repeat` calls of `issue()` on `stream`, each waited for (CUDA events)."""
    with ExitStack() as owner:
        clock = EventClock(owner)
        return [clock.elapsed(stream, issue) for _ in range(repeat)]


def time_captured(stream, issue: Callable[[], None], replays: int, rounds: int) -> float:
    """Median over `rounds` of the mean milliseconds of `replays` back-to-back replays of a CUDA graph
    captured from what `issue()` issues on `stream`; one replay first uploads the graph. Whatever `issue`
    launches must have run once outside a capture (to load its modules)."""
    with ExitStack() as owner:
        clock = EventClock(owner)
        executable = cuda.capture(owner, stream, issue)

        def replay() -> None:
            cuda.launch_graph(executable, stream)

        replay()
        return statistics.median([clock.elapsed(stream, replay, replays) for _ in range(rounds)])
