"""tvmsched's on-disk caches of measurements: one JSON file each under $TVMSCHED_CACHE (default
~/.cache/tvmsched), holding entries under content keys. A cache only saves time: an unreadable file reads
as empty, and a save merges into what is on disk and replaces the file atomically, one writer at a time
(a lock file beside it), so concurrent builds lose no entry of their own and an interrupted save leaves
the old file.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from pathlib import Path
from typing import Callable

LOGGER = logging.getLogger(__name__)


def cache_path(name: str) -> Path:
    """The cache file `name` in $TVMSCHED_CACHE, else in ~/.cache/tvmsched."""
    root = os.environ.get("TVMSCHED_CACHE") or Path.home() / ".cache" / "tvmsched"
    return Path(root) / name


def read_cache(path: Path) -> dict:
    """The cache's contents; an unreadable cache is treated as empty."""
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        return {}
    return cache if isinstance(cache, dict) else {}


def read_section(path: Path, key: str) -> dict:
    """The cache's section `key`; one that is missing or not a mapping reads as empty."""
    return _section(read_cache(path), key)


def _section(cache: dict, key: str) -> dict:
    section = cache.get(key, {})
    return section if isinstance(section, dict) else {}


def merge_into_cache(path: Path, key: str, entries: dict, keep: Callable[[str], bool] | None = None) -> None:
    """Merge `entries` into the cache's section `key` (atomically), dropping the section's entries whose
    key `keep` refuses, where given; where the cache cannot be written, nothing is saved."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:  # one writer at a time reads, merges, replaces
            fcntl.flock(lock, fcntl.LOCK_EX)
            cache = read_cache(path)
            section = cache[key] = {**_section(cache, key), **entries}
            if keep is not None:
                cache[key] = {name: value for name, value in section.items() if keep(name)}
            temporary = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            temporary.write_text(json.dumps(cache))
            temporary.replace(path)
    except OSError as error:  # a read-only or missing cache directory: the cache only saves time
        LOGGER.debug("cache %s not written: %s", path, error)


class Remembered:
    """Entries of the section `section` of cache file `name`, kept in this process in front of the file: a
    lookup reads the file only for a key this process has not seen, and `remember` saves to both (the file
    drops the entries whose key `keep` refuses, where given). A new instance stands for another process."""

    def __init__(self, name: str, section: str, keep: Callable[[str], bool] | None = None):
        self.name, self.section, self.keep = name, section, keep
        self.known: dict[str, object] = {}

    def get(self, key: str):
        """The value remembered for `key` here or in the file; None if neither has it."""
        if key not in self.known:
            value = read_section(cache_path(self.name), self.section).get(key)
            if value is None:
                return None
            self.known[key] = value
        return self.known[key]

    def remember(self, key: str, value) -> None:
        self.known[key] = value
        merge_into_cache(cache_path(self.name), self.section, {key: value}, keep=self.keep)
