"""Which kernels of an offloaded model read their weights in place for the first inference after it is
reloaded (direct host access, as DeepPlan plans it), from measured times.

Reloading, the weights go to the GPU on one copy stream in the plan's order while the kernels run, each
kernel after its own weights' copy. A kernel may instead read its weights from page-locked host memory
over the link (`direct`): it does not wait for their copy, and their copy moves behind every other one
(still made, for the inferences after). That pays where a kernel waits for a large copy and reads little
of it (BERT's embedding table: a first inference reads 128 of its 30,522 rows), or where a kernel reading
from the host is not slower than waiting.

`plan_load` decides from each kernel's measured time with its weights on the device and read in place and
its copy's time, over a model of the reload: one copy stream in order, the kernels one after another in
the plan's order, each starting once the kernel before it ended and (unless direct) its copy arrived. The
model leaves out that reads in place share the link with the copies, and the plan's concurrency; a
plan's measured first inference (`tvmsched plan-load`) says how far that holds.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

import numpy as np

from tvmsched.errors import ArtifactError

SCHEMA = 1
MIN_GAIN_MS = 0.001  # a kernel reads in place only where the model gains at least this


@dataclass(frozen=True)
class KernelLoad:
    """One kernel's row: the bytes of the weights first copied for it, that copy's milliseconds, the
    kernel's milliseconds with its weights on the device and read in place, and the choice."""

    kernel: int
    name: str
    weight_bytes: int
    copy_ms: float
    device_ms: float
    direct_ms: float
    direct: bool = False

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "name": self.name, "weight_bytes": self.weight_bytes,
                "copy_ms": self.copy_ms, "device_ms": self.device_ms, "direct_ms": self.direct_ms,
                "direct": self.direct}

    @classmethod
    def from_json(cls, data: dict) -> KernelLoad:
        return cls(**data)


@dataclass(frozen=True)
class LoadPlan:
    """The rows of one build's kernels in the plan's order, on `device`, for the kernel graph `graph_hash`;
    the modelled first inference with every weight uploaded (`upload_ms`) and with the model's choice
    (`modelled`, `planned_ms`); once checked, both measured (`measured_upload_ms`, `measured_planned_ms`),
    and the rows' `direct` the choice kept: the model's where it measured faster, else none."""

    device: str
    graph_hash: str
    kernels: tuple[KernelLoad, ...]
    upload_ms: float
    planned_ms: float
    modelled: tuple[int, ...] = ()
    measured_upload_ms: float | None = None
    measured_planned_ms: float | None = None

    @property
    def direct(self) -> frozenset[int]:
        """The kernels that read their weights in place."""
        return frozenset(row.kernel for row in self.kernels if row.direct)

    def checked(self, upload_ms: float, planned_ms: float) -> LoadPlan:
        """The plan with the first inference measured after an offload with every weight uploaded and with
        the model's choice: that choice kept where it was faster, else every weight uploaded."""
        kept = planned_ms < upload_ms
        return replace(self, measured_upload_ms=upload_ms, measured_planned_ms=planned_ms,
                       kernels=tuple(replace(row, direct=kept and row.kernel in self.modelled)
                                     for row in self.kernels))

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "device": self.device, "graph_hash": self.graph_hash,
                "upload_ms": self.upload_ms, "planned_ms": self.planned_ms, "modelled": list(self.modelled),
                "measured_upload_ms": self.measured_upload_ms,
                "measured_planned_ms": self.measured_planned_ms,
                "kernels": [row.to_json() for row in self.kernels]}

    @classmethod
    def from_json(cls, data: dict) -> LoadPlan:
        if data.get("schema") != SCHEMA:
            raise ArtifactError(f"load plan schema {data.get('schema')} is not {SCHEMA}; "
                                f"plan again with tvmsched plan-load")
        return cls(data["device"], data["graph_hash"],
                   tuple(KernelLoad.from_json(row) for row in data["kernels"]),
                   data["upload_ms"], data["planned_ms"], tuple(data["modelled"]),
                   data["measured_upload_ms"], data["measured_planned_ms"])


def first_inference_ms(kernels: tuple[KernelLoad, ...] | list[KernelLoad], direct: frozenset[int]) -> float:
    """The modelled first inference after a reload where the kernels in `direct` read in place. A kernel
    reading in place holds the link for its time beyond its time on the device (its reads over the
    link), and while copies are under way that delays each copy not yet done."""
    total = sum(row.copy_ms for row in kernels if row.kernel not in direct)
    copied = delay = end = 0.0
    for row in kernels:
        if row.kernel in direct:
            if end < total + delay:  # the link is still copying
                delay += max(0.0, row.direct_ms - row.device_ms)
            end += row.direct_ms
        else:
            copied += row.copy_ms
            end = max(end, copied + delay) + row.device_ms
    return end


def plan_load(device: str, graph_hash: str, kernels: list[KernelLoad]) -> LoadPlan:
    """The plan: in order, a kernel with weights reads them in place where that holds the link for less
    time than their copy and its end comes no later than waiting for the copy would make it; of that
    choice, none and all, the one the model makes fastest; then passes in order keep any single change
    that shortens the modelled first inference, until none does."""
    greedy: set[int] = set()
    copied = end = 0.0
    for row in kernels:
        uploaded = max(end, copied + row.copy_ms) + row.device_ms
        link_ms = row.direct_ms - row.device_ms  # its reads over the link
        if row.weight_bytes and link_ms < row.copy_ms and end + row.direct_ms <= uploaded - MIN_GAIN_MS:
            greedy.add(row.kernel)
            end += row.direct_ms
        else:
            copied += row.copy_ms
            end = uploaded
    every = frozenset(row.kernel for row in kernels if row.weight_bytes)
    candidates = [frozenset(greedy), frozenset(), every]
    direct = min(candidates, key=lambda chosen: (first_inference_ms(kernels, chosen), len(chosen)))
    best = first_inference_ms(kernels, direct)
    improved = True
    while improved:
        improved = False
        for kernel in every:
            changed = direct ^ {kernel}
            modelled = first_inference_ms(kernels, changed)
            if modelled < best - MIN_GAIN_MS:
                direct, best, improved = changed, modelled, True
    chosen = tuple(replace(row, direct=row.kernel in direct) for row in kernels)
    return LoadPlan(device, graph_hash, chosen, round(first_inference_ms(kernels, frozenset()), 4),
                    round(best, 4), tuple(sorted(direct)))


def table(plan: LoadPlan) -> list[tuple[str, ...]]:
    """The plan as rows of text (a header first): each kernel with weights, like DeepPlan's table; where a
    check dropped the model's choice, its kernels say so."""
    rows = [("kernel", "name", "weights MiB", "copy ms", "on device ms", "in place ms", "load")]
    for row in plan.kernels:
        if row.weight_bytes:
            rows.append((str(row.kernel), row.name, f"{row.weight_bytes / 2**20:.2f}", f"{row.copy_ms:.4f}",
                         f"{row.device_ms:.4f}", f"{row.direct_ms:.4f}",
                         "in place" if row.direct else "upload (modelled in place)"
                         if row.kernel in plan.modelled else "upload"))
    return rows


def time_reloads(model, load_plan: LoadPlan | None, inputs: dict, expected: list, rounds: int) -> dict:
    """`rounds` first inferences of `model` (a `CompiledModel`) after `offload(load_plan)`: the median and
    each milliseconds of `run` (host clock: memory mapped back, inputs in, reload graph, outputs out),
    and whether every output equalled `expected` exactly. One round first captures its reload graph."""
    model.offload(load_plan)
    model.run(inputs)
    times, equal = [], True
    for _ in range(rounds):
        model.offload(load_plan)
        start = time.perf_counter()
        outputs = model.run(inputs)
        times.append(round((time.perf_counter() - start) * 1e3, 4))
        equal = equal and all(np.array_equal(got, want) for got, want in zip(outputs, expected))
    return {"median_ms": round(statistics.median(times), 4), "ms": times, "equal": equal}
