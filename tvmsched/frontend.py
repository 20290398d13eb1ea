"""ONNX → Relax: load a model, check its operators, bind input shapes, import it with weights as constants."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from tvmsched.errors import ModelLoadError, ShapeBindingError, UnsupportedOperator


@dataclass(frozen=True)
class TensorSpec:
    """A named tensor with a static shape and a dtype (a model input or output)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict) -> TensorSpec:
        return cls(data["name"], tuple(data["shape"]), data["dtype"])


def load_model(model: str | Path | onnx.ModelProto) -> onnx.ModelProto:
    """Return `model` as a checked ModelProto, reading it from a file if given a path."""
    if isinstance(model, onnx.ModelProto):
        proto = model
    else:
        path = Path(model)
        if not path.is_file():
            raise ModelLoadError(f"model file '{path}' does not exist; give a path to an .onnx file "
                                 f"or a zoo model name (tvmsched models list)")
        try:
            proto = onnx.load(str(path))
        except Exception as error:  # protobuf raises several unrelated types
            raise ModelLoadError(f"'{path}' is not a readable ONNX model ({error}); "
                                 f"re-export it or check that the file is complete") from error
        if not proto.HasField("graph"):  # an empty file, or another kind of protobuf, parses as no model
            content = "it is empty" if path.stat().st_size == 0 else "it holds no graph"
            raise ModelLoadError(f"'{path}' is not an ONNX model ({content}); re-export it or check that "
                                 f"the file is complete")
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as error:
        first_line = str(error).strip().splitlines()[0]
        raise ModelLoadError(f"the ONNX model is invalid: {first_line}; re-export it with a "
                             f"current exporter") from error
    return proto


def graph_inputs(proto: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The real inputs of the graph (older exporters also list initializers as inputs)."""
    initializers = {init.name for init in proto.graph.initializer}
    inputs = [value for value in proto.graph.input if value.name not in initializers]
    if not inputs:
        raise ModelLoadError("the ONNX model has no inputs; tvmsched compiles models that take at "
                             "least one input tensor")
    return inputs


def check_operators(proto: onnx.ModelProto) -> None:
    """Raise UnsupportedOperator naming the first node whose op the importer cannot convert."""
    from tvmsched.importer import supported_ops

    supported = supported_ops()
    opsets = {opset.domain or "ai.onnx": opset.version for opset in proto.opset_import}
    for index, node in enumerate(proto.graph.node):
        domain_ok = node.domain in ("", "ai.onnx")
        if not domain_ok or node.op_type not in supported:
            name = node.name or f"#{index}"
            raise UnsupportedOperator(
                f"node '{name}' uses '{node.op_type}'"
                f"{f' from domain {node.domain}' if not domain_ok else ''} (opset "
                f"{opsets.get(node.domain or 'ai.onnx', '?')}), which the TVM Relax ONNX frontend cannot "
                f"import; replace it in the exporter or decompose it into supported ops")


def default_opset(proto: onnx.ModelProto) -> int:
    """The model's opset for the default ONNX domain."""
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return opset.version
    raise ModelLoadError("the ONNX model imports no opset of the default domain (ai.onnx); re-export it "
                         "with one")


def bind_input_shapes(proto: onnx.ModelProto, batch: int | None = None,
                      input_shapes: dict[str, tuple[int, ...]] | None = None) -> list[TensorSpec]:
    """Static shapes for every input: `input_shapes` first, else `batch` for dim 0, else the file's dims."""
    input_shapes = dict(input_shapes or {})
    inputs = graph_inputs(proto)
    names = [value.name for value in inputs]
    unknown = sorted(set(input_shapes) - set(names))
    if unknown:
        raise ShapeBindingError(f"--input-shape names {', '.join(unknown)}, but the model's inputs "
                                f"are {', '.join(names)}")
    if batch is not None and batch < 1:
        raise ShapeBindingError(f"batch must be a positive integer, got {batch}")
    return [_bind_one(value, batch, input_shapes.get(value.name)) for value in inputs]


def _bind_one(value: onnx.ValueInfoProto, batch: int | None, override: tuple[int, ...] | None) -> TensorSpec:
    tensor_type = value.type.tensor_type
    dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
    dims = [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or "?")
            for dim in tensor_type.shape.dim]
    if override is not None:
        if len(override) != len(dims):
            raise ShapeBindingError(f"input '{value.name}' has rank {len(dims)} (dims {_format(dims)}), "
                                    f"but --input-shape gives {_format(override)}")
        return TensorSpec(value.name, tuple(override), dtype)
    if batch is not None and dims:
        dims[0] = batch
    whole_shape = f"--input-shape {value.name}:{'x'.join('N' for _ in dims)}"
    if 0 in dims:
        raise ShapeBindingError(f"input '{value.name}' is empty (size 0 in dim {dims.index(0)}, dims "
                                f"{_format(dims)}), and tvmsched compiles tensors with at least one "
                                f"element; bind a nonzero shape with {whole_shape}")
    unbound = [(axis, dim) for axis, dim in enumerate(dims) if not isinstance(dim, int)]
    if unbound:
        axis, dim = unbound[0]
        hint = "--batch N" if axis == 0 else whole_shape
        raise ShapeBindingError(f"input '{value.name}' has dynamic dim {axis} ('{dim}', dims "
                                f"{_format(dims)}); bind it with {hint}")
    return TensorSpec(value.name, tuple(dims), dtype)


def _format(dims) -> str:
    return "x".join(str(dim) for dim in dims)


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse `name:1x3x224x224` into ('name', (1, 3, 224, 224))."""
    name, _, dims = text.rpartition(":")
    try:
        shape = tuple(int(dim) for dim in dims.lower().split("x"))
    except ValueError:
        shape = ()
    if not name or not shape or min(shape) < 1:
        raise ShapeBindingError(f"cannot parse input shape '{text}'; write it as NAME:1x3x224x224")
    return name, shape


def to_relax(proto: onnx.ModelProto, inputs: list[TensorSpec]):
    """Import the ONNX model into a Relax IRModule with the given static input shapes."""
    from tvmsched.importer import import_model

    check_operators(proto)
    return import_model(proto, {spec.name: list(spec.shape) for spec in inputs},
                        {spec.name: spec.dtype for spec in inputs}, default_opset(proto))
