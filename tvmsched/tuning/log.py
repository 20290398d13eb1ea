"""Tuning logs: `<root>/<target key>/`, one MetaSchedule JSON database per target plus manifest.json.

Two roots: the logs shipped with tvmsched (the repository's `tuning_logs/`), and the user's, where `tune`
writes unless told where ($TVMSCHED_TUNING_LOGS, else ~/.cache/tvmsched/tuning_logs): an installed package
is not the user's to write. Builds apply the user's log first, then the shipped one (`build_logs`).

The database is MetaSchedule's own JSON (`database_workload.json`, one workload per line;
`database_tuning_record.json`, one `[workload index, record]` per line), kept gzip-compressed (`.json.gz`,
20x smaller: a zoo's log must fit in git and in a device call). A tuning run holds the log's lock and
unpacks beside the archives every workload but only the records of the kernels it tunes (MetaSchedule
replays every record it loads, ~5 ms each); MetaSchedule appends each record as it is measured, and the
run merges the new lines into the archives when it ends. A run killed before that leaves the unpacked
files: readers merge them with the archives, and the next run packs them first. Builds read a validated
copy holding only the best record of each workload they compile, so they load fast (googlenet's fp32 build
for the H100 here: 12.2 → 9.2 s, `experiments/results/build_log_filter_cpu_2026-11-26.json`), import
TVM's tensor intrinsics only where one of those records is a tensor-core schedule, never see a
half-written line and never block on a running tuner.
"""

from __future__ import annotations

import datetime
import fcntl
import gzip
import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from tvmsched.errors import TuningLogError
from tvmsched.target import TargetSpec
from tvmsched.tuning.defaults import mean_ms
from tvmsched.tuning.intrinsics import import_tensor_intrinsics

MANIFEST_SCHEMA = 1
WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
MANIFEST = "manifest.json"
FAILED_MS = 1e12  # MetaSchedule records a candidate that failed to build or run as 1e10 s


def user_root() -> Path:
    """Where `tune` writes by default: $TVMSCHED_TUNING_LOGS, else ~/.cache/tvmsched/tuning_logs."""
    return Path(os.environ.get("TVMSCHED_TUNING_LOGS") or Path.home() / ".cache" / "tvmsched" / "tuning_logs")


def shipped_root() -> Path:
    """The `tuning_logs/` shipped beside the package (the repository's, in git)."""
    return Path(__file__).resolve().parents[2] / "tuning_logs"


@dataclass(frozen=True)
class TuningLog:
    """The tuning log of one target key, in `directory`."""

    directory: Path
    target_key: str

    @classmethod
    def for_target(cls, spec: TargetSpec, location: str | Path | None = None) -> TuningLog:
        """The log for `spec`: `location` itself if it is a log (has a manifest), else `<location or the
        user's root>/<target key>`. A log made for another target key is refused."""
        location = Path(location) if location else user_root()
        directory = location if (location / MANIFEST).is_file() else location / spec.key
        log = cls(directory, spec.key)
        log.manifest()  # refuses a foreign log before anything uses it
        return log

    @property
    def workloads_path(self) -> Path:
        """The unpacked workloads file (present while a run tunes into the log)."""
        return self.directory / WORKLOADS

    @property
    def records_path(self) -> Path:
        """The unpacked records file (present while a run tunes into the log)."""
        return self.directory / RECORDS

    def exists(self) -> bool:
        return any(path.is_file() and path.stat().st_size > 0
                   for path in (self.records_path, _packed(self.records_path)))

    def lines(self, path: Path) -> list[str]:
        """The lines of `workloads_path` or `records_path`: the archive's, then those a tuning run appended
        to the unpacked file."""
        return _merged(self._read(_packed(path)), self._read(path))

    def _read(self, path: Path) -> list[str]:
        """The lines of one file, gzip-compressed or not ([] if it does not exist)."""
        if not path.is_file():
            return []
        if path.suffix != ".gz":
            return path.read_text().splitlines(keepends=True)
        try:
            with gzip.open(path, "rt") as file:
                return file.read().splitlines(keepends=True)
        except (OSError, EOFError, UnicodeDecodeError) as error:
            raise TuningLogError(f"'{path}' is corrupt ({error}); restore it (git checkout {path.name}) or "
                                 f"delete the log") from error

    def manifest(self) -> dict:
        """The manifest (an empty one for a new log); raises if it names another target key."""
        path = self.directory / MANIFEST
        if not path.is_file():
            return {"schema": MANIFEST_SCHEMA, "target": self.target_key, "workloads": {}}
        try:
            manifest = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise TuningLogError(f"'{path}' is corrupt ({error}); restore it (git checkout) or delete "
                                 f"the log") from error
        if manifest.get("target") != self.target_key:
            raise TuningLogError(f"the tuning log '{self.directory}' was made for {manifest.get('target')}, "
                                 f"not {self.target_key}; logs are applied only to their own target (tune "
                                 f"for this one with: tvmsched tune MODEL --target ...)")
        return manifest

    def slower_than_default(self) -> set[str]:
        """Workloads whose best tuned record measured no faster than their default schedule: builds keep
        the default for them."""
        return {key for key, entry in self.manifest()["workloads"].items()
                if "best_ms" in entry and "default_ms" in entry and entry["best_ms"] >= entry["default_ms"]}

    def write_manifest(self, manifest: dict, device: str) -> None:
        """Write the manifest atomically, stamped with this TVM version, the device and the date."""
        manifest = {**manifest, "schema": MANIFEST_SCHEMA, "target": self.target_key, "tvm": tvm.__version__,
                    "device": device, "updated": datetime.datetime.now().isoformat(timespec="seconds")}
        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = self.directory / f".{MANIFEST}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        temporary.replace(self.directory / MANIFEST)

    @contextmanager
    def locked(self):
        """Hold the log for writing; a second tuning run on the same log is refused, not interleaved."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / ".lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as error:
                raise TuningLogError(f"another `tvmsched tune` is writing '{self.directory}'; wait for it to "
                                     f"finish or tune into another --log") from error
            try:
                for stale in [*self.directory.glob(".*.gz"), *self.directory.glob(f".{MANIFEST}.*.tmp")]:
                    stale.unlink()  # a killed run's half-written archive or manifest
                self.pack()  # what a killed run left unpacked
                yield self
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def database(self, work_dir: str | Path, keys: set[str] | None = None) -> ms.database.JSONDatabase:
        """The log as a MetaSchedule database for builds, read from a validated copy in `work_dir` that
        holds the best measured record of each workload in `keys` (MetaSchedule's keys, `database_key`;
        None: every workload) only (a build applies no other). MetaSchedule replays each record it loads;
        a tensor-core record needs TVM's tensor intrinsics registered first (seconds), so they are imported
        only where a kept record uses them."""
        Path(work_dir).mkdir(parents=True, exist_ok=True)
        workloads = self._workloads()
        kept = [index for index, line in enumerate(workloads) if keys is None or json.loads(line)[0] in keys]
        position = {index: new for new, index in enumerate(kept)}
        best: dict[int, tuple[float, list]] = {}
        for line in self._records(len(workloads)):
            index, record = json.loads(line)
            trace, run_secs, *_ = record
            mean = mean_ms(run_secs) if run_secs and _schedules(trace) else FAILED_MS
            if index in position and mean < min(FAILED_MS, best.get(index, (FAILED_MS,))[0]):
                best[index] = (mean, record)
        records = [json.dumps([position[index], record]) + "\n" for index, (_, record) in best.items()]
        copies = [Path(work_dir) / WORKLOADS, Path(work_dir) / RECORDS]
        for path, lines in zip(copies, ([workloads[index] for index in kept], records)):
            path.write_text("".join(lines))
        if any('["Tensorize",' in line for line in records):
            import_tensor_intrinsics()
        return ms.database.JSONDatabase(str(copies[0]), str(copies[1]), allow_missing=False)

    @contextmanager
    def unpacked(self, tuned: set[str] | None = None):
        """The log's own database for a tuning run of the workloads `tuned` (MetaSchedule's keys,
        `database_key`; None: all), which MetaSchedule appends records to as they are measured. Every
        workload is unpacked, but only the records of `tuned`; on the way out, however the run ends, the
        new lines are merged into the archives (hold `locked()`)."""
        workloads = self._workloads()
        records = self._records(len(workloads))
        if tuned is not None:
            kept = {index for index, line in enumerate(workloads) if json.loads(line)[0] in tuned}
            records = [line for line in records if json.loads(line)[0] in kept]
        self.directory.mkdir(parents=True, exist_ok=True)
        self.workloads_path.write_text("".join(workloads))
        self.records_path.write_text("".join(records))
        try:
            yield ms.database.JSONDatabase(str(self.workloads_path), str(self.records_path),
                                           allow_missing=False)
        finally:
            self.pack()

    def pack(self) -> None:
        """Merge the unpacked files into their archives (atomically) and remove them; a last line that a
        killed run did not finish writing is dropped."""
        for path in (self.workloads_path, self.records_path):
            if path.is_file():
                lines = self.lines(path)
                if lines and not lines[-1].endswith("\n"):
                    lines.pop()
                temporary = path.with_name(f".{path.name}.{os.getpid()}.gz")
                temporary.write_bytes(gzip.compress("".join(lines).encode(), compresslevel=9, mtime=0))
                temporary.replace(_packed(path))
                path.unlink()

    def _workloads(self) -> list[str]:
        return self._valid_lines(self.workloads_path, lambda item: isinstance(item, list))

    def _records(self, count: int) -> list[str]:
        """The records, each checked to name one of the `count` workloads."""
        return self._valid_lines(self.records_path, lambda item: (
            isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) and 0 <= item[0] < count
            and isinstance(item[1], list) and len(item[1]) == 4))

    def _valid_lines(self, path: Path, valid) -> list[str]:
        """The lines of `path` (archive and unpacked file), each checked to be JSON of the right form. A
        file's last line without its newline (being appended by a running tuner, or cut off by a killed
        one) is left out; any other bad line is an error that names it."""
        checked = []
        for where in (_packed(path), path):
            lines = self._read(where)
            if lines and not lines[-1].endswith("\n"):
                lines.pop()
            for number, line in enumerate(lines, 1):
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    item = None
                if item is None or not valid(item):
                    kind = path.stem.split("_")[-1]
                    raise TuningLogError(f"{where}:{number}: not a MetaSchedule {kind} line; restore the "
                                         f"file (git checkout {where.name}) or delete that line")
            checked.append(lines)
        return _merged(*checked)


def build_logs(spec: TargetSpec, location: str | Path | None = None) -> list[TuningLog]:
    """The logs a build for `spec` applies, first to last: the one at `location` if given, else the user's
    (where `tune` writes) and the shipped one."""
    roots = [location] if location else [user_root(), shipped_root()]
    logs = [TuningLog.for_target(spec, root) for root in roots]
    return [log for index, log in enumerate(logs)
            if log.directory.resolve() not in {other.directory.resolve() for other in logs[:index]}]


@contextmanager
def applied(logs: list[TuningLog], workloads: dict[str, str], keys: set[str] | None = None):
    """For a build whose kernels have `workloads` ({symbol: workload}) and MetaSchedule keys `keys`
    (`database_key`; None: read every workload): one database of the best records of `logs` for them (None
    if no log has any), where each workload's records come from the first log that measured it; the
    symbols that keep their default schedule because that log measured tuning slower; and the logs
    applied."""
    used = [log for log in logs if log.exists()]
    if not used:
        yield None, frozenset(), []
        return
    slower, measured = set(), set()
    for log in used:
        slower |= log.slower_than_default() - measured
        measured |= {key for key, entry in log.manifest()["workloads"].items() if "best_ms" in entry}
    keep_default = frozenset(symbol for symbol, workload in workloads.items() if workload in slower)
    with tempfile.TemporaryDirectory(prefix="tvmsched-log-") as copy:
        databases = [log.database(Path(copy) / str(index), keys) for index, log in enumerate(used)]
        database = databases[0] if len(databases) == 1 else ms.database.OrderedUnionDatabase(*databases)
        yield database, keep_default, used


def database_key(module: tvm.IRModule) -> str:
    """The key MetaSchedule's JSON database files a workload under (its structural hash)."""
    return str(tvm_ffi.structural_hash(module) & (2**64 - 1))


def _schedules(trace: list) -> bool:
    """Whether a record's trace schedules anything before its postprocessing (MetaSchedule applies no
    record that does not)."""
    instructions = trace[0] if trace else []
    return bool(instructions) and instructions[0][0] != "EnterPostproc"


def _merged(packed: list[str], unpacked: list[str]) -> list[str]:
    """An archive's lines, then the unpacked file's lines that it does not hold (those a run appended)."""
    known = set(packed)
    return packed + [line for line in unpacked if line not in known]


def _packed(path: Path) -> Path:
    return path.with_name(path.name + ".gz")
