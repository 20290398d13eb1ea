"""Files' SHA-256 digests, as a saved build records (`save`) and checks (`load`) them.

A file whose digest was written or checked is remembered with its identity and times (device, inode, size,
modification and status-change times, in nanoseconds) and the digest: while all are the same it is not read
again, in this process or another (section `digests1` of the cache file `verified.json`,
`tvmsched.cache`, by path). Any write to the file or its times moves its status-change time, which no one
can set back (`cp -p` and `touch -d` included), so an edited file is read and hashed again. Hashing took
0.26-0.42 s of a fresh process's load of resnet50 on the H100's host, 0.7 s of BERT-base's.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tvmsched.cache import cache_path, merge_into_cache, read_cache

SECTION = "digests1"
HASHED_BYTES = 16 << 20  # read and hashed at a time: few waits for the GIL, and within the caches
_MATCHED: set[tuple] = set()  # this process's: (path, identity, times, digest)


def sha256(path: Path) -> str:
    """The file's SHA-256, read and hashed HASHED_BYTES at a time: hashlib and the read release the GIL, so
    a library opening beside it (`open_in_background`) holds it up little. In 1 MiB steps each step waited
    for the GIL: resnet50's weights took 0.44 s instead of 0.09 on the H100's host."""
    digest = hashlib.sha256()
    buffer = bytearray(HASHED_BYTES)
    with path.open("rb", buffering=0) as file:
        while read := file.readinto(buffer):
            digest.update(memoryview(buffer)[:read])
    return digest.hexdigest()


def record(path: Path, digest: str) -> None:
    """Remember that the file, as it is now, has `digest` (a save that just hashed what it wrote)."""
    key = _key(path, digest)
    _MATCHED.add(key)
    merge_into_cache(cache_path("verified.json"), SECTION, {key[0]: list(key[1:])},
                     keep=lambda name: Path(name).exists())  # files deleted since are forgotten


def matches(path: Path, digest: str | None) -> bool:
    """Whether the file's SHA-256 is `digest`; a file remembered with it, unchanged since, is not read."""
    key = _key(path, digest)
    if key in _MATCHED:
        return True
    if read_cache(cache_path("verified.json")).get(SECTION, {}).get(key[0]) == list(key[1:]):
        _MATCHED.add(key)
        return True
    if digest is None or sha256(path) != digest:
        return False
    record(path, digest)
    return True


def _key(path: Path, digest: str | None) -> tuple:
    status = path.stat()
    return (str(path.resolve()), status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns,
            status.st_ctime_ns, digest)
