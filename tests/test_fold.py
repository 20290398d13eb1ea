"""Shape folding: shape computations become constants once input shapes (and constant inputs) are bound;
graph inputs whose value decides a shape are refused by name."""

import numpy as np
import pytest
from conftest import assert_matches, make_model, onnxruntime_outputs, tensor
from onnx import TensorProto, helper, numpy_helper

import tvmsched
from tvmsched import fold
from tvmsched.errors import ConstantInputRequired

RNG = np.random.default_rng(0)


def _compiled_matches(model, feeds: dict, **options) -> list[np.ndarray]:
    outputs = tvmsched.compile(model, target="llvm", **options).run(feeds)
    assert_matches(outputs, onnxruntime_outputs(model, feeds))
    return outputs


def _shape_dims(source: str, count: int) -> list:
    """Shape(source), then Gather and Unsqueeze of each dim: `d0u`..., 1-element int64 tensors."""
    axes = range(count)
    return [helper.make_node("Shape", [source], ["shape"]),
            *[helper.make_node("Gather", ["shape", f"i{axis}"], [f"d{axis}"], axis=0) for axis in axes],
            *[helper.make_node("Unsqueeze", [f"d{axis}", "zero_axis"], [f"d{axis}u"]) for axis in axes]]


DIM_WEIGHTS = {**{f"i{axis}": np.array(axis, "int64") for axis in range(4)}, "zero_axis": np.array([0])}


def test_channel_shuffle_matches_onnxruntime():
    """shufflenet's channel shuffle: the Reshape shapes come from Shape → Gather → Unsqueeze → Concat of an
    input whose batch is bound at build time."""
    nodes = [*_shape_dims("x", 4),
             helper.make_node("Div", ["d1u", "groups"], ["per_group"]),
             helper.make_node("Concat", ["d0u", "groups", "per_group", "d2u", "d3u"], ["split_shape"],
                              axis=0),
             helper.make_node("Reshape", ["x", "split_shape"], ["split"]),
             helper.make_node("Transpose", ["split"], ["shuffled"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Concat", ["d0u", "d1u", "d2u", "d3u"], ["back_shape"], axis=0),
             helper.make_node("Reshape", ["shuffled", "back_shape"], ["y"])]
    model = make_model(nodes, [tensor("x", ["batch", 6, 4, 4])], [tensor("y", ["batch", 6, 4, 4])],
                       {**DIM_WEIGHTS, "groups": np.array([2])})
    x = RNG.standard_normal((2, 6, 4, 4)).astype("float32")
    (y,) = _compiled_matches(model, {"x": x}, batch=2)
    np.testing.assert_array_equal(y, x.reshape(2, 2, 3, 4, 4).transpose(0, 2, 1, 3, 4).reshape(2, 6, 4, 4))


def test_outputs_that_are_shapes_sizes_or_inputs():
    """A Shape or Size result is a constant graph output; an Identity of an input outputs the input."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Size", ["x"], ["size"]),
             helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Relu", ["x"], ["y"])]
    model = make_model(nodes, [tensor("x", ["batch", 3])],
                       [tensor("y", ["batch", 3]), tensor("shape", [2], TensorProto.INT64),
                        tensor("same", ["batch", 3]), tensor("size", [], TensorProto.INT64)], {})
    x = RNG.standard_normal((5, 3)).astype("float32")
    y, shape, same, size = _compiled_matches(model, {"x": x}, batch=5)
    assert shape.tolist() == [5, 3] and size.shape == () and int(size) == 15
    np.testing.assert_array_equal(same, x)


def test_fills_and_ranges_from_shape_chains():
    """ConstantOfShape, Expand, Range and Tile whose shapes, limits and repeats come from Shape chains."""
    fill = numpy_helper.from_array(np.array([1.5], "float32"))
    nodes = [*_shape_dims("x", 2),
             helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=fill),
             helper.make_node("Add", ["x", "ones"], ["shifted"]),
             helper.make_node("Expand", ["bias", "shape"], ["bias_full"]),
             helper.make_node("Mul", ["shifted", "bias_full"], ["scaled"]),
             helper.make_node("Range", ["zero", "d1", "one"], ["columns"]),
             helper.make_node("Cast", ["columns"], ["columns_float"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["scaled", "columns_float"], ["summed"]),
             helper.make_node("Div", ["d0u", "d0u"], ["once"]),
             helper.make_node("Concat", ["two", "once"], ["repeats"], axis=0),
             helper.make_node("Tile", ["summed", "repeats"], ["y"])]
    weights = {**DIM_WEIGHTS, "bias": RNG.standard_normal(4).astype("float32"), "zero": np.array(0),
               "one": np.array(1), "two": np.array([2])}
    model = make_model(nodes, [tensor("x", ["batch", 4])], [tensor("y", ["rows", 4])], weights)
    (y,) = _compiled_matches(model, {"x": RNG.standard_normal((3, 4)).astype("float32")}, batch=3)
    assert y.shape == (6, 4)


def test_torch_expand_pattern_with_constant_of_shape_folds():
    """torch's expand(-1, n) exports Where(Equal(shape, ConstantOfShape(...) * -1), ones, shape): onnxscript
    keeps ConstantOfShape by default, which would leave the Expand's shape to run time."""
    minus_one = numpy_helper.from_array(np.array([1], "int64"))
    nodes = [*_shape_dims("x", 2),
             helper.make_node("Concat", ["d0u", "d1u"], ["target"], axis=0),
             helper.make_node("ConstantOfShape", ["rank"], ["ones"], value=minus_one),
             helper.make_node("Mul", ["ones", "minus_one"], ["minus_ones"]),
             helper.make_node("Equal", ["target", "minus_ones"], ["is_free"]),
             helper.make_node("Where", ["is_free", "ones", "target"], ["expand_shape"]),
             helper.make_node("ReduceMean", ["x", "zero_axis"], ["mean"]),
             helper.make_node("Expand", ["mean", "expand_shape"], ["means"]),
             helper.make_node("Sub", ["x", "means"], ["y"])]
    weights = {**DIM_WEIGHTS, "rank": np.array([2]), "minus_one": np.array(-1)}
    model = make_model(nodes, [tensor("x", ["batch", 4])], [tensor("y", ["batch", 4])], weights)
    folded = fold.fold_shapes(model, {"x": (3, 4)}, {})
    expand = next(node for node in folded.proto.graph.node if node.op_type == "Expand")
    assert expand.input[1] in {tensor.name for tensor in folded.proto.graph.initializer}
    _compiled_matches(model, {"x": RNG.standard_normal((3, 4)).astype("float32")}, batch=3)


def test_bound_dims_win_over_the_files_annotations():
    """A model annotated for batch 1 (value_info, outputs) and bound to batch 3 folds its shapes for 3."""
    nodes = [helper.make_node("Relu", ["x"], ["positive"]), *_shape_dims("positive", 2),
             helper.make_node("Concat", ["d0u", "minus_one"], ["flat"], axis=0),
             helper.make_node("Reshape", ["positive", "flat"], ["y"])]
    model = make_model(nodes, [tensor("x", ["batch", 2, 3])], [tensor("y", [1, 6])],
                       {**DIM_WEIGHTS, "minus_one": np.array([-1])})
    model.graph.value_info.append(tensor("positive", [1, 2, 3]))
    x = RNG.standard_normal((3, 2, 3)).astype("float32")
    np.testing.assert_array_equal(tvmsched.compile(model, target="llvm", batch=3)(x),
                                  np.maximum(x, 0).reshape(3, 6))


def test_large_weights_are_not_copied_into_the_folder():
    """Weights over the limit stay in the model (the importer reads them there); small ones are folded."""
    big = RNG.standard_normal((128, 96)).astype("float32")
    nodes = [helper.make_node("MatMul", ["x", "big"], ["y0"]), helper.make_node("Shape", ["big"], ["shape"]),
             helper.make_node("Reshape", ["y0", "shape"], ["y"])]
    model = make_model(nodes, [tensor("x", [128, 128])], [tensor("y", [128, 96])], {"big": big})
    folded = fold.fold_shapes(model, {"x": (128, 128)}, {})
    assert big.size > fold.WEIGHT_LIMIT
    assert [tensor.name for tensor in folded.weights] == ["big"]
    assert "big" not in {tensor.name for tensor in folded.proto.graph.initializer}
    assert "big" not in {value.name for value in folded.proto.graph.input}
    assert folded.proto.ByteSize() < big.nbytes / 10
    assert not any(node.op_type == "Shape" for node in folded.proto.graph.node)
    _compiled_matches(model, {"x": RNG.standard_normal((128, 128)).astype("float32")})


def test_an_input_whose_value_decides_a_shape_is_refused_by_name():
    nodes = [helper.make_node("Relu", ["x"], ["positive"]),
             helper.make_node("Cast", ["new_shape"], ["shape64"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["positive", "shape64"], ["y"], name="reshape_2")]
    model = make_model(nodes, [tensor("x", [2, 3]), tensor("new_shape", [2], TensorProto.INT32)],
                       [tensor("y", [3, 2])], {})
    message = (r"node 'reshape_2' \(Reshape\) needs the value of its input 'shape64' .*graph input "
               r"'new_shape' is only known at run time; bind it with --constant-input new_shape=FILE.npy")
    with pytest.raises(ConstantInputRequired, match=message) as error:
        tvmsched.compile(model, target="llvm")
    assert error.value.inputs == ("new_shape",)
    x = RNG.standard_normal((2, 3)).astype("float32")
    new_shape = np.array([3, 2], "int32")
    compiled = tvmsched.compile(model, target="llvm", constant_inputs={"new_shape": new_shape})
    assert [spec.name for spec in compiled.inputs] == ["x"]
    np.testing.assert_array_equal(compiled(x), np.maximum(x, 0).reshape(3, 2))


@pytest.mark.parametrize("op, opset, attrs", [("CumProd", 26, {}), ("Trilu", 14, {"upper": 0})])
def test_an_axis_or_diagonal_given_as_an_input_is_bound_by_name(op, opset, attrs):
    """CumProd's axis and Trilu's k decide the computation, not a shape; they too are named for binding."""
    nodes = [helper.make_node(op, ["x", "k"], ["y"], name="n", **attrs)]
    model = make_model(nodes, [tensor("x", [3, 4]), tensor("k", [], TensorProto.INT64)],
                       [tensor("y", [3, 4])], {}, opset=opset)
    with pytest.raises(ConstantInputRequired, match=rf"node 'n' \({op}\) needs the value of its input 'k'"):
        tvmsched.compile(model, target="llvm")
    x, k = RNG.standard_normal((3, 4)).astype("float32"), np.array(1, "int64")
    expected = np.cumprod(x, axis=1) if op == "CumProd" else np.tril(x, 1)
    got = tvmsched.compile(model, target="llvm", constant_inputs={"k": k})(x)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_an_if_on_a_graph_input_is_bound_by_name_and_then_takes_one_branch():
    branch = {name: helper.make_graph([helper.make_node(op, ["x"], [f"{name}_y"])], name, [],
                                      [tensor(f"{name}_y", [2])])
              for name, op in (("then", "Relu"), ("else", "Neg"))}
    nodes = [helper.make_node("If", ["flag"], ["y"], name="choose", then_branch=branch["then"],
                              else_branch=branch["else"])]
    model = make_model(nodes, [tensor("x", [2]), tensor("flag", [], TensorProto.BOOL)], [tensor("y", [2])],
                       {})
    message = r"node 'choose' \(If\) needs the value of its input 'flag'"
    with pytest.raises(ConstantInputRequired, match=message):
        tvmsched.compile(model, target="llvm")
    x = np.array([-1.0, 2.0], "float32")
    for flag, expected in ((True, [0.0, 2.0]), (False, [1.0, -2.0])):
        compiled = tvmsched.compile(model, target="llvm", constant_inputs={"flag": np.array(flag)})
        np.testing.assert_array_equal(compiled(x), expected)


def test_a_shape_known_only_at_run_time_is_left_to_the_importer():
    """A Reshape whose shape reads the shape of NonZero's output (data-dependent): no input to bind."""
    nodes = [helper.make_node("NonZero", ["x"], ["where"]), helper.make_node("Shape", ["where"], ["shape"]),
             helper.make_node("Reshape", ["where", "shape"], ["y"])]
    model = make_model(nodes, [tensor("x", [4])], [tensor("y", [1, "n"], TensorProto.INT64)], {})
    fold.check_value_inputs(fold.fold_shapes(model, {"x": (4,)}, {}))
