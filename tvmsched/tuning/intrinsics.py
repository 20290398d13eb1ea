"""TVM's tensor intrinsics, imported without the cost of their frame stacks.

MetaSchedule's `TuneContext` imports `tvm.s_tir.tensor_intrin`, whose TVMScript decorators call
`inspect.stack()` for each of its 124 intrinsics: the source lines of every outer frame, and for each of
importlib's frozen frames (whose file does not exist) a scan of `sys.modules`. That import took 30 s of
every tuning run on the 2-core development machine, 39 s on the H100 host and 70-96 s under pytest's
deeper stacks. TVMScript's parser reads the frames themselves and the source line of the third alone; with
`inspect.stack` answering source lines for the three innermost frames only, the same intrinsics register
(equal structural hashes) in 6.7 s here.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from contextlib import contextmanager

MODULE = "tvm.s_tir.tensor_intrin"
WITH_SOURCE = 3  # innermost frames given their source lines (TVMScript reads the third's)


def import_tensor_intrinsics() -> None:
    """Import `tvm.s_tir.tensor_intrin` (once per process), as `TuneContext` would."""
    if MODULE not in sys.modules:
        with _shallow_stacks():
            importlib.import_module(MODULE)


def shallow_stack(context: int = 1) -> list[inspect.FrameInfo]:
    """`inspect.stack(context)` of the caller, with source lines for its `WITH_SOURCE` innermost frames
    only (the others' `code_context` and `index` are None)."""
    frame, frames = sys._getframe(1), []
    while frame is not None:
        if len(frames) < WITH_SOURCE:
            frames.append(inspect.FrameInfo(frame, *inspect.getframeinfo(frame, context)))
        else:
            code = frame.f_code
            frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None,
                                            None))
        frame = frame.f_back
    return frames


@contextmanager
def _shallow_stacks():
    """`inspect.stack` is `shallow_stack` inside the block, for every thread of the process (`tune` imports
    before its threads start)."""
    full, inspect.stack = inspect.stack, shallow_stack
    try:
        yield
    finally:
        inspect.stack = full
