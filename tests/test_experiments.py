"""The result files the experiments add to over several calls (experiments/common.py)."""

import json

import pytest

from experiments.common import ResultFile


def test_a_case_measured_again_keeps_its_row_until_the_new_one_lands(tmp_path, capsys):
    path = tmp_path / "bench.json"
    rows = [{"case": "a:1", "ms": 1.0}, {"case": "b:1", "ms": 2.0}]
    path.write_text(json.dumps({"commands": ["first"], "results": rows, "assembled": "by hand"}))

    assert ResultFile.load(path, "case").todo(["a:1", "c:1"], again=False) == ["c:1"]
    assert "a:1" in capsys.readouterr().out  # says what it skips

    results = ResultFile.load(path, "case")
    assert results.todo(["b:1", "c:1"], again=True) == ["b:1", "c:1"]
    results.commands.append("second")
    results.put({"case": "b:1", "ms": 1.5})
    results.write({"experiment": "bench"})  # a call cut off here has lost nothing
    results.put({"case": "c:1", "ms": 3.0})
    results.write({"experiment": "bench"})

    written = json.loads(path.read_text())
    assert written["results"] == [{"case": "a:1", "ms": 1.0}, {"case": "b:1", "ms": 1.5},
                                  {"case": "c:1", "ms": 3.0}]
    assert written["superseded"] == [{"case": "b:1", "ms": 2.0}]  # the replaced row stays traceable
    assert written["commands"] == ["first", "second"]
    assert written["assembled"] == "by hand" and written["experiment"] == "bench"


def test_no_earlier_file_means_everything_to_measure(tmp_path):
    results = ResultFile.load(tmp_path / "none.json", "model")
    assert results.todo(["x"], again=False) == ["x"] and results.rows == results.superseded == []


@pytest.mark.parametrize("contents", [b'{"results": [{"case": "a:1"}', b"\x89PNG\r\n"])  # cut off; not text
def test_a_corrupt_result_file_stops_the_call_and_is_kept(tmp_path, contents):
    path = tmp_path / "bench.json"
    path.write_bytes(contents)
    with pytest.raises(SystemExit, match="bench.json is not a result file"):
        ResultFile.load(path, "case")
    assert path.read_bytes() == contents


def test_the_table_rounds_dp_speedup_once():
    from experiments.bench import markdown

    row = {"case": "tv:resnet50:16", "systems": {"pytorch_cuda_graph": {"median_ms": 6.6887},
                                                 "tvmsched_dp": {"median_ms": 10.0641, "matches": True}},
           "best_peer": {"system": "pytorch_cuda_graph", "median_ms": 6.6887, "dp_speedup": 0.665}}
    assert markdown([row]).splitlines()[-1].endswith("| 0.66x (pytorch_cuda_graph) |")  # 0.6646, not 0.665
    peers = {"case": "tv:resnet50:1", "systems": {"torch_compile": {"median_ms": 1.5}}}  # --schedules (none)
    assert markdown([row, peers]).splitlines()[-1] == "| tv:resnet50:1 | — | — | 1.500 | — |"


def test_a_saved_build_is_reused_only_for_the_export_and_code_it_was_built_from(tmp_path, monkeypatch):
    """A network exported again (e.g. with new weights), or by changed tvmsched sources, is built again, not
    checked against its old build."""
    import os

    import numpy as np
    from onnx import helper, numpy_helper, save

    from experiments import real_models
    from experiments.real_models import build_case, reused_build

    def export(scale: float) -> None:
        weight = numpy_helper.from_array(np.full((4, 4), scale, "float32"), "w")
        graph = helper.make_graph([helper.make_node("MatMul", ["input", "w"], ["output"])], "tiny",
                                  [helper.make_tensor_value_info("input", 1, [1, 4])],
                                  [helper.make_tensor_value_info("output", 1, [1, 4])], [weight])
        save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)

    path, build = tmp_path / "tiny_b1.onnx", tmp_path / "build"
    export(0.0)
    row = build_case(path, "llvm", build)
    assert row["status"] == "built" and reused_build(path, build) == row
    monkeypatch.setattr(real_models, "_code_digest", lambda: "other code")
    assert reused_build(path, build) is None  # built by other tvmsched sources
    monkeypatch.undo()
    export(1.0)
    os.utime(path, ns=(1, 1))
    assert reused_build(path, build) is None


def test_the_models_table_has_a_row_per_network_and_a_column_per_target_and_batch(tmp_path):
    from experiments.real_models import markdown

    rows = {"llvm": [{"network": "resnet", "target": "llvm", "batch": 1, "status": "ok", "rel_diff": 2e-6}],
            "cuda": [{"network": "resnet", "target": "cuda", "batch": 16, "status": "ok", "rel_diff": 1e-6,
                      "speedup_vs_pytorch_cuda_graph": 0.5},
                     {"network": "vit", "target": "cuda", "batch": 16, "status": "refused"}]}
    files = []
    for target, results in rows.items():
        files.append(tmp_path / f"{target}.json")
        files[-1].write_text(json.dumps({"results": results}))
    assert markdown(files).splitlines() == [
        "| network | llvm b1 | cuda b16 |", "| --- | --- | --- |",
        "| resnet | 2.0e-06 | 1.0e-06, 0.50x |", "| vit | not run | refused |"]


def test_the_cpu_table_has_a_column_per_label_measured():
    from experiments.cpu_speed import table

    rows = [{"model": "squeezenet", "onnxruntime_ms": 3.7, "before_ms": 234.1, "before_vs_onnxruntime": 24.5,
             "before_compile_s": 1.3, "before_first_ms": 1427.6, "after_ms": 12.76,
             "after_vs_onnxruntime": 3.4, "after_compile_s": 3.6, "after_first_ms": 16.1},
            {"model": "nasnet", "onnxruntime_ms": 27.4, "after_ms": 49.9, "after_vs_onnxruntime": 1.8,
             "after_compile_s": 12.9, "after_first_ms": 112.4}]
    lines = table(rows).splitlines()
    assert lines[0] == ("| model | after ms (x onnxruntime) | before ms (x onnxruntime) | after compile s / "
                        "first call ms | before compile s / first call ms | onnxruntime ms |")
    assert lines[2] == "| squeezenet | 12.8 (3.4x) | 234.1 (24.5x) | 3.6 / 16 | 1.3 / 1428 | 3.70 |"
    assert lines[3] == "| nasnet | 49.9 (1.8x) |  | 12.9 / 112 |  | 27.40 |"


def test_bench_cases_name_source_model_batch_and_precision():
    from experiments.bench import _parse

    assert _parse("googlenet:16") == ("zoo", "googlenet", 16, "fp32")
    assert _parse("googlenet:1:fp16") == ("zoo", "googlenet", 1, "fp16")
    assert _parse("tv:resnet50:16:fp16") == ("tv", "resnet50", 16, "fp16")
    for bad in ("googlenet", "tv:resnet50", "googlenet:fp16", "x:y:1", "tv:resnet50:one"):
        with pytest.raises(SystemExit, match=f"bad case '{bad}'"):
            _parse(bad)


def test_parallel_transmission_relays_the_last_pieces_and_covers_every_byte():
    from experiments.transfer_links import chunks

    plan = chunks(10, 3, 0.5)
    assert [(offset, length) for offset, length, _ in plan] == [(0, 3), (3, 3), (6, 3), (9, 1)]
    assert [relayed for *_, relayed in plan] == [False, False, True, True]
    assert not any(relayed for *_, relayed in chunks(10, 3, 0.0))
    assert all(relayed for *_, relayed in chunks(10, 3, 1.0))


def test_gpu_utilization_is_averaged_per_gpu_and_unreadable_samples_are_skipped(tmp_path):
    from experiments.rpc_tuning import Utilization

    utilization = Utilization(tmp_path)
    utilization.path.write_text("0, 10\n1, 0\n0, 30\n1, [N/A]\n")
    assert utilization.summary() == {"host_cpu_percent": None, "gpu_percent": {"0": 20.0, "1": 0.0},
                                     "cpu_s": {}}


def test_cpu_seconds_are_counted_by_part_of_the_tuning_run():
    """A process marked as an RPC server and a worker under a process marked as `tvmsched tune` each burn
    about 0.4 s of CPU during the sampling: each part gets its own; the tuning process, which only waits,
    gets almost none."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from experiments.rpc_tuning import ProcessCpu

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(60)"
    spawn = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {burn!r}])"
    cpu = ProcessCpu()
    cpu.start()
    processes = [subprocess.Popen([sys.executable, "-c", code, mark], start_new_session=True)
                 for code, mark in ((burn, "tvm.exec.rpc_server"), (spawn, "tvmsched tune"))]
    try:
        time.sleep(3.0)
        cpu.stop()
    finally:
        for process in processes:  # with the worker the second one started
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    seconds = cpu.seconds()
    assert 0.3 <= seconds["servers"] < 1.5 and 0.3 <= seconds["tune_workers"] < 1.5
    assert seconds["tune"] < 0.3


def test_bench_mixes_no_rows_measured_otherwise_and_resolves_the_layout_per_precision():
    from types import SimpleNamespace

    from experiments.bench import _mixed, row_options

    args = SimpleNamespace(schedules=["dp"], stream_mapping="affinity", stage_sums=False, kernels="auto",
                           untuned=False, layout="auto", merge="off", target="cuda")
    full = row_options(args, "fp16") | {"systems": {"tvmsched_dp": {"median_ms": 1.0}}}
    assert full["layout"] == "nhwc" and row_options(args, "fp32")["layout"] == "nchw"
    assert not _mixed(full, row_options(args, "fp16"))
    assert _mixed(full | {"layout": "nchw"}, row_options(args, "fp16"))
    peers = {"systems": {"pytorch_cuda_graph": {"median_ms": 1.0}}}
    older_peers = peers | {"layout": "nhwc", "merge": "off", "untuned": False}  # before peers_only was kept
    for row in (peers | {"peers_only": True}, older_peers):
        assert _mixed(row, row_options(args, "fp16"))  # a full run names it (measure --again), not skips it
        assert not _mixed(row, row_options(SimpleNamespace(schedules=[]), "fp16"))
