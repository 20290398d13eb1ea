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
