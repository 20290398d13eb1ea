"""Parallel transmission (DeepPlan's PT, issues 28 and 30), measured as a transfer: a saved build's weights
copied from pinned host memory to GPU 0 over GPU 0's own link, and over two links at once — part straight
to GPU 0, the rest to GPU 1 and on to GPU 0 peer to peer, chunk by chunk, so the second hop of one chunk
overlaps the first of the next. Each way is timed by the host clock from the first copy issued to the last
one done (median of --repeat), and GPU 0's copy is compared with the host bytes after every way.

    python -m experiments.transfer_links --builds DIR... --out experiments/results/transfer_links_<date>.json

Needs two CUDA devices (cuda-python).
"""

from __future__ import annotations

import ctypes
import json
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from experiments.common import ResultFile, argument_parser, command, now
from tvmsched import cuda, weights
from tvmsched.target import device_name, resolve_target


def chunks(size: int, chunk: int, relayed: float) -> list[tuple[int, int, bool]]:
    """(offset, bytes, relayed through GPU 1) covering `size` bytes in `chunk`-byte pieces: the last
    `relayed` of the pieces (rounded to whole pieces, half to even) go through GPU 1; each row of `measure`
    says what share of the bytes that was."""
    pieces = [(offset, min(chunk, size - offset)) for offset in range(0, size, chunk)]
    through = round(relayed * len(pieces))
    return [(offset, length, index >= len(pieces) - through) for index, (offset, length) in enumerate(pieces)]


class Links:
    """Pinned host bytes, a buffer for them on each GPU, and a stream per hop: host to GPU 0, host to
    GPU 1, GPU 1 to GPU 0."""

    def __init__(self, owner: ExitStack, data: np.ndarray):
        cudart = cuda.runtime()
        if cuda.check(cudart.cudaGetDeviceCount()) < 2:
            raise SystemExit("transfer_links needs two CUDA devices")
        self.peer = all(cuda.check(cudart.cudaDeviceCanAccessPeer(device, 1 - device)) for device in (0, 1))
        self.size = data.nbytes
        self.host = cuda.own(owner, cudart.cudaHostAlloc(self.size, cudart.cudaHostAllocPortable),
                             cudart.cudaFreeHost)
        ctypes.memmove(self.host, data.ctypes.data, self.size)
        self.owner, self.devices, streams = owner, [], []
        for device in (0, 1):
            cuda.check(cudart.cudaSetDevice(device))
            if self.peer:
                error = cudart.cudaDeviceEnablePeerAccess(1 - device, 0)[0]
                if error not in (cudart.cudaError_t.cudaSuccess,
                                 cudart.cudaError_t.cudaErrorPeerAccessAlreadyEnabled):
                    cuda.check((error,))
            self.devices.append(cuda.own(owner, cudart.cudaMalloc(self.size), cudart.cudaFree))
            streams += [cuda.stream(owner) for _ in range(device + 1)]
        self.direct, self.upload, self.relay = streams  # GPU 0's; GPU 1's first and second hop

    def events(self, plan: list[tuple[int, int, bool]]) -> list:
        """One event of GPU 1 per relayed piece of `plan`, marking its arrival there."""
        cuda.check(cuda.runtime().cudaSetDevice(1))
        return [cuda.event(self.owner) for *_, relayed in plan if relayed]

    def copy(self, plan: list[tuple[int, int, bool]], events: list) -> float:
        """Issue `plan` (see `chunks`; `events` from `events(plan)`) and wait for it: seconds by the host
        clock."""
        cudart = cuda.runtime()
        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        direct, upload, relay = self.direct, self.upload, self.relay
        arrivals = iter(events)
        start = time.perf_counter()
        for offset, length, relayed in plan:
            if not relayed:
                cuda.check(cudart.cudaMemcpyAsync(self.devices[0] + offset, self.host + offset, length, h2d,
                                                  direct))
                continue
            cuda.check(cudart.cudaMemcpyAsync(self.devices[1] + offset, self.host + offset, length, h2d,
                                              upload))
            arrived = next(arrivals)
            cuda.check(cudart.cudaEventRecord(arrived, upload))
            cuda.check(cudart.cudaStreamWaitEvent(relay, arrived, 0))
            cuda.check(cudart.cudaMemcpyPeerAsync(self.devices[0] + offset, 0, self.devices[1] + offset, 1,
                                                  length, relay))
        for stream in (direct, upload, relay):
            cuda.check(cudart.cudaStreamSynchronize(stream))
        return time.perf_counter() - start

    def arrived_intact(self, data: np.ndarray) -> bool:
        """Whether GPU 0 holds exactly the host bytes; then zeroes them there for the next copy (on GPU 0's
        stream, waited for)."""
        cudart = cuda.runtime()
        back = np.empty_like(data)
        cuda.check(cudart.cudaMemcpy(back.ctypes.data, self.devices[0], self.size,
                                     cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost))
        cuda.check(cudart.cudaSetDevice(0))
        cuda.check(cudart.cudaMemsetAsync(self.devices[0], 0, self.size, self.direct))
        cuda.check(cudart.cudaStreamSynchronize(self.direct))
        return bool(np.array_equal(back, data))


def measure(data: np.ndarray, chunk: int, shares: list[float], repeat: int) -> dict:
    """Milliseconds and GB/s of copying `data` to GPU 0 with each share of its bytes relayed via GPU 1."""
    with ExitStack() as owner:
        links = Links(owner, data)
        row = {"mb": round(data.nbytes / 2**20, 2), "chunk_mb": chunk / 2**20, "peer_access": links.peer}
        for share in shares:
            plan = chunks(data.nbytes, chunk, share)
            events = links.events(plan)
            links.copy(plan, events)  # first use of each path
            intact = links.arrived_intact(data)
            seconds = statistics.median(links.copy(plan, events) for _ in range(repeat))
            intact = intact and links.arrived_intact(data)
            relayed = sum(length for _, length, through in plan if through) / data.nbytes
            row[f"relayed_{share:g}"] = {"relayed_bytes": round(relayed, 3), "ms": round(seconds * 1e3, 3),
                                          "gbps": round(data.nbytes / seconds / 1e9, 2), "intact": intact}
    return row


def devices() -> str:
    """The CUDA devices, as "2x NAME"."""
    count = cuda.check(cuda.runtime().cudaGetDeviceCount())
    return f"{count}x {device_name(resolve_target('cuda'))}"


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--builds", nargs="+", type=Path, required=True, help="saved builds (weights.bin)")
    parser.add_argument("--chunk-mb", type=float, default=4.0)
    parser.add_argument("--shares", nargs="+", type=float, default=[0.0, 0.4, 0.5, 0.6, 1.0],
                        help="fractions of the bytes relayed through GPU 1")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = ResultFile.load(args.out, "build")
    results.commands.append(command("experiments.transfer_links"))
    for build in args.builds:
        constants, _ = weights.read(build)
        data = np.concatenate([np.ascontiguousarray(value).reshape(-1).view(np.uint8)
                               for value in constants.values()])
        row = measure(data, int(args.chunk_mb * 2**20), args.shares, args.repeat)
        results.put({"build": build.name, "measured": now(), **row})
        results.write({"experiment": "transfer_links", "device": devices()})
        print(json.dumps(results.rows[-1]), flush=True)


if __name__ == "__main__":
    main()
