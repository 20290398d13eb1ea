"""Shared fixtures: small hand-built ONNX graphs and an onnxruntime reference."""

from __future__ import annotations

import os

# pytest-xdist runs one worker per core: one TVM thread each, not a pool of every core in each worker
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("TVM_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import onnx
import pytest
import tvm
from fakecuda import GRANULARITY, FakeCudart, FakeDriver
from onnx import TensorProto, helper, numpy_helper


def pytest_collection_modifyitems(config, items):
    if tvm.cuda(0).exist:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def own_tuning_logs(tmp_path_factory):
    """Tests read and write no tuning log of the user's (where `tune` writes by default, and builds look)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TVMSCHED_TUNING_LOGS", str(tmp_path_factory.mktemp("user_tuning_logs")))
        yield


@pytest.fixture(autouse=True, scope="session")
def own_caches(tmp_path_factory):
    """Tests keep their measurements and remembered digests out of the user's caches (`tvmsched.cache`)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TVMSCHED_CACHE", str(tmp_path_factory.mktemp("caches")))
        yield


@pytest.fixture
def fake_cuda(monkeypatch) -> FakeCudart:
    """The CUDA executors on the CPU (a CPU device passes for a CUDA one) over a stand-in cudart."""
    from tvmsched import cuda
    from tvmsched.executor import streams

    fake = FakeCudart()
    monkeypatch.setattr(cuda, "runtime", lambda: fake)
    monkeypatch.setattr(streams, "_check_cuda_device", lambda device, executor: None)
    return fake


@pytest.fixture
def fake_driver(monkeypatch) -> FakeDriver:
    """CUDA's virtual memory management on the CPU (`executor.mapped`) over a stand-in driver."""
    from tvmsched import cuda
    from tvmsched.executor import mapped

    driver = FakeDriver()
    monkeypatch.setattr(cuda, "driver", lambda: driver)
    monkeypatch.setattr(mapped, "CHUNK", GRANULARITY)
    return driver


def onnxruntime_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def assert_matches(actual: list[np.ndarray], expected: list[np.ndarray], rtol: float = 1e-4) -> None:
    """Outputs agree elementwise within rtol, with atol scaled to each output's magnitude."""
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max() or 1.0))


def make_model(nodes, inputs, outputs, weights: dict[str, np.ndarray], opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs,
                              [numpy_helper.from_array(value, name) for name, value in weights.items()])
    # IR version 9 keeps the models loadable by older onnxruntime releases (such as the GPU machine's).
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def tensor(name: str, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


@pytest.fixture
def branchy_model() -> onnx.ModelProto:
    """Two parallel conv branches, a concat, a split into a multi-output kernel, and an add."""
    rng = np.random.default_rng(0)
    weights = {"w1": rng.standard_normal((8, 3, 3, 3)).astype("float32") * 0.3,
               "w2": rng.standard_normal((8, 3, 1, 1)).astype("float32") * 0.3,
               "b2": rng.standard_normal(8).astype("float32")}
    nodes = [helper.make_node("Conv", ["input", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["input", "w2", "b2"], ["c2"], name="conv_b"),
             helper.make_node("Concat", ["r1", "c2"], ["cat"], axis=1),
             helper.make_node("MaxPool", ["cat"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Split", ["pool"], ["s1", "s2"], axis=1, num_outputs=2),
             helper.make_node("Add", ["s1", "s2"], ["sum"]),
             helper.make_node("Sigmoid", ["s2"], ["gate"]),
             helper.make_node("Mul", ["sum", "gate"], ["output"])]
    return make_model(nodes, [tensor("input", ["batch", 3, 8, 8])], [tensor("output", ["batch", 8, 4, 4])],
                      weights)


@pytest.fixture
def runtime_axes_model() -> onnx.ModelProto:
    """A ReduceSum whose axes are a graph input (as in onnx's node tests): a value that decides a shape."""
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    return make_model([node], [tensor("x", [3, 4]), tensor("axes", [1], TensorProto.INT64)],
                      [tensor("y", [3])], {})


@pytest.fixture
def two_io_model() -> onnx.ModelProto:
    """Two inputs of different dtypes' shapes and two outputs, one of them a graph input passed through."""
    rng = np.random.default_rng(1)
    weights = {"w": rng.standard_normal((4, 6)).astype("float32")}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "y"], ["out"]),
             helper.make_node("Identity", ["y"], ["y_copy"])]
    return make_model(nodes, [tensor("x", [2, 4]), tensor("y", [2, 6])],
                      [tensor("out", [2, 6]), tensor("y_copy", [2, 6])], weights)


RPC_KEY = "tvmsched-test"


@pytest.fixture(scope="session")
def rpc_tracker():
    """A TVM RPC tracker on 127.0.0.1 with two servers registered under RPC_KEY (its TrackerAddress)."""
    import time

    from tvm import rpc
    from tvm.rpc.tracker import Tracker

    from tvmsched.tuning.rpc import TrackerAddress, registered_servers

    tracker = Tracker(host="127.0.0.1", port=9490, port_end=9590, silent=True)
    servers = [rpc.Server(host="127.0.0.1", port=9600, port_end=9700, key=RPC_KEY,
                          tracker_addr=("127.0.0.1", tracker.port), silent=True) for _ in range(2)]
    address = TrackerAddress("127.0.0.1", tracker.port, RPC_KEY)
    for _ in range(50):
        if registered_servers(address) == 2:
            break
        time.sleep(0.1)
    yield address
    for server in servers:
        server.terminate()
    tracker.terminate()


@pytest.fixture
def gpu_rewrites(monkeypatch):
    """llvm builds rewritten as GPU builds are: without the CPU-only rewrites (padded channels, weights
    stored output channel last), whose convolutions no vendor library takes. For tests that run tactic
    recognition and selection on the CPU in place of a GPU."""
    from tvmsched import rewrite

    monkeypatch.setattr(rewrite, "channels_padded", lambda module, lanes: module)
    monkeypatch.setattr(rewrite, "weights_packed", lambda module: module)
