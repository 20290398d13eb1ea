"""Tactic selection: for each kernel a vendor library could compute, the implementation that runs it
fastest, by measurement, among TVM's compiled function and the installed libraries' plans.

Each implementation is timed as the measured cost source times a stage (`measure.time_captured`: the
kernel captured `COPIES` times into a CUDA graph, replayed back to back, CUDA events, median of rounds), in
a `StageTimer`'s buffers, which one inference of standard-normal inputs has filled with realistic data.
A vendor plan must first reproduce TVM's output (relative L2 difference within `TOLERANCE` of the dtype):
a plan that differs (a TF32 engine where fp32 was asked, a broken one) or fails is never chosen.

Timings are cached by (device, implementation, workload): a vendor plan by its library, version and
VendorOp, TVM's function by its workload and the build's scheduled kernels (`kernels_hash`). A second build
of the same model measures nothing and makes no timer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import tvm

from tvmsched import measure
from tvmsched.cache import cache_path, merge_into_cache, read_section
from tvmsched.errors import TargetError, check_choice
from tvmsched.graph import Kernel, KernelGraph
from tvmsched.tactics import tail
from tvmsched.tactics.affine import vendor_op_of
from tvmsched.tactics.library import LIBRARIES, Tactic, installed, shared_library
from tvmsched.tactics.vendor_op import VendorOp

LOGGER = logging.getLogger("tvmsched.tactics")

MODES = ("auto", "tvm", "vendor")
TOLERANCE = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 3e-2}
COPIES = 10  # kernels per captured graph, so that the graph launch is amortized
MAX_PLANS = 8  # of each library, in its own order of preference
CACHE_SECTION = "timings1"  # raised when what a timing includes changes, so older timings stay apart


@dataclass(frozen=True)
class Selection:
    """What selection chose: the graph with its tactics, and per chosen kernel the measured milliseconds of
    TVM's function and of the tactic (TVM's is absent under --kernels vendor, which does not time it)."""

    graph: KernelGraph
    timings: dict[int, tuple[float | None, float]]

    @property
    def tvm_ms(self) -> dict[int, float]:
        """TVM's function's milliseconds, by chosen kernel, where timed."""
        return {kernel: tvm for kernel, (tvm, _) in self.timings.items() if tvm is not None}


def select_tactics(graph: KernelGraph, mode: str, make_timer: Callable[[], object], device_name: str,
                   kernels_hash: str, constants: dict[str, np.ndarray], cache: Path | None = None,
                   progress: Callable[[int, int], None] = lambda done, total: None) -> Selection:
    """Choose each recognized kernel's implementation (`mode`: "auto" the fastest, "vendor" the fastest
    vendor plan wherever one works, "tvm" none). `make_timer()` makes the StageTimer of the graph, only
    where something is not cached; `constants` are the graph's constant values by name (a batch norm after
    a convolution is folded into its weights for the libraries, `tactics.affine`); `progress(done, total)`
    follows the kernels."""
    check_choice("kernel choice", mode, MODES)
    recognized = [kernel for kernel in graph.kernels if kernel.vendor_op is not None]
    versions = installed()
    if mode == "vendor" and not versions:
        raise TargetError("--kernels vendor needs a vendor library; install the GPU extra: "
                          "pip install \"tvmsched[cuda]\"")
    if mode == "tvm" or not recognized or not versions:
        return Selection(graph, {})
    with ExitStack() as owner:
        selector = _Selector(owner, versions, make_timer, device_name, kernels_hash,
                             cache or cache_path("tactics.json"))
        # kernels of one PrimFunc whose libraries' op is the same (folded alike) share one choice
        calls = {kernel.id: vendor_op_of(kernel) for kernel in recognized}
        keys = {kernel.id: (kernel.symbol, _digest(calls[kernel.id].to_json())) for kernel in recognized}
        representatives = {keys[kernel.id]: kernel for kernel in reversed(recognized)}
        try:
            chosen = {}
            for done, (key, kernel) in enumerate(representatives.items()):
                chosen[key] = selector.choose(kernel, mode, calls[kernel.id], constants)
                progress(done + 1, len(representatives))
        finally:
            selector.save()
    tactics = {kernel.id: chosen[keys[kernel.id]][0] for kernel in recognized if chosen[keys[kernel.id]]}
    timings = {kernel.id: chosen[keys[kernel.id]][1] for kernel in recognized if chosen[keys[kernel.id]]}
    return Selection(graph.with_tactics(tactics), timings)


class _Selector:
    def __init__(self, owner: ExitStack, versions: dict[str, str], make_timer, device_name: str,
                 kernels_hash: str, path: Path):
        self.owner = owner
        self.libraries = {name: shared_library(LIBRARIES[name]) for name in versions}
        self.versions = versions
        self.make_timer = make_timer
        self.timer = None
        self.device_name = device_name
        self.kernels_hash = kernels_hash
        self.path = path
        self.entries = read_section(path, CACHE_SECTION)
        self.measured: dict[str, float | None] = {}

    def choose(self, kernel: Kernel, mode: str, vendor_op: VendorOp,
               constants: dict[str, np.ndarray]) -> tuple[Tactic, tuple[float | None, float]] | None:
        """The fastest working tactic of `kernel`, whose libraries compute `vendor_op` (folded from the
        `constants`, `tactics.affine`) or, where none of a library's whole plans works, its head before the
        kernel's tail function (`tactics.tail`), with (TVM's ms, its ms); None where TVM's function wins or
        no plan works."""
        options = []
        ways = _ways(kernel, vendor_op)
        for name, library in self.libraries.items():
            working = len(options)
            for way, op, marker in ways:
                if way is not None and len(options) > working:
                    break  # a split only where the library's whole plans do not work
                prefix = _plan_prefix(self.device_name, name, self.versions[name], op)
                for candidate in library.candidates(op, MAX_PLANS):
                    tactic = Tactic(name, self.versions[name], candidate.plan, candidate.workspace, way)
                    key = prefix + candidate.plan + (marker and marker + self.kernels_hash)
                    ms = self._cached(key, lambda: self._time_tactic(kernel, tactic,  # noqa: B023
                                                                     library, constants))  # noqa: B023
                    if ms is not None:
                        options.append((ms, tactic))
        if not options:
            return None
        best_ms, best = min(options, key=lambda option: option[0])
        if mode == "vendor":
            return best, (None, best_ms)
        key = f"{self.device_name}/tvm/{kernel.workload}/{self.kernels_hash}"
        tvm_ms = self._cached(key, lambda: self._time(self._timer().launchers[kernel.id]))
        LOGGER.debug("%s: TVM %.4f ms, %s %.4f ms (of %d plans that work)", kernel.symbol, tvm_ms,
                     best.library, best_ms, len(options))
        return (best, (tvm_ms, best_ms)) if best_ms < tvm_ms else None

    def _cached(self, key: str, measure_ms: Callable[[], float | None]) -> float | None:
        if key not in self.entries:
            self.entries[key] = self.measured[key] = measure_ms()
        return self.entries[key]

    def _timer(self):
        if self.timer is None:
            self.timer = self.owner.enter_context(self.make_timer())
        return self.timer

    def _time(self, launch) -> float:
        stream = self.timer.main_stream
        return measure.time_captured(stream, lambda: [launch(stream) for _ in range(COPIES)],
                                     replays=5, rounds=3) / COPIES

    def _time_tactic(self, kernel: Kernel, tactic: Tactic, library, constants: dict[str, np.ndarray]
                     ) -> float | None:
        """The tactic's milliseconds computing `kernel`; None where it fails or its output differs from
        TVM's function's."""
        timer = self._timer()
        output = timer.buffers[kernel.outputs[0].name]
        stream = timer.main_stream
        timer.launchers[kernel.id](stream)
        timer.synchronize()
        expected = output.numpy()
        workspace = [tvm.runtime.empty(shape, dtype, timer.device)
                     for shape, dtype in tail.workspace(kernel, tactic)]
        try:
            call = timer.uploaded_call(kernel, tactic, constants.__getitem__)
            launch = timer.tactic_launcher(kernel, tactic, library, call, *workspace)
            output.copyfrom(np.zeros(output.shape, output.dtype))
            launch(stream)
            timer.synchronize()
        except Exception as error:  # noqa: BLE001  (a plan that fails to run is not a candidate)
            LOGGER.debug("%s: %s plan %s fails: %s", kernel.symbol, tactic.library, tactic.plan,
                         str(error).strip()[:300])
            return None
        difference = relative_difference(output.numpy(), expected)
        if not difference <= TOLERANCE.get(kernel.outputs[0].dtype, 1e-5):  # (NaN included)
            LOGGER.debug("%s: %s plan %s is %.2g off TVM's kernel", kernel.symbol, tactic.library,
                         tactic.plan, difference)
            return None
        return self._time(launch)

    def save(self) -> None:
        if self.measured:
            merge_into_cache(self.path, CACHE_SECTION, self.measured)


def vendor_latencies(graphs: Iterable[KernelGraph], device_name: str,
                     cache: Path | None = None) -> dict[str, float]:
    """By workload, the fastest time the tactics cache holds of a working vendor plan for a kernel of
    `graphs` (whole, or a split's head with its tail) on `device_name` with the installed libraries: what a
    build gets from a library there. It measures nothing: kernels no build has timed are absent."""
    entries = read_section(cache or cache_path("tactics.json"), CACHE_SECTION)
    versions = installed()
    found: dict[str, float] = {}
    for kernel in (kernel for graph in graphs for kernel in graph.kernels):
        if kernel.vendor_op is None:
            continue
        for _, op, marker in _ways(kernel, vendor_op_of(kernel)):
            prefixes = tuple(_plan_prefix(device_name, name, version, op)
                             for name, version in versions.items())
            times = [ms for key, ms in entries.items() if ms is not None and key.startswith(prefixes)
                     and (marker in key if marker else TAIL not in key)]
            if times:
                found[kernel.workload] = min(min(times), found.get(kernel.workload, math.inf))
    return found


TAIL = "/tail-"  # in a split plan's timing key, before the kernel's workload and the build's kernels hash


def _ways(kernel: Kernel, whole: VendorOp) -> list[tuple[int | None, VendorOp, str]]:
    """What a library may be asked for `kernel`: its `whole` VendorOp, then, where it has a tail, its head
    (folded alike), each as (split, op, the marker its timing keys carry after the plan: none for
    the whole op, else the kernel's tail, a function of the build whose kernels hash follows)."""
    split = tail.split_point(kernel.vendor_op)
    ways = [(None, whole, "")]
    if split is not None:
        head = vendor_op_of(kernel, split)
        ways.append((split, head, f"{TAIL}{kernel.workload}-"))
    return ways


def _plan_prefix(device_name: str, library: str, version: str, op: VendorOp) -> str:
    """How the timing keys of `library`'s plans for `op` on `device_name` begin (the plan's name follows)."""
    return f"{device_name}/{library}-{version}/{_digest(op.to_json())}/"


def relative_difference(actual: np.ndarray, expected: np.ndarray) -> float:
    """‖actual − expected‖₂ / ‖expected‖₂ in float64 (the difference itself where expected is zero)."""
    actual, expected = actual.astype(np.float64), expected.astype(np.float64)
    scale = np.linalg.norm(expected)
    difference = np.linalg.norm(actual - expected)
    return float(difference / scale) if scale else float(difference)


def _digest(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
