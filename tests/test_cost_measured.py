"""The measured cost source: measurements cached on disk under a key naming what they hold for; closing it
(also by leaving a `with` block after an interrupted search) saves them and closes its timer, even when
saving fails; made for a build, it owns a stage timer."""

import json

import pytest
import tvm
from synthetic import random_graph

import tvmsched
from tvmsched.cost.measured import MeasuredCost, cache_key
from tvmsched.executor.streams import StageTimer


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


def test_the_timer_is_closed_when_saving_fails(tmp_path, monkeypatch):
    from tvmsched.cost import measured

    (tmp_path / "file").write_text("")
    timer = Timer()
    cost = MeasuredCost(random_graph(4, seed=0), timer, "key", tmp_path / "file" / "costs.json")
    cost.stage_latency(((0,),))
    cost.close()  # a cache that cannot be written (a file where its folder should be) saves nothing
    assert timer.closed == 1 and (tmp_path / "file").read_text() == ""

    def fails(*args, **kwargs):
        raise RuntimeError("the save failed")
    monkeypatch.setattr(measured, "merge_into_cache", fails)
    timer = Timer()
    cost = MeasuredCost(random_graph(4, seed=0), timer, "key", tmp_path / "costs.json")
    cost.stage_latency(((0,),))
    with pytest.raises(RuntimeError, match="the save failed"):
        cost.close()
    assert timer.closed == 1


def test_the_cache_key_names_the_graph_target_batch_kernels_and_timer_version():
    graph = random_graph(4, seed=0)
    context = {"target": "nvidia-h100-sm90a", "device": "NVIDIA H100 80GB HBM3", "batch": 16}
    key = cache_key(graph, context, "0123abcd")
    # the format of the caches measured before the key moved here, so they stay valid
    assert key == f"{graph.hash}/nvidia-h100-sm90a/batch16/kernels0123abcd/timer{StageTimer.version}"
    others = [cache_key(random_graph(4, seed=1), context, "0123abcd"),
              cache_key(graph, {**context, "target": "nvidia-h200-sm90a"}, "0123abcd"),
              cache_key(graph, {**context, "batch": 1}, "0123abcd"), cache_key(graph, context, "tuned")]
    assert len({key, *others}) == 5


def test_a_source_for_a_build_owns_its_stage_timer_and_keys_its_cache(branchy_model, fake_cuda, tmp_path):
    model = tvmsched.compile(branchy_model, target="llvm", batch=2)
    path = tmp_path / "costs.json"
    with MeasuredCost.on_device(model.library, model.graph, model.plan, model.constants, tvm.cpu(),
                                model.meta.kernels_hash, max_groups=3, cache_path=path) as cost:
        assert isinstance(cost.timer, StageTimer) and len(cost.timer.streams) == 3
        assert cost.key == cache_key(model.graph, model.plan.context, model.meta.kernels_hash)
        assert "/batch2/" in cost.key
        assert cost.stage_latency(((0,), (1,))) == 1.0 / 5  # the stand-in's 1 ms for 5 replays
    assert cost.timer.closed and fake_cuda.made == fake_cuda.destroyed and not fake_cuda.refused
    assert json.loads(path.read_text()) == {cost.key: {"0|1": 0.2}}
