"""ONNX conformance: the `onnx` package's backend node tests through tvmsched (llvm) and onnxruntime.

Each case is one ONNX node with inputs and expected outputs that onnx's own test generators compute (the
cases its test-data writer writes out, regenerated here from the installed `onnx`). A case passes when every
output has the expected dtype and shape and agrees within the case's rtol/atol (NaNs equal), as onnx's
backend test runner checks. A tvmsched result is one of

    pass      the outputs match
    wrong     it compiled and ran, and an output differs (the failure that must not exist)
    refused   a TvmschedError: one message naming the problem
    crash     any other exception (a bug: it should have been a refusal or a pass)
    timeout   no answer within --timeout seconds

The node tests give values such as a ReduceSum's axes or a Reshape's shape as graph inputs. A case whose
build is refused because such an input's value decides a shape (ConstantInputRequired) is built again with
those inputs bound to the case's values (`constant_inputs`), as a user would; its row names them in
`constant_inputs`, and its pass counts in `tvmsched_pass` and in `passed_with_constant_inputs`. onnxruntime
runs the original model.

Cases run in worker processes (a crash or a hang costs one case), `--jobs` at a time:

    python -m experiments.onnx_conformance --out experiments/results/onnx_conformance.json
    python -m experiments.onnx_conformance --ops Gather Resize --out /tmp/subset.json   # some ops only
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import re
import time
import traceback
from pathlib import Path

import numpy as np

from experiments.common import argument_parser, command, now

OUTCOMES = ("pass", "wrong", "refused", "crash", "timeout")


def node_cases(ops: list[str] | None = None) -> dict:
    """The backend node test cases of the installed onnx, by name (optionally those of `ops` only), each
    with the op it tests: an `..._expanded` case (the op's function body) counts for the op it expands."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = {case.name: case for case in collect_testcases()}
    tested = {}
    for name, case in cases.items():
        base = cases.get(re.sub(r"_expanded(_ver\d+)?$", "", name), case)
        node = base.model.graph.node[0]
        tested[name] = (case, node.op_type, node.domain or "ai.onnx")
    return {name: value for name, value in tested.items() if ops is None or value[1] in ops}


def describe(name: str, case, op: str, domain: str) -> dict:
    """The op, domain and whether the case is in the float32 subset: a float32 tensor among its inputs and
    outputs, and no floating-point tensor of another precision (integer and bool tensors may be there)."""
    from onnx import TensorProto, helper

    types = [value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else None
             for value in [*case.model.graph.input, *case.model.graph.output]]
    floats = {kind for kind in types if kind is not None and kind != TensorProto.BOOL
              and helper.tensor_dtype_to_np_dtype(kind).kind in "fcV"}
    return {"case": name, "op": op, "domain": domain, "float32": floats == {TensorProto.FLOAT}}


def compare(actual: list, expected: list, rtol: float, atol: float) -> str | None:
    """None where the outputs match as onnx's backend runner checks them, else what differs."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for index, (got, want) in enumerate(zip(actual, expected)):
        if isinstance(got, list) or isinstance(want, list):  # sequence outputs
            if not (isinstance(got, list) and isinstance(want, list)):
                return f"output {index} is {'a sequence' if isinstance(got, list) else 'a tensor'}"
            difference = compare(got, want, rtol, atol)
            if difference:
                return f"output {index}: {difference}"
            continue
        got, want = np.asarray(got), np.asarray(want)
        if got.dtype != want.dtype or got.shape != want.shape:
            return f"output {index} is {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
        if want.dtype == object or want.dtype.kind in "SUb":
            if not np.array_equal(got, want):
                return f"output {index} differs"
            continue
        try:
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError:
            diff = np.abs(got.astype("float64") - want.astype("float64"))
            return f"output {index} differs (max abs diff {np.nanmax(diff):.3g})"
    return None


def _inputs(case) -> dict:
    """The case's inputs by graph input name."""
    inputs, _ = case.data_sets[0]
    return {value.name: _array(array) for value, array in zip(case.model.graph.input, inputs)}


def _expected(case) -> list:
    return [_array(array) for array in case.data_sets[0][1]]


def _array(value):
    """A case's value as an array: onnx writes some (the Cast cases' float8, int4, ...) as TensorProtos."""
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(value) if isinstance(value, TensorProto) else value


def run_tvmsched(case) -> dict:
    """The case through tvmsched; where the build is refused because an input's value decides a shape, it
    is built again with those inputs bound to the case's values (named in the row's `constant_inputs`)."""
    import tvmsched
    from tvmsched.errors import ConstantInputRequired, TvmschedError

    expected, inputs, bound = _expected(case), _inputs(case), {}
    try:
        try:
            model = tvmsched.compile(case.model, target="llvm")
        except ConstantInputRequired as error:
            bound = {name: inputs[name] for name in error.inputs}
            model = tvmsched.compile(case.model, target="llvm", constant_inputs=bound)
        actual = model.run({name: value for name, value in inputs.items() if name not in bound})
        difference = compare(actual, expected, case.rtol, case.atol)
        row = {"tvmsched": "wrong", "tvmsched_error": difference} if difference else {"tvmsched": "pass"}
    except TvmschedError as error:
        row = {"tvmsched": "refused", "tvmsched_error": f"{type(error).__name__}: {error}"}
    except Exception as error:  # noqa: BLE001  (any other exception is what this classifies as a crash)
        where = traceback.extract_tb(error.__traceback__)[-1]
        row = {"tvmsched": "crash", "tvmsched_error": f"{type(error).__name__}: {_first_line(error)} "
                                                       f"({Path(where.filename).name}:{where.lineno})"}
    return {**row, "constant_inputs": sorted(bound)} if bound else row


def run_onnxruntime(case) -> dict:
    import onnxruntime

    try:
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(case.model.SerializeToString(), options,
                                               providers=["CPUExecutionProvider"])
        actual = session.run(None, _inputs(case))
    except Exception as error:  # noqa: BLE001  (onnxruntime raises its own types for unsupported cases)
        return {"onnxruntime": "error", "onnxruntime_error": _first_line(error)}
    difference = compare(actual, _expected(case), case.rtol, case.atol)
    return {"onnxruntime": "wrong" if difference else "pass"}


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:300]


def _worker(ops, connection) -> None:
    """A worker process: collects the cases once, then answers case names with result rows."""
    os.environ["TVM_NUM_THREADS"] = "1"  # not defaulted: the parent's `import tvmsched` set every core
    import warnings
    warnings.simplefilter("ignore")
    cases = node_cases(ops)
    connection.send("ready")
    while (name := connection.recv()) is not None:
        case = cases[name][0]
        with np.errstate(all="ignore"):
            row = {**describe(name, *cases[name]), **run_onnxruntime(case)}
            row.update(run_tvmsched(case))
        connection.send(row)


class _Worker:
    """A worker process with its end of a pipe; `start` makes a new one after a timeout kills the old."""

    def __init__(self, ops):
        self.ops = ops
        self.start()

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_worker, args=(self.ops, child), daemon=True)
        self.process.start()
        self.case, self.since = None, 0.0
        self.ready = False

    def give(self, name: str) -> None:
        self.case, self.since = name, time.monotonic()
        self.connection.send(name)

    def kill(self) -> None:
        self.process.kill()
        self.process.join()


def run_cases(names: list[str], ops, jobs: int, timeout: float, describe_case, report) -> list[dict]:
    """Each case's row, computed by `jobs` workers; a case past `timeout` seconds (or whose worker died)
    gets a row from `describe_case` with the outcome filled in, and its worker is replaced."""
    pending, rows = list(reversed(names)), []
    workers = [_Worker(ops) for _ in range(min(jobs, len(names)))]
    while pending or any(worker.case for worker in workers):
        for worker in workers:
            if worker.connection.poll(0.05):
                try:
                    message = worker.connection.recv()
                except EOFError:
                    message = None
                if message == "ready":
                    worker.ready = True
                elif message is not None:
                    rows.append(message)
                    report(message)
                    worker.case = None
            dead = worker.case and not worker.process.is_alive()
            late = worker.case and time.monotonic() - worker.since > timeout
            if dead or late:
                row = {**describe_case(worker.case), "tvmsched": "timeout" if late else "crash",
                       "tvmsched_error": f"no answer in {timeout:.0f} s" if late
                       else f"the worker process died (exit code {worker.process.exitcode})"}
                rows.append(row)
                report(row)
                worker.kill()
                worker.start()
            if worker.ready and worker.case is None and pending:
                worker.give(pending.pop())
    for worker in workers:
        worker.connection.send(None)
        worker.process.join(timeout=10)
    return rows


def summarize(rows: list[dict]) -> dict:
    """Counts over all cases, over the float32 subset, and per op; `tvmsched_pass` includes the passes that
    needed inputs bound to values (`passed_with_constant_inputs`)."""
    def counts(subset: list[dict]) -> dict:
        tvm_pass = {row["case"] for row in subset if row["tvmsched"] == "pass"}
        ort_pass = {row["case"] for row in subset if row.get("onnxruntime") == "pass"}
        outcome = collections.Counter(row["tvmsched"] for row in subset)
        return {"cases": len(subset), "tvmsched_pass": len(tvm_pass), "onnxruntime_pass": len(ort_pass),
                "both_pass": len(tvm_pass & ort_pass),
                "passed_with_constant_inputs": sum(row["tvmsched"] == "pass" and "constant_inputs" in row
                                                   for row in subset),
                "wrong": outcome["wrong"],
                "refused": outcome["refused"], "crash": outcome["crash"], "timeout": outcome["timeout"],
                "both_pass_of_onnxruntime_pass": round(len(tvm_pass & ort_pass) / max(len(ort_pass), 1), 4)}

    by_op = collections.defaultdict(list)
    for row in rows:
        by_op[row["op"]].append(row)
    return {"float32": counts([row for row in rows if row["float32"]]), "all": counts(rows),
            "per_op": {op: counts(op_rows) for op, op_rows in sorted(by_op.items())}}


def markdown_table(summary: dict, rows: list[dict]) -> str:
    """The per-op table for docs: cases, passes, and why tvmsched does not pass a case of the op (one that
    onnxruntime passes, if any): the error's reason, without the node's name and the fix."""
    first_problem = {}
    for row in sorted(rows, key=lambda row: row["onnxruntime"] != "pass"):
        if row["tvmsched"] != "pass" and row["op"] not in first_problem:
            first_problem[row["op"]] = f"{row['tvmsched']}: {_reason(row.get('tvmsched_error', ''))}"
    lines = ["| op | cases | tvmsched pass | onnxruntime pass | both | wrong | why not |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for op, stats in summary["per_op"].items():
        problem = first_problem.get(op, "").replace("|", "\\|")[:200]
        lines.append(f"| {op} | {stats['cases']} | {stats['tvmsched_pass']} | {stats['onnxruntime_pass']} | "
                     f"{stats['both_pass']} | {stats['wrong']} | {problem} |")
    return "\n".join(lines) + "\n"


def _reason(error: str) -> str:
    """`UnsupportedOperator: node '#0' (Op) (opset 9): it does X; do Y` → `it does X`."""
    error = re.sub(r"^\w+: ", "", error)
    error = re.sub(r"^node '[^']*' (\(\w+\)( \(opset \d+\))?:? )?", "", error)
    return error.split("; ")[0]


def main() -> None:
    import json

    import onnx
    import onnxruntime
    import tvm

    parser = argument_parser(__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write")
    parser.add_argument("--table", type=Path, help="also write the per-op markdown table here")
    parser.add_argument("--ops", nargs="+", help="only the cases of these ONNX ops")
    parser.add_argument("--cases", nargs="+", help="only these cases (test_... names)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per case")
    args = parser.parse_args()

    cases = node_cases(args.ops)
    names = sorted(name for name in cases if not args.cases or name in args.cases)
    print(f"{len(names)} cases, {args.jobs} workers", flush=True)
    started = time.monotonic()

    def report(row: dict) -> None:
        note = f"  {row.get('tvmsched_error', '')}" if row["tvmsched"] != "pass" else ""
        print(f"{row['tvmsched']:8s} {row['case']}{note}"[:220], flush=True)

    rows = run_cases(names, args.ops, args.jobs, args.timeout, lambda name: describe(name, *cases[name]),
                     report)
    rows.sort(key=lambda row: row["case"])
    summary = summarize(rows)
    report_json = {"experiment": "onnx_conformance", "date": now(), "command": command(
        "experiments.onnx_conformance"), "device": "cpu (llvm)", "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__, "tvm": tvm.__version__,
        "seconds": round(time.monotonic() - started), **summary, "cases": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report_json, indent=1))
    if args.table:
        args.table.write_text(markdown_table(summary, rows))
    print(json.dumps({key: summary[key] for key in ("float32", "all")}, indent=1))


if __name__ == "__main__":
    main()
