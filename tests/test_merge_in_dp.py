"""IOS-Both inside dp (`merge_choice.chosen_in_dp`): each merge group's kernels found in the unmerged model's
graph (`merge_kernels.group_kernels`), and `--merge auto` builds scheduled by dp merging exactly the groups
dp's search ran merged. (The search itself against brute force: tests/test_schedule_dp.py.)"""

from dataclasses import replace

import pytest
from conftest import make_model, tensor
from onnx import helper
from test_merge import (
    assert_runs_as_onnxruntime,
    conv,
    conv_kernels,
    fire,
    kernel_graph,
    merged_as_kept,
    three_3x3_epilogues,
    two_groups,
    weight,
)

import tvmsched
from tvmsched import frontend
from tvmsched.api import model_proto
from tvmsched.graph import extract
from tvmsched.lower import lower
from tvmsched.merge import convolution_groups
from tvmsched.merge_choice import MergeChoice, group_modules, groups_module
from tvmsched.merge_kernels import Lowered, group_kernels
from tvmsched.rewrite import prepared
from tvmsched.target import resolve_target


def found_kernels(model, target: str, precision: str = "fp32"):
    """The groups of `model`, per group the kernels `group_kernels` finds for it in the model's graph, the
    model's graph and the lowered groups module (as `chosen_in_dp` makes them)."""
    spec = resolve_target(target)
    layout = "nhwc" if precision == "fp16" else "nchw"
    inputs = frontend.bind_input_shapes(model)
    module = frontend.to_relax(model, inputs)
    modules = group_modules(module, lambda part: prepared(part, precision, layout, spec))
    members = modules.members
    lowered = Lowered(*extract(members, [param.name for param in members.module["main"].params]))
    model = Lowered(*extract(lower(prepared(module, precision, layout, spec)),
                             [item.name for item in inputs]))
    return modules.groups, group_kernels(lowered, model), model.graph, lowered.graph


@pytest.mark.parametrize("name, target, joined",
                         [("squeezenet", "llvm", True), ("inception_v3", "cuda", False)])
def test_every_group_of_a_zoo_model_is_found_with_its_members_and_concat(name, target, joined):
    groups, found, graph, _ = found_kernels(model_proto(name, 1), target)
    assert all(found) and len(set().union(*found)) == sum(map(len, found))  # each group, none shared
    for group, kernels in zip(groups, found):
        convolutions = [kernel for kernel in kernels if "conv2d" in graph.kernels[kernel].op_kinds]
        assert len(convolutions) == len(group)
        sources = {ref.name for kernel in convolutions for ref in graph.kernels[kernel].inputs
                   if ref.kind in ("input", "kernel")}
        assert len(sources) == 1  # the members read one tensor
        # squeezenet's fire modules: the concat joining the two expands is the group's too
        concats = [kernel for kernel in kernels if graph.kernels[kernel].op_kinds == ("concatenate",)]
        assert len(concats) == joined


@pytest.mark.parametrize("model", [fire, two_groups])
def test_in_float16_channels_last_the_groups_module_holds_the_models_kernels_alone(model):
    """Without `as_computed`, each member's kernel would end with a cast back to float32 (another kernel than
    the model's) and each parameter would have a transform of its own."""
    groups, found, graph, members = found_kernels(model(), "cuda", "fp16")
    assert all(found) and len(found) == len(groups)
    convolutions = [kernel for kernel in members.kernels if "conv2d" in kernel.op_kinds]
    workloads = {kernel.workload for kernel in graph.kernels}
    assert all(kernel.workload in workloads for kernel in convolutions)
    assert len(convolutions) == sum(map(len, groups)) and all(
        output.dtype == "float16" for kernel in convolutions for output in kernel.outputs)
    assert all(kernel.inputs[0].kind == "input" for kernel in convolutions)  # no transform before them


def test_a_group_whose_results_the_model_returns_is_found_in_float16():
    """Where the model returns a member's result, its kernel ends with the cast back to float32 in the model
    too: the groups module keeps that cast."""
    groups, found, graph, _ = found_kernels(three_3x3_epilogues(), "cuda", "fp16")
    assert len(found) == 1 and found[0]
    assert {kernel.id for kernel in graph.kernels if "conv2d" in kernel.op_kinds} <= found[0]


def test_groups_of_one_shape_are_told_apart_by_their_weights():
    """Two pairs of equal 1x1 convolutions, of sigmoid(x) and of relu(x): the sigmoid's pair is the first
    group (its convolutions come first) though relu's result is computed first."""
    nodes = [helper.make_node("Relu", ["x"], ["p"]), helper.make_node("Sigmoid", ["x"], ["q"]),
             conv(["q", "w1"], "a"), conv(["q", "w2"], "b"), conv(["p", "w3"], "c"), conv(["p", "w4"], "d"),
             helper.make_node("Concat", ["a", "b", "c", "d"], ["y"], axis=1)]
    model = make_model(nodes, [tensor("x", [1, 4, 8, 8])], [tensor("y", [1, 16, 8, 8])],
                       {name: weight(4, 4, 1, 1) for name in ("w1", "w2", "w3", "w4")})
    groups, found, graph, _ = found_kernels(model, "llvm")
    assert len(groups) == 2 and all(found)
    for kernels, reads in zip(found, ("sigmoid", "relu")):
        producers = {ref.producer for kernel in kernels for ref in graph.kernels[kernel].inputs
                     if ref.kind == "kernel"}
        assert len(producers) == 1 and reads in graph.kernels[producers.pop()].op_kinds[0]


@pytest.mark.parametrize("device, pointwise_ms, window_ms, merged", [
    ("gpu", 1e-6, 1e-6, (True, True)),  # both merged: two stages of about nothing
    ("gpu", 1e-6, 3.0, (False, False)),  # the 1x1 pair alone would merge, but runs beside the 3x3 pair free
    ("gpu", 3.0, 3.0, (False, False)),
    ("cpu", 1e-6, 3.0, (True, False))])  # one kernel at a time: nothing runs beside anything
def test_dp_merges_the_groups_its_search_runs_merged(monkeypatch, device, pointwise_ms, window_ms, merged):
    """Each pair timed 2.0 ms apart and `pointwise_ms` (the 1x1 pair) or `window_ms` (the 3x3 pair) merged;
    dp weighs those against the analytic cost of the whole unmerged model: a GPU's, in which the four
    convolutions share one stage for about the cost of one, or the CPU's, which runs them in turn."""
    from tvmsched import api
    from tvmsched.cost.analytic import CPU, DeviceModel

    monkeypatch.setattr(api, "device_model", lambda kind: CPU if device == "cpu" else DeviceModel())
    model = two_groups()
    groups = convolution_groups(frontend.to_relax(model, frontend.bind_input_shapes(model)))
    pointwise = [group[0].weight.shape[2] == 1 for group in groups]

    def latencies(lowered, *args) -> tuple[float, ...]:
        if conv_kernels(kernel_graph(lowered)) == 4:
            return (2.0, 2.0)
        return tuple(pointwise_ms if one else window_ms for one in pointwise)
    monkeypatch.setattr(api, "alternative_ms", latencies)
    alone = tvmsched.compile(model, target="llvm", merge="auto")  # sequential: each group's own choice
    assert [choice.merged for choice in alone.meta.merge_choices] == [
        (pointwise_ms if one else window_ms) < 2.0 for one in pointwise]
    compiled = tvmsched.compile(model, target="llvm", merge="auto", schedule="dp")
    by_group = tuple(merged[0] if one else merged[1] for one in pointwise)
    assert tuple(choice.dp_merged for choice in compiled.meta.merge_choices) == by_group
    assert compiled.meta.merged_convolutions == (2,) * sum(by_group)
    assert conv_kernels(compiled.graph) == 4 - sum(by_group)
    assert_runs_as_onnxruntime(compiled, model)


def test_dp_weighs_the_groups_on_the_unmerged_model_timed_on_a_gpu(monkeypatch, fake_cuda, tmp_path):
    """The GPU path on the CPU (llvm kernels, a stand-in cudart): the unmerged model is built and scheduled,
    dp's search runs on its measured cost source, and every timer is closed."""
    from tvmsched import api

    monkeypatch.setenv("TVMSCHED_CACHE", str(tmp_path))
    monkeypatch.setattr(api, "on_gpu", lambda spec: True)
    model = two_groups()
    compiled = tvmsched.compile(model, target="llvm", merge="auto", schedule="dp")
    assert all(choice.dp_merged is not None for choice in compiled.meta.merge_choices)
    assert compiled.meta.merged_convolutions == merged_as_kept(compiled.meta)
    assert fake_cuda.made["graph_exec"] and fake_cuda.made == fake_cuda.destroyed
    assert_runs_as_onnxruntime(compiled, model)


def test_without_a_gpu_the_unmerged_model_weighed_by_dp_is_the_build_where_nothing_merges(monkeypatch):
    """On the CPU with dp, the unmerged model that dp's search weighs the groups in is lowered once: where
    no group merges it is the build, the same as with merge "off"."""
    from tvmsched import api

    model = two_groups()
    monkeypatch.setattr(api, "alternative_ms", lambda lowered, *args: (
        (1.0, 1.0) if conv_kernels(kernel_graph(lowered)) == 4 else (3.0, 3.0)))  # merged is slower
    lowered = []
    monkeypatch.setattr(api, "lower", lambda module: lowered.append(module) or lower(module))
    compiled = tvmsched.compile(model, target="llvm", merge="auto", schedule="dp")
    assert compiled.meta.merged_convolutions == () and len(lowered) == 1
    assert compiled.graph.hash == tvmsched.compile(model, target="llvm", schedule="dp").graph.hash
    assert_runs_as_onnxruntime(compiled, model)


def test_with_analytic_costs_on_a_gpu_the_groups_are_not_timed(monkeypatch):
    """dp's analytic stage costs and the groups' merged latencies come from one source: with cost "analytic"
    the groups are modelled, not compiled and timed, also where a GPU is present."""
    from tvmsched import api

    model = two_groups()
    module = frontend.to_relax(model, frontend.bind_input_shapes(model))
    members = lower(groups_module(module, convolution_groups(module)))
    monkeypatch.setattr(api, "on_gpu", lambda spec: True)
    monkeypatch.setattr(api, "_compiled_kernels", lambda *args: pytest.fail("compiled to be timed"))
    spec = resolve_target("llvm")
    modelled = api.alternative_ms(members, spec, [], "auto", "analytic")
    monkeypatch.undo()
    assert len(modelled) == 2 and modelled == api.alternative_ms(members, spec, [], "auto")  # no GPU


def test_choices_of_schema_1_were_the_groups_own():
    choice = MergeChoice(2, 2.0, 1.0)
    assert MergeChoice.from_json({"schema": 1, "members": 2, "members_ms": 2.0, "merged_ms": 1.0}) == choice
    assert choice.merged and MergeChoice.from_json(choice.to_json()) == choice
    assert not MergeChoice(2, 2.0, 1.0, dp_merged=False).merged


@pytest.mark.parametrize("dp_merges, times, check, kept", [
    # dp merged nothing: each group's own choice (the 1x1 pair merged) and every group merged are weighed
    ((False, False), {(2,): 1.0, (2, 2): 1.5, (): 2.0}, (("own", 1.0), ("all", 1.5), ("unmerged", 2.0)),
     (2,)),
    ((False, False), {(2,): 3.0, (2, 2): 2.5, (): 2.0}, (("own", 3.0), ("all", 2.5), ("unmerged", 2.0)),
     ()),
    ((False, False), {(2,): 1.0, (2, 2): 0.5, (): 2.0}, (("own", 1.0), ("all", 0.5), ("unmerged", 2.0)),
     (2, 2)),
    # dp merged both: that is every group, weighed once
    ((True, True), {(2, 2): 1.5, (2,): 1.0, (): 2.0}, (("dp", 1.5), ("own", 1.0), ("unmerged", 2.0)),
     (2,)),
    ((True, True), {(2, 2): 0.5, (2,): 1.0, (): 2.0}, (("dp", 0.5), ("own", 1.0), ("unmerged", 2.0)),
     (2, 2))])
def test_the_whole_model_check_weighs_dps_choice_each_groups_own_and_all(monkeypatch, fake_cuda, tmp_path,
                                                                          dp_merges, times, check, kept):
    """On a GPU, dp's choice, each group's own (`time_groups`: the 1x1 pair merged) and every group merged,
    each where it differs from those before, and the unmerged model are built and benchmarked whole; the
    fastest is kept, its meta saying what it merged, every candidate's time, and what dp's search chose."""
    from test_merge import time_groups

    from tvmsched import api

    monkeypatch.setenv("TVMSCHED_CACHE", str(tmp_path))
    monkeypatch.setattr(api, "on_gpu", lambda spec: True)
    model = two_groups()
    time_groups(monkeypatch, model)
    monkeypatch.setattr(api, "_chosen_in_dp", lambda module, choices, *args: tuple(
        replace(choice, dp_merged=merged) for choice, merged in zip(choices, dp_merges)))
    monkeypatch.setattr(api.CompiledModel, "benchmark", lambda self, *args, **kwargs: {
        "median_ms": times[self.meta.merged_convolutions]})
    compiled = tvmsched.compile(model, target="llvm", merge="auto", schedule="dp")
    assert compiled.meta.merge_check == check
    assert compiled.meta.merged_convolutions == kept
    # whatever the check kept, the choices hold dp's decisions and each group's own timing
    assert tuple(choice.dp_merged for choice in compiled.meta.merge_choices) == dp_merges
    assert [choice.faster_merged for choice in compiled.meta.merge_choices] == [False, True]  # 3x3, 1x1
    assert_runs_as_onnxruntime(compiled, model)
