"""`--rpc HOST:PORT:KEY`: measuring candidates on the devices a TVM RPC tracker has registered under KEY.

MetaSchedule's RPC runner opens a session per candidate, and an RPC server starts a process per session:
on a GPU, a new process and a new CUDA context for every candidate (on the H100 host the server must spawn
them, `--no-fork`: a forked one failed to initialize CUDA; a spawned one took 7-10 s to start). Here each
runner worker keeps its session, and with it the server's process and CUDA context, until a minute before
the session timeout, and opens a new one after a candidate failed (a faulting kernel can leave the context
unusable). The runner has one worker per server registered when tuning starts, so N GPUs behind the tracker
measure N candidates at once.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

from tvmsched.errors import TvmschedError


@dataclass(frozen=True)
class TrackerAddress:
    host: str
    port: int
    key: str

    @classmethod
    def parse(cls, text: str) -> TrackerAddress:
        host, _, rest = text.partition(":")
        port, _, key = rest.partition(":")
        if not (host and port.isdigit() and key):
            raise TvmschedError(f"--rpc '{text}': write HOST:PORT:KEY of a TVM RPC tracker, e.g. "
                                f"127.0.0.1:9190:h100")
        return cls(host, int(port), key)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}:{self.key}"


def registered_servers(address: TrackerAddress, timeout_s: float = 5.0) -> int:
    """How many RPC servers the tracker at `address` has registered under its key (busy ones included);
    raises TvmschedError naming the fix if the tracker cannot be reached or has none."""
    from tvm import rpc

    try:  # TVM's tracker client retries a refused connection for 60 s: fail fast first
        socket.create_connection((address.host, address.port), timeout=timeout_s).close()
        summary = rpc.connect_tracker(address.host, address.port).summary()
    except (OSError, RuntimeError) as error:
        raise TvmschedError(f"--rpc {address}: no TVM RPC tracker answers at {address.host}:{address.port} "
                            f"({error}); start one with `python -m tvm.exec.rpc_tracker --host "
                            f"{address.host} --port {address.port}`") from error
    keys = [server.get("key", "").removeprefix("server:") for server in summary.get("server_info", [])]
    servers = keys.count(address.key)
    if servers == 0:
        others = ", ".join(sorted(set(keys))) or "none"
        raise TvmschedError(f"--rpc {address}: the tracker has no server registered under key "
                            f"'{address.key}' (keys: {others}); start one per device with `python -m "
                            f"tvm.exec.rpc_server --tracker {address.host}:{address.port} --key "
                            f"{address.key}` (CUDA_VISIBLE_DEVICES=i for GPU i)")
    return servers


def rpc_runner(address: TrackerAddress, evaluator: ms.runner.EvaluatorConfig,
               session_timeout_s: int = 300) -> ms.runner.RPCRunner:
    """MetaSchedule's RPC runner measuring on every server registered under the key, one kept session each."""
    config = ms.runner.RPCConfig(tracker_host=address.host, tracker_port=address.port,
                                 tracker_key=address.key, session_timeout_sec=session_timeout_s)
    return ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator,
                               max_workers=registered_servers(address), f_create_session=kept_session,
                               f_upload_module=upload_module, f_run_evaluator=run_evaluator,
                               f_cleanup=cleanup)


# A kept session takes no new candidate in the last minute before the server ends it (the session timeout),
# so a candidate has a minute to finish; a hung kernel holds its device until the timeout.
LAST_CANDIDATE_S = 60


class KeptSession:
    """The session a runner worker process keeps between candidates.

    Every candidate is uploaded under a name of its own: MetaSchedule names every artifact alike, and a
    process that loads a library from a path it loaded before gets the first library back."""

    def __init__(self):
        self.session = None
        self.opened = 0.0
        self.uploads = 0
        self.remote_path: str | None = None
        self.measured = True  # False from a candidate's start until its timings came back

    def get(self, config: ms.runner.RPCConfig, clock=time.monotonic):
        """The kept session while it has a minute left before the session timeout and the last candidate
        was measured; else a new one."""
        aged = clock() - self.opened >= config.session_timeout_sec - LAST_CANDIDATE_S
        if self.session is None or not self.measured or aged:
            self.session = None  # frees its server for the tracker before asking for one
            self.session = config.connect_server()
            self.opened = clock()
        self.measured, self.remote_path = False, None
        return self.session

    def upload(self, session, local_path: str, remote_path: str):
        self.uploads += 1
        self.remote_path = f"{self.uploads}_{remote_path}"
        session.upload(local_path, self.remote_path)
        return session.load_module(self.remote_path)

    def release(self, session) -> None:
        """After a candidate: delete its files, or drop the session if the candidate failed."""
        if not self.measured:
            self.session = None
        elif self.remote_path is not None:
            session.remove(self.remote_path)
            session.remove(self.remote_path + ".so")


KEPT = KeptSession()  # one per runner worker process


def kept_session(config: ms.runner.RPCConfig):
    return KEPT.get(config)


def upload_module(session, local_path: str, remote_path: str):
    return KEPT.upload(session, local_path, remote_path)


def run_evaluator(session, module, device, evaluator_config, repeated_args) -> list[float]:
    costs = run_evaluator_common(module, device, evaluator_config, repeated_args)
    KEPT.measured = True
    return costs


def cleanup(session, remote_path: str | None) -> None:
    KEPT.release(session)
