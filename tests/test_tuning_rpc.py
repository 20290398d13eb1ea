"""--rpc: the tracker check and the sessions each runner worker keeps (on llvm, with a tracker and servers
on 127.0.0.1)."""

import numpy as np
import pytest
import tvm
from conftest import RPC_KEY
from tvm import te
from tvm.s_tir import meta_schedule as ms

from tvmsched.errors import TvmschedError
from tvmsched.tuning.rpc import LAST_CANDIDATE_S, KeptSession, TrackerAddress, registered_servers


def test_tracker_counts_the_servers_under_its_key_and_names_the_fix_when_there_are_none(rpc_tracker):
    assert registered_servers(rpc_tracker) == 2
    with pytest.raises(TvmschedError, match=f"no server registered under key 'gpu' \\(keys: {RPC_KEY}\\); "
                                            f"start one per device with `python -m tvm.exec.rpc_server"):
        registered_servers(TrackerAddress(rpc_tracker.host, rpc_tracker.port, "gpu"))
    with pytest.raises(TvmschedError, match="no TVM RPC tracker answers at 127.0.0.1:1 .*python -m "
                                            "tvm.exec.rpc_tracker"):
        registered_servers(TrackerAddress("127.0.0.1", 1, RPC_KEY))
    with pytest.raises(TvmschedError, match="write HOST:PORT:KEY"):
        TrackerAddress.parse("127.0.0.1:9190")


def _artifact(directory, scale: float) -> str:
    """A library computing x * scale, exported as MetaSchedule's builder names every artifact."""
    x = te.placeholder((8,), name="x")
    y = te.compute((8,), lambda i: x[i] * scale, name="y")
    directory.mkdir()
    path = str(directory / "tvm_tmp_mod.tar")
    tvm.compile(te.create_prim_func([x, y]), target="llvm").export_library(path)
    return path


def test_a_kept_session_runs_each_candidate_uploaded_not_the_first_of_that_name(rpc_tracker, tmp_path):
    config = ms.runner.RPCConfig(tracker_host=rpc_tracker.host, tracker_port=rpc_tracker.port,
                                 tracker_key=RPC_KEY, session_timeout_sec=120)
    kept = KeptSession()
    x = np.arange(8, dtype="float32")
    sessions = []
    for index, scale in enumerate((2.0, 3.0)):
        session = kept.get(config)
        sessions.append(session)
        module = kept.upload(session, _artifact(tmp_path / f"c{index}", scale), "tvm_tmp_mod.tar")
        device = session.cpu()
        a, b = tvm.runtime.tensor(x, device), tvm.runtime.tensor(np.zeros(8, "float32"), device)
        module["main"](a, b)
        np.testing.assert_allclose(b.numpy(), x * scale)
        kept.measured = True
        kept.release(session)
    assert sessions[0] is sessions[1]


class _Config:
    """Stands in for RPCConfig: counts the sessions opened."""

    session_timeout_sec = 300

    def __init__(self):
        self.opened = 0

    def connect_server(self):
        self.opened += 1
        return f"session {self.opened}"


def test_a_kept_session_is_renewed_after_a_failed_candidate_and_before_the_server_ends_it():
    config, kept, now = _Config(), KeptSession(), [0.0]
    clock = lambda: now[0]  # noqa: E731

    def candidate(measured: bool) -> str:
        session = kept.get(config, clock)
        kept.measured = measured
        kept.release(session)
        return session

    assert [candidate(True), candidate(True)] == ["session 1", "session 1"]
    assert [candidate(False), candidate(True)] == ["session 1", "session 2"]  # the failure's session dropped
    now[0] += config.session_timeout_sec - LAST_CANDIDATE_S - 1
    assert candidate(True) == "session 2"
    now[0] += 1
    assert candidate(True) == "session 3"

