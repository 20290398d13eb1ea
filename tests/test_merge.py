"""IOS-Merge (`tvmsched.merge`): convolutions, and matmuls, reading one tensor merged into one, on the CPU;
with merge "auto", only the groups that `tvmsched.merge_choice` finds faster merged."""

import numpy as np
import pytest
import tvm
from conftest import assert_matches, make_model, onnxruntime_outputs, tensor
from onnx import helper
from test_plan import assert_race_free
from tvm import relax

import tvmsched
from tvmsched import frontend
from tvmsched.api import ModelMeta
from tvmsched.graph import extract
from tvmsched.lower import lower
from tvmsched.merge import convolution_groups, merge_convolutions
from tvmsched.merge_choice import MODEL_OUTPUTS, MergeChoice, groups_module

RNG = np.random.default_rng(7)


def weight(*shape) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.3).astype("float32")


def conv(inputs, output, **attributes):
    return helper.make_node("Conv", inputs, [output], name=output, **attributes)


def batch_norm(channels: int) -> dict[str, np.ndarray]:
    return {"scale": weight(channels) + 1, "shift": weight(channels), "mean": weight(channels),
            "variance": np.abs(weight(channels)) + 0.5}


def two_1x1():
    """Two 1x1 convolutions of different widths, without bias, concatenated."""
    nodes = [conv(["x", "w1"], "a"), conv(["x", "w2"], "b"),
             helper.make_node("Concat", ["a", "b"], ["y"], axis=1)]
    return make_model(nodes, [tensor("x", [1, 6, 8, 8])], [tensor("y", [1, 12, 8, 8])],
                      {"w1": weight(8, 6, 1, 1), "w2": weight(4, 6, 1, 1)})


def three_3x3_epilogues():
    """Three padded 3x3 convolutions, two with a bias; a relu after one, a batch norm after another."""
    nodes = [conv(["x", "w1", "b1"], "a", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["ya"]),
             conv(["x", "w2"], "b", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["b", "scale", "shift", "mean", "variance"], ["yb"]),
             conv(["x", "w3", "b3"], "yc", pads=[1, 1, 1, 1])]
    outputs = [tensor("ya", [1, 8, 6, 6]), tensor("yb", [1, 4, 6, 6]), tensor("yc", [1, 6, 6, 6])]
    return make_model(nodes, [tensor("x", [1, 5, 6, 6])], outputs,
                      {"w1": weight(8, 5, 3, 3), "b1": weight(8), "w2": weight(4, 5, 3, 3), **batch_norm(4),
                       "w3": weight(6, 5, 3, 3), "b3": weight(6)})


def fire(stride: int = 1):
    """Squeezenet's fire module: a 1x1 and a padded 3x3 expand of one tensor, each with bias and relu,
    concatenated; the 1x1 kernel is padded into the 3x3 window."""
    nodes = [conv(["x", "w1", "b1"], "a", strides=[stride, stride]), helper.make_node("Relu", ["a"], ["ra"]),
             conv(["x", "w3", "b3"], "b", pads=[1, 1, 1, 1], strides=[stride, stride]),
             helper.make_node("Relu", ["b"], ["rb"]), helper.make_node("Concat", ["ra", "rb"], ["y"], axis=1)]
    size = 8 // stride
    return make_model(nodes, [tensor("x", [2, 4, 8, 8])], [tensor("y", [2, 16, size, size])],
                      {"w1": weight(8, 4, 1, 1), "b1": weight(8), "w3": weight(8, 4, 3, 3), "b3": weight(8)})


def shared_epilogues():
    """Two 1x1 convolutions of x with a bias, a batch norm and a relu each, then a bias over every pixel
    (not per channel); one continues into a 3x3 convolution."""
    nodes = []
    for branch in "ab":
        nodes += [conv(["x", f"w{branch}", f"b{branch}"], f"c{branch}"),
                  helper.make_node("BatchNormalization", [f"c{branch}", *(f"{name}{branch}" for name in (
                      "scale", "shift", "mean", "variance"))], [f"n{branch}"]),
                  helper.make_node("Relu", [f"n{branch}"], [f"r{branch}"]),
                  helper.make_node("Add", [f"r{branch}", f"p{branch}"], [f"e{branch}"])]
    nodes += [conv(["ea", "w3"], "ya", pads=[1, 1, 1, 1]), helper.make_node("Identity", ["eb"], ["yb"])]
    weights = {"w3": weight(3, 6, 3, 3)}
    for branch, width in (("a", 6), ("b", 4)):
        weights |= {f"w{branch}": weight(width, 5, 1, 1), f"b{branch}": weight(width),
                    f"p{branch}": weight(1, width, 6, 6),
                    **{f"{name}{branch}": value for name, value in batch_norm(width).items()}}
    outputs = [tensor("ya", [1, 3, 6, 6]), tensor("yb", [1, 4, 6, 6])]
    return make_model(nodes, [tensor("x", [1, 5, 6, 6])], outputs, weights)


MERGED = {"two_1x1": (two_1x1, (2,)), "three_3x3_epilogues": (three_3x3_epilogues, (3,)),
          "fire": (fire, (2,)), "fire_stride_2": (lambda: fire(stride=2), (2,)),
          "shared_epilogues": (shared_epilogues, (2,))}


def pair(first: dict, second: dict, kernel: int, sizes: tuple[int, int]):
    """Two convolutions of x (1x4x8x8) with the given attributes into ya and yb, of these output sizes."""
    nodes = [conv(["x", "w1"], "ya", **first), conv(["x", "w2"], "yb", **second)]
    outputs = [tensor(name, [1, 4, size, size]) for name, size in zip(("ya", "yb"), sizes)]
    return make_model(nodes, [tensor("x", [1, 4, 8, 8])], outputs,
                      {"w1": weight(4, 4, kernel, kernel), "w2": weight(4, 4, kernel, kernel)})


def different_strides():
    return pair({"pads": [1, 1, 1, 1]}, {"pads": [1, 1, 1, 1], "strides": [2, 2]}, kernel=3, sizes=(8, 4))


def weight_is_input():
    nodes = [conv(["x", "w1"], "ya"), conv(["x", "w2"], "yb")]
    return make_model(nodes, [tensor("x", [1, 4, 8, 8]), tensor("w2", [4, 4, 1, 1])],
                      [tensor("ya", [1, 4, 8, 8]), tensor("yb", [1, 4, 8, 8])], {"w1": weight(4, 4, 1, 1)})


def dependent():
    """The second convolution reads the first's relu: same shapes and attributes, another tensor."""
    nodes = [conv(["x", "w1"], "a"), helper.make_node("Relu", ["a"], ["ra"]), conv(["ra", "w2"], "y")]
    return make_model(nodes, [tensor("x", [1, 4, 8, 8])], [tensor("y", [1, 4, 8, 8])],
                      {"w1": weight(4, 4, 1, 1), "w2": weight(4, 4, 1, 1)})


def shifted_windows():
    """Two 3x3 convolutions of one output size whose windows are one row apart: a 4x4 kernel would cover
    both, a 3x3 cannot."""
    return pair({"pads": [1, 1, 1, 1]}, {"pads": [0, 1, 2, 1]}, kernel=3, sizes=(8, 8))


def crossed_kernels():
    """A 1x3 and a 3x1 convolution, each padded to keep the size: both fit a 3x3 window, neither's kernel."""
    nodes = [conv(["x", "w1"], "ya", pads=[0, 1, 0, 1]), conv(["x", "w2"], "yb", pads=[1, 0, 1, 0])]
    outputs = [tensor("ya", [1, 4, 8, 8]), tensor("yb", [1, 4, 8, 8])]
    return make_model(nodes, [tensor("x", [1, 4, 8, 8])], outputs,
                      {"w1": weight(4, 4, 1, 3), "w2": weight(4, 4, 3, 1)})


NOT_MERGED = {"different_strides": different_strides, "weight_is_input": weight_is_input,
              "dependent": dependent, "shifted_windows": shifted_windows, "crossed_kernels": crossed_kernels}


def projections():
    """Three products of one (1, 4, 8) input, as BERT's query, key and value: with bias, with bias and
    relu, alone; added up."""
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("Add", ["q", "bq"], ["qb"]),
             helper.make_node("MatMul", ["x", "wk"], ["k"]), helper.make_node("Add", ["k", "bk"], ["kb"]),
             helper.make_node("Relu", ["kb"], ["kr"]), helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("Add", ["qb", "kr"], ["qk"]), helper.make_node("Add", ["qk", "v"], ["y"])]
    return make_model(nodes, [tensor("x", [1, 4, 8])], [tensor("y", [1, 4, 6])],
                      {"wq": weight(8, 6), "bq": weight(6), "wk": weight(8, 6), "bk": weight(6),
                       "wv": weight(8, 6)})


def gemms(third_weight_is_input: bool = False):
    """Two Gemms of one input with bias, one with a transposed weight; optionally a MatMul of the same input
    by a weight that is a graph input, which stays apart while the Gemms merge."""
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["a"], transB=1),
             helper.make_node("Gemm", ["x", "w2", "b2"], ["b"])]
    inputs, outputs = [tensor("x", [2, 8])], [tensor("a", [2, 6]), tensor("b", [2, 4])]
    if third_weight_is_input:
        nodes.append(helper.make_node("MatMul", ["x", "w3"], ["c"]))
        inputs.append(tensor("w3", [8, 3]))
        outputs.append(tensor("c", [2, 3]))
    return make_model(nodes, inputs, outputs, {"w1": weight(6, 8), "b1": weight(6), "w2": weight(8, 4),
                                               "b2": weight(4)})


def conv_kernels(graph) -> int:
    return sum("conv2d" in kernel.op_kinds for kernel in graph.kernels)


def matmul_kernels(graph) -> int:
    return sum("matmul" in kernel.op_kinds for kernel in graph.kernels)


def kernel_graph(lowered):
    """The kernel graph of a lowered module whose inputs are its `main`'s parameters (a side of
    `merge_choice.GroupModules`)."""
    return extract(lowered, [param.name for param in lowered.module["main"].params])[0]


def unmerged_graph(model):
    inputs = frontend.bind_input_shapes(model)
    return extract(lower(frontend.to_relax(model, inputs)), [spec.name for spec in inputs])[0]


def random_inputs(model) -> dict[str, np.ndarray]:
    return {value.name: RNG.standard_normal([dim.dim_value for dim in value.type.tensor_type.shape.dim])
            .astype("float32") for value in model.graph.input}


def assert_runs_as_onnxruntime(compiled, model, schedules=("dp",)) -> None:
    """`compiled` computes what onnxruntime computes for `model`, also under `schedules` (race-free)."""
    inputs = random_inputs(model)
    expected = onnxruntime_outputs(model, inputs)
    assert_matches(compiled.run(inputs), expected)
    for schedule in schedules:
        rescheduled = compiled.reschedule(schedule, cost="analytic")
        assert_race_free(rescheduled.graph, rescheduled.plan)
        assert_matches(rescheduled.run(inputs), expected)


@pytest.mark.parametrize("name", MERGED)
def test_merged_convolutions_match_onnxruntime(name):
    make, groups = MERGED[name]
    model = make()
    compiled = tvmsched.compile(model, target="llvm", merge="all")
    assert compiled.meta.merge == "all" and compiled.meta.merged_convolutions == groups
    assert conv_kernels(compiled.graph) == conv_kernels(unmerged_graph(model)) - sum(groups) + len(groups)
    assert_runs_as_onnxruntime(compiled, model, ("greedy", "dp"))


@pytest.mark.parametrize("name", NOT_MERGED)
def test_convolutions_that_must_not_merge(name):
    model = NOT_MERGED[name]()
    compiled = tvmsched.compile(model, target="llvm", merge="all")
    assert compiled.meta.merge == "all" and compiled.meta.merged_convolutions == ()
    assert conv_kernels(compiled.graph) == conv_kernels(unmerged_graph(model)) == 2
    inputs = random_inputs(model)
    assert_matches(compiled.run(inputs), onnxruntime_outputs(model, inputs))


@pytest.mark.parametrize("make, groups, kernels", [(projections, (3,), 3), (gemms, (2,), 2),
                                                    (lambda: gemms(third_weight_is_input=True), (2,), 3)])
def test_matmuls_by_constants_of_one_input_merge(make, groups, kernels):
    model = make()
    compiled = tvmsched.compile(model, target="llvm", merge="all")
    assert compiled.meta.merged_matmuls == groups
    assert matmul_kernels(unmerged_graph(model)) == kernels
    assert matmul_kernels(compiled.graph) == kernels - sum(groups) + len(groups)
    assert_runs_as_onnxruntime(compiled, model)


def test_merge_is_off_by_default():
    compiled = tvmsched.compile(two_1x1(), target="llvm")
    assert compiled.meta.merge == "off" and conv_kernels(compiled.graph) == 2


def test_saved_build_records_merge(tmp_path):
    tvmsched.compile(fire(), target="llvm", merge="all").save(tmp_path / "build")
    loaded = tvmsched.load(tmp_path / "build")
    assert loaded.meta.merge == "all" and loaded.meta.merged_convolutions == (2,)


@pytest.mark.slow
def test_squeezenet_merged_matches_unmerged():
    unmerged = tvmsched.compile("squeezenet", target="llvm", batch=1)
    merged = tvmsched.compile("squeezenet", target="llvm", batch=1, merge="all")
    assert merged.meta.merged_convolutions == (2,) * 8  # every fire module's two expands
    assert conv_kernels(merged.graph) == conv_kernels(unmerged.graph) - 8
    assert len(merged.graph.kernels) == len(unmerged.graph.kernels) - 16  # a fire module is one kernel, not 3
    inputs = unmerged.random_inputs()
    assert_matches(merged.run(inputs), unmerged.run(inputs))


def two_groups():
    """Two groups: two 1x1 convolutions of x, and two padded 3x3 ones of relu(x), each pair concatenated."""
    nodes = [conv(["x", "w1"], "a"), conv(["x", "w2"], "b"), helper.make_node("Relu", ["x"], ["r"]),
             conv(["r", "w3", "b3"], "c", pads=[1, 1, 1, 1]), conv(["r", "w4"], "d", pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b", "c", "d"], ["y"], axis=1)]
    return make_model(nodes, [tensor("x", [1, 6, 8, 8])], [tensor("y", [1, 20, 8, 8])],
                      {"w1": weight(8, 6, 1, 1), "w2": weight(4, 6, 1, 1), "w3": weight(5, 6, 3, 3),
                       "b3": weight(5), "w4": weight(3, 6, 3, 3)})


def test_groups_module_keeps_each_member_with_the_epilogue_it_fuses_with():
    model = three_3x3_epilogues()
    module = frontend.to_relax(model, frontend.bind_input_shapes(model))
    groups = convolution_groups(module)
    graph, _ = extract(lower(groups_module(module, groups)), ["group0"])
    full = unmerged_graph(model)
    # the members' kernels are the model's convolution kernels, epilogues fused: their tuning records apply
    assert sorted(kernel.workload for kernel in graph.kernels) == sorted(
        kernel.workload for kernel in full.kernels if "conv2d" in kernel.op_kinds)
    assert [tuple(output.shape) for output in graph.outputs] == [(1, 8, 6, 6), (1, 4, 6, 6), (1, 6, 6, 6)]


def test_groups_are_costed_apart_each_on_a_parameter_of_its_own():
    model = two_groups()
    module = frontend.to_relax(model, frontend.bind_input_shapes(model))
    groups = convolution_groups(module)
    members = groups_module(module, groups)
    merged, sizes = merge_convolutions(members)
    assert sizes == (2, 2)
    for part in (members, merged):
        graph, _ = extract(lower(part), ["group0", "group1"])
        first, second = graph.reading("group0"), graph.reading("group1")
        assert first and second and not set(first) & set(second)
        assert sorted(first + second) == [kernel.id for kernel in graph.kernels]


def time_groups(monkeypatch, model) -> None:
    """The choice's group timings for `two_groups()`: merging the 1x1 pair pays, merging the 3x3 pair does
    not."""
    from tvmsched import api

    groups = convolution_groups(frontend.to_relax(model, frontend.bind_input_shapes(model)))
    pointwise = [group[0].weight.shape[2] == 1 for group in groups]

    def latencies(lowered, *args) -> tuple[float, ...]:
        merged = conv_kernels(kernel_graph(lowered)) == 2
        return tuple((1.0 if merged else 2.0) if one else (3.0 if merged else 2.0) for one in pointwise)
    monkeypatch.setattr(api, "alternative_ms", latencies)


def test_auto_merges_the_groups_whose_merged_module_is_faster(monkeypatch):
    model = two_groups()
    time_groups(monkeypatch, model)
    compiled = tvmsched.compile(model, target="llvm", merge="auto")
    assert set(compiled.meta.merge_choices) == {MergeChoice(2, 2.0, 1.0), MergeChoice(2, 2.0, 3.0)}
    assert compiled.meta.merged_convolutions == (2,)
    assert conv_kernels(compiled.graph) == 3
    assert any(kernel.outputs[0].shape[1] == 12 for kernel in compiled.graph.kernels  # the 1x1 pair's
               if "conv2d" in kernel.op_kinds)
    assert_runs_as_onnxruntime(compiled, model)


def assert_two_choices_made(meta) -> tuple[MergeChoice, ...]:
    """`meta` (of `two_groups` built with merge "auto") holds two timed choices and merged as they say."""
    choices = meta.merge_choices
    assert len(choices) == 2 and all(choice.members_ms > 0 and choice.merged_ms > 0 for choice in choices)
    assert meta.merged_convolutions == merged_as_kept(meta)
    return choices


def merged_as_kept(meta) -> tuple[int, ...]:
    """The sizes of the groups of convolutions (`merged_convolutions`) a `--merge auto` build merges by its
    choices: as dp's search chose (each group's own choice where it did not weigh the group), or where its
    whole-model check kept another candidate (on a GPU), as that one merges."""
    kept = min(meta.merge_check, key=lambda pair: pair[1])[0] if meta.merge_check else "dp"
    merges = {"dp": lambda choice: choice.merged, "own": lambda choice: choice.faster_merged,
              "all": lambda choice: True, "unmerged": lambda choice: False}[kept]
    return tuple(choice.members for choice in meta.merge_choices
                 if choice.kind == "conv2d" and merges(choice))


def test_auto_without_a_gpu_chooses_by_the_analytic_cost_and_the_build_records_it(tmp_path):
    model = two_groups()
    compiled = tvmsched.compile(model, target="llvm", merge="auto")
    choices = assert_two_choices_made(compiled.meta)
    inputs = random_inputs(model)
    assert_matches(compiled.run(inputs), onnxruntime_outputs(model, inputs))
    compiled.save(tmp_path / "build")
    loaded = tvmsched.load(tmp_path / "build")
    assert loaded.meta.merge == "auto" and loaded.meta.merge_choices == choices


def test_merge_true_and_false_are_all_and_off():
    assert tvmsched.compile(fire(), target="llvm", merge=True).meta.merged_convolutions == (2,)
    assert tvmsched.compile(fire(), target="llvm", merge=False).meta.merge == "off"


def test_builds_before_merge_modes_load_with_theirs():
    meta = tvmsched.compile(two_1x1(), target="llvm").meta.to_json()
    for recorded, mode in ((True, "all"), (False, "off")):
        assert ModelMeta.from_json({**meta, "merge": recorded}).merge == mode
    # a whole-model check recorded (merged ms, unmerged ms) before the candidates had names
    assert ModelMeta.from_json({**meta, "merge_check": [1.5, 2.0]}).merge_check == (("merged", 1.5),
                                                                                   ("unmerged", 2.0))


def merged_main(model) -> str:
    module = frontend.to_relax(model, frontend.bind_input_shapes(model))
    return merge_convolutions(module)[0]["main"].script(show_meta=False)


def test_shared_epilogue_steps_merge_with_the_convolution_until_they_differ():
    # the bias, batch norm and relu are per channel in both branches: one of each, over 10 channels; the
    # per-pixel add is not per channel, so each branch adds its own on its slice
    text = merged_main(shared_epilogues())
    assert text.count("R.nn.conv2d(") == 2 and text.count("R.nn.batch_norm(") == 1
    assert text.count("R.nn.relu(") == 1 and text.count("R.strided_slice(") == 2
    assert "R.Tensor((1, 10, 6, 6)" in text.split("R.nn.batch_norm(")[0].rsplit("\n", 1)[-1]


def test_a_fire_module_merged_is_one_kernel_whose_result_is_the_concat():
    model = fire()
    compiled = tvmsched.compile(model, target="llvm", merge="all")
    assert [kernel.op_kinds for kernel in compiled.graph.kernels] == [("conv2d", "add", "relu")]
    assert "R.concat(" not in merged_main(model)
    module = frontend.to_relax(model, frontend.bind_input_shapes(model))
    members = groups_module(module, convolution_groups(module))
    graph, _ = extract(lower(members), ["group0"])  # the concat that joins the group's results is costed too
    assert [tuple(output.shape) for output in graph.outputs] == [(2, 16, 8, 8)] and len(graph.kernels) == 3


def test_an_epilogue_constant_that_adds_axes_stays_per_member():
    """ONNX broadcasting: a result plus a rank-5 constant is 5-D, where channels are no longer axis 1."""
    nodes = [conv(["x", "w1"], "a"), helper.make_node("Add", ["a", "k1"], ["ya"]),
             conv(["x", "w2"], "b"), helper.make_node("Add", ["b", "k2"], ["yb"])]
    model = make_model(nodes, [tensor("x", [1, 4, 6, 6])],
                       [tensor("ya", [1, 1, 3, 6, 6]), tensor("yb", [1, 1, 5, 6, 6])],
                       {"w1": weight(3, 4, 1, 1), "w2": weight(5, 4, 1, 1), "k1": weight(1, 1, 3, 1, 1),
                        "k2": weight(1, 1, 5, 1, 1)})
    compiled = tvmsched.compile(model, target="llvm", merge="all")
    assert compiled.meta.merged_convolutions == (2,)
    assert_runs_as_onnxruntime(compiled, model)


def relax_pair(epilogue) -> tvm.IRModule:
    """Two 1x1 convolutions of x (3 and 5 channels), each followed by `epilogue(builder, conv)`, which
    returns what the function outputs of that branch."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 6, 6), "float32"))
    with builder.function("main", [x], attrs={"num_input": 1}):
        with builder.dataflow():
            outputs = []
            for channels in (3, 5):
                convolution = builder.emit(relax.op.nn.conv2d(x, relax.const(weight(channels, 4, 1, 1))))
                outputs += epilogue(builder, convolution, channels)
            output = builder.emit_output(relax.Tuple(outputs))
        builder.emit_func_output(output)
    return builder.get()


def test_a_dead_user_of_a_merged_variable_is_dropped_with_it():
    def epilogue(builder, convolution, channels):
        builder.emit(relax.op.sigmoid(convolution))  # dead: nothing uses it
        return [builder.emit(relax.op.nn.relu(convolution))]
    merged, sizes = merge_convolutions(relax_pair(epilogue))
    assert sizes == (2,) and not relax.analysis.free_vars(merged["main"])
    assert merged["main"].script(show_meta=False).count("R.nn.relu(") == 1


def test_a_batch_norm_whose_statistics_are_used_merges_no_further_than_the_convolution():
    def epilogue(builder, convolution, channels):
        ones = relax.const(np.ones(channels, "float32"))
        normed = builder.emit(relax.op.nn.batch_norm(convolution, ones, ones, ones, ones, axis=1))
        return [builder.emit(relax.TupleGetItem(normed, 0)), builder.emit(relax.TupleGetItem(normed, 1))]
    merged, sizes = merge_convolutions(relax_pair(epilogue))
    assert sizes == (2,) and merged["main"].script(show_meta=False).count("R.nn.batch_norm(") == 2
    graph, _ = extract(lower(merged), ["x"])
    assert [tuple(output.shape) for output in graph.outputs] == [(1, 3, 6, 6), (3,), (1, 5, 6, 6), (5,)]


@pytest.mark.parametrize("read_through", ["nothing", "alias", "tuple"])
def test_the_groups_module_records_the_results_that_the_model_only_returns(read_through):
    """Their output cast fuses into their kernel in the model, so it is timed with them; a result that a
    kernel also reads, even through an alias or a tuple that the model returns, gets that cast in a kernel
    of its own."""
    def epilogue(builder, convolution, channels):
        result = builder.emit(relax.op.nn.relu(convolution))
        if read_through == "nothing":
            return [result]
        passed = builder.emit(result if read_through == "alias" else relax.Tuple([result]))
        read = passed if read_through == "alias" else builder.emit(relax.TupleGetItem(passed, 0))
        return [passed, builder.emit(relax.op.add(read, read))]
    module = relax_pair(epilogue)
    returned = groups_module(module, convolution_groups(module))["main"].attrs[MODEL_OUTPUTS]
    assert list(returned) == ([0, 1] if read_through == "nothing" else [])


def test_auto_on_a_gpu_times_each_group_in_the_two_modules(monkeypatch, fake_cuda, tmp_path):
    """The GPU path of the choice on the CPU: llvm kernels, a CPU device passing for the GPU and a stand-in
    cudart: each side is compiled, timed per group by dp's stages, and its timer closed."""
    from tvmsched import api

    monkeypatch.setenv("TVMSCHED_CACHE", str(tmp_path))
    monkeypatch.setattr(api, "on_gpu", lambda spec: True)
    model = two_groups()
    compiled = tvmsched.compile(model, target="llvm", merge="auto")
    choices = assert_two_choices_made(compiled.meta)
    # every side is one stage as dp runs it, each timed alike by the stand-in: a tie keeps a group apart
    assert len({choice.members_ms for choice in choices} | {choice.merged_ms for choice in choices}) == 1
    assert compiled.meta.merged_convolutions == ()
    assert fake_cuda.made["graph_exec"] and fake_cuda.made == fake_cuda.destroyed
    assert_runs_as_onnxruntime(compiled, model)


@pytest.mark.parametrize("merged_ms, plain_ms", [(1.0, 2.0), (2.0, 1.0)])
def test_auto_keeps_the_merged_model_only_where_its_whole_plan_is_faster(monkeypatch, fake_cuda, tmp_path,
                                                                         merged_ms, plain_ms):
    """On a GPU, a build that merged some groups is checked whole: the merged, the all-merged and the
    unmerged model are built, scheduled and benchmarked, and the fastest is kept, with every time in its
    meta."""
    from tvmsched import api

    monkeypatch.setenv("TVMSCHED_CACHE", str(tmp_path))
    monkeypatch.setattr(api, "on_gpu", lambda spec: True)
    model = two_groups()
    time_groups(monkeypatch, model)
    times = {(2,): merged_ms, (2, 2): merged_ms + 1.0, (): plain_ms}
    monkeypatch.setattr(api.CompiledModel, "benchmark", lambda self, *args, **kwargs: {
        "median_ms": times[self.meta.merged_convolutions]})
    compiled = tvmsched.compile(model, target="llvm", merge="auto", schedule="greedy")
    assert compiled.meta.merge_check == (("own", merged_ms), ("all", merged_ms + 1.0), ("unmerged", plain_ms))
    assert compiled.meta.merged_convolutions == ((2,) if merged_ms < plain_ms else ())
    assert conv_kernels(compiled.graph) == (3 if merged_ms < plain_ms else 4)
    assert len(compiled.meta.merge_choices) == 2 and compiled.meta.merge == "auto"
    assert_runs_as_onnxruntime(compiled, model)
    loaded = tvmsched.load(compiled.save(tmp_path / "build"))
    assert loaded.meta == compiled.meta
