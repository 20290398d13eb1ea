"""ONNX → Relax: load a model, check its operators, bind input shapes (and the values of constant inputs),
fold its shape computations, import it with weights as constants."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from tvmsched.errors import ModelLoadError, ShapeBindingError, UnsupportedOperator
from tvmsched.fold import check_value_inputs, fold_shapes

# The element types tvmsched computes with; TVM cannot run the 2-, 4- and 8-bit floats and integers
# (their Casts give wrong values or crash the code generator).
COMPUTED_DTYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                             "float16", "bfloat16", "float32", "float64"})


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


@dataclass(frozen=True)
class ConstantInput:
    """A graph input bound to a value when the model was built: its spec and the SHA-256 of the value."""

    spec: TensorSpec
    sha256: str

    @classmethod
    def of(cls, name: str, value: np.ndarray) -> ConstantInput:
        digest = hashlib.sha256(value.tobytes()).hexdigest()  # the bytes in C order, whatever the layout
        return cls(TensorSpec(name, value.shape, str(value.dtype)), digest)

    def to_json(self) -> dict:
        return {**self.spec.to_json(), "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: dict) -> ConstantInput:
        return cls(TensorSpec.from_json(data), data["sha256"])


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
    try:  # by path where there is one: the checker serializes a proto, which protobuf caps at 2 GB
        onnx.checker.check_model(proto if isinstance(model, onnx.ModelProto) else str(model))
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
        name = node.name or f"#{index}"
        if node.domain not in ("", "ai.onnx"):
            raise UnsupportedOperator(
                f"node '{name}' uses '{node.op_type}' from domain {node.domain} (opset "
                f"{opsets.get(node.domain, '?')}); tvmsched converts the default ONNX domain (ai.onnx) only: "
                f"replace it in the exporter or decompose it into supported ops")
        if node.op_type not in supported:
            raise UnsupportedOperator(
                f"node '{name}' uses '{node.op_type}' (opset {opsets.get('ai.onnx', '?')}), which the TVM "
                f"Relax ONNX frontend cannot import; replace it in the exporter or decompose it into "
                f"supported ops")


def default_opset(proto: onnx.ModelProto) -> int:
    """The model's opset for the default ONNX domain."""
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return opset.version
    raise ModelLoadError("the ONNX model imports no opset of the default domain (ai.onnx); re-export it "
                         "with one")


def bind_input_shapes(proto: onnx.ModelProto, batch: int | None = None,
                      input_shapes: dict[str, tuple[int, ...]] | None = None,
                      constant_inputs: dict[str, np.ndarray] | None = None) -> list[TensorSpec]:
    """Static shapes for every input that `constant_inputs` does not bind to a value: `input_shapes` first,
    else `batch` for dim 0, else the file's dims."""
    input_shapes = dict(input_shapes or {})
    constant_inputs = constant_inputs or {}
    inputs = graph_inputs(proto)
    names = [value.name for value in inputs]
    for flag, given in (("--input-shape", input_shapes), ("--constant-input", constant_inputs)):
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ShapeBindingError(f"{flag} names {', '.join(unknown)}, but the model's inputs are "
                                    f"{', '.join(names)}")
    both = sorted(set(input_shapes) & set(constant_inputs))
    if both:
        raise ShapeBindingError(f"input '{both[0]}' is given both a shape (--input-shape) and a value "
                                f"(--constant-input); a bound value has its own shape: drop the shape")
    if batch is not None and batch < 1:
        raise ShapeBindingError(f"batch must be a positive integer, got {batch}")
    for value in inputs:
        if value.name in constant_inputs:
            _check_constant(value, np.asarray(constant_inputs[value.name]))
    return [_bind_one(value, batch, input_shapes.get(value.name)) for value in inputs
            if value.name not in constant_inputs]


def _declared(value: onnx.ValueInfoProto) -> tuple[str, list]:
    """The dtype and dims (ints, else the dim's name or '?') a graph input declares."""
    if not value.type.HasField("tensor_type"):
        kind = (value.type.WhichOneof("value") or "untyped").removesuffix("_type")
        article = "an" if kind[0] in "aeiou" else "a"
        raise ShapeBindingError(f"input '{value.name}' is {article} {kind} value, not a tensor; tvmsched "
                                f"compiles models whose inputs are tensors: export the model with tensor "
                                f"inputs")
    tensor_type = value.type.tensor_type
    dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
    if dtype not in COMPUTED_DTYPES:
        what = "strings" if dtype == "object" else f"{dtype} elements"
        raise UnsupportedOperator(f"input '{value.name}' holds {what}; tvmsched computes with "
                                  f"{', '.join(sorted(COMPUTED_DTYPES))}")
    dims = [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or "?")
            for dim in tensor_type.shape.dim]
    return dtype, dims


def _check_constant(value: onnx.ValueInfoProto, array: np.ndarray) -> None:
    """A value bound to an input must have the input's dtype and rank, and its static dims."""
    dtype, dims = _declared(value)
    if array.dtype != np.dtype(dtype):
        raise ShapeBindingError(f"the value given for input '{value.name}' is {array.dtype}, but the input "
                                f"is {dtype}; convert it with .astype('{dtype}')")
    fits = len(dims) == array.ndim and all(not isinstance(dim, int) or dim == size
                                           for dim, size in zip(dims, array.shape))
    if not fits:
        raise ShapeBindingError(f"the value given for input '{value.name}' has shape "
                                f"{_format(array.shape) or 'scalar'}, but the input's dims are "
                                f"{_format(dims) or 'scalar'}; give a value of that shape")


def _bind_one(value: onnx.ValueInfoProto, batch: int | None, override: tuple[int, ...] | None) -> TensorSpec:
    dtype, dims = _declared(value)
    if override is not None:
        if len(override) != len(dims):
            raise ShapeBindingError(f"input '{value.name}' has rank {len(dims)} (dims {_format(dims)}), "
                                    f"but --input-shape gives {_format(override)}")
        return TensorSpec(value.name, tuple(override), dtype)
    if batch is not None and dims:
        dims[0] = batch
    unbound = [(axis, dim) for axis, dim in enumerate(dims) if not isinstance(dim, int) or dim < 0]
    if unbound:
        axis, dim = unbound[0]
        hint = "--batch N" if axis == 0 else f"--input-shape {value.name}:{'x'.join('N' for _ in dims)}"
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


def to_relax(proto: onnx.ModelProto, inputs: list[TensorSpec],
             constant_inputs: dict[str, np.ndarray] | None = None):
    """Import the ONNX model into a Relax IRModule with the given static input shapes, the inputs named in
    `constant_inputs` bound to those values, its shape computations folded, and its half-precision
    products summing in float32 (`accumulate`); `tvmsched.rewrite` applies what a build asks for next."""
    from tvmsched.accumulate import accumulate_in_float32
    from tvmsched.importer import import_model

    folded = fold_shapes(proto, {spec.name: spec.shape for spec in inputs}, constant_inputs or {})
    check_operators(folded.proto)
    check_value_inputs(folded)
    module = import_model(folded, {spec.name: list(spec.shape) for spec in inputs},
                          {spec.name: spec.dtype for spec in inputs}, default_opset(proto),
                          _rebound(proto, inputs))
    return accumulate_in_float32(module)


def _rebound(proto: onnx.ModelProto, inputs: list[TensorSpec]) -> str:
    """Which inputs are bound to other dims than the model fixes ("input 'x' bound to 1x4x8x8 where the
    model fixes 1x3x8x8"), "" where none is (symbolic dims may take any value)."""
    declared = {value.name: _declared(value)[1] for value in graph_inputs(proto)}
    changed = [f"input '{spec.name}' bound to {_format(spec.shape)} where the model fixes "
               f"{_format(declared[spec.name])}" for spec in inputs
               if any(isinstance(dim, int) and dim > 0 and dim != bound
                      for dim, bound in zip(declared[spec.name], spec.shape))]
    return ", ".join(changed)
