"""Remembered digests (`tvmsched.digests`): a file checked once is not read again while unchanged, in this
process or another; any write, its times put back, makes it read again; deleted files are forgotten."""

import os

import numpy as np
import pytest

from tvmsched import digests
from tvmsched.cache import cache_path, read_section


@pytest.fixture(autouse=True)
def not_racy(monkeypatch):
    """Files written by the tests count as old enough to remember (`digests.RACY_NS`), unless a test says."""
    monkeypatch.setattr(digests, "RACY_NS", -1)


@pytest.fixture
def counted(monkeypatch):
    read = []
    monkeypatch.setattr(digests, "sha256",
                        lambda path, hashed=digests.sha256: read.append(path.name) or hashed(path))
    return read


def test_a_checked_file_is_read_again_only_once_changed(tmp_path, counted, monkeypatch):
    path = tmp_path / "a.bin"
    path.write_bytes(b"abc" * 1000)
    digest = digests.sha256(path)
    counted.clear()
    assert digests.matches(path, digest) and counted == ["a.bin"]
    monkeypatch.setattr(digests.REMEMBERED, "known", {})  # another process: the cache file remembers it
    assert digests.matches(path, digest) and counted == ["a.bin"]
    assert not digests.matches(path, "0" * 64)  # another digest is checked against the file
    status = path.stat()
    with open(path, "r+b") as file:
        file.write(b"x")
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert not digests.matches(path, digest)


def test_files_deleted_since_are_forgotten(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for path in (first, second):
        path.write_bytes(path.name.encode())
        digests.checked_sha256(path)
    first.unlink()
    third = tmp_path / "third"
    third.write_bytes(b"3")
    digests.checked_sha256(third)
    remembered = read_section(cache_path("verified.json"), digests.REMEMBERED.section)
    assert str(second.resolve()) in remembered and str(third.resolve()) in remembered
    assert str(first.resolve()) not in remembered


def test_a_file_written_while_it_is_hashed_is_not_remembered(tmp_path, monkeypatch):
    path = tmp_path / "a.bin"
    path.write_bytes(b"before")
    hashed = digests.sha256

    def written_meanwhile(file):
        digest = hashed(file)
        file.write_bytes(b"after!")
        return digest

    monkeypatch.setattr(digests, "sha256", written_meanwhile)
    digest = digests.checked_sha256(path)
    monkeypatch.setattr(digests, "sha256", hashed)
    monkeypatch.setattr(digests.REMEMBERED, "known", {})
    assert not digests.matches(path, digest)


@pytest.mark.parametrize("contents", [b"\xff\xfe", b"null", b"[]", b'{"digests1": []}'])
def test_a_corrupt_cache_file_reads_as_empty(tmp_path, contents):
    path = tmp_path / "a.bin"
    path.write_bytes(b"a")
    cache_path("verified.json").parent.mkdir(parents=True, exist_ok=True)
    cache_path("verified.json").write_bytes(contents)
    assert digests.matches(path, digests.checked_sha256(path))


def test_a_file_changed_just_before_its_check_is_not_remembered_unless_written_here(tmp_path, monkeypatch):
    """Where file times are coarser than a write, one made during the hashing may leave them as they were:
    a file changed within RACY_NS of its check is hashed again next time, except a save's own."""
    monkeypatch.setattr(digests, "RACY_NS", 60 * 10**9)
    path = tmp_path / "a.bin"
    path.write_bytes(b"a")
    digest = digests.checked_sha256(path)
    assert not digests.matches(path, "0" * 64) and digests.matches(path, digest)
    monkeypatch.setattr(digests.REMEMBERED, "known", {})
    assert str(path.resolve()) not in read_section(cache_path("verified.json"), digests.REMEMBERED.section)
    digests.checked_sha256(path, written_here=True)
    assert str(path.resolve()) in read_section(cache_path("verified.json"), digests.REMEMBERED.section)


def test_a_cache_that_cannot_be_written_saves_nothing_and_breaks_nothing(tmp_path, monkeypatch,
                                                                         branchy_model):
    """Caches only save time: with $TVMSCHED_CACHE unwritable, a save, a load and a refused CUDA build that
    would be remembered all work, and nothing is remembered."""
    import tvmsched
    from tvmsched import shared_memory

    monkeypatch.setenv("TVMSCHED_CACHE", "/proc/tvmsched-unwritable")
    build = tvmsched.compile(branchy_model, batch=1).save(tmp_path / "build")
    x = np.zeros((1, 3, 8, 8), "float32")
    np.testing.assert_array_equal(tvmsched.load(build)(x), tvmsched.compile(branchy_model, batch=1)(x))

    builds = []

    def build_once():
        builds.append(1)
        if len(builds) == 1:
            raise RuntimeError(shared_memory.REFUSED)
        return "built"
    assert shared_memory.built_retrying_merged(build_once, "cuda", "unwritable/h100") == "built"
    assert not cache_path("verified.json").exists()
