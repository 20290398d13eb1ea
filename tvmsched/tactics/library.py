"""Vendor libraries as kernel implementations: the interface each implements, their registry, and `Tactic`,
the plain record of which vendor plan a kernel runs.

A library turns a kernel's `VendorOp` into candidate plans (`candidates`), each with the workspace it
needs, and into a launcher for one plan on a kernel's device buffers (`launcher`). A launcher is called
with a CUDA stream and issues the kernel's work on it, so the executors capture vendor launches into their
CUDA graphs exactly as they capture TVM's. Adding a library is one file with `@register_library(name)`.

A process opens each library once per thread (`shared_library`) and keeps it until it exits: selection and
every executor use that instance, so what it built stays built. A cuDNN plan of a runtime-fusion engine
compiles its kernel when built (the fused fp16 NHWC convolutions: seconds each), and a build makes
executors again and again to time whole plans (dp's baselines, the concurrency-aware choice). `load`
starts opening a build's libraries in the background (`open_in_background`) while it checks and maps the
build's files.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Iterable

from tvmsched.errors import ArtifactError, TargetError
from tvmsched.registry import registrar
from tvmsched.tactics.vendor_op import VendorOp

SCHEMA = 2  # 2: and the split (a tactic of schema 1 has none)
LIBRARIES: dict[str, type[VendorLibrary]] = {}

Launcher = Callable[[object], None]  # called with the raw CUDA stream to issue the kernel on


@dataclass(frozen=True)
class Candidate:
    """One way a library can compute a VendorOp: the plan's name and the workspace bytes it needs."""

    plan: str
    workspace: int


@dataclass(frozen=True)
class Tactic:
    """The vendor plan a kernel runs instead of TVM's function: library, the library's version (a plan is
    named by the version it was chosen with), the plan, and its workspace bytes. Where `split` is set, the
    plan computes the anchor and the first `split` epilogue ops only, and TVM's tail function the rest
    (`tactics.tail`)."""

    library: str
    version: str
    plan: str
    workspace: int
    split: int | None = None

    def to_json(self) -> dict:
        """A tactic without a split is written as schema 1 wrote it, so that the graph hashes of builds with
        tactics, and the plans and stage measurements keyed by them, stay what they were."""
        data = {"schema": 1, "library": self.library, "version": self.version, "plan": self.plan,
                "workspace": self.workspace}
        return data if self.split is None else {**data, "schema": SCHEMA, "split": self.split}

    @classmethod
    def from_json(cls, data: dict) -> Tactic:
        if data.get("schema") not in (1, SCHEMA):
            raise ArtifactError(f"tactic schema {data.get('schema')} is not {SCHEMA}; rebuild the model")
        return cls(data["library"], data["version"], data["plan"], data["workspace"], data.get("split"))


class VendorLibrary(ABC):
    """One vendor library on the current device, opened with `shared_library`. Its handles live as long as
    the process: destroying them at exit can race the CUDA driver's own teardown (PyTorch does not
    either)."""

    name = "library"

    @staticmethod
    @abstractmethod
    def version() -> str | None:
        """The installed library's version; None where it cannot be loaded (not installed)."""

    @abstractmethod
    def candidates(self, vendor_op: VendorOp, limit: int) -> list[Candidate]:
        """Up to `limit` plans that compute `vendor_op`, the library's preferred first; none where the
        library does not take it."""

    @abstractmethod
    def launcher(self, vendor_op: VendorOp, plan: str, arguments: list, workspace,
                 owner: ExitStack) -> Launcher:
        """Plan `plan` of `vendor_op` on `arguments` (the kernel's device tensors, in its parameter order)
        with `workspace` (a device tensor of the plan's size, or None); what the launcher alone needs is
        released when `owner` (its executor's) closes."""


register_library = registrar(LIBRARIES)  # class decorator: @register_library("name")


def installed() -> dict[str, str]:
    """The registered libraries that can be loaded here, with their versions."""
    versions = {name: cls.version() for name, cls in LIBRARIES.items()}
    return {name: version for name, version in versions.items() if version is not None}


_SHARED: dict[tuple, Future] = {}  # by (class, thread): the instance, or its opening under way
_LOCK = threading.Lock()


def shared_library(cls: type[VendorLibrary]) -> VendorLibrary:
    """This thread's instance of library `cls`, opened on first use (or by `open_in_background`, waited
    for). An executor keeps the instance of the thread that made it, so a library's launchers may run on
    several threads at once. A library that failed to open is tried again on the next use."""
    thread = threading.get_ident()
    future, mine = _claim((cls, thread))
    if mine:
        _open(cls, thread, future)
    return future.result()


def open_in_background(names: Iterable[str]) -> None:
    """Start opening the named libraries (loading them, making their handles: a few tenths of a second for
    cuDNN) for the calling thread, each on a thread of its own, so that loading a build overlaps them; the
    thread's first `shared_library` call waits for them. Names not registered are left out."""
    caller = threading.get_ident()
    for name in names:
        cls = LIBRARIES.get(name)
        future, mine = _claim((cls, caller)) if cls else (None, False)
        if mine:
            try:
                threading.Thread(target=_open, args=(cls, caller, future),
                                 name=f"tvmsched-open-{name}").start()
            except BaseException as error:  # no thread to be had: the caller's first use opens it
                _forget(cls, caller, future, error)


def _claim(key: tuple) -> tuple[Future, bool]:
    """The future of `key`'s instance, and whether this caller must open it (nobody has yet)."""
    with _LOCK:
        if key in _SHARED:
            return _SHARED[key], False
        future = _SHARED[key] = Future()
        return future, True


def _open(cls: type[VendorLibrary], thread: int, future: Future) -> None:
    try:
        future.set_result(cls())
    except BaseException as error:  # noqa: BLE001  (handed to whoever waits; the next use tries again)
        _forget(cls, thread, future, error)


def _forget(cls: type[VendorLibrary], thread: int, future: Future, error: BaseException) -> None:
    """Drop a library whose opening failed, so that the next use opens it again, and hand `error` to whoever
    waits for it."""
    with _LOCK:
        _SHARED.pop((cls, thread), None)
    future.set_exception(error)


def open_library(tactic: Tactic) -> VendorLibrary:
    """The library a tactic was chosen from (`shared_library`); refuses another version than the build's."""
    cls = LIBRARIES.get(tactic.library)
    version = cls and cls.version()
    if version is None:
        raise TargetError(f"this build runs kernels with {tactic.library}, which is not installed here; "
                          f"install the GPU extra (pip install \"tvmsched[cuda]\") or rebuild with "
                          f"--kernels tvm")
    if version != tactic.version:
        raise ArtifactError(f"this build chose its {tactic.library} plans with version {tactic.version}, "
                            f"this is {version}; rebuild the model")
    return shared_library(cls)
