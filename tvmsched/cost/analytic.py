"""The analytic stage cost: a roofline per kernel and a simple concurrency model per stage.

A kernel alone takes `launch + max(flops / peak, bytes / bandwidth) / utilization`, where utilization is
the share of the GPU a kernel of its size keeps busy (small kernels leave SMs idle). Concurrent groups
share the GPU: a stage lasts at least its longest group and at least its total busy work
(Σ time × utilization), so running small kernels side by side pays and large ones gains nothing. Used
without the target's GPU, in tests, and to prune before measuring. A CPU target's builds (their dp, and
`--merge auto`'s choice) use `CPU`, the model of a processor that runs one kernel at a time on all its cores.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvmsched.cost.base import StageCost, register_stage_cost
from tvmsched.graph import KernelGraph

# FP32 (non-tensor-core) FLOP/s and memory bytes/s of the GPUs we know, by device-name substring (also
# `profile`'s roofline bound).
GPU_PEAKS = {"H100 80GB HBM3": (67e12, 3.35e12), "H100 PCIe": (51e12, 2.0e12), "H200": (67e12, 4.8e12),
             "A100-SXM4-80GB": (19.5e12, 2.04e12)}


@dataclass(frozen=True)
class DeviceModel:
    """Throughputs of the modeled device (defaults: an H100 SXM in fp32 without tensor cores; `CPU`)."""

    peak_flops: float = GPU_PEAKS["H100 80GB HBM3"][0]
    bandwidth: float = GPU_PEAKS["H100 80GB HBM3"][1]
    launch_ms: float = 0.003
    saturating_flops: float = 2e8  # work a kernel needs to keep every SM busy
    saturating_bytes: float = 2e7
    min_utilization: float = 0.02  # of the smallest kernel


# A CPU runs one kernel at a time on all its cores, so every kernel keeps it busy and a stage lasts the sum
# of its kernels; a call costs microseconds, and padded work costs its FLOPs (squeezenet's fire modules,
# their 1x1 expand padded to 3x3, ran 24% slower merged on a 2-core x86 host, where the GPU model merged
# them). Rough fp32 figures of a few-core x86 host; only their ratios decide.
CPU = DeviceModel(peak_flops=3e11, bandwidth=3e10, launch_ms=0.005, min_utilization=1.0)


def device_model(kind: str) -> DeviceModel:
    """The modeled device of a target kind: "llvm" the CPU, else the GPU."""
    return CPU if kind == "llvm" else DeviceModel()


def kernel_alone(flops: int, traffic: int, device: DeviceModel = DeviceModel()) -> tuple[float, float]:
    """(milliseconds alone, utilization) of a kernel with `flops` and `traffic` bytes."""
    utilization = min(1.0, max(flops / device.saturating_flops, traffic / device.saturating_bytes,
                               device.min_utilization))
    work_ms = max(flops / device.peak_flops, traffic / device.bandwidth) * 1e3
    return device.launch_ms + work_ms / utilization, utilization


@register_stage_cost("analytic")
class AnalyticCost(StageCost):
    def __init__(self, graph: KernelGraph, device: DeviceModel = DeviceModel()):
        super().__init__(graph)
        self.device = device
        self.alone = [kernel_alone(kernel.flops, kernel.bytes, device) for kernel in graph.kernels]

    def stage_latency(self, groups: tuple[tuple[int, ...], ...]) -> float:
        longest = max(sum(self.alone[kernel][0] for kernel in group) for group in groups)
        busy = sum(self.alone[kernel][0] * self.alone[kernel][1] for group in groups for kernel in group)
        return max(longest, busy)
