"""cuda-python's runtime as tvmsched uses it: the module, its results checked, and the streams, events and
CUDA graphs tvmsched makes, each owned by an `ExitStack` that destroys it once when it closes.

The executors and the timers (`tvmsched.measure`) share these, so there is one place that creates and
destroys a handle, and one runtime for the tests to stand in for (`tests/fakecuda.py`).
"""

from __future__ import annotations

import gc
from contextlib import ExitStack
from typing import Callable

from tvmsched.errors import TargetError


def runtime():
    """cuda-python's runtime module (`cuda.bindings.runtime`)."""
    try:
        from cuda.bindings import runtime
    except ImportError as error:
        raise TargetError("the CUDA executors need cuda-python: pip install cuda-python") from error
    return runtime


def check(result):
    """Unwrap a cuda-python call's (error, *values) result, raising on any error."""
    cudart = runtime()
    error, *values = result if isinstance(result, tuple) else (result,)
    if error != cudart.cudaError_t.cudaSuccess:
        name = cudart.cudaGetErrorName(error)[1].decode()
        raise TargetError(f"CUDA call failed with {name}")
    return values[0] if len(values) == 1 else values


def driver():
    """cuda-python's driver module (`cuda.bindings.driver`), for what the runtime lacks: CUDA's virtual
    memory management (`executor.mapped`)."""
    from cuda.bindings import driver

    return driver


def check_driver(result):
    """Unwrap a driver call's (error, *values) result, raising on any error."""
    cu = driver()
    error, *values = result if isinstance(result, tuple) else (result,)
    if error != cu.CUresult.CUDA_SUCCESS:
        raise TargetError(f"CUDA driver call failed with {cu.cuGetErrorName(error)[1].decode()}")
    return values[0] if len(values) == 1 else (values or None)


def own(owner: ExitStack, created, destroy):
    """The handle a cuda-python call `created`, destroyed with `destroy` when `owner` closes."""
    handle = check(created)
    owner.callback(lambda: check(destroy(handle)))
    return handle


def stream(owner: ExitStack):
    """A new non-blocking stream, destroyed when `owner` closes."""
    cudart = runtime()
    created = cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking)
    return own(owner, created, cudart.cudaStreamDestroy)


def event(owner: ExitStack, timing: bool = False):
    """A new event, destroyed when `owner` closes; only timers ask for `timing`, which makes an event
    slower to record and to wait on."""
    cudart = runtime()
    flags = cudart.cudaEventDefault if timing else cudart.cudaEventDisableTiming
    return own(owner, cudart.cudaEventCreateWithFlags(flags), cudart.cudaEventDestroy)


def capture(owner: ExitStack, stream, issue: Callable[[], None]):
    """An instantiated CUDA graph of what `issue()` issues on `stream` (and on the streams it forks from
    `stream`); the executable and its graph are destroyed when `owner` closes.

    Python's garbage collector is held off during the capture: a collection inside it ran the finalizers
    of unreachable device tensors, whose cudaFree is illegal while this thread captures, and TVM aborted
    the process (H100, the zoo's executors rebuilt one after another, in cuDNN's Python code under
    `issue`). It is not run before each capture: timing dp's stages captures thousands of graphs."""
    cudart = runtime()
    mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
    collecting = gc.isenabled()
    gc.disable()
    try:
        check(cudart.cudaStreamBeginCapture(stream, mode))
        try:
            issue()
        finally:  # a capture is ended also when issuing raised; `owner` then destroys its graph at once
            graph = own(owner, cudart.cudaStreamEndCapture(stream), cudart.cudaGraphDestroy)
    finally:
        if collecting:
            gc.enable()
    return own(owner, cudart.cudaGraphInstantiate(graph, 0), cudart.cudaGraphExecDestroy)


def launch_graph(executable, stream) -> None:
    """Launch an instantiated CUDA graph on `stream` (asynchronously)."""
    check(runtime().cudaGraphLaunch(executable, stream))
