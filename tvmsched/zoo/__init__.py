"""The model zoo: ONNX builders with seeded random weights (no torch) for the networks of the IOS and
Opara papers. Each model has one input `input` [batch, 3, H, W] (batch symbolic unless given) and one
output `output` [batch, 1000] of logits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx

from tvmsched.errors import UnknownModel
from tvmsched.zoo import googlenet, inception_v3, nasnet, randwire, resnet50, squeezenet
from tvmsched.zoo.onnx_builder import GraphBuilder


@dataclass(frozen=True)
class ZooModel:
    name: str
    description: str
    image_size: int
    builder: Callable[[GraphBuilder, int], str]


MODELS = {model.name: model for model in [
    ZooModel("googlenet", "GoogLeNet (torchvision topology, no aux heads)", 224, googlenet.build),
    ZooModel("inception_v3", "Inception-v3 (torchvision topology, no aux head)", 299, inception_v3.build),
    ZooModel("nasnet", "NASNet-A Mobile (4 cells per stack, 44 filters)", 224, nasnet.build),
    ZooModel("randwire", "RandWire-WS small regime (N=32, K=4, P=0.75, C=78), seeded", 224, randwire.build),
    ZooModel("resnet50", "ResNet-50 (torchvision topology)", 224, resnet50.build),
    ZooModel("squeezenet", "SqueezeNet 1.1 (torchvision topology)", 224, squeezenet.build),
]}


def list_models() -> list[str]:
    return sorted(MODELS)


def build(name: str, batch: int | str = "batch", image_size: int | None = None, seed: int = 0,
          num_classes: int = 1000) -> onnx.ModelProto:
    """The zoo model `name` as a checked ModelProto; the same arguments give the same bytes."""
    if name not in MODELS:
        raise UnknownModel(f"no zoo model '{name}'; available: {', '.join(list_models())}")
    model = MODELS[name]
    builder = GraphBuilder(name, batch, image_size or model.image_size, seed)
    return builder.finish(model.builder(builder, num_classes))


def export(name: str, path: str | Path, **build_options) -> Path:
    """Write the zoo model `name` to `path` (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build(name, **build_options), str(path))
    return path
