"""The measured cost source: measurements cached on disk; closing it (also by leaving a `with` block after
an interrupted search) saves them and closes its timer, even when saving fails."""

import json

import pytest
from synthetic import random_graph

from tvmsched.cost.measured import MeasuredCost


class Timer:
    """A stand-in plan timer: every stage takes 2 ms."""

    def __init__(self):
        self.timed = self.closed = 0

    def time_stage(self, groups) -> float:
        self.timed += 1
        return 2.0

    def close(self) -> None:
        self.closed += 1


def test_closing_saves_the_measurements_and_closes_the_timer(tmp_path):
    graph, timer, path = random_graph(4, seed=0), Timer(), tmp_path / "costs.json"
    with pytest.raises(KeyboardInterrupt), MeasuredCost(graph, timer, "key", path) as cost:
        assert cost.stage_latency(((1,), (0,))) == 2.0
        raise KeyboardInterrupt  # an interrupted search
    assert timer.closed == 1 and json.loads(path.read_text()) == {"key": {"0|1": 2.0}}
    again = MeasuredCost(graph, Timer(), "key", path)
    assert again.stage_latency(((0,), (1,))) == 2.0 and again.hits == 1 and again.timer.timed == 0


def test_the_timer_is_closed_when_saving_fails(tmp_path):
    (tmp_path / "file").write_text("")
    timer = Timer()
    cost = MeasuredCost(random_graph(4, seed=0), timer, "key", tmp_path / "file" / "costs.json")
    cost.stage_latency(((0,),))
    with pytest.raises(OSError):
        cost.close()
    assert timer.closed == 1
