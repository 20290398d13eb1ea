"""The IOS dynamic-programming scheduler: optimal for its stage cost against brute force on small DAGs,
never worse than greedy or sequential on the zoo's graphs, and its plans valid and race-free."""

import itertools
import random

import pytest
from synthetic import graph_of, random_graph
from test_plan import assert_race_free

from tvmsched.cost import StageCost
from tvmsched.cost.analytic import AnalyticCost
from tvmsched.plan import add_waits, make_plan
from tvmsched.schedule import create_scheduler
from tvmsched.schedule.base import Schedule
from tvmsched.schedule.dp import MergeOption, blocks, merged_sum
from tvmsched.schedule.greedy import GreedyScheduler


def brute_force(graph, cost, max_group_size, max_groups, options=()) -> float:
    """Minimum total stage latency over every sequence of stages, enumerated forwards from the start:
    a stage is any set of unscheduled kernels whose producers are scheduled or in the set, its groups the
    set's connected components (bounded like the DP's); a set that is a merge option's kernels may take
    the option's merged latency instead (IOS-Both)."""
    kernels = [kernel.id for kernel in graph.kernels]
    merged = {option.kernels: option.merged_ms for option in options}
    best = float("inf")

    def groups_of(members):
        groups = []
        left = set(members)
        while left:
            component, frontier = set(), [min(left)]
            while frontier:
                kernel = frontier.pop()
                if kernel in component:
                    continue
                component.add(kernel)
                consumers = {k for k in members if kernel in graph.dependencies(k)}
                neighbours = graph.dependencies(kernel) | consumers
                frontier.extend(neighbours & left)
            left -= component
            groups.append(tuple(sorted(component)))
        return tuple(sorted(groups))

    def search(done: frozenset, total: float):
        nonlocal best
        if total >= best:
            return
        if len(done) == len(kernels):
            best = total
            return
        todo = [kernel for kernel in kernels if kernel not in done]
        for size in range(1, len(todo) + 1):
            for members in itertools.combinations(todo, size):
                chosen = set(members)
                if any(not graph.dependencies(kernel) <= done | chosen for kernel in members):
                    continue
                groups = groups_of(members)
                latency = merged.get(frozenset(chosen), float("inf"))
                if len(groups) <= max_groups and max(map(len, groups)) <= max_group_size:
                    latency = min(latency, cost.stage_latency(groups))
                if latency < float("inf"):
                    search(done | chosen, total + latency)

    search(frozenset(), 0.0)
    return best


@pytest.mark.parametrize("seed", range(12))
def test_dp_equals_brute_force_on_small_dags(seed):
    graph = random_graph(num_kernels=4 + seed % 5, seed=100 + seed, max_inputs=2)
    cost = AnalyticCost(graph)
    scheduler = create_scheduler("dp", max_streams=3, max_group_size=2, max_groups=3)
    schedule = scheduler.schedule(graph, cost)
    modeled = sum(cost.stage_latency(stage.groups) for stage in schedule.stages)
    assert modeled == pytest.approx(schedule.stats["modeled_ms"])
    assert modeled == pytest.approx(brute_force(graph, cost, 2, 3), rel=1e-9)
    assert_race_free(graph, make_plan(graph, list(schedule.order), "dp"))


def random_options(graph, seed: int, count: int = 3) -> tuple[MergeOption, ...]:
    """Up to `count` merge options over distinct random sets of two to four kernels, merged in 2 to 12 us."""
    rng = random.Random(seed)
    ids = [kernel.id for kernel in graph.kernels]
    sets = {frozenset(rng.sample(ids, rng.randint(2, min(4, len(ids))))) for _ in range(count)}
    return tuple(MergeOption(group, kernels, rng.uniform(0.002, 0.012)) for group, kernels in enumerate(sets))


@pytest.mark.parametrize("seed", range(12))
def test_merge_search_equals_brute_force_on_small_dags(seed):
    graph = random_graph(num_kernels=4 + seed % 5, seed=700 + seed, max_inputs=2)
    cost = AnalyticCost(graph)
    options = random_options(graph, seed)
    scheduler = create_scheduler("dp", max_streams=3, max_group_size=2, max_groups=3)
    stages, weighed = scheduler.merge_search(graph, cost, options)
    assert weighed == {option.group for option in options}
    assert merged_sum(stages, cost) == pytest.approx(brute_force(graph, cost, 2, 3, options), rel=1e-9)
    for stage, option in stages:
        assert option is None or set(stage.kernels) == option.kernels
    order = Schedule.from_stages([stage for stage, _ in stages]).order
    assert_race_free(graph, make_plan(graph, list(order), "dp"))


def _diamond():
    """Kernel 0 feeds 1 and 2 (a group of two convolutions reading one tensor), which 3 joins."""
    return graph_of([(), (0,), (0,), (1, 2)])


@pytest.mark.parametrize("merged_ms, merges", [(0.001, True), (1.0, False)])
def test_merge_search_merges_a_stage_only_where_merged_is_faster(merged_ms, merges):
    graph = _diamond()
    option = MergeOption(0, frozenset({1, 2, 3}), merged_ms)
    for cost in (AnalyticCost(graph), CountingCost(graph)):  # the second as measured: an analytic guide
        stages, _ = create_scheduler("dp").merge_search(graph, cost, (option,))
        assert [option_ for _, option_ in stages if option_] == [option] * merges
        assert sorted(kernel for stage, _ in stages for kernel in stage.kernels) == [0, 1, 2, 3]


def test_merge_search_reports_its_progress():
    graph = random_graph(num_kernels=30, seed=9)
    cost = AnalyticCost(graph)
    reports = []
    stages, _ = create_scheduler("dp", search_progress=reports.append).merge_search(
        graph, cost, random_options(graph, 9))
    assert reports[-1]["modeled_ms"] == pytest.approx(merged_sum(stages, cost))


def test_an_option_that_a_split_block_cuts_in_two_is_not_weighed():
    # two chains of six side by side: 49 sets to search, more than max_states, so the block is split
    graph = graph_of([(), (0,), (1,), (2,), (3,), (4,), (), (6,), (7,), (8,), (9,), (10,), (5, 11)])
    across, within = MergeOption(0, frozenset({0, 11}), 1e-9), MergeOption(1, frozenset({0, 6}), 1e-9)
    _, weighed = create_scheduler("dp").merge_search(graph, AnalyticCost(graph), (across, within))
    assert weighed == {0, 1}
    stages, weighed = create_scheduler("dp", max_states=8).merge_search(graph, AnalyticCost(graph),
                                                                        (across, within))
    assert weighed == {1} and [option for _, option in stages if option] == [within]


def test_blocks_that_a_merge_option_spans_are_one():
    graph = _diamond()
    assert blocks(graph) == [[0], [1, 2], [3]]
    assert blocks(graph, [frozenset({1, 2, 3})]) == [[0], [1, 2, 3]]
    assert blocks(graph, [frozenset({0, 1}), frozenset({2, 3})]) == [[0, 1, 2, 3]]


@pytest.mark.parametrize("seed", range(4))
def test_part_latency_of_a_whole_graph_equals_brute_force(seed):
    graph = random_graph(num_kernels=5 + seed, seed=300 + seed, max_inputs=2)
    cost = AnalyticCost(graph)
    scheduler = create_scheduler("dp", max_streams=3, max_group_size=2, max_groups=3)
    everything = [kernel.id for kernel in graph.kernels]
    assert scheduler.part_latency(graph, everything, cost) == pytest.approx(brute_force(graph, cost, 2, 3))


@pytest.mark.parametrize("seed", range(5))
def test_dp_never_worse_than_greedy_or_sequential_on_random_graphs(seed):
    graph = random_graph(num_kernels=30, seed=seed)
    cost = AnalyticCost(graph)
    modeled = {}
    for name in ("sequential", "greedy", "dp"):
        schedule = create_scheduler(name, max_streams=8).schedule(graph, cost)
        modeled[name] = sum(cost.stage_latency(stage.groups) for stage in schedule.stages)
        plan = make_plan(graph, list(schedule.order), name)
        assert plan.num_streams <= 8
        assert_race_free(graph, plan)
    assert modeled["dp"] <= modeled["greedy"] + 1e-12 and modeled["dp"] <= modeled["sequential"] + 1e-12


def test_blocks_cut_at_kernels_every_path_crosses():
    graph = random_graph(num_kernels=30, seed=4, max_inputs=1)
    parts = blocks(graph)
    assert sorted(kernel for part in parts for kernel in part) == list(range(30))
    assert all(part == sorted(part) for part in parts)


def test_state_budget_splits_blocks_and_stays_valid():
    graph = random_graph(num_kernels=30, seed=8)
    cost = AnalyticCost(graph)
    small = create_scheduler("dp", max_states=16).schedule(graph, cost)
    assert small.stats["blocks"] > create_scheduler("dp").schedule(graph, cost).stats["blocks"]
    assert_race_free(graph, make_plan(graph, list(small.order), "dp"))


@pytest.mark.parametrize("seed", range(4))
def test_oversized_blocks_split_into_searchable_parts_closed_under_producers(seed):
    graph = random_graph(num_kernels=40, seed=50 + seed)
    scheduler = create_scheduler("dp", max_states=32)
    for block in blocks(graph):
        parts = scheduler.parts(graph, block)
        assert sorted(kernel for part in parts for kernel in part) == block
        done = set(range(block[0]))  # blocks are runs of consecutive ids
        for part in parts:
            assert all(graph.dependencies(kernel) <= done | set(part) for kernel in part)
            done |= set(part)
            assert scheduler.parts(graph, part) == [part]  # within the state budget


def test_search_progress_reports_finished_blocks():
    graph = random_graph(num_kernels=30, seed=9)
    reports = []
    schedule = create_scheduler("dp", search_progress=reports.append).schedule(graph, AnalyticCost(graph))
    blocks_done = [report["blocks"] for report in reports]
    assert blocks_done == sorted(blocks_done) and blocks_done[-1] == schedule.stats["blocks"]
    assert reports[-1]["modeled_ms"] == pytest.approx(schedule.stats["modeled_ms"])


class CountingCost(StageCost):
    """A stand-in for measurements: the analytic latency plus a per-stage penalty, counting the calls."""

    def __init__(self, graph):
        super().__init__(graph)
        self.model = AnalyticCost(graph)
        self.asked = set()

    def stage_latency(self, groups):
        if groups not in self.asked:
            self.asked.add(groups)
            self.measured += 1
        return self.model.stage_latency(groups) * (1.0 + 0.1 * len(groups))


def test_analytic_guide_limits_what_a_measured_search_asks():
    graph = random_graph(num_kernels=18, seed=21)
    full = CountingCost(graph)
    exhaustive = create_scheduler("dp", measure_top=10**6).schedule(graph, full)
    guided_cost = CountingCost(graph)
    guided = create_scheduler("dp", measure_top=2).schedule(graph, guided_cost)
    assert len(guided_cost.asked) < len(full.asked)
    assert guided.stats["measurements"] == len(guided_cost.asked)
    assert guided.stats["modeled_ms"] >= exhaustive.stats["modeled_ms"] - 1e-12
    assert_race_free(graph, make_plan(graph, list(guided.order), "dp"))


class OrderTimingCost(AnalyticCost):
    """A stand-in for a source that also times whole plans: `latency(order)` of each order it is asked."""

    def __init__(self, graph, latency):
        super().__init__(graph)
        self.latency = latency
        self.orders = {}

    def order_latency(self, order):
        self.orders[order] = self.latency(order)
        return self.orders[order]


def _simulated_ms(graph):
    """A plan's latency as a list scheduler runs it: each kernel starts when its stream is free and the
    launches it waits on have finished, and takes its analytic latency alone."""
    model = AnalyticCost(graph)

    def latency(order):
        finished, free = {}, {}
        for launch in add_waits(graph, list(order)):
            begin = max([free.get(launch.stream, 0.0)] + [finished[k] for k in launch.waits])
            finished[launch.kernel] = free[launch.stream] = begin + model.kernel_latency(launch.kernel)
        return max(finished.values())
    return latency


def _options(graph, mapping):
    """dp's plan by stage sums, its stages of each part of dp's search, and greedy's."""
    dp = create_scheduler("dp", stream_mapping=mapping)
    parts = [part for block in blocks(graph) for part in dp.parts(graph, block)]
    by_sum = dp.schedule(graph, AnalyticCost(graph))
    chosen = [[stage for stage in by_sum.stages if stage.kernels[0] in part] for part in parts]
    return by_sum, chosen, [GreedyScheduler(8).stages(graph, part) for part in parts]


def _order(graph, stages, mapping):
    return Schedule.from_stages(list(stages), graph=graph, mapping=mapping).order


@pytest.mark.parametrize("mapping", ["index", "affinity"])
def test_parts_are_chosen_by_timing_the_whole_plan(mapping):
    """Where the cost source times whole orders, the plan is the stage-sum choice or all of greedy's
    stages, whichever runs faster, then each part whose options differ switched to its other option
    where the whole plan runs faster: one timing per such part, and the plan kept is the fastest timed."""
    graph = random_graph(num_kernels=40, seed=5)
    by_sum, summed, greedy = _options(graph, mapping)
    all_greedy = [stage for stages in greedy for stage in stages]
    assert list(by_sum.stages) != all_greedy

    greedy_order = _order(graph, all_greedy, mapping)
    greedy_fastest = OrderTimingCost(graph, lambda order: 0.0 if order == greedy_order else 1.0)
    chosen = create_scheduler("dp", stream_mapping=mapping).schedule(graph, greedy_fastest)
    assert list(chosen.stages) == all_greedy and chosen.stats["plan_ms"] == 0.0
    differing = chosen.stats["blocks_timed"]
    baselines = {name for name, order in _baseline_orders(graph, mapping).items() if order != chosen.order}
    assert set(chosen.stats["baselines_ms"]) == baselines
    assert differing == chosen.stats["blocks_greedy"] == len(greedy_fastest.orders) - 2 - len(baselines) > 0

    sum_order = _order(graph, by_sum.stages, mapping)
    sum_fastest = OrderTimingCost(graph, lambda order: 0.0 if order == sum_order else 1.0)
    kept = create_scheduler("dp", stream_mapping=mapping).schedule(graph, sum_fastest)
    assert kept.stages == by_sum.stages and kept.stats["blocks_timed"] == differing

    last = max(index for index, stages in enumerate(summed) if stages != greedy[index])
    mixed = [stage for index in range(len(summed)) for stage in (greedy if index == last else summed)[index]]
    mixed_order = _order(graph, mixed, mapping)
    one_switched = OrderTimingCost(graph, lambda order: {mixed_order: 0.0, greedy_order: 2.0}.get(order, 1.0))
    switched = create_scheduler("dp", stream_mapping=mapping).schedule(graph, one_switched)
    assert list(switched.stages) == mixed and switched.stats["plan_ms"] == 0.0

    simulated = OrderTimingCost(graph, _simulated_ms(graph))
    best = create_scheduler("dp", stream_mapping=mapping).schedule(graph, simulated)
    assert best.stats["plan_ms"] == min(simulated.orders.values()) == simulated.orders[best.order]
    assert best.stats["plan_ms"] <= min(simulated.orders[sum_order], simulated.orders[greedy_order])
    assert_race_free(graph, make_plan(graph, list(best.order), "dp"))

    assert by_sum.stats["blocks_timed"] == 0 and "plan_ms" not in by_sum.stats  # stage sums decide
    as_ios = create_scheduler("dp", stream_mapping=mapping, time_orders=False).schedule(graph, simulated)
    assert as_ios.stats["blocks_timed"] == 0 and as_ios.stages == by_sum.stages


def _baseline_orders(graph, mapping, max_streams=8):
    """Each baseline's order of the whole graph, made here as dp should make it."""
    cost = AnalyticCost(graph)
    schedulers = {"greedy": GreedyScheduler(max_streams, stream_mapping=mapping),
                  **{name: create_scheduler(name, max_streams=max_streams)
                     for name in ("sequential", "opara", "nimble")}}
    return {name: scheduler.schedule(graph, cost).order for name, scheduler in schedulers.items()}


@pytest.mark.parametrize("mapping", ["index", "affinity"])
@pytest.mark.parametrize("baseline", ["greedy", "sequential", "opara", "nimble"])
def test_a_baselines_plan_of_the_whole_graph_is_taken_where_it_runs_faster(mapping, baseline):
    """Greedy's stages of the parts a block was split into are not greedy's stages of the block, and
    Opara's and Nimble's plans have no stages: where a baseline's plan of the whole graph times faster
    than the plan chosen part by part, dp returns it; where none does, dp keeps its own."""
    graph = random_graph(num_kernels=40, seed=5)
    dp = create_scheduler("dp", stream_mapping=mapping, max_states=64)
    parts = [part for block in blocks(graph) for part in dp.parts(graph, block)]
    whole = GreedyScheduler(8).stages(graph, [kernel.id for kernel in graph.kernels])
    assert whole != [stage for part in parts for stage in GreedyScheduler(8).stages(graph, part)]
    plan = (GreedyScheduler(8, stream_mapping=mapping) if baseline == "greedy"
            else create_scheduler(baseline)).schedule(graph, AnalyticCost(graph))

    faster = OrderTimingCost(graph, lambda order: 0.5 if order == plan.order else 1.0)
    taken = dp.schedule(graph, faster)
    assert taken.order == plan.order and taken.stages == plan.stages
    assert taken.stats["baseline_plan"] == baseline and taken.stats["plan_ms"] == 0.5
    assert set(taken.stats["baselines_ms"]) == {"greedy", "sequential", "opara", "nimble"}
    if plan.stages:
        assert taken.stats["modeled_ms"] == pytest.approx(sum(faster.stage_latency(s.groups)
                                                              for s in plan.stages))
    else:
        assert "modeled_ms" not in taken.stats
    assert_race_free(graph, make_plan(graph, list(taken.order), "dp"))

    slower = OrderTimingCost(graph, lambda order: 1.0 if order == plan.order else 0.5)
    kept = dp.schedule(graph, slower)
    assert plan.order in slower.orders and kept.stats["baseline_plan"] is None and kept.order != plan.order


@pytest.mark.parametrize("max_streams", [3, 8])
def test_the_fastest_of_several_faster_baselines_is_taken_within_dps_stream_limit(max_streams):
    """Two baselines time faster than dp's plan: the faster of them is taken (not the last found), and
    the baselines are planned with dp's stream limit."""
    graph = random_graph(num_kernels=40, seed=5)
    orders = _baseline_orders(graph, "affinity", max_streams)
    assert orders["opara"] != _baseline_orders(graph, "affinity")["opara"] or max_streams == 8
    times = {orders["opara"]: 0.5, orders["nimble"]: 0.8}
    cost = OrderTimingCost(graph, lambda order: times.get(order, 1.0))
    taken = create_scheduler("dp", max_streams=max_streams).schedule(graph, cost)
    assert taken.order == orders["opara"] and taken.stats["baseline_plan"] == "opara"
    assert taken.stats["baselines_ms"]["nimble"] == 0.8
    assert max(stream for _, stream in taken.order) < max_streams
