"""Files' SHA-256 digests, as a saved build records (`save`) and checks (`load`) them.

A file whose digest was written or checked is remembered with its identity and times (device, inode, size,
modification and status-change times, in nanoseconds) and the digest: while all are the same it is not read
again, in this process or another (section `digests1` of the cache file `verified.json`,
`tvmsched.cache`, by path). Any write to the file or its times moves its status-change time, which no one
can set back (`cp -p` and `touch -d` included), so an edited file is read and hashed again; a file that
changed while it was hashed is not remembered. Hashing took 0.26-0.42 s of a fresh process's load of
resnet50 on the H100's host, 0.55-0.61 s of BERT-base's.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from tvmsched.cache import Remembered

RACY_NS = 2_000_000_000  # a file changed as recently as this is hashed again at its next check
HASHED_BYTES = 16 << 20  # read and hashed at a time: few waits for the GIL, and within the caches
# by path: [identity, times, digest]; files deleted since are forgotten
REMEMBERED = Remembered("verified.json", "digests1", keep=lambda name: Path(name).exists())


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


def checked_sha256(path: Path, written_here: bool = False) -> str:
    """The file's SHA-256, remembered where the file did not change while it was read. A file changed
    within RACY_NS before the check is not remembered, unless this process just wrote it (`save`, the
    only writer of its files): where file times are coarser than a write, a write during the hashing could
    leave them as they were."""
    before = _key(path, None)
    digest = sha256(path)
    if _key(path, None) == before and (written_here or time.time_ns() - before[5] > RACY_NS):
        REMEMBERED.remember(before[0], list(before[1:-1]) + [digest])
    return digest


def matches(path: Path, digest: str | None) -> bool:
    """Whether the file's SHA-256 is `digest`; a file remembered with it, unchanged since, is not read."""
    key = _key(path, digest)
    if digest is not None and REMEMBERED.get(key[0]) == list(key[1:]):
        return True
    return digest is not None and checked_sha256(path) == digest


def _key(path: Path, digest: str | None) -> tuple:
    status = path.stat()
    return (str(path.resolve()), status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns,
            status.st_ctime_ns, digest)
