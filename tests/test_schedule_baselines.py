"""The Nimble and Opara baselines: valid race-free plans, Nimble's minimum path cover against brute force,
one stream per chain, and Opara's alternating heavy/light launch order."""

import itertools

import pytest
from synthetic import random_graph
from test_plan import assert_race_free

from tvmsched.cost import StageCost
from tvmsched.cost.analytic import AnalyticCost
from tvmsched.graph import Kernel, KernelGraph, TensorRef
from tvmsched.plan import make_plan
from tvmsched.schedule import create_scheduler

UNLIMITED = 10**6


def hand_graph(producers: list[tuple[int, ...]], flops: list[int] | None = None) -> KernelGraph:
    """Kernel i reads the outputs of kernels producers[i] (the graph input if none) and does flops[i]."""
    graph_input = TensorRef("input", (4,), "float32", "input")
    outputs = [TensorRef(f"k{kernel}", (16,), "float32", "kernel", kernel)
               for kernel in range(len(producers))]
    kernels = []
    for kernel, reads in enumerate(producers):
        inputs = tuple(outputs[producer] for producer in reads) or (graph_input,)
        kernels.append(Kernel(kernel, f"f{kernel}", "0", inputs, (outputs[kernel],),
                              flops[kernel] if flops else 0, 64 * (1 + len(inputs)), ("synthetic",)))
    read = {producer for reads in producers for producer in reads}
    sinks = tuple(outputs[kernel] for kernel in range(len(producers)) if kernel not in read)
    return KernelGraph(tuple(kernels), (graph_input,), sinks, ())


def run(name: str, graph: KernelGraph, max_streams: int, cost: StageCost | None = None):
    return create_scheduler(name, max_streams=max_streams).schedule(graph, cost or AnalyticCost(graph))


def brute_force_path_cover(graph: KernelGraph) -> int:
    """Kernels minus the most edges that form vertex-disjoint paths: every way of picking at most one
    successor per kernel, keeping those where no kernel is picked twice."""
    successors = [[] for _ in graph.kernels]
    for consumer in graph.kernels:
        for producer in graph.dependencies(consumer.id):
            successors[producer].append(consumer.id)
    choices = [[None, *targets] for targets in successors]
    most = 0
    for picks in itertools.product(*choices):
        chosen = [pick for pick in picks if pick is not None]
        if len(chosen) == len(set(chosen)):
            most = max(most, len(chosen))
    return len(graph.kernels) - most


@pytest.mark.parametrize("name", ["nimble", "opara"])
@pytest.mark.parametrize("max_streams", [1, 2, 8])
@pytest.mark.parametrize("seed", range(6))
def test_valid_race_free_plans(name, max_streams, seed):
    graph = random_graph(num_kernels=5 + 4 * seed, seed=seed)
    schedule = run(name, graph, max_streams)
    kernels = [kernel for kernel, _ in schedule.order]
    assert sorted(kernels) == list(range(len(graph.kernels)))
    position = {kernel: index for index, kernel in enumerate(kernels)}
    for kernel in graph.kernels:
        assert all(position[producer] < position[kernel.id] for producer in graph.dependencies(kernel.id))
    streams = {stream for _, stream in schedule.order}
    assert streams == set(range(len(streams))) and len(streams) <= max_streams
    assert schedule.stages is None and schedule.stats["streams"] == len(streams)
    assert_race_free(graph, make_plan(graph, list(schedule.order), name))


@pytest.mark.parametrize("seed", range(12))
def test_nimble_streams_are_a_minimum_path_cover(seed):
    graph = random_graph(num_kernels=3 + seed % 6, seed=100 + seed)
    schedule = run("nimble", graph, UNLIMITED)
    assert schedule.stats["chains"] == schedule.stats["streams"] == brute_force_path_cover(graph)
    for stream in range(schedule.stats["streams"]):
        path = [kernel for kernel, on in schedule.order if on == stream]
        assert all(first in graph.dependencies(second) for first, second in itertools.pairwise(path))


def test_nimble_merges_chains_beyond_max_streams():
    graph = random_graph(num_kernels=30, seed=3)
    chains = run("nimble", graph, UNLIMITED).stats["chains"]
    schedule = run("nimble", graph, 2)
    assert chains > 2 and schedule.stats == {"chains": chains, "streams": 2}


@pytest.mark.parametrize("name", ["nimble", "opara"])
def test_a_single_chain_uses_one_stream(name):
    graph = hand_graph([()] + [(kernel,) for kernel in range(5)])
    assert {stream for _, stream in run(name, graph, 8).order} == {0}


def test_nimble_puts_each_independent_chain_on_its_own_stream():
    chains = [[0, 3, 5, 8], [1, 4], [2, 6, 7]]
    producers: list[tuple[int, ...]] = [()] * 9
    for chain in chains:
        for first, second in itertools.pairwise(chain):
            producers[second] = (first,)
    schedule = run("nimble", hand_graph(producers), 8)
    stream_of = dict(schedule.order)
    assert schedule.stats == {"chains": 3, "streams": 3}
    streams = [{stream_of[kernel] for kernel in chain} for chain in chains]
    assert streams == [{0}, {1}, {2}]


class FlopsCost(StageCost):
    """A cost source without utilization: time proportional to FLOPs, concurrent groups add up."""

    def stage_latency(self, groups):
        return sum(self.graph.kernels[kernel].flops * 1e-9 for group in groups for kernel in group)


@pytest.mark.parametrize("cost_source", [AnalyticCost, FlopsCost])
def test_opara_interleaves_heavy_and_light_kernels(cost_source):
    graph = hand_graph([(), (), (), ()], flops=[10**9, 10**6, 10**11, 10**8])
    order = [kernel for kernel, _ in run("opara", graph, 8, cost_source(graph)).order]
    assert order == [2, 1, 0, 3]
