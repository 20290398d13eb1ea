"""IOS-Merge of matrix products (`tvmsched.merge_products`): products of one input by constants merged into
one whose slices fuse with the reshapes after them, only the groups kept, and with merge "auto" each group
of products timed and chosen beside the groups of convolutions (`merge_choice`)."""

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import helper
from test_merge import (
    assert_runs_as_onnxruntime,
    conv,
    conv_kernels,
    kernel_graph,
    matmul_kernels,
    unmerged_graph,
    weight,
)

import tvmsched
from tvmsched import frontend
from tvmsched.graph import extract
from tvmsched.lower import lower
from tvmsched.merge_choice import MergeChoice, group_modules
from tvmsched.merge_kernels import Lowered, group_kernels
from tvmsched.merge_products import matmul_groups, merge_matmuls
from tvmsched.rewrite import prepared
from tvmsched.target import resolve_target

SEQUENCE, WIDTH, HEADS = 8, 16, 2


def attention_nodes(source: str, output: str, scaled: bool = False) -> tuple[list, dict]:
    """One self-attention of `source` (1, SEQUENCE, WIDTH) as BERT's: query, key and value projections with
    bias, each reshaped and transposed into heads (the query and key then `scaled` by the root of the
    scale, as PyTorch exports scaled dot-product attention), the scores' softmax and the heads joined
    again."""
    head = WIDTH // HEADS
    nodes, constants = [], {"heads": np.array([1, SEQUENCE, HEADS, head], "int64"),
                            "joined": np.array([1, SEQUENCE, WIDTH], "int64"),
                            "scale": np.array(head ** -0.25, "float32")}
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("MatMul", [source, f"w{name}"], [f"{name}0"]),
                  helper.make_node("Add", [f"{name}0", f"b{name}"], [f"{name}1"]),
                  helper.make_node("Reshape", [f"{name}1", "heads"], [f"{name}2"]),
                  helper.make_node("Transpose", [f"{name}2"], [f"{name}3" + "t" * (scaled and name != "v")],
                                   perm=perm)]
        if scaled and name != "v":
            nodes.append(helper.make_node("Mul", [f"{name}3t", "scale"], [f"{name}3"]))
        constants |= {f"w{name}": weight(WIDTH, WIDTH), f"b{name}": weight(WIDTH)}
    nodes += [helper.make_node("MatMul", ["q3", "k3"], ["scores"]),
              helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v3"], ["o"]),
              helper.make_node("Transpose", ["o"], ["o1"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o1", "joined"], [output])]
    return nodes, constants


def attention(scaled: bool = False, query_returned: bool = False):
    """The attention of x; with `query_returned` the model also returns the query's heads."""
    nodes, constants = attention_nodes("x", "y", scaled)
    outputs = [tensor("y", [1, SEQUENCE, WIDTH])]
    outputs += [tensor("q3", [1, HEADS, SEQUENCE, WIDTH // HEADS])] * query_returned
    return make_model(nodes, [tensor("x", [1, SEQUENCE, WIDTH])], outputs, constants)


def attention_and_gemms():
    """The attention of x, and two Gemms with bias of another input z: two groups of products."""
    nodes, constants = attention_nodes("x", "y")
    nodes += [helper.make_node("Gemm", ["z", "g1", "c1"], ["a"], transB=1),
              helper.make_node("Gemm", ["z", "g2", "c2"], ["b"])]
    constants |= {"g1": weight(6, 8), "c1": weight(6), "g2": weight(8, 4), "c2": weight(4)}
    outputs = [tensor("y", [1, SEQUENCE, WIDTH]), tensor("a", [2, 6]), tensor("b", [2, 4])]
    return make_model(nodes, [tensor("x", [1, SEQUENCE, WIDTH]), tensor("z", [2, 8])], outputs, constants)


def attention_and_convolutions():
    """The attention of x, and two 1x1 convolutions of an image concatenated: a group of each kind."""
    nodes, constants = attention_nodes("x", "y")
    nodes += [conv(["image", "w1"], "c1"), conv(["image", "w2"], "c2"),
              helper.make_node("Concat", ["c1", "c2"], ["joined_image"], axis=1)]
    constants |= {"w1": weight(8, 6, 1, 1), "w2": weight(4, 6, 1, 1)}
    return make_model(nodes, [tensor("image", [1, 6, 8, 8]), tensor("x", [1, SEQUENCE, WIDTH])],
                      [tensor("joined_image", [1, 12, 8, 8]), tensor("y", [1, SEQUENCE, WIDTH])], constants)


def relax_of(model):
    return frontend.to_relax(model, frontend.bind_input_shapes(model))


def test_projections_merged_are_one_kernel_whose_slices_fuse_with_the_reshapes_into_heads():
    model = attention()
    unmerged = unmerged_graph(model)
    compiled = tvmsched.compile(model, target="llvm", merge="all")
    assert compiled.meta.merged_matmuls == (3,)
    assert matmul_kernels(unmerged) == 5 and matmul_kernels(compiled.graph) == 3
    assert len(compiled.graph.kernels) == len(unmerged.kernels) - 2  # no kernel of its own for the split
    sliced = [kernel.op_kinds for kernel in compiled.graph.kernels if "strided_slice" in kernel.op_kinds]
    assert sliced == [("strided_slice", "reshape", "transpose")] * 3
    assert_runs_as_onnxruntime(compiled, model, ("greedy", "dp"))


@pytest.mark.parametrize("kept", [(0,), (1,), (0, 1)])
def test_only_the_kept_groups_of_products_merge(kept):
    module = relax_of(attention_and_gemms())
    assert [len(group) for group in matmul_groups(module)] == [3, 2]  # in program order
    merged, sizes = merge_matmuls(module, keep=lambda index: index in kept)
    assert sizes == tuple([3, 2][index] for index in kept)
    graph, _ = extract(lower(merged), ["x", "z"])
    assert matmul_kernels(graph) == 7 - sum(sizes) + len(sizes)
    assert merge_matmuls(module, keep=lambda index: False) == (module, ())


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("scaled, query_returned", [(False, False), (True, False), (True, True)])
def test_a_group_of_products_is_timed_with_its_biases_and_reshapes_and_found_in_the_model(precision, scaled,
                                                                                         query_returned):
    """The groups module, rewritten as the model is and as computed (`as_computed`: the transposes into heads
    are the model's own and stay), holds each product with its bias and its reshape and transpose into
    heads (and the scale after them, which FuseOps fuses with the transpose), as the model's kernels; they
    are all found in the model's graph. A head the model also returns is cast back to float32 for its output
    in a kernel of its own, after the one that computes it, as in the model."""
    model = attention(scaled, query_returned)
    module = relax_of(model)
    spec = resolve_target("llvm")
    modules = group_modules(module, lambda part: prepared(part, precision, "nchw", spec))
    assert [len(group) for group in modules.groups] == [3]
    lowered = Lowered(*extract(modules.members, ["group0"]))
    full = Lowered(*extract(lower(prepared(module, precision, "nchw", spec)), ["x"]))
    products = [kind for kind in lowered.graph.kernels if "matmul" in kind.op_kinds]
    scaled_heads = 2 * scaled  # the query's and the key's
    moves = [("reshape", "transpose", "multiply")] * scaled_heads
    moves += [("reshape", "transpose")] * (3 - scaled_heads)
    assert len(products) == 3 and sorted(kernel.op_kinds for kernel in lowered.graph.kernels
                                         if kernel not in products) == sorted(moves)
    [found] = group_kernels(lowered, full)
    assert sorted(full.graph.kernels[kernel].op_kinds for kernel in found) == sorted(
        kernel.op_kinds for kernel in lowered.graph.kernels)
    casts = [kernel for kernel in full.graph.kernels if kernel.op_kinds == ("cast",)]
    assert len(casts) == (precision == "fp16") * (1 + query_returned)  # y's, and the query heads'


def test_scaled_heads_are_sliced_in_the_kernel_that_scales_them():
    """PyTorch's export scales the query and key heads after their transposes: merged, each slice fuses with
    its reshape, transpose and scale, so merging adds no kernel."""
    model = attention(scaled=True)
    compiled = tvmsched.compile(model, target="llvm", merge="all")
    sliced = sorted(kernel.op_kinds for kernel in compiled.graph.kernels
                    if "strided_slice" in kernel.op_kinds)
    assert sliced == [("strided_slice", "reshape", "transpose")] + [
        ("strided_slice", "reshape", "transpose", "multiply")] * 2
    assert len(compiled.graph.kernels) == len(unmerged_graph(model).kernels) - 2
    assert_runs_as_onnxruntime(compiled, model, ("greedy", "dp"))


def time_groups(monkeypatch, convolutions_merged_ms: float, products_merged_ms: float) -> None:
    """`attention_and_convolutions`' groups timed 2.0 ms apart and as given merged."""
    from tvmsched import api

    def latencies(lowered, *args) -> tuple[float, ...]:
        if conv_kernels(kernel_graph(lowered)) == 2:
            return (2.0, 2.0)
        return (convolutions_merged_ms, products_merged_ms)
    monkeypatch.setattr(api, "alternative_ms", latencies)


@pytest.mark.parametrize("schedule", ["sequential", "dp"])
def test_auto_chooses_groups_of_products_beside_those_of_convolutions(monkeypatch, schedule):
    model = attention_and_convolutions()
    time_groups(monkeypatch, 3.0, 1e-6)
    compiled = tvmsched.compile(model, target="llvm", merge="auto", schedule=schedule)
    choices = compiled.meta.merge_choices
    assert [(choice.kind, choice.members, choice.merged) for choice in choices] == [
        ("conv2d", 2, False), ("matmul", 3, True)]
    assert all((choice.dp_merged is None) == (schedule == "sequential") for choice in choices)
    assert compiled.meta.merged_convolutions == () and compiled.meta.merged_matmuls == (3,)
    assert conv_kernels(compiled.graph) == 2 and matmul_kernels(compiled.graph) == 3
    assert_runs_as_onnxruntime(compiled, model)


def test_auto_keeps_products_apart_where_merged_is_slower(monkeypatch):
    model = attention_and_convolutions()
    time_groups(monkeypatch, 1.0, 3.0)
    compiled = tvmsched.compile(model, target="llvm", merge="auto")
    assert compiled.meta.merged_convolutions == (2,) and compiled.meta.merged_matmuls == ()
    assert_runs_as_onnxruntime(compiled, model)


def test_a_choice_records_its_kind():
    choice = MergeChoice(3, 2.0, 1.0, kind="matmul")
    assert MergeChoice.from_json(choice.to_json()) == choice
    before = {"schema": 2, "members": 2, "members_ms": 2.0, "merged_ms": 1.0, "dp_merged": True}
    assert MergeChoice.from_json(before) == MergeChoice(2, 2.0, 1.0, True, "conv2d")  # convolutions only
