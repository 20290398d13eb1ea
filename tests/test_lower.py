"""Lowering: calls whose shapes are only known at run time are left alone by the constant folding."""

import numpy as np
import onnx
import pytest
import tvm
from conftest import make_model, onnxruntime_outputs, tensor
from onnx import TensorProto, helper

import tvmsched
from tvmsched import fold
from tvmsched.importer import import_model
from tvmsched.lower import is_call_tir, lower


def test_a_call_of_run_time_shape_is_not_folded(monkeypatch):
    """Range over bounds given at run time: TVM computes its length, then calls a kernel without tensor
    arguments whose output shape is a symbolic variable (fold_constant_calls took it for a constant and
    failed on int() of that variable). The import refuses such a node (`static_shapes`): not here."""
    import tvmsched.importer

    monkeypatch.setattr(tvmsched.importer, "check_static_output", lambda *args: None)
    node = helper.make_node("Range", ["start", "limit", "delta"], ["y"])
    names = ("start", "limit", "delta")
    model = make_model([node], [tensor(name, [], TensorProto.FLOAT) for name in names],
                       [tensor("y", ["n"])], {})
    module = import_model(fold.fold_shapes(model, dict.fromkeys(names, ()), {}), dict.fromkeys(names, []),
                          dict.fromkeys(names, "float32"), 18)
    main = lower(module).module["main"]
    shapes = [binding.value.ty.shape.values for block in main.body.blocks for binding in block.bindings
              if is_call_tir(binding.value)]
    assert any(not isinstance(dim, tvm.tirx.IntImm) for shape in shapes for dim in shape)


@pytest.mark.parametrize("index", [1, -1])
def test_a_gather_at_a_constant_index_is_a_slice_that_fuses(index):
    """ViT picks its query, key and value out of one tensor with Gather at constant indices: each is a
    slice fused with the transpose after it (TVM's take read the index from a buffer and ran as a kernel
    of its own), and computes what onnxruntime does, a negative index counting from the end."""
    nodes = [helper.make_node("Gather", ["input", "index"], ["picked"], axis=1),
             helper.make_node("Transpose", ["picked"], ["t"], perm=[1, 0]),
             helper.make_node("Relu", ["t"], ["output"])]
    model = make_model(nodes, [tensor("input", [4, 3, 5])], [tensor("output", [5, 4])],
                       {"index": np.array(index)})
    compiled = tvmsched.compile(model, target="llvm")
    assert [kernel.op_kinds for kernel in compiled.graph.kernels] == [("take", "transpose", "relu")]
    x = np.random.default_rng(15).standard_normal((4, 3, 5)).astype("float32")
    np.testing.assert_array_equal(compiled(x), onnxruntime_outputs(model, {"input": x})[0])


def _squeeze_excitation() -> onnx.ModelProto:
    """x * sigmoid(conv(relu(conv(mean(x))))) of 1x8x6x6, then a 3x3 convolution scaled per channel by a
    constant: that multiply has the same shapes as the gate's, so TVM legalizes both to one PrimFunc."""
    rng = np.random.default_rng(16)
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
             helper.make_node("Conv", ["m", "w1", "b1"], ["c1"]), helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["c2"]), helper.make_node("Sigmoid", ["c2"], ["s"]),
             helper.make_node("Mul", ["x", "s"], ["y"]),
             helper.make_node("Conv", ["y", "w3"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c3", "scale"], ["z"])]
    weights = {"axes": np.array([2, 3]), "w1": rng.standard_normal((2, 8, 1, 1)).astype("float32"),
               "b1": rng.standard_normal(2).astype("float32"),
               "w2": rng.standard_normal((8, 2, 1, 1)).astype("float32"),
               "b2": rng.standard_normal(8).astype("float32"),
               "w3": rng.standard_normal((8, 8, 3, 3)).astype("float32"),
               "scale": rng.standard_normal((1, 8, 1, 1)).astype("float32")}
    return make_model(nodes, [tensor("x", [1, 8, 6, 6])], [tensor("z", [1, 8, 6, 6])], weights)


def test_a_broadcast_of_a_convolutions_result_is_a_kernel_of_its_own():
    """A squeeze-and-excitation block's `x * sigmoid(conv(...))` spreads the convolution's 1x8x1x1 result
    over 1x8x6x6: fused as the convolution's epilogue it ran on the convolution's few threads (0.31 ms
    for EfficientNet-B0's first one on the H100), so the multiply is a kernel of its own. The per-channel
    scale after the next convolution, the same PrimFunc as legalized, stays that convolution's epilogue;
    the outputs are onnxruntime's."""
    model = _squeeze_excitation()
    compiled = tvmsched.compile(model, target="llvm")
    kinds = [kernel.op_kinds for kernel in compiled.graph.kernels]
    assert ("conv2d", "add", "tir_sigmoid") in kinds and ("multiply",) in kinds
    assert ("conv2d", "multiply") in kinds
    x = np.random.default_rng(17).standard_normal((1, 8, 6, 6)).astype("float32")
    np.testing.assert_allclose(compiled(x), onnxruntime_outputs(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_a_broadcast_back_over_the_reduced_axes_stays_fused():
    """`x - mean(x)` spreads the mean over the axis it reduced, as a layer norm spelled out does: one
    kernel, which dlight's GeneralReduction computes a row per block."""
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["y"])]
    model = make_model(nodes, [tensor("x", [4, 16])], [tensor("y", [4, 16])], {"axes": np.array([1])})
    compiled = tvmsched.compile(model, target="llvm")
    assert [kernel.op_kinds for kernel in compiled.graph.kernels] == [("mean", "subtract")]
    x = np.random.default_rng(18).standard_normal((4, 16)).astype("float32")
    np.testing.assert_allclose(compiled(x), onnxruntime_outputs(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_a_mutated_main_is_a_new_module_and_the_input_keeps_its_own():
    """`with_main_mutated` returns a new module: the mutator's builder holds the input module itself, and
    setting its main replaced the input's (the layout rewrite compares two rewrites of one module)."""
    from tvm import relax

    from tvmsched.lower import with_main_mutated

    x = relax.Var("x", relax.TensorType((2,), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            output = builder.emit_output(builder.emit(relax.op.add(x, x)))
        builder.emit_func_output(output)
    module = builder.get()
    before = module["main"]

    @relax.expr_functor.mutator
    class Multiply(relax.PyExprMutator):
        def visit_call_(self, op):
            call = super().visit_call_(op)
            return relax.op.multiply(*call.args)

    mutated = with_main_mutated(module, Multiply(module))
    assert module["main"].same_as(before) and not mutated.same_as(module)
    assert "multiply" in mutated["main"].script() and "multiply" not in module["main"].script()


def test_constants_fold_in_one_build_to_what_relax_folds_one_call_at_a_time(monkeypatch):
    """A batch norm decomposed, a bias reshaped, a Gemm's weight transposed: `fold_constants` gives the module
    FoldConstant gives (same constants, bit for bit), building one function for all of them; and where
    that build fails, FoldConstant's module still."""
    import tvm_ffi
    from test_tactics_select import network
    from tvm import relax

    from tvmsched import frontend
    from tvmsched import lower as lowering

    proto = network()
    module = relax.transform.DecomposeOpsForInference()(
        frontend.to_relax(proto, frontend.bind_input_shapes(proto)))
    expected = relax.transform.DeadCodeElimination()(relax.transform.FoldConstant()(module))
    builds = []
    compile_ = tvm.compile
    monkeypatch.setattr(tvm, "compile", lambda *args, **kwargs: builds.append(1) or compile_(*args, **kwargs))
    folded = lowering.fold_constants(module)
    assert len(builds) == 1 and tvm_ffi.structural_equal(folded, expected, map_free_vars=True)
    assert len(lowering.constant_vars(folded["main"])) < len(lowering.constant_vars(module["main"]))

    def fails(*args):
        raise RuntimeError("no CPU build")
    monkeypatch.setattr(lowering, "_evaluated", fails)
    assert tvm_ffi.structural_equal(relax.transform.DeadCodeElimination()(lowering.fold_constants(module)),
                                    expected, map_free_vars=True)


def test_only_pure_ops_of_constants_fold_and_a_match_cast_keeps_its_type():
    """A print of a constant stays where it is (it prints when the model runs); a match_cast's variable
    keeps the cast's type: only the add before it becomes a constant."""
    from tvm import relax

    from tvmsched.lower import constant_vars, fold_constants

    c = relax.const(np.arange(4, dtype="float32"))
    x = relax.Var("x", relax.TensorType([4], "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        total = builder.emit(relax.op.add(c, c))
        builder.emit(relax.op.print(total, format="{}"))
        cast = builder.match_cast(total, relax.TensorType([4], "float32"))
        builder.emit_func_output(builder.emit(relax.op.multiply(x, cast)))
    module = builder.get()
    assert constant_vars(module["main"]) == {total}
    folded = fold_constants(module)["main"].body.blocks[0].bindings
    printed, matched, product = folded
    assert printed.value.op.name == "relax.print" and isinstance(printed.value.args[0], tvm.ir.Constant)
    assert isinstance(matched, relax.MatchCast) and isinstance(matched.value, tvm.ir.Constant)
    assert product.value.args[1].same_as(matched.var)
