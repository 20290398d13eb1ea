"""Recognition: which fused kernels a vendor library could compute exactly as TVM's kernel does.

It runs in `lower` between FuseOps and FuseTIR, where each kernel is still a Relax function of `call_tir`s
of one legalized operator each. A kernel is recognized when it is an anchor (conv2d, matmul) on two kernel
inputs followed by a chain of pointwise ops, each reading the value so far (once) and kernel inputs only,
and nothing else; the chain's end is the kernel's one output.

- Anchors are known by provenance: LegalizeOps runs with wrappers of the default legalization of conv2d
  and matmul (`lower.LegalizedCalls` of ANCHOR_OPS) that record the Relax call, with its attributes,
  behind each PrimFunc made.
- Epilogue ops are known by rebuilding: the callee's name proposes an op, whose default legalization for
  the same argument types must give a structurally equal PrimFunc. Provenance would miss some: TVM's ONNX
  Clip emits `topi.maximum` and `minimum` as TE, never as Relax ops.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from tvmsched.lower import LegalizedCalls, is_call_tir, op_name
from tvmsched.tactics.vendor_op import Conv2d, EpilogueOp, Matmul, VendorOp

FLOATS = ("float32", "float16", "bfloat16")
WEIGHT_LAYOUTS = {"NCHW": "OIHW", "NHWC": "OHWI"}  # of a convolution the libraries take, by data layout
ANCHOR_OPS = ("relax.nn.conv2d", "relax.matmul")
# the name TVM's legalization gives an op's PrimFunc: the op's kind here, the Relax op, its tensor inputs
EPILOGUE_OPS = {"add": ("add", relax.op.add, 2), "subtract": ("subtract", relax.op.subtract, 2),
                "multiply": ("multiply", relax.op.multiply, 2), "divide": ("divide", relax.op.divide, 2),
                "relu": ("relu", relax.op.nn.relu, 1), "tir_sigmoid": ("sigmoid", relax.op.sigmoid, 1),
                "maximum": ("maximum", relax.op.maximum, 2), "minimum": ("minimum", relax.op.minimum, 2),
                "cast": ("cast", relax.op.astype, 1)}
# erf's GELU as ONNX exports write it, x * 0.5 * (1 + erf(x / √2)): each step's op, its scalar constant
# (inlined in the PrimFunc), and whether it also reads x
GELU = (("divide", math.sqrt(2), False), ("erf", None, False), ("add", 1.0, False), ("multiply", None, True),
        ("multiply", 0.5, False))


def recognize(module: tvm.IRModule, anchors: LegalizedCalls) -> dict[str, VendorOp]:
    """The VendorOp of each kernel of fused `module` that a vendor library could compute, by the symbol of
    the PrimFunc that FuseTIR will make of it (a kernel called twice must be recognized alike)."""
    recognizer, found, refused = _Recognizer(module, anchors), {}, set()
    for symbol, params, arguments, steps, output in _kernels(module):
        vendor_op = recognizer.recognize(params, arguments, steps, output)
        if vendor_op is None or found.get(symbol, vendor_op) != vendor_op:
            refused.add(symbol)
        found[symbol] = vendor_op
    return {symbol: vendor_op for symbol, vendor_op in found.items() if symbol not in refused}


def _kernels(module: tvm.IRModule):
    """Per kernel call in `main`: (symbol, parameters, the call's arguments, call_tir steps as
    (variable, callee, arguments), output variable), a lone call_tir being its own one step; no steps where
    the kernel binds anything else."""
    for block in module["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if is_call_tir(value):
                arguments = tuple(value.args[1].fields)
                yield (value.args[0].name_hint, arguments, arguments,
                       [(binding.var, value.args[0], arguments)], binding.var)
            elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
                function = module[value.op]
                if isinstance(function, relax.Function) and "Primitive" in (function.attrs or {}):
                    yield value.op.name_hint, tuple(function.params), tuple(value.args), _steps(function), \
                        function.body.body


def _steps(function: relax.Function) -> list[tuple]:
    bindings = [binding for block in function.body.blocks for binding in block.bindings]
    steps = [(binding.var, binding.value.args[0], tuple(binding.value.args[1].fields))
             for binding in bindings if is_call_tir(binding.value)]
    return steps if len(steps) == len(bindings) else []


class _Recognizer:
    def __init__(self, module: tvm.IRModule, anchors: LegalizedCalls):
        self.module = module
        self.anchors = anchors
        self.identified: dict[str, str | None] = {}

    def recognize(self, params, arguments, steps, output) -> VendorOp | None:
        if not steps or not all(isinstance(param.ty, relax.TensorType) for param in params):
            return None
        self.params, self.arguments, self.steps = params, arguments, steps
        variable, callee, inputs = steps[0]
        call = self.anchors.calls.get(callee.name_hint)
        positions = [self._position(value) for value in inputs]
        if call is None or len(inputs) != 2 or None in positions:
            return None
        anchor = _anchor(call, [value.ty for value in inputs], variable.ty)
        if anchor is None:
            return None
        epilogue, current, index = [], variable, 1
        while index < len(steps):
            matched = self._epilogue_op(index, current, anchor)
            if matched is None:
                return None
            operation, taken = matched
            epilogue.append(operation)
            index += taken
            current = steps[index - 1][0]
        if not current.same_as(output):
            return None
        return VendorOp(anchor, positions[0], positions[1], tuple(epilogue), len(params))

    def _position(self, value) -> int | None:
        """The kernel input that `value` is."""
        return next((position for position, param in enumerate(self.params) if param.same_as(value)), None)

    def _epilogue_op(self, index: int, current, anchor) -> tuple[EpilogueOp, int] | None:
        """The epilogue op at step `index` on value `current`, and how many steps it spans."""
        variable, callee, inputs = self.steps[index]
        kind, dtype = self._identify(callee, inputs, variable.ty), str(variable.ty.dtype)
        others = [value for value in inputs if not value.same_as(current)]
        if len(inputs) - len(others) != 1 or _shape(variable.ty) != _shape(current.ty):
            return None
        gelu = self._gelu(index, current)
        if gelu is not None:
            return gelu
        if kind is None:
            return None
        if kind in ("relu", "sigmoid", "cast"):
            following = self._next(index, "multiply") if kind == "sigmoid" else None
            if following is not None and any(value.same_as(current) for value in following[2]):
                return EpilogueOp("silu", dtype), 2
            return EpilogueOp(kind, dtype), 1
        operand = self._position(others[0])
        if operand is None:
            return None
        if kind in ("add", "subtract", "multiply", "divide"):
            ordered = kind in ("add", "multiply") or inputs[0].same_as(current)  # x - c, not c - x
            return _binary(kind, operand, others[0].ty, variable.ty, anchor) if ordered else None
        following = self._next(index, "minimum") if kind == "maximum" else None
        if following is not None:
            high = [value for value in following[2] if not value.same_as(variable)]
            bounds = (self._bound(operand), self._bound(self._position(high[0])))
            return None if None in bounds else (EpilogueOp("clip", dtype, bounds=bounds), 2)
        bound = self._bound(operand)
        if kind not in ("maximum", "minimum") or bound is None:
            return None
        return EpilogueOp("clip", dtype, bounds=(bound, None) if kind == "maximum" else (None, bound)), 1

    def _gelu(self, index: int, current) -> tuple[EpilogueOp, int] | None:
        """GELU (`GELU`'s five steps) of value `current` from step `index`, if the steps are those."""
        steps = self.steps[index:index + len(GELU)]
        if len(steps) < len(GELU):
            return None
        previous = current
        for (variable, callee, inputs), (name, scalar, reads_x) in zip(steps, GELU):
            if op_name(callee.name_hint) != name or str(variable.ty.dtype) != str(current.ty.dtype) or \
                    _shape(variable.ty) != _shape(current.ty):
                return None
            values = [value for value in inputs if not self._is_scalar(value, scalar, variable.ty.dtype)]
            inlined = len(values) == len(inputs)  # a scalar constant of the model is inlined, else an input
            expected = [current, previous] if reads_x else [previous]
            if not _reads(values, expected) or len(inputs) - len(values) > 1 or \
                    (name == "divide" and not inlined and not inputs[0].same_as(previous)):
                return None
            operator = relax.op.erf if name == "erf" else EPILOGUE_OPS[name][1]
            types = [value.ty for value in inputs]
            if not _rebuilds(self.module[callee], operator, types, variable.ty, scalar if inlined else None):
                return None
            previous = variable
        return EpilogueOp("gelu", str(previous.ty.dtype)), len(GELU)

    def _is_scalar(self, value, scalar: float | None, dtype) -> bool:
        """Whether `value` is a kernel input holding the scalar constant `scalar` in `dtype`."""
        bound = None if scalar is None else self._bound(self._position(value))
        return bound is not None and bound == float(np.array(scalar, str(dtype)))

    def _next(self, index: int, kind: str) -> tuple | None:
        """Step `index + 1` if it is op `kind` reading the value of step `index` once."""
        if index + 1 >= len(self.steps):
            return None
        variable, callee, inputs = self.steps[index + 1]
        produced = self.steps[index][0]
        if self._identify(callee, inputs, variable.ty) != kind or \
                sum(value.same_as(produced) for value in inputs) != 1:
            return None
        return self.steps[index + 1]

    def _bound(self, position: int | None) -> float | None:
        """The value of a scalar constant argument; None where it is not one."""
        value = None if position is None else self.arguments[position]
        if not isinstance(value, tvm.ir.Constant) or value.ty.ndim != 0:
            return None
        return float(value.value.numpy())

    def _identify(self, callee: tvm.ir.GlobalVar, inputs, out_type) -> str | None:
        """The op that `callee` is, by rebuilding the op its name proposes (cached per callee)."""
        if callee.name_hint not in self.identified:
            kind, operator, arity = EPILOGUE_OPS.get(op_name(callee.name_hint), (None, None, 0))
            types = [value.ty for value in inputs]
            # a binary op with a scalar constant has it inlined (x * 0.5 is a PrimFunc of one input)
            rebuilt = kind and len(types) == arity and (kind == "cast" or all(
                str(ty.dtype) == str(out_type.dtype) for ty in types)) and _rebuilds(
                    self.module[callee], operator, types, out_type)
            self.identified[callee.name_hint] = kind if rebuilt else None
        return self.identified[callee.name_hint]


def _reads(inputs, values) -> bool:
    """Whether `inputs` are exactly `values`, in any order."""
    remaining = list(inputs)
    for value in values:
        match = next((position for position, other in enumerate(remaining) if other.same_as(value)), None)
        if match is None:
            return False
        remaining.pop(match)
    return not remaining


def _rebuilds(function: tvm.tirx.PrimFunc, operator, types, out_type, scalar: float | None = None) -> bool:
    """Whether TVM's default legalization of Relax op `operator` on `types` (and a `scalar` constant of the
    output's dtype after them) gives `function`."""
    builder = relax.BlockBuilder()
    params = [relax.Var(f"input{index}", ty) for index, ty in enumerate(types)]
    extra = (str(out_type.dtype),) if operator is relax.op.astype else ()
    if scalar is not None:
        extra = (relax.const(np.array(scalar, str(out_type.dtype))),)
    call = builder.normalize(operator(*params, *extra))
    legal = tvm.ir.Op.get(call.op.name).get_attr("FLegalize")(builder, call)
    # AnnotateTIROpPattern adds op_pattern to the PrimFuncs of the module
    return is_call_tir(legal) and tvm_ffi.structural_equal(builder.get()[legal.args[0]],
                                                           function.without_attr("op_pattern"))


def _binary(kind: str, operand: int, operand_type, out_type, anchor) -> tuple[EpilogueOp, int] | None:
    """Arithmetic with kernel input `operand`, of the output's shape or varying along the channel axis
    (conv2d) or the last axis (matmul) only: an add is a `residual` or a `bias`."""
    shape, out_shape = _shape(operand_type), _shape(out_type)
    dtype = str(out_type.dtype)
    if shape == out_shape:
        return EpilogueOp({"add": "residual"}.get(kind, kind), dtype, operand), 1
    axis = anchor.channel_axis if isinstance(anchor, Conv2d) else len(out_shape) - 1
    aligned = (1,) * (len(out_shape) - len(shape)) + shape
    if len(shape) > len(out_shape) or any(size != 1 for dim, size in enumerate(aligned) if dim != axis) \
            or aligned[axis] != out_shape[axis]:
        return None
    return EpilogueOp({"add": "bias"}.get(kind, kind), dtype, operand, axis), 1


def _anchor(call: relax.Call, types, out_type) -> Conv2d | Matmul | None:
    """The anchor the recorded Relax call computes, if a vendor library takes it."""
    dtype, accumulate = str(types[0].dtype), str(out_type.dtype)
    if str(types[1].dtype) != dtype or dtype not in FLOATS or accumulate not in (dtype, "float32"):
        return None
    shapes = [_shape(ty) for ty in (*types, out_type)]
    if call.op.name == "relax.matmul":
        return Matmul(*shapes, dtype, accumulate) if min(len(shapes[0]), len(shapes[1])) >= 2 else None
    attrs = call.attrs
    layout = str(attrs.data_layout)
    if WEIGHT_LAYOUTS.get(layout) != str(attrs.kernel_layout) or str(attrs.out_layout) != layout:
        return None
    return Conv2d(layout, *shapes, tuple(int(value) for value in attrs.strides),
                  tuple(int(value) for value in attrs.padding), tuple(int(value) for value in attrs.dilation),
                  int(attrs.groups), dtype, accumulate)


def _shape(tensor_type) -> tuple[int, ...]:
    return tuple(int(dim) for dim in tensor_type.shape.values)
