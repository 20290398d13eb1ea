"""Multi-stream CUDA executors: the plan's launches on one CUDA stream per plan stream, ordered across
streams by events; `cuda-graph` captures the launches once into a CUDA Graph and replays it.

Each inference forks from stream 0 and joins back to it, so stream 0 alone orders consecutive
inferences and is the one stream a caller synchronizes with.
"""

from __future__ import annotations

import tvm_ffi

from tvmsched.errors import TargetError
from tvmsched.executor.base import Executor, register_executor


def _cudart():
    try:
        from cuda.bindings import runtime
    except ImportError as error:
        raise TargetError("the CUDA executors need cuda-python: pip install cuda-python") from error
    return runtime


def check(result):
    """Unwrap a cuda-python call's (error, *values) result, raising on any error."""
    cudart = _cudart()
    error, *values = result if isinstance(result, tuple) else (result,)
    if error != cudart.cudaError_t.cudaSuccess:
        name = cudart.cudaGetErrorName(error)[1].decode()
        raise TargetError(f"CUDA call failed with {name}")
    return values[0] if len(values) == 1 else values


@register_executor("streams")
class StreamsExecutor(Executor):
    """Launches live on several CUDA streams with event waits: no capture, for debugging."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cudart = self.cudart = _cudart()
        if self.device.dlpack_device_type() != 2:  # kDLCUDA
            raise TargetError(f"the '{self.name}' executor needs a CUDA device; use 'sequential' on the CPU")
        self.streams = [check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking))
                        for _ in range(self.plan.num_streams)]
        signaled = {producer for launch in self.plan.launches for producer in launch.waits}
        self.events = {kernel: self._event() for kernel in signaled}
        self.fork_event = self._event()
        self.join_events = [self._event() for _ in self.streams[1:]]
        self.calls = [(launch, self.functions[self.graph.kernels[launch.kernel].symbol],
                       self.kernel_arguments(launch.kernel)) for launch in self.plan.launches]

    def _event(self, timing: bool = False):
        flags = self.cudart.cudaEventDefault if timing else self.cudart.cudaEventDisableTiming
        return check(self.cudart.cudaEventCreateWithFlags(flags))

    def issue(self) -> None:
        """Fork from stream 0, issue every launch on its stream with its waits, join back to stream 0."""
        cudart, main = self.cudart, self.streams[0]
        check(cudart.cudaEventRecord(self.fork_event, main))
        for stream in self.streams[1:]:
            check(cudart.cudaStreamWaitEvent(stream, self.fork_event, 0))
        for launch, function, arguments in self.calls:
            stream = self.streams[launch.stream]
            for producer in launch.waits:
                check(cudart.cudaStreamWaitEvent(stream, self.events[producer], 0))
            with tvm_ffi.use_raw_stream(self.device, int(stream)):
                function(*arguments)
            if launch.kernel in self.events:
                check(cudart.cudaEventRecord(self.events[launch.kernel], stream))
        for stream, event in zip(self.streams[1:], self.join_events):
            check(cudart.cudaEventRecord(event, stream))
            check(cudart.cudaStreamWaitEvent(main, event, 0))

    def launch(self) -> None:
        self.issue()

    def synchronize(self) -> None:
        check(self.cudart.cudaStreamSynchronize(self.streams[0]))

    def time_launches(self, repeat: int) -> list[float]:
        """Milliseconds of each of `repeat` inferences, by CUDA events on stream 0."""
        start, end = self._event(timing=True), self._event(timing=True)
        times = []
        for _ in range(repeat):
            check(self.cudart.cudaEventRecord(start, self.streams[0]))
            self.launch()
            check(self.cudart.cudaEventRecord(end, self.streams[0]))
            check(self.cudart.cudaEventSynchronize(end))
            times.append(check(self.cudart.cudaEventElapsedTime(start, end)))
        return times


@register_executor("cuda-graph")
class CudaGraphExecutor(StreamsExecutor):
    """Captures the multi-stream launches once into a CUDA Graph; each inference is one graph launch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cudart = self.cudart
        self.issue()  # loads every kernel's module outside the capture
        self.synchronize()
        check(cudart.cudaStreamBeginCapture(self.streams[0],
                                            cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal))
        try:
            self.issue()
        finally:
            graph = check(cudart.cudaStreamEndCapture(self.streams[0]))
        self.graph_exec = check(cudart.cudaGraphInstantiate(graph, 0))

    def launch(self) -> None:
        check(self.cudart.cudaGraphLaunch(self.graph_exec, self.streams[0]))
