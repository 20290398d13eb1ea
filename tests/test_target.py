"""Target resolution for the local GPU, with a stand-in for `tvm.cuda(0)` (no GPU here)."""

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tvmsched import target
from tvmsched.errors import TargetError


@dataclass
class _Device:
    device_name: str
    compute_version: str
    exist: bool = True


def _resolve_with(monkeypatch, name: str, compute_version: str):
    monkeypatch.setattr(target.tvm, "cuda", lambda index=0: _Device(name, compute_version))
    return target.resolve_target("cuda")


def test_a_gpu_resolves_to_its_own_tag(monkeypatch):
    spec = _resolve_with(monkeypatch, "NVIDIA H100 80GB HBM3", "9.0")
    assert spec.key == "nvidia-h100-sm90a" and spec.config["arch"] == "sm_90a"


def test_a_gpu_without_a_tag_compiles_for_a_tag_of_its_architecture(monkeypatch):
    """TVM 0.27 has no H200 tag: the H100's (same SM) applies, and with it the H100's tuning logs."""
    spec = _resolve_with(monkeypatch, "NVIDIA H200", "9.0")
    assert spec.key == "nvidia-h100-sm90a"
    ampere = _resolve_with(monkeypatch, "NVIDIA Z100 Ampere", "8.0")
    assert ampere.config["arch"] == "sm_80"


def test_a_gpu_of_an_architecture_no_tag_has_is_refused_by_name(monkeypatch):
    with pytest.raises(TargetError, match=r"'NVIDIA Z1'.*compute capability 1\.0.*--target nvidia/"):
        _resolve_with(monkeypatch, "NVIDIA Z1", "1.0")


def test_host_cores_are_those_the_affinity_allows_at_most_the_physical_ones(monkeypatch):
    monkeypatch.setattr(target.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(target.psutil, "cpu_count", lambda logical=True: 8 if logical else 4)
    assert (target.host_cores(), target.host_cores(physical=False)) == (4, 8)
    monkeypatch.setattr(target.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert (target.host_cores(), target.host_cores(physical=False)) == (2, 2)


@pytest.mark.parametrize("asked", [None, "1"])
def test_tvms_thread_pool_takes_every_core_unless_told(asked):
    """`import tvmsched` sizes TVM's CPU thread pool to the physical cores (TVM itself halves x86 hardware
    threads); a TVM_NUM_THREADS the user set is kept."""
    env = {name: value for name, value in os.environ.items() if name != "TVM_NUM_THREADS"}
    if asked:
        env["TVM_NUM_THREADS"] = asked
    script = "import tvmsched, tvm; print(tvm.runtime.num_threads())"
    threads = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                             check=True).stdout.split()[-1]
    assert int(threads) == (int(asked) if asked else target.host_cores())
