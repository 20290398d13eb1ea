"""Tuning logs: `tuning_logs/<target key>/`, one MetaSchedule JSON database per target plus manifest.json.

The database is MetaSchedule's own JSON (`database_workload.json`, one workload per line;
`database_tuning_record.json`, one `[workload index, record]` per line), kept gzip-compressed (`.json.gz`,
20x smaller: a zoo's log must fit in git and in a device call). A tuning run holds the log's lock,
unpacks the files beside the archives, lets MetaSchedule append each record as it is measured, and packs
them again when it ends; a run killed before that leaves the unpacked files, the newest state, which builds
read and the next run packs first. Builds read a validated copy of the newest state, so they never see a
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
from tvm.s_tir import meta_schedule as ms

from tvmsched.errors import TuningLogError
from tvmsched.target import TargetSpec

MANIFEST_SCHEMA = 1
WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
MANIFEST = "manifest.json"


def default_root() -> Path:
    """$TVMSCHED_TUNING_LOGS, else the `tuning_logs/` shipped beside the package."""
    return Path(os.environ.get("TVMSCHED_TUNING_LOGS") or Path(__file__).resolve().parents[2] / "tuning_logs")


@dataclass(frozen=True)
class TuningLog:
    """The tuning log of one target key, in `directory`."""

    directory: Path
    target_key: str

    @classmethod
    def for_target(cls, spec: TargetSpec, location: str | Path | None = None) -> TuningLog:
        """The log for `spec`: `location` itself if it is a log (has a manifest), else `<location or the
        default root>/<target key>`. A log made for another target key is refused."""
        location = Path(location) if location else default_root()
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
        """The lines of `workloads_path` or `records_path`: unpacked where a run left them, else packed."""
        if path.is_file():
            return path.read_text().splitlines(keepends=True)
        if _packed(path).is_file():
            try:
                with gzip.open(_packed(path), "rt") as file:
                    return file.read().splitlines(keepends=True)
            except (OSError, EOFError, UnicodeDecodeError) as error:
                raise TuningLogError(f"'{_packed(path)}' is corrupt ({error}); restore it (git checkout "
                                     f"{_packed(path).name}) or delete the log") from error
        return []

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

    @contextmanager
    def applied(self, workloads: dict[str, str]):
        """For a build whose kernels have `workloads` ({symbol: workload}): a validated copy of the
        database (None for an empty log) and the symbols that keep their default schedule because tuning
        measured them slower."""
        if not self.exists():
            yield None, frozenset()
            return
        slower = self.slower_than_default()
        keep_default = frozenset(symbol for symbol, workload in workloads.items() if workload in slower)
        with tempfile.TemporaryDirectory(prefix="tvmsched-log-") as copy:
            yield self.database(copy), keep_default

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
                self.pack()  # what a killed run left unpacked
                yield self
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def database(self, work_dir: str | Path) -> ms.database.JSONDatabase:
        """The log as a MetaSchedule database, read from a validated copy in `work_dir`."""
        Path(work_dir).mkdir(parents=True, exist_ok=True)
        workloads = self._valid_lines(self.workloads_path, lambda item: isinstance(item, list))
        records = self._valid_lines(self.records_path, lambda item: (
            isinstance(item, list) and len(item) == 2 and isinstance(item[0], int)
            and 0 <= item[0] < len(workloads)))
        copies = [Path(work_dir) / WORKLOADS, Path(work_dir) / RECORDS]
        for path, lines in zip(copies, (workloads, records)):
            path.write_text("".join(lines))
        return ms.database.JSONDatabase(str(copies[0]), str(copies[1]), allow_missing=False)

    @contextmanager
    def unpacked(self):
        """The log's own database, unpacked for MetaSchedule to append records to as they are measured,
        and packed again on the way out, however the run ends (hold `locked()`)."""
        workloads = self._valid_lines(self.workloads_path, lambda item: isinstance(item, list))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.workloads_path.write_text("".join(workloads))
        self.records_path.write_text("".join(self.lines(self.records_path)))
        try:
            yield ms.database.JSONDatabase(str(self.workloads_path), str(self.records_path),
                                           allow_missing=False)
        finally:
            self.pack()

    def pack(self) -> None:
        """Compress the unpacked files into their archives (atomically) and remove them; a last line that
        a killed run did not finish writing is dropped."""
        for path in (self.workloads_path, self.records_path):
            if path.is_file():
                text = path.read_text()
                if not text.endswith("\n"):
                    text = text[:text.rfind("\n") + 1]
                temporary = path.with_name(f".{path.name}.{os.getpid()}.gz")
                temporary.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
                temporary.replace(_packed(path))
                path.unlink()

    def _valid_lines(self, path: Path, valid) -> list[str]:
        """The file's lines, each checked to be JSON of the right form. A last line without its newline
        (being appended by a running tuner, or cut off by a killed one) is left out; any other bad line is
        an error that names it."""
        lines = self.lines(path)
        where = path if path.is_file() else _packed(path)
        result = []
        for number, line in enumerate(lines, 1):
            if number == len(lines) and not line.endswith("\n"):
                break
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                item = None
            if item is None or not valid(item):
                kind = path.stem.split("_")[-1]
                raise TuningLogError(f"{where}:{number}: not a MetaSchedule {kind} line; restore the file "
                                     f"(git checkout {where.name}) or delete that line")
            result.append(line)
        return result


def _packed(path: Path) -> Path:
    return path.with_name(path.name + ".gz")
