"""Relax passes that turn an imported model into one `call_tir` per fused kernel.

The sequence is TVM's "zero" pipeline spelled out, so that the operators inside each fused kernel can be
recorded between FuseOps and FuseTIR (they name the kernel's `op_kinds`), and the kernels a vendor library
could compute recognized there (`tactics.recognize`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, te, topi

from tvmsched.tactics.vendor_op import VendorOp


@dataclass(frozen=True)
class LoweredModule:
    """A Relax module whose `main` calls only PrimFuncs, the operators fused into each PrimFunc, and what a
    vendor library would compute for those it could."""

    module: tvm.IRModule
    op_kinds: dict[str, tuple[str, ...]]
    vendor_ops: dict[str, VendorOp]


def lower(module: tvm.IRModule) -> LoweredModule:
    """Legalize, fold constants and fuse `module`; every PrimFunc gets its global symbol."""
    from tvmsched.tactics.recognize import ANCHOR_OPS, recognize

    anchors, takes = LegalizedCalls(ANCHOR_OPS), LegalizedCalls(("relax.take",))
    module = relax.transform.DecomposeOpsForInference()(module)
    module = relax.transform.LegalizeOps({**anchors.legalize_map(), **takes.legalize_map(),
                                          **FLOAT32_INSIDE})(module)
    module = slice_constant_takes(fold_constant_calls(module), takes)
    module = tvm.transform.Sequential([relax.transform.AnnotateTIROpPattern(),
                                       relax.transform.FoldConstant()])(module)
    module = relax.transform.FuseOps()(broadcasts_of_reductions_unfused(module))
    op_kinds, vendor_ops = _fused_op_kinds(module), recognize(module, anchors)
    module = tvm.transform.Sequential([
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
        relax.transform.AttachGlobalSymbol(),
    ])(module)
    for global_var, function in module.functions.items():
        if isinstance(function, tvm.tirx.PrimFunc) and global_var.name_hint not in op_kinds:
            op_kinds[global_var.name_hint] = (op_name(global_var.name_hint),)
    return LoweredModule(module, op_kinds, vendor_ops)


ELEMWISE, BROADCAST, COMM_REDUCE, OUT_EWISE_FUSABLE, INJECTIVE = 0, 1, 3, 4, 2  # TVM's OpPatternKind


def broadcasts_of_reductions_unfused(module: tvm.IRModule) -> tvm.IRModule:
    """`module` (op patterns annotated) with each element-wise call that spreads a reduction's result over
    axes the reduction did not reduce marked injective, so that FuseOps leaves it out of the reduction's
    kernel.

    FuseOps would make it the epilogue of the convolution, matmul or reduction whose smaller result (through
    element-wise ops of its shape) it broadcasts: a squeeze-and-excitation block's
    `x * sigmoid(conv(mean(x)))`. The kernel's schedule then parallelizes the small reduction and runs the
    large epilogue on its few threads: EfficientNet-B0's first one, 1x112x112x32 in float16 after a 1x1
    convolution of 8 channels, took 0.312 ms on the H100 (GEMV's schedule, 64 threads). Apart, each is
    scheduled for its own shape. A broadcast back over the reduced axes (`x - mean(x)` of a layer norm
    spelled out) stays fused: dlight's GeneralReduction computes such a row in one block. So do broadcasts
    of constants (a bias) and of the larger operand. (TVM annotates a broadcasting multiply element-wise.)"""
    reduced: dict[relax.Var, set[int]] = {}  # a reduction's result (or element-wise of it): axes reduced
    unfused: list[relax.Call] = []
    for block in module["main"].body.blocks:
        for binding in block.bindings:
            call, shape = binding.value, _static_shape(binding.var)
            if not is_call_tir(call) or shape is None:
                continue
            pattern = int(module[call.args[0]].attrs.get("op_pattern", -1))
            inputs = [(arg, _static_shape(arg)) for arg in call.args[1].fields if isinstance(arg, relax.Var)]
            inputs = [(arg, dims) for arg, dims in inputs if dims is not None and len(dims) == len(shape)]
            if pattern in (COMM_REDUCE, OUT_EWISE_FUSABLE) and inputs:
                reduced[binding.var] = {axis for axis, (before, after) in enumerate(zip(inputs[0][1], shape))
                                        if after == 1 < before}
            elif pattern in (ELEMWISE, BROADCAST):
                spread = [(reduced[arg],
                           {axis for axis, (dim, out) in enumerate(zip(dims, shape)) if dim < out})
                          for arg, dims in inputs if arg in reduced]
                if any(not axes <= axes_reduced for axes_reduced, axes in spread):
                    unfused.append(call)
                elif same := [axes_reduced for axes_reduced, axes in spread if not axes]:
                    reduced[binding.var] = same[0]
    if not unfused:
        return module
    marked = {call.__chandle__(): module[call.args[0]].with_attr("op_pattern", INJECTIVE) for call in unfused}
    return with_main_mutated(module, _CallsRedirected(module, marked))


@relax.expr_functor.mutator
class _CallsRedirected(relax.PyExprMutator):
    """Points the given `call_tir`s (by handle) at the given PrimFuncs, each added to the module once under
    a name of its own: the callee's other calls keep it."""

    def __init__(self, module: tvm.IRModule, callees: dict[int, tvm.tirx.PrimFunc]):
        super().__init__(module)
        self.callees = callees
        self.added: dict[str, tvm.ir.GlobalVar] = {}

    def visit_call_(self, op: relax.Call):
        call = super().visit_call_(op)
        function = self.callees.get(op.__chandle__())
        if function is None:
            return call
        callee = call.args[0].name_hint
        if callee not in self.added:  # under the op's name, which the builder numbers apart
            self.added[callee] = self.builder_.add_func(function, op_name(callee))
        return relax.Call(call.op, [self.added[callee], *call.args[1:]], call.attrs, call.ty_args)


def _static_shape(var: relax.Var) -> tuple[int, ...] | None:
    return tuple(int(dim) for dim in var.ty.shape.values) if is_static(var.ty) else None


def _float32_inside(name: str, topi_op):
    """Legalizes a softmax-like op as TVM does, except on float16: there its exponentials and sums are
    float32 (TVM's would be float16) and the result is rounded once."""
    short = name.rsplit(".", 1)[1]

    def legalize(builder: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        data, axis = call.args[0], int(call.attrs.axis)
        if data.ty.dtype != "float16":
            return builder.call_te(topi_op, data, axis, primfunc_name_hint=short)
        return builder.call_te(lambda x: topi.cast(topi_op(topi.cast(x, "float32"), axis), "float16"), data,
                               primfunc_name_hint=short)
    return legalize


FLOAT32_INSIDE = {name: _float32_inside(name, op) for name, op in
                  (("relax.nn.softmax", topi.nn.softmax), ("relax.nn.log_softmax", topi.nn.log_softmax))}


FOLD_TARGET = {"kind": "llvm", "opt-level": 0}  # each folded function runs once: compiling fast pays


class LegalizedCalls:
    """The Relax calls of `ops` that LegalizeOps turned into PrimFuncs, by PrimFunc name: `legalize_map` is
    LegalizeOps' `customize_legalize_map`, TVM's own legalization recording what it legalized."""

    def __init__(self, ops: tuple[str, ...]):
        self.ops = ops
        self.calls: dict[str, relax.Call] = {}

    def legalize_map(self) -> dict:
        return {name: self._recording(tvm.ir.Op.get(name).get_attr("FLegalize")) for name in self.ops}

    def _recording(self, legalize):
        def recorded(builder: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
            legal = legalize(builder, call)
            if is_call_tir(legal):
                self.calls[legal.args[0].name_hint] = call
            return legal
        return recorded


def slice_constant_takes(module: tvm.IRModule, takes: LegalizedCalls) -> tvm.IRModule:
    """`module` with each `take` (`takes`: the Relax calls behind the takes' PrimFuncs) at one constant
    index made a plain slice of that index. TVM's take reads its index from a buffer, which makes it
    opaque to FuseOps: a kernel of its own (ViT's query, key and value, picked out of one projection: 36
    kernels). Exported models compute such an index from the input's shape, so it is constant only once
    `fold_constant_calls` has run, after legalization."""
    return with_main_mutated(module, _SliceTakes(takes, module))


def with_main_mutated(module: tvm.IRModule, mutator: relax.PyExprMutator) -> tvm.IRModule:
    """A module of `module`'s functions, the functions `mutator` (a mutator over `module`) added, and `main`
    visited by it. The mutator's builder holds `module` itself (functions it adds are added there too), so
    the result is a new module: `module` keeps its `main` (setting the builder's replaced it in place, which
    broke a caller that rewrote one module two ways to compare them)."""
    main = mutator.visit_expr(module["main"])
    mutated = mutator.builder_.get()
    result = tvm.IRModule(dict(mutated.functions), attrs=mutated.attrs)
    result["main"] = main
    return result


@relax.expr_functor.mutator
class _SliceTakes(relax.PyExprMutator):
    def __init__(self, takes: LegalizedCalls, module: tvm.IRModule):
        super().__init__(module)
        self.takes = takes

    def visit_call_(self, op: relax.Call):
        call = super().visit_call_(op)
        take = self.takes.calls.get(call.args[0].name_hint) if is_call_tir(call) else None
        if take is None or take.attrs.axis is None:
            return call
        data, index = call.args[1].fields
        if isinstance(index, relax.Var):  # the folded index, bound to a variable
            index = self.lookup_binding(index)
        if not (isinstance(index, tvm.ir.Constant) and index.value.numpy().ndim == 0):
            return call
        shape = [int(dim) for dim in data.ty.shape]
        axis = int(take.attrs.axis) % len(shape)
        at = int(index.value.numpy())
        if not -shape[axis] <= at < shape[axis]:
            return call
        at %= shape[axis]
        picked = shape[:axis] + shape[axis + 1:]
        return self.builder_.call_te(
            lambda x: te.compute(picked, lambda *i: x[(*i[:axis], at, *i[axis:])], name="T_take"), data,
            primfunc_name_hint="take")


def constant_vars(function: relax.Function) -> set[relax.Var]:
    """The variables of `function` computed by pure ops from constants alone (a weight cast to float16,
    reshaped, a field of a constant tuple, a batch norm's statistics combined), found in one pass over its
    bindings in order; a variable a match_cast binds is not one (its type is the cast's)."""
    constant: set[relax.Var] = set()

    def known(expr) -> bool:
        if isinstance(expr, relax.Var):
            return expr in constant
        if isinstance(expr, relax.Tuple):
            return all(known(field) for field in expr.fields)
        return isinstance(expr, tvm.ir.Constant | relax.ShapeExpr | tvm.ir.GlobalVar)

    def pure(call: relax.Call) -> bool:
        return isinstance(call.op, tvm.ir.Op) and bool(call.op.get_attr("FPurity"))

    for block in function.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(binding, relax.MatchCast):
                continue
            if (isinstance(value, relax.Call) and pure(value) and all(known(arg) for arg in value.args)
                    or isinstance(value, relax.TupleGetItem) and known(value.tuple_value) or known(value)):
                constant.add(binding.var)
    return constant


def fold_constants(module: tvm.IRModule) -> tvm.IRModule:
    """`module` with every tensor `main` computes from constants alone, and uses, made a constant, as
    Relax's FoldConstant makes it, but evaluated by one compiled function: FoldConstant compiles each call
    on its own (1,159 LLVM builds and 31 s for nasnet's decomposed batch norms in fp16 here)."""
    main = module["main"]
    constant = constant_vars(main)
    bindings = [binding for block in main.body.blocks for binding in block.bindings]
    used = {var for binding in bindings if binding.var not in constant
            for var in relax.analysis.free_vars(binding.value)}
    used |= set(relax.analysis.free_vars(main.body.body))
    frontier = [binding.var for binding in bindings if binding.var in used and binding.var in constant
                and isinstance(binding.var.ty, relax.TensorType) and binding.var.ty.shape is not None
                and not isinstance(binding.value, tvm.ir.Constant)]
    if not frontier:
        return module
    try:
        values = _evaluated(module, [binding for binding in bindings if binding.var in constant], frontier)
    except Exception:  # noqa: BLE001  (an op the CPU build cannot take: FoldConstant leaves it unfolded)
        return relax.transform.FoldConstant()(module)
    mutator = _ConstantVars(dict(zip(frontier, values)), module)
    return relax.transform.DeadCodeElimination()(with_main_mutated(module, mutator))


def _evaluated(module: tvm.IRModule, bindings: list, outputs: list[relax.Var]) -> list[np.ndarray]:
    """The values of `outputs`, computed by `bindings` (of constants alone) in one function built for the
    CPU beside `module`'s other functions and run once."""
    builder = relax.BlockBuilder(tvm.IRModule({var: function for var, function in module.functions.items()
                                               if var.name_hint != "main"}))
    renamed: dict[relax.Var, relax.Var] = {}
    with builder.function("main", []):
        for binding in bindings:
            renamed[binding.var] = builder.emit(_substituted(binding.value, renamed))
        builder.emit_func_output(relax.Tuple([renamed[var] for var in outputs]))
    executable = tvm.compile(builder.get(), target=tvm.target.Target(FOLD_TARGET))
    machine = relax.VirtualMachine(executable, tvm.cpu())
    return [tensor.numpy() for tensor in machine["main"]()]


def _substituted(expr, renamed: dict):
    """`expr` (a binding's value) reading `renamed`'s variables in place of the keys."""
    if isinstance(expr, relax.Var):
        return renamed[expr]
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_substituted(field, renamed) for field in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(_substituted(expr.tuple_value, renamed), expr.index)
    if isinstance(expr, relax.Call):
        arguments = [_substituted(arg, renamed) for arg in expr.args]
        return relax.Call(expr.op, arguments, expr.attrs, expr.ty_args)
    return expr


@relax.expr_functor.mutator
class _ConstantVars(relax.PyExprMutator):
    """Reads each variable of `values` as its constant (one per variable, however often it is read)."""

    def __init__(self, values: dict, module: tvm.IRModule):
        super().__init__(module)
        self.constants = {var: relax.const(value, str(var.ty.dtype)) for var, value in values.items()}

    def visit_var_(self, var: relax.Var):
        return self.constants[var] if var in self.constants else super().visit_var_(var)

    def visit_dataflow_var_(self, var: relax.DataflowVar):
        return self.constants[var] if var in self.constants else super().visit_dataflow_var_(var)


def fold_constant_calls(module: tvm.IRModule) -> tvm.IRModule:
    """Evaluate every `call_tir` of `main` whose arguments are all constants, round by round, with one LLVM
    library per round (unoptimized; each function looked up once). Relax's FoldConstant gives the same
    module but compiles each call on its own (343 builds, 10 s for googlenet here; 3 rounds, 0.9 s this
    way); it then folds only what is left."""
    while True:
        calls = _constant_calls(module["main"])
        if not calls:
            return module
        functions = {call.args[0].name_hint: module[call.args[0]].with_attr("global_symbol",
                                                                           call.args[0].name_hint)
                     for call, _ in calls}
        library = tvm.compile(tvm.IRModule(functions), target=FOLD_TARGET)
        kernels = {name: library[name] for name in functions}
        values = {}
        for call, args in calls:
            output = tvm.runtime.empty([int(dim) for dim in call.ty.shape], str(call.ty.dtype), tvm.cpu())
            kernels[call.args[0].name_hint](*[arg.value for arg in args], output)
            values[call.__chandle__()] = relax.const(output.numpy(), str(call.ty.dtype))
        module = with_main_mutated(module, _ReplaceCalls(values, module))


def _constant_calls(main: relax.Function) -> list[tuple[relax.Call, list[tvm.ir.Constant]]]:
    """The single-output `call_tir`s of `main` of static shape whose arguments are constants (or variables
    bound to one)."""
    bound, calls = {}, []
    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, tvm.ir.Constant):
                bound[binding.var.__chandle__()] = value
            elif is_call_tir(value) and len(value.args) == 2 and is_static(value.ty):
                fields = value.args[1].fields if isinstance(value.args[1], relax.Tuple) else [value.args[1]]
                args = [bound.get(arg.__chandle__()) if isinstance(arg, relax.Var) else arg for arg in fields]
                if all(isinstance(arg, tvm.ir.Constant) for arg in args):
                    calls.append((value, args))
    return calls


def is_static(ty) -> bool:
    """Whether `ty` is a tensor type of static shape (a call may compute a tensor whose shape is a symbolic
    variable, e.g. Range over run-time bounds: nothing to fold, and nothing the kernel graph can hold)."""
    return (isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)
            and all(isinstance(dim, tvm.tirx.IntImm) for dim in ty.shape.values))


@relax.expr_functor.mutator
class _ReplaceCalls(relax.PyExprMutator):
    """Replaces the calls in `values` (by object) with their constant."""

    def __init__(self, values: dict, module: tvm.IRModule):
        super().__init__(module)
        self.values = values

    def visit_call_(self, op: relax.Call):
        value = self.values.get(op.__chandle__())
        return value if value is not None else super().visit_call_(op)


def kernel_module(lowered: LoweredModule) -> tvm.IRModule:
    """The PrimFuncs of a lowered module alone: what gets compiled into the kernel library."""
    return tvm.IRModule({global_var: function for global_var, function in lowered.module.functions.items()
                         if isinstance(function, tvm.tirx.PrimFunc)})


def is_op(expr, name: str) -> bool:
    """Whether `expr` calls the Relax op `name`."""
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def is_call_tir(expr) -> bool:
    """Whether `expr` is `R.call_tir(primfunc, args, ...)`."""
    return is_op(expr, "relax.call_tir")


def _fused_op_kinds(module: tvm.IRModule) -> dict[str, tuple[str, ...]]:
    """For each fused Relax function (named like the PrimFunc FuseTIR makes of it), its operators."""
    kinds = {}
    for global_var, function in module.functions.items():
        if isinstance(function, relax.Function) and function.attrs and "Primitive" in function.attrs:
            kinds[global_var.name_hint] = tuple(op_name(name) for name in _callees(function))
    return kinds


def _callees(function: relax.Function) -> list[str]:
    """The PrimFuncs a Relax function calls with call_tir, in order."""
    callees = []

    def visit(expr) -> None:
        if is_call_tir(expr):
            callees.append(expr.args[0].name_hint)

    relax.analysis.post_order_visit(function.body, visit)
    return callees


def op_name(symbol: str) -> str:
    """`conv2d3` → `conv2d`: legalized PrimFuncs are named after their operator plus a dedup suffix."""
    return re.sub(r"(?<=[a-z_])\d+$", "", symbol)
