"""Targets: resolve a user's target name to a TVM target, a stable key for logs and plans, and a device."""

from __future__ import annotations

import json
import logging
import os
import platform
import re
from dataclasses import dataclass

import psutil
import tvm

from tvmsched.errors import TargetError

# Builds for "cuda" on a machine without a GPU cross-compile for the device tvmsched is tuned on.
DEFAULT_CUDA_TAG = "nvidia/nvidia-h100"
TARGET_NAMES = ("auto", "cuda", "llvm")

LOGGER = logging.getLogger(__name__)


def host_cores(physical: bool = True) -> int:
    """The cores this process may run on (its CPU affinity); with `physical`, at most the machine's
    physical cores, for work a core's second hardware thread does not speed up (kernels, searches)."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(allowed, psutil.cpu_count(logical=False) or allowed)) if physical else allowed


@dataclass(frozen=True)
class TargetSpec:
    """A compilation target as plain data: its kind, TVM's config dict, and the key that names it."""

    kind: str
    config: dict
    key: str

    @property
    def tvm_target(self) -> tvm.target.Target:
        return tvm.target.Target(self.config)

    def to_json(self) -> dict:
        return {"kind": self.kind, "config": self.config, "key": self.key}

    @classmethod
    def from_json(cls, data: dict) -> TargetSpec:
        return cls(data["kind"], data["config"], data["key"])


def gpu_present() -> bool:
    """Whether this machine has a CUDA device that TVM can use."""
    return tvm.cuda(0).exist


def on_gpu(spec: TargetSpec) -> bool:
    """Whether `spec` is a CUDA target and this machine has its GPU (to run, time and measure on)."""
    return spec.kind == "cuda" and gpu_present()


def resolve_target(name: str) -> TargetSpec:
    """`auto` (cuda if a GPU is present, else llvm), `llvm` (this CPU), `cuda` (the local GPU, else the
    H100), or a TVM tag such as `nvidia/nvidia-a100`."""
    if name == "auto":
        name = "cuda" if gpu_present() else "llvm"
    if name == "llvm":  # this CPU's instructions (without an mcpu, LLVM emits SSE2 alone on x86-64)
        config = {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()}
        return TargetSpec("llvm", config, f"llvm-{platform.machine()}")
    if name == "cuda":
        return _cuda_spec(_local_cuda_tag() or DEFAULT_CUDA_TAG)
    if name.startswith("nvidia/") and name in tvm.target.list_tags():
        return _cuda_spec(name)
    raise TargetError(f"unknown target '{name}'; use one of {', '.join(TARGET_NAMES)} or an NVIDIA tag such "
                      f"as {DEFAULT_CUDA_TAG}")


def device_for(spec: TargetSpec) -> tvm.runtime.Device:
    """The device that runs code for `spec`; raises if it is not present."""
    device = tvm.cuda(0) if spec.kind == "cuda" else tvm.cpu(0)
    if not device.exist:
        raise TargetError("no CUDA device is present; build with --target llvm to run on the CPU, or run "
                          "this build on a machine with an NVIDIA GPU")
    return device


def default_executor(spec: TargetSpec) -> str:
    """The fastest executor for a target kind: one CUDA Graph on GPU, in-order launches on the CPU."""
    return "cuda-graph" if spec.kind == "cuda" else "sequential"


def target_device_name(spec: TargetSpec) -> str:
    """The device a build is made for: the local one if present, else the target key (cross-compiling)."""
    return device_name(spec) if spec.kind != "cuda" or gpu_present() else spec.key


def device_name(spec: TargetSpec) -> str:
    """The name of the device that runs `spec`: the GPU's model, or the CPU's architecture."""
    return device_for(spec).device_name if spec.kind == "cuda" else f"cpu-{platform.machine()}"


def _cuda_spec(tag: str) -> TargetSpec:
    config = json.loads(str(tvm.target.Target(tag)))
    arch = str(config["arch"]).replace("_", "")
    return TargetSpec("cuda", config, f"{tag.split('/')[-1]}-{arch}")


def _local_cuda_tag() -> str | None:
    """The TVM tag of the local GPU: by name ('NVIDIA H100 80GB HBM3' → nvidia/nvidia-h100), else the first
    tag of the same architecture (an H200, which TVM 0.27 has no tag for, compiles as the H100: same SM,
    same limits per block, so its tuning logs apply too). None without a GPU."""
    device = tvm.cuda(0)
    if not device.exist:
        return None
    words = re.findall(r"[a-z0-9]+", device.device_name.lower())
    tags = sorted(tag for tag in tvm.target.list_tags() if tag.startswith("nvidia/"))
    for length in range(len(words), 0, -1):
        tag = "nvidia/" + "-".join(words[:length])
        if tag in tags:
            return tag
    arch = device.compute_version.replace(".", "")
    same_arch = [tag for tag in tags if _tag_arch(tag) == arch]
    if not same_arch:
        raise TargetError(f"no TVM target tag matches the GPU '{device.device_name}' (compute capability "
                          f"{device.compute_version}); pass --target nvidia/<model> with one of "
                          f"tvm.target.list_tags()")
    LOGGER.warning("GPU '%s' has no TVM tag; compiling for %s, the same architecture (sm_%s)",
                   device.device_name, same_arch[0], arch)
    return same_arch[0]


def _tag_arch(tag: str) -> str:
    """The compute capability digits of a tag's arch ('sm_90a' → '90')."""
    return re.sub(r"\D", "", str(tvm.target.Target(tag).attrs.get("arch", "")))
