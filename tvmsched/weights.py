"""A saved build's weights: every constant's bytes in one file (`weights.bin`), each at an offset aligned to
a page, and an index of names, dtypes, shapes and offsets (`weights.json`). Loading maps the file and
makes each constant a read-only view of it: nothing is copied, and a page is read from disk when it is
first used (a CUDA build's whole mapping when `load` page-locks it, `tvmsched.pinned`). Builds before it
kept `constants.npz`, which loads as before.

The same file holds the vendor plans' folded weights (`tactics.affine`), by kernel and split, in a section
of their own (`folded`), so that a load folds nothing and uploads them from the same mapping; a build
saved without them (before them, or for the CPU) folds at its first executor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SCHEMA = 1
ALIGNMENT = 4096  # each constant starts on a page: it can be mapped, or registered with the driver, alone
BINARY, INDEX, ARCHIVE = "weights.bin", "weights.json", "constants.npz"


@dataclass(frozen=True)
class Placed:
    """Where one constant lies in the binary file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "offset": self.offset}

    @classmethod
    def from_json(cls, data: dict) -> Placed:
        return cls(data["name"], data["dtype"], tuple(data["shape"]), data["offset"])


Folded = dict[tuple[int, "int | None"], list[np.ndarray]]  # by (kernel, split): its plan's folded weights


@dataclass(frozen=True)
class Index:
    """Where each constant and each folded weight (named `kernel/split/position`) lies in the file."""

    constants: tuple[Placed, ...]
    folded: tuple[Placed, ...] = ()

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "constants": [entry.to_json() for entry in self.constants],
                "folded": [entry.to_json() for entry in self.folded]}

    @classmethod
    def from_json(cls, data: dict) -> Index:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"{INDEX} schema {data.get('schema')} is not {SCHEMA}")
        return cls(*(tuple(Placed.from_json(entry) for entry in data.get(section, ()))
                     for section in ("constants", "folded")))


def _folded_arrays(folded: Folded) -> dict[str, np.ndarray]:
    return {f"{kernel}/{split}/{position}": array for (kernel, split), arrays in folded.items()
            for position, array in enumerate(arrays)}


def layout(constants: dict[str, np.ndarray], folded: Folded | None = None) -> Index:
    """Each constant's place in the binary file, in the dict's order, then each folded weight's, each at the
    next aligned offset."""
    offset, sections = 0, []
    for arrays in (constants, _folded_arrays(folded or {})):
        placed = []
        for name, array in arrays.items():
            placed.append(Placed(name, array.dtype.str, tuple(array.shape), offset))
            offset += -(-array.nbytes // ALIGNMENT) * ALIGNMENT
        sections.append(tuple(placed))
    return Index(*sections)


def write_binary(path: Path, index: Index, constants: dict[str, np.ndarray],
                 folded: Folded | None = None) -> None:
    """Write the constants' and folded weights' bytes at their places (`layout`), zeros between them."""
    named = _folded_arrays(folded or {})
    entries = [(entry, constants[entry.name]) for entry in index.constants] + [
        (entry, named[entry.name]) for entry in index.folded]
    with open(path, "wb") as file:
        for entry, array in entries:
            file.seek(entry.offset)
            file.write(np.ascontiguousarray(array).tobytes())
        file.truncate(max((entry.offset + array.nbytes for entry, array in entries), default=0))


def files(directory: Path) -> tuple[str, ...]:
    """The weight files of a build directory, the one whose digest meta.json keeps first: the archive of a
    build made before the binary file, else the binary file and its index."""
    legacy = (directory / ARCHIVE).is_file() and not (directory / BINARY).is_file()
    return (ARCHIVE,) if legacy else (BINARY, INDEX)


def read(directory: Path) -> tuple[dict[str, np.ndarray], Folded]:
    """The constants of a build directory and its folded weights, as read-only arrays mapped from its binary
    file; in a build made before the binary file, the constants read from `constants.npz` and none."""
    if files(directory) == (ARCHIVE,):
        with np.load(directory / ARCHIVE) as archive:
            return {name: archive[name] for name in archive.files}, {}
    index = Index.from_json(json.loads((directory / INDEX).read_text()))
    size = (directory / BINARY).stat().st_size
    mapped = np.memmap(directory / BINARY, dtype=np.uint8, mode="r") if size else np.empty(0, np.uint8)
    constants = {entry.name: _view(mapped, entry, size) for entry in index.constants}
    folded: Folded = {}
    for entry in index.folded:
        kernel, split, _ = entry.name.split("/")
        folded.setdefault((int(kernel), None if split == "None" else int(split)), []).append(
            _view(mapped, entry, size))
    return constants, folded


def _view(mapped: np.ndarray, entry: Placed, size: int) -> np.ndarray:
    dtype = np.dtype(entry.dtype)
    if dtype.kind not in "biuf" or not dtype.isnative or entry.offset < 0 or entry.offset % ALIGNMENT \
            or any(dim < 0 for dim in entry.shape):
        raise ValueError(f"{INDEX} places constant '{entry.name}' impossibly ({entry.to_json()})")
    if entry.offset + int(np.prod(entry.shape, dtype=np.int64)) * dtype.itemsize > size:
        raise ValueError(f"{BINARY} ends before constant '{entry.name}'")
    return np.ndarray(entry.shape, dtype, buffer=mapped, offset=entry.offset)
