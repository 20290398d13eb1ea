"""IOS dynamic programming (Ding et al., "IOS: Inter-Operator Scheduler for CNN Acceleration", MLSys'21).

The graph is cut into blocks at kernels every path crosses; each block is scheduled on its own. Within a
block, `cost[S]` for a set S of not-yet-scheduled kernels (closed under producers) is the minimum over
ending sets E ⊆ S (closed under consumers within S) of `stage_latency(E) + cost[S − E]`. The stage E runs
its weakly connected components as concurrent groups, each in topological order on one stream. Pruning:
at most `max_group_size` kernels per group and `max_groups` groups per stage. Sets are bitmasks over the
block's kernels and memoized. A block with more than `max_states` such sets (counted before searching) is
split in two at the depth level nearest its middle, so both halves keep the block's branches side by side,
and each half is searched alone.
With a cost source other than the analytic model (measurements), an analytic search of the same block
guides the real one: per state only the `measure_top` ending sets the model ranks best are measured.
Each part's searched stages are finally checked against greedy's (IOS's baseline): by stage sums, or where
the cost source can time whole orders, in the whole plan as executed, which is then also checked against
the baseline schedulers' plans of the whole graph (docs/schedulers.md).

IOS-Both (`merge_search`): given merge options (the kernels of a group of convolutions or of matrix
products reading one tensor and the latency of that group merged), a stage made of exactly an option's
kernels may run them merged instead, whichever the cost source finds faster; the search says which stages
merged.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from tvmsched.cost import StageCost
from tvmsched.cost.analytic import AnalyticCost
from tvmsched.graph import KernelGraph
from tvmsched.schedule.base import (
    DEFAULT_STREAM_MAPPING,
    STREAM_MAPPING_FLAG,
    Flag,
    Schedule,
    Scheduler,
    SchedulerError,
    Stage,
    check_stream_mapping,
    register_scheduler,
)
from tvmsched.schedule.greedy import GreedyScheduler
from tvmsched.schedule.nimble import NimbleScheduler
from tvmsched.schedule.opara import OparaScheduler
from tvmsched.schedule.sequential import SequentialScheduler


@dataclass(frozen=True)
class MergeOption:
    """IOS-Both's other way to run one stage: `kernels` (a group of convolutions or matrix products reading
    one tensor with their epilogues, and the concat joining exactly their results where there is one)
    replaced by the group merged, which takes `merged_ms`; `group` numbers the group among the model's
    (`merge_choice.parallel_groups`)."""

    group: int
    kernels: frozenset[int]
    merged_ms: float


@register_scheduler("dp")
class DynamicProgrammingScheduler(Scheduler):
    flags = (Flag("max_group_size", "--max-group-size",
                  "at most this many kernels in one group of a stage (IOS's r, default 3)"),
             Flag("max_groups", "--max-groups",
                  "at most this many concurrent groups in a stage (IOS's s, default 8)"),
             Flag("max_states", "--max-states",
                  "split a block whose search has more sets of kernels than this (default 1024; larger "
                  "searches longer for schedules that are rarely better)"),
             Flag("time_orders", "--stage-sums",
                  "choose each part's searched or greedy's stages by the sum of their stage latencies, as "
                  "IOS, instead of timing the whole plan on the GPU (the executed plan has no barriers "
                  "between stages; docs/schedulers.md)", switch=False),
             STREAM_MAPPING_FLAG)

    def __init__(self, max_streams: int = 8, max_group_size: int = 3, max_groups: int = 8,
                 max_states: int = 1024, measure_top: int = 3, stream_mapping: str = DEFAULT_STREAM_MAPPING,
                 time_orders: bool = True, search_progress: Callable[[dict], None] | None = None):
        super().__init__(max_streams)
        self.time_orders = time_orders
        self.stream_mapping = check_stream_mapping(stream_mapping)
        if max_group_size < 1 or max_groups < 1 or measure_top < 1:
            raise SchedulerError("max_group_size, max_groups and measure_top must be at least 1")
        self.max_group_size = max_group_size
        self.max_groups = min(max_groups, max_streams)
        self.max_states = max_states
        self.measure_top = measure_top
        self.search_progress = search_progress

    def schedule(self, graph: KernelGraph, cost: StageCost) -> Schedule:
        start = time.perf_counter()
        self.cost = cost
        self.stats = {**_counters(), "blocks_timed": 0, "blocks_greedy": 0}
        options, sums = [], []
        for block in blocks(graph):
            for part in self.parts(graph, block):
                options.append(self._part_options(graph, part, cost))
                sums.append(tuple(stage_sum(stages, cost) for stages in options[-1]))
                self.stats["modeled_ms"] += min(sums[-1])
                self.report()
        picks = self._choose(graph, options, sums, cost)
        self.stats["modeled_ms"] = sum(pair[pick] for pick, pair in zip(picks, sums))
        chosen = self._or_baselines(graph, _picked(options, picks), cost)
        self.stats["measurements"] = cost.measured
        self.stats["search_s"] = round(time.perf_counter() - start, 3)
        return replace(chosen, stats={**chosen.stats, **self.stats})

    def merge_search(self, graph: KernelGraph, cost: StageCost, options: tuple[MergeOption, ...]
                     ) -> tuple[list[tuple[Stage, MergeOption | None]], frozenset[int]]:
        """IOS-Both: the stages of dp's search (by stage sums, IOS's rule; per part the better of them and
        greedy's) in which a stage made of exactly an option's kernels runs them merged (paired with that
        option) where its `merged_ms` beats `cost`'s latency of the stage; and the groups of the options
        weighed. The blocks an option's kernels span are searched as one; an option whose kernels a block
        too large to search whole (`max_states`) splits into two parts is not weighed."""
        self.cost = cost
        self.stats = _counters()
        stages: list[tuple[Stage, MergeOption | None]] = []
        weighed: set[int] = set()
        for block in blocks(graph, [option.kernels for option in options]):
            for part in self.parts(graph, block):
                search = self._search(graph, part, cost, options)
                weighed |= {option.group for option in search.options.values()}
                greedy = [(stage, None) for stage in GreedyScheduler(self.max_streams).stages(graph, part)]
                latency, best = min(((merged_sum(pick, cost), pick) for pick in (search.run(), greedy)),
                                    key=lambda pair: pair[0])
                stages += best
                self.stats["blocks"] += 1
                self.stats["modeled_ms"] += latency
                self.report()
        return stages, frozenset(weighed)

    def part_latency(self, graph: KernelGraph, kernels: list[int], cost: StageCost) -> float:
        """The stage sum of the better of dp's searched stages and greedy's for `kernels` alone (ids in order,
        closed under their producers in `graph` but for graph inputs), as for one part of a graph."""
        self.cost = cost
        self.stats = _counters()
        return min(stage_sum(stages, cost) for stages in self._part_options(graph, kernels, cost))

    def parts(self, graph: KernelGraph, block: list[int]) -> list[list[int]]:
        """`block` split until no part has more than max_states sets to search."""
        if len(block) == 1 or _BlockSearch(graph, block, None, self).states_within(self.max_states):
            return [block]
        first, second = split(graph, block)
        return self.parts(graph, first) + self.parts(graph, second)

    def _part_options(self, graph: KernelGraph, part: list[int], cost: StageCost
                      ) -> tuple[list[Stage], list[Stage]]:
        """The part's searched stages and greedy's."""
        searched = [stage for stage, _ in self._search(graph, part, cost).run()]
        self.stats["blocks"] += 1
        return searched, GreedyScheduler(self.max_streams).stages(graph, part)

    def _search(self, graph: KernelGraph, part: list[int], cost: StageCost,
                options: tuple[MergeOption, ...] = ()) -> _BlockSearch:
        """The search of `part` with `cost` (and merge `options`), guided by an analytic search of the same
        part where `cost` is another source."""
        guide = None
        if not isinstance(cost, AnalyticCost):
            guide = _BlockSearch(graph, part, AnalyticCost(graph), self)
        return _BlockSearch(graph, part, cost, self, guide, options)

    def _choose(self, graph: KernelGraph, options: list[tuple[list[Stage], list[Stage]]],
                sums: list[tuple[float, float]], cost: StageCost) -> list[int]:
        """Per part, 0 for its searched stages or 1 for greedy's, so dp is never worse than greedy. By the
        sums of their stage latencies (`sums`), which the search minimizes (IOS's rule, also with
        time_orders=False); but where the cost source times whole orders (measurements), as the executor
        runs the whole plan:
        without barriers between stages, in which greedy's one-kernel groups can overlap across stages
        more than the searched stages' chains. Then the faster plan of the stage-sum choice and all of
        greedy's stages is the start, and each part whose two options differ is switched to its other
        option where the whole plan runs faster."""
        picks = [int(greedy < searched) for searched, greedy in sums]
        plan_ms = self._plan_ms(graph, _picked(options, picks), cost) if self.time_orders else None
        if plan_ms is not None:
            greedy_picks = [1] * len(options)
            greedy_ms = self._plan_ms(graph, _picked(options, greedy_picks), cost)
            if greedy_ms < plan_ms:
                picks, plan_ms = greedy_picks, greedy_ms
            for index, (searched, greedy) in enumerate(options):
                if searched == greedy:
                    continue
                trial = picks[:index] + [1 - picks[index]] + picks[index + 1:]
                trial_ms = self._plan_ms(graph, _picked(options, trial), cost)
                self.stats["blocks_timed"] += 1
                if trial_ms < plan_ms:
                    picks, plan_ms = trial, trial_ms
                self.report()
            self.stats["plan_ms"] = plan_ms
        self.stats["blocks_greedy"] = sum(pick and searched != greedy
                                          for pick, (searched, greedy) in zip(picks, options))
        return picks

    def _or_baselines(self, graph: KernelGraph, stages: list[Stage], cost: StageCost) -> Schedule:
        """The plan of `stages`, or where whole plans were timed, the fastest of the baselines' plans of
        the whole graph (greedy, sequential, Opara, Nimble) if it runs faster (stats `baseline_plan`,
        `baselines_ms` of those whose order differs from dp's): greedy's stages of the parts a block was
        split into are not greedy's stages of the block, whose waves run across the split, and Opara's and
        Nimble's plans are not made of stages at all."""
        chosen = Schedule.from_stages(stages, graph=graph, mapping=self.stream_mapping)
        if "plan_ms" not in self.stats:
            return chosen
        self.stats.update(baseline_plan=None, baselines_ms={})
        for name, plan in self._baseline_plans(graph, cost):
            if plan.order == chosen.order:
                continue
            self.stats["baselines_ms"][name] = plan_ms = cost.order_latency(plan.order)
            if plan_ms < self.stats["plan_ms"]:
                chosen = plan
                self.stats.update(baseline_plan=name, plan_ms=plan_ms)
        if chosen.stages is None:
            self.stats.pop("modeled_ms")  # no stages to sum
        elif self.stats["baseline_plan"]:
            self.stats["modeled_ms"] = stage_sum(list(chosen.stages), cost)
        return chosen

    def _baseline_plans(self, graph: KernelGraph, cost: StageCost):
        """(name, Schedule) of each baseline scheduler's plan of the whole graph with dp's stream limit
        (`max_streams`; `max_groups` bounds dp's own stages only)."""
        whole = GreedyScheduler(self.max_streams).stages(graph, [kernel.id for kernel in graph.kernels])
        yield "greedy", Schedule.from_stages(whole, graph=graph, mapping=self.stream_mapping)
        for baseline in (SequentialScheduler, OparaScheduler, NimbleScheduler):
            yield baseline.name, baseline(self.max_streams).schedule(graph, cost)

    def _plan_ms(self, graph: KernelGraph, stages: list[Stage], cost: StageCost) -> float | None:
        """The whole plan of `stages` timed as the executor runs it; None where the cost source times
        stages only."""
        schedule = Schedule.from_stages(stages, graph=graph, mapping=self.stream_mapping)
        return cost.order_latency(schedule.order)

    def report(self) -> None:
        """Pass the search's counters to `search_progress`; `modeled_ms` covers the blocks finished so far."""
        if self.search_progress:
            self.stats["measurements"] = self.cost.measured
            self.search_progress(dict(self.stats))


class _BlockSearch:
    """The memoized DP over one block's kernels (local bit i is kernel `block[i]`), with the merge options
    whose kernels all lie in the block."""

    def __init__(self, graph: KernelGraph, block: list[int], cost: StageCost,
                 scheduler: DynamicProgrammingScheduler, guide: _BlockSearch | None = None,
                 options: tuple[MergeOption, ...] = ()):
        self.block = block
        self.cost = cost
        self.scheduler = scheduler
        self.guide = guide
        local = {kernel: index for index, kernel in enumerate(block)}
        self.producers = [0] * len(block)
        self.consumers = [0] * len(block)
        for index, kernel in enumerate(block):
            for producer in graph.dependencies(kernel):
                if producer in local:
                    self.producers[index] |= 1 << local[producer]
                    self.consumers[local[producer]] |= 1 << index
        self.options = {sum(1 << local[kernel] for kernel in option.kernels): option
                        for option in options if option.kernels <= local.keys()}
        self.best: dict[int, tuple[float, int]] = {0: (0.0, 0)}
        self.stage_costs: dict[int, tuple[float, tuple[tuple[int, ...], ...], MergeOption | None] | None] = {}

    def run(self) -> list[tuple[Stage, MergeOption | None]]:
        """The stages in order, each with the merge option it runs merged, else None."""
        remaining = (1 << len(self.block)) - 1
        self.solve(remaining)
        stages = []
        while remaining:
            ending = self.best[remaining][1]
            _, groups, option = self.stage_costs[ending]
            stages.append((Stage(groups), option))
            remaining &= ~ending
        return stages[::-1]

    def solve(self, remaining: int) -> float:
        """Minimum latency of scheduling the kernels in `remaining` (memoized)."""
        if remaining in self.best:
            return self.best[remaining][0]
        stats = self.scheduler.stats
        stats["states"] += 1
        best = (float("inf"), 0)
        for ending in self.candidates(remaining):
            stage = self.stage(ending)
            if stage is None:
                continue
            total = stage[0] + self.solve(remaining & ~ending)
            if total < best[0]:
                best = (total, ending)
        self.best[remaining] = best
        if stats["states"] % 256 == 0:
            self.scheduler.report()
        return best[0]

    def states_within(self, budget: int) -> bool:
        """Whether the block has at most `budget` sets closed under producers (the states `solve` visits),
        enumerated from the full set by removing one sink at a time until the budget is passed."""
        full = (1 << len(self.block)) - 1
        seen = {full}
        frontier = [full]
        while frontier:
            state = frontier.pop()
            for index in range(len(self.block)):
                if state >> index & 1 and self.consumers[index] & state == 0:
                    child = state & ~(1 << index)
                    if child not in seen:
                        seen.add(child)
                        frontier.append(child)
                        if len(seen) > budget:
                            return False
        return True

    def candidates(self, remaining: int):
        """The ending sets to evaluate: the merge options that are ending sets of `remaining`, and all the
        others, or with a guide (an analytic search of the same block, without the options) only the
        `measure_top` that the guide ranks best, so expensive costs are asked rarely."""
        merging = [mask for mask in self.options if self.is_ending(mask, remaining)]
        yield from merging
        others = (ending for ending in self.ending_sets(remaining) if ending not in merging)
        if self.guide is None:
            yield from others
            return
        guide = self.guide
        guide.solve(remaining)
        valid = (ending for ending in others if guide.stage(ending) is not None)
        yield from heapq.nsmallest(self.scheduler.measure_top, valid, key=lambda ending: (
            guide.stage(ending)[0] + guide.best[remaining & ~ending][0]))

    def is_ending(self, members: int, remaining: int) -> bool:
        """Whether `members` lie in `remaining` and no kernel left in it consumes one of them."""
        return members & remaining == members and not any(
            self.consumers[index] & remaining & ~members
            for index in range(len(self.block)) if members >> index & 1)

    def ending_sets(self, remaining: int):
        """Non-empty subsets of `remaining` closed under consumers within it whose groups stay within
        max_group_size (adding kernels only merges groups, so an oversized group prunes the branch)."""
        members = [index for index in range(len(self.block) - 1, -1, -1) if remaining >> index & 1]
        group_size = self.scheduler.max_group_size
        limit = group_size * self.scheduler.max_groups

        def extend(start: int, chosen: int, count: int):
            """Every ending set that adds members at positions >= start (in reverse topological order a
            member's consumers come first, so whether it may join is known when it is reached)."""
            if chosen:
                yield chosen
            if count == limit:
                return
            for position in range(start, len(members)):
                index = members[position]
                grown = chosen | 1 << index
                if ((self.consumers[index] & remaining) & ~chosen == 0
                        and self.component(grown, 1 << index).bit_count() <= group_size):
                    yield from extend(position + 1, grown, count + 1)

        yield from extend(0, 0, 0)

    def stage(self, ending: int) -> tuple[float, tuple[tuple[int, ...], ...], MergeOption | None] | None:
        """(latency, groups, merge option or None) of running `ending` as one stage: its groups concurrently,
        or where `ending` is a merge option's kernels and merged is faster, merged; None if it breaks the
        pruning bounds and is no option."""
        if ending not in self.stage_costs:
            groups = self.components(ending)
            scheduler = self.scheduler
            option = self.options.get(ending)
            entry = None
            if len(groups) <= scheduler.max_groups and max(map(len, groups)) <= scheduler.max_group_size:
                scheduler.stats["stages_evaluated"] += 1
                entry = (self.cost.stage_latency(groups), groups, None)
            if option is not None and (entry is None or option.merged_ms < entry[0]):
                entry = (option.merged_ms, groups, option)
            self.stage_costs[ending] = entry
        return self.stage_costs[ending]

    def component(self, members: int, seed: int) -> int:
        """The weakly connected component of `members` that contains the bits of `seed`."""
        component = frontier = seed
        while frontier:
            index = (frontier & -frontier).bit_length() - 1
            frontier &= frontier - 1
            neighbours = (self.producers[index] | self.consumers[index]) & members & ~component
            component |= neighbours
            frontier |= neighbours
        return component

    def components(self, members: int) -> tuple[tuple[int, ...], ...]:
        """Weakly connected components of `members`, each as kernel ids in topological order."""
        groups = []
        unvisited = members
        while unvisited:
            component = self.component(members, unvisited & -unvisited)
            unvisited &= ~component
            groups.append(tuple(self.block[i] for i in range(len(self.block)) if component >> i & 1))
        return tuple(sorted(groups))


def _counters() -> dict:
    """The search's counters, as `report` passes them to `search_progress`."""
    return {"blocks": 0, "states": 0, "stages_evaluated": 0, "measurements": 0, "modeled_ms": 0.0}


def _picked(options: list[tuple[list[Stage], list[Stage]]], picks: list[int]) -> list[Stage]:
    """The stages of each part's picked option, in order."""
    return [stage for pick, pair in zip(picks, options) for stage in pair[pick]]


def stage_sum(stages: list[Stage], cost: StageCost) -> float:
    """The sum of `stages`' latencies by `cost` (IOS's objective)."""
    return merged_sum([(stage, None) for stage in stages], cost)


def merged_sum(stages: list[tuple[Stage, MergeOption | None]], cost: StageCost) -> float:
    """The stage sum of `merge_search`'s stages: a merged stage takes its option's `merged_ms`."""
    return sum(option.merged_ms if option else cost.stage_latency(stage.groups) for stage, option in stages)


def split(graph: KernelGraph, block: list[int]) -> tuple[list[int], list[int]]:
    """`block` in two, the first closed under producers: the kernels up to the depth level (longest path
    within the block) that leaves the first half nearest half the kernels, or the first half in order
    when every kernel is at one level."""
    members = set(block)
    depth: dict[int, int] = {}
    for kernel in block:
        depth[kernel] = 1 + max((depth[p] for p in graph.dependencies(kernel) if p in members), default=-1)
    levels = sorted(set(depth.values()))[:-1]
    if not levels:
        return block[: len(block) // 2], block[len(block) // 2:]
    cut = min(levels, key=lambda level: abs(2 * sum(depth[k] <= level for k in block) - len(block)))
    return [k for k in block if depth[k] <= cut], [k for k in block if depth[k] > cut]


def blocks(graph: KernelGraph, joined: list[frozenset[int]] = ()) -> list[list[int]]:
    """The kernels split at cut kernels (comparable with every other kernel): each cut kernel is a block
    of its own, and so is each run of kernels between two cuts; the blocks that a set in `joined` spans are
    one (blocks are runs of consecutive ids)."""
    count = len(graph.kernels)
    ancestors = [0] * count
    for kernel in graph.kernels:
        for producer in graph.dependencies(kernel.id):
            ancestors[kernel.id] |= ancestors[producer] | 1 << producer
    descendants = [0] * count
    for kernel in reversed(graph.kernels):
        for producer in graph.dependencies(kernel.id):
            descendants[producer] |= descendants[kernel.id] | 1 << kernel.id
    everything = (1 << count) - 1
    result: list[list[int]] = []
    current: list[int] = []
    for kernel in range(count):
        if ancestors[kernel] | descendants[kernel] | 1 << kernel == everything:
            if current:
                result.append(current)
            result.append([kernel])
            current = []
        else:
            current.append(kernel)
    if current:
        result.append(current)
    return _joined(result, joined)


def _joined(parts: list[list[int]], joined: list[frozenset[int]]) -> list[list[int]]:
    """`parts` (runs of consecutive ids, in order) with the runs from the first to the last that a set in
    `joined` touches made one."""
    index = {kernel: position for position, part in enumerate(parts) for kernel in part}
    last = list(range(len(parts)))  # the last part each part is joined up to
    for kernels in joined:
        first = min(index[kernel] for kernel in kernels)
        last[first] = max(last[first], max(index[kernel] for kernel in kernels))
    result, end = [], -1
    for position, part in enumerate(parts):
        if position <= end:
            result[-1] = result[-1] + part
        else:
            result.append(list(part))
        end = max(end, last[position])
    return result
