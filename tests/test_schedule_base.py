"""Stage schedules onto streams: group i on stream i, or by affinity (a group continues the stream of a
kernel it reads, and a lone stage stays after the stage before); both give valid race-free plans."""

import pytest
from synthetic import random_graph
from test_plan import assert_race_free
from test_schedule_baselines import hand_graph

from tvmsched.cost.analytic import AnalyticCost
from tvmsched.plan import make_plan
from tvmsched.schedule import create_scheduler, options_for, scheduler_flags
from tvmsched.schedule.base import STREAM_MAPPING_FLAG, Schedule, SchedulerError, Stage


def streams_of(schedule: Schedule) -> dict[int, int]:
    return dict(schedule.order)


def test_affinity_keeps_each_chain_on_its_stream_where_index_crosses_them():
    graph = hand_graph([(), (), (1,), (0,)])  # chains 0 -> 3 and 1 -> 2
    stages = [Stage(((0,), (1,))), Stage(((2,), (3,)))]  # the second stage lists the chains the other way
    index = streams_of(Schedule.from_stages(stages))
    affinity = streams_of(Schedule.from_stages(stages, graph=graph, mapping="affinity"))
    assert index[2] == index[0] and index[3] == index[1]  # each consumer queued behind the other chain
    assert affinity[2] == affinity[1] and affinity[3] == affinity[0]
    assert len(make_plan(graph, list(Schedule.from_stages(stages, graph=graph, mapping="affinity").order),
                         "affinity").launches[2].waits) == 0  # stream order keeps the dependency


def test_affinity_reuses_the_stream_idle_longest_for_a_group_without_producers_there():
    graph = hand_graph([(), (), (0,), (), (2,)])
    stages = [Stage(((0,), (1,))), Stage(((2,),)), Stage(((3,), (4,)))]
    streams = streams_of(Schedule.from_stages(stages, graph=graph, mapping="affinity"))
    assert streams[2] == streams[0] and streams[4] == streams[2]  # the chain 0 -> 2 -> 4
    assert streams[3] == streams[1]  # idle since the first stage
    assert len(set(streams.values())) == 2


def test_affinity_keeps_a_lone_stage_after_the_stage_before_it_does_not_read():
    # squeezenet's fire modules: 1 -> (2, 3) -> 4 run in parallel, 4 -> (5, 6) -> 7 one after the other
    graph = hand_graph([(), (0,), (1,), (1,), (2, 3), (4,), (4,), (5, 6)])
    stages = [Stage(((0,),)), Stage(((1,),)), Stage(((2,), (3,))), Stage(((4,),)), Stage(((5,),)),
              Stage(((6,),)), Stage(((7,),))]
    schedule = Schedule.from_stages(stages, graph=graph, mapping="affinity")
    streams = streams_of(schedule)
    assert streams[2] != streams[3]
    assert streams[6] == streams[5]  # not on the idle stream of 3, where it would run beside 5
    assert streams_of(Schedule.from_stages(stages)) == streams  # the same plan as index here
    launches = make_plan(graph, list(schedule.order), "affinity").launches
    assert [launch.kernel for launch in launches if launch.stream == streams[5]][-3:] == [5, 6, 7]


def test_affinity_keeps_a_lone_stage_after_the_stage_before_that_it_reads_but_does_not_continue():
    graph = hand_graph([(), (0,), (0,), (1, 2), (3,), (4,), (4,), (5, 6)])
    stages = [Stage(((0,),)), Stage(((1,), (2,))), Stage(((3,),)), Stage(((4, 5),)), Stage(((6,),)),
              Stage(((7,),))]  # 6 reads 4, which 5 follows on its stream
    streams = streams_of(Schedule.from_stages(stages, graph=graph, mapping="affinity"))
    assert streams[6] == streams[5]
    assert streams == streams_of(Schedule.from_stages(stages))


@pytest.mark.parametrize("name", ["greedy", "dp"])
@pytest.mark.parametrize("seed", range(6))
def test_affinity_plans_are_race_free_and_use_no_more_streams(name, seed):
    graph = random_graph(num_kernels=24, seed=seed)
    plans = {mapping: make_plan(graph, list(create_scheduler(name, max_streams=4, stream_mapping=mapping)
                                             .schedule(graph, AnalyticCost(graph)).order), name)
             for mapping in ("index", "affinity")}
    assert_race_free(graph, plans["affinity"])
    assert plans["affinity"].num_streams <= plans["index"].num_streams


def test_unknown_stream_mapping_names_the_choices():
    with pytest.raises(SchedulerError, match="unknown stream mapping 'nearest'; available: index, affinity"):
        create_scheduler("dp", stream_mapping="nearest")


def test_options_for_gives_each_scheduler_only_the_flags_it_takes():
    flags = {"stream_mapping": "index", "time_orders": False, "max_states": 64}
    assert options_for("dp", **flags) == flags
    assert options_for("greedy", **flags) == {"stream_mapping": "index"}
    assert options_for("nimble", **flags) == {}
    create_scheduler("greedy", **options_for("greedy", **flags))  # what it returns, the scheduler accepts


def test_each_scheduler_flag_is_an_option_its_scheduler_takes_and_each_flag_means_one_option():
    taking = scheduler_flags()
    assert {flag.flag for flag in taking} >= {"--max-states", "--stage-sums", "--stream-mapping"}
    assert len({flag.flag for flag in taking}) == len({flag.keyword for flag in taking}) == len(taking)
    for flag, schedulers in taking.items():
        for name in schedulers:
            assert options_for(name, **{flag.keyword: None}), (name, flag.flag)
    assert taking[STREAM_MAPPING_FLAG] == ("dp", "greedy")

