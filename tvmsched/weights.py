"""A saved build's weights: every constant's bytes in one file (`weights.bin`), each at an offset aligned to
a page, and an index of names, dtypes, shapes and offsets (`weights.json`). Loading maps the file and
makes each constant a read-only view of it: nothing is copied, and a page is read from disk only when a
kernel's weights are first used (uploaded to the device). Builds before it kept `constants.npz`, which
loads as before.
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


def layout(constants: dict[str, np.ndarray]) -> tuple[Placed, ...]:
    """Each constant's place in the binary file, in the dict's order, each at the next aligned offset."""
    placed, offset = [], 0
    for name, array in constants.items():
        placed.append(Placed(name, array.dtype.str, tuple(array.shape), offset))
        offset += -(-array.nbytes // ALIGNMENT) * ALIGNMENT
    return tuple(placed)


def index_json(placed: tuple[Placed, ...]) -> dict:
    return {"schema": SCHEMA, "constants": [entry.to_json() for entry in placed]}


def write_binary(path: Path, constants: dict[str, np.ndarray], placed: tuple[Placed, ...]) -> None:
    """Write the constants' bytes at their places (`layout`), zeros between them."""
    with open(path, "wb") as file:
        for entry in placed:
            file.seek(entry.offset)
            file.write(np.ascontiguousarray(constants[entry.name]).tobytes())
        file.truncate(max((entry.offset + constants[entry.name].nbytes for entry in placed), default=0))


def files(directory: Path) -> tuple[str, ...]:
    """The weight files of a build directory, the one whose digest meta.json keeps first: the archive of a
    build made before the binary file, else the binary file and its index."""
    legacy = (directory / ARCHIVE).is_file() and not (directory / BINARY).is_file()
    return (ARCHIVE,) if legacy else (BINARY, INDEX)


def read(directory: Path) -> dict[str, np.ndarray]:
    """The constants of a build directory as read-only arrays mapped from its binary file, or read from
    `constants.npz` in a build made before the binary file."""
    if files(directory) == (ARCHIVE,):
        with np.load(directory / ARCHIVE) as archive:
            return {name: archive[name] for name in archive.files}
    index = json.loads((directory / INDEX).read_text())
    if index.get("schema") != SCHEMA:
        raise ValueError(f"{INDEX} schema {index.get('schema')} is not {SCHEMA}")
    placed = [Placed.from_json(entry) for entry in index["constants"]]
    size = (directory / BINARY).stat().st_size
    mapped = np.memmap(directory / BINARY, dtype=np.uint8, mode="r") if size else np.empty(0, np.uint8)
    arrays = {}
    for entry in placed:
        dtype = np.dtype(entry.dtype)
        if dtype.kind not in "biuf" or not dtype.isnative or entry.offset < 0 or entry.offset % ALIGNMENT \
                or any(dim < 0 for dim in entry.shape):
            raise ValueError(f"{INDEX} places constant '{entry.name}' impossibly ({entry.to_json()})")
        if entry.offset + int(np.prod(entry.shape, dtype=np.int64)) * dtype.itemsize > size:
            raise ValueError(f"{BINARY} ends before constant '{entry.name}'")
        arrays[entry.name] = np.ndarray(entry.shape, dtype, buffer=mapped, offset=entry.offset)
    return arrays
