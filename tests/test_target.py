"""Target resolution for the local GPU, with a stand-in for `tvm.cuda(0)` (no GPU here)."""

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
