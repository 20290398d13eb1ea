"""ExecutionPlan waits and buffer plan, checked against a brute-force race checker on random DAGs and
random stream assignments, and the stream assigners' plans."""

import itertools
import random
from dataclasses import replace

import pytest
from synthetic import random_graph, random_order

from tvmsched.cost.analytic import AnalyticCost
from tvmsched.errors import GraphError
from tvmsched.memory import MemoryPlan
from tvmsched.plan import HappensBefore, make_plan
from tvmsched.schedule import SCHEDULERS, create_scheduler


def closure(plan) -> set[tuple[int, int]]:
    """All (a, b) with a complete before b starts: stream order plus waits, transitively (brute force)."""
    edges = set()
    last_on_stream = {}
    for launch in plan.launches:
        if launch.stream in last_on_stream:
            edges.add((last_on_stream[launch.stream], launch.kernel))
        last_on_stream[launch.stream] = launch.kernel
        edges.update((producer, launch.kernel) for producer in launch.waits)
    kernels = [launch.kernel for launch in plan.launches]
    reach = {kernel: {b for a, b in edges if a == kernel} for kernel in kernels}
    for middle, first in itertools.product(kernels, kernels):  # Floyd–Warshall, middle loop outermost
        if middle in reach[first]:
            reach[first] |= reach[middle]
    return {(a, b) for a in kernels for b in reach[a]}


def assert_race_free(graph, plan) -> None:
    ordered = closure(plan)
    for kernel in graph.kernels:
        for producer in graph.dependencies(kernel.id):
            assert (producer, kernel.id) in ordered, f"kernel {kernel.id} may read {producer} early"
    users = {}
    for kernel in graph.kernels:
        for tensor in kernel.written:  # outputs and workspace
            users.setdefault(tensor.name, set()).add(kernel.id)
        for tensor in kernel.inputs:
            users.setdefault(tensor.name, set()).add(kernel.id)
    writer = {tensor.name: kernel.id for kernel in graph.kernels for tensor in kernel.written}
    by_buffer = {}
    for name, buffer in plan.memory.tensor_buffers.items():
        by_buffer.setdefault(buffer, []).append(name)
    outputs = {tensor.name for tensor in graph.outputs}
    for names in by_buffer.values():
        assert len(names) == 1 or not outputs & set(names), "a graph output shares its buffer"
        for first, second in itertools.combinations(names, 2):
            before = all((user, writer[second]) in ordered for user in users[first])
            after = all((user, writer[first]) in ordered for user in users[second])
            assert before or after, f"'{first}' and '{second}' share a buffer while both may be live"


@pytest.mark.parametrize("seed", range(60))
def test_random_plans_are_race_free(seed):
    graph = random_graph(num_kernels=4 + seed % 17, seed=seed)
    plan = make_plan(graph, random_order(graph, num_streams=1 + seed % 4, seed=seed + 1000), "random")
    assert_race_free(graph, plan)


@pytest.mark.parametrize("seed", range(20))
def test_random_plans_with_workspace_tensors_are_race_free(seed):
    """Workspace tensors (scratch only their kernel uses) take buffers like outputs that nothing reads."""
    graph = random_graph(num_kernels=12 + seed % 9, seed=seed)
    graph = graph.with_workspace({kernel.symbol: (((8 + kernel.id,), "float32"),) * (1 + kernel.id % 2)
                                  for kernel in graph.kernels if kernel.id % 3 == 0})
    assert sum(len(kernel.workspace) for kernel in graph.kernels) > 0
    plan = make_plan(graph, random_order(graph, num_streams=1 + seed % 4, seed=seed + 2000), "random")
    assert_race_free(graph, plan)
    assert {tensor.name for kernel in graph.kernels for tensor in kernel.workspace} <= set(
        plan.memory.tensor_buffers)


@pytest.mark.parametrize("seed", range(10))
def test_every_wait_is_needed(seed):
    graph = random_graph(num_kernels=20, seed=seed)
    plan = make_plan(graph, random_order(graph, 3, seed=seed), "random")
    assert any(launch.waits for launch in plan.launches)
    for position, launch in enumerate(plan.launches):
        for producer in launch.waits:
            fewer = replace(launch, waits=tuple(p for p in launch.waits if p != producer))
            launches = list(plan.launches)
            launches[position] = fewer
            broken = replace(plan, launches=tuple(launches))
            with pytest.raises(GraphError, match="without waiting"):
                broken.validate(graph)
            with pytest.raises(AssertionError):
                assert_race_free(graph, broken)


def test_a_plan_waiting_for_a_later_launch_is_refused_by_name():
    graph = random_graph(num_kernels=8, seed=3)
    plan = make_plan(graph, random_order(graph, 2, seed=3), "random")
    first, *rest = plan.launches
    broken = replace(plan, launches=(replace(first, waits=(rest[-1].kernel,)), *rest))
    with pytest.raises(GraphError, match=f"waiting for kernel {rest[-1].kernel}, which is not launched"):
        broken.validate(graph)


def test_checkers_catch_a_shared_buffer():
    graph = random_graph(num_kernels=20, seed=2)
    plan = make_plan(graph, random_order(graph, 3, seed=2), "random")
    outputs = {tensor.name for tensor in graph.outputs}
    buffers = {name: 0 if name not in outputs else 1 + index
               for index, name in enumerate(plan.memory.tensor_buffers)}
    size = max(plan.memory.buffer_sizes)
    shared = MemoryPlan((size,) * (1 + len(buffers)), buffers)
    with pytest.raises(GraphError, match="share buffer"):
        shared.validate(graph, HappensBefore(plan.launches))
    with pytest.raises(AssertionError):
        assert_race_free(graph, replace(plan, memory=shared))


def test_the_buffer_check_agrees_with_brute_force_where_a_tensor_moved_buffer():
    """validate (each tenant against the next in issue order) refuses exactly the buffer plans in which
    some pair of tenants may be live at once: plans with one tensor moved to another buffer, some racy."""
    outcomes = []
    for seed in range(60):
        rng = random.Random(seed)
        graph = random_graph(num_kernels=6 + seed % 12, seed=seed)
        plan = make_plan(graph, random_order(graph, num_streams=1 + seed % 3, seed=seed + 3000), "random")
        outputs = {tensor.name for tensor in graph.outputs}
        buffers = dict(plan.memory.tensor_buffers)
        movable = sorted(name for name in buffers if name not in outputs)
        buffers[rng.choice(movable)] = rng.choice(sorted({buffers[name] for name in movable}))
        memory = MemoryPlan((max(plan.memory.buffer_sizes),) * len(plan.memory.buffer_sizes), buffers)
        try:
            assert_race_free(graph, replace(plan, memory=memory))
            racy = False
        except AssertionError:
            racy = True
        try:
            memory.validate(graph, HappensBefore(plan.launches))
            refused = False
        except GraphError as error:
            assert "share buffer" in str(error)
            refused = True
        assert refused == racy, f"seed {seed}"
        outcomes.append(racy)
    assert 5 <= sum(outcomes) <= len(outcomes) - 5  # both kinds checked


def test_memory_is_reused_on_one_stream():
    graph = random_graph(num_kernels=40, seed=9, max_inputs=1)
    plan = make_plan(graph, [(kernel.id, 0) for kernel in graph.kernels], "sequential")
    total = sum(tensor.nbytes for kernel in graph.kernels for tensor in kernel.outputs)
    assert plan.memory.activation_bytes < total
    assert_race_free(graph, plan)


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
@pytest.mark.parametrize("streams", [1, 2, 8])
def test_schedulers_make_valid_race_free_plans(name, streams):
    for seed in range(4):
        graph = random_graph(num_kernels=20, seed=seed)
        schedule = create_scheduler(name, max_streams=streams).schedule(graph, AnalyticCost(graph))
        plan = make_plan(graph, list(schedule.order), name)
        assert plan.num_streams <= streams
        assert_race_free(graph, plan)


def test_chains_uses_parallel_streams_for_parallel_branches():
    graph = random_graph(num_kernels=30, seed=1)
    schedule = create_scheduler("chains", max_streams=4).schedule(graph, AnalyticCost(graph))
    plan = make_plan(graph, list(schedule.order), "chains")
    assert plan.num_streams > 1
