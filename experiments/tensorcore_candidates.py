"""Why most fp16 tensor-core candidates fail to build for the H100 (issue 26), without a GPU: a float16
NHWC convolution (+ bias + relu, as the fp16 and NHWC rewrites leave it) is lowered for the H100 target,
MetaSchedule's evolutionary search samples candidates from its design space (random cost model), and each
is built as TVM builds it (CUDA code generation and NVRTC, no device needed; not tune's builder, which
builds a refused candidate again with merged shared memory), under TVM's default pass configuration and
under each `--config KEY=true` given. Writes each build's outcome by error, and by
the tensor intrinsics the candidate uses.

    python -m experiments.tensorcore_candidates --candidates 64 --config tirx.merge_static_smem=true \
        --out /tmp/tc.json
"""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import numpy as np
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm.s_tir import meta_schedule as ms

from experiments.common import argument_parser, command, now
from tvmsched import frontend
from tvmsched.lower import lower
from tvmsched.rewrite import rewrite
from tvmsched.target import resolve_target
from tvmsched.tuning.intrinsics import import_tensor_intrinsics
from tvmsched.tuning.tune import _anonymous

ERRORS = {"tvm_access_ptr element type must match": "access_ptr dtype",
          "even number of lanes": "odd half lanes", "eval_vec_": "eval_vec_"}


def convolution(channels_in: int, channels_out: int, size: int, seed: int):
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array((rng.standard_normal((channels_out, channels_in, 3, 3)) / 10)
                                       .astype("float32"), "w"),
               numpy_helper.from_array(rng.standard_normal(channels_out).astype("float32"), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels_in, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels_out, size, size])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--shape", nargs=3, type=int, default=[64, 96, 28], metavar=("CIN", "COUT", "SIZE"))
    parser.add_argument("--candidates", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=true",
                        help="TVM pass-configuration options to build the same candidates under too")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    spec = resolve_target("nvidia/nvidia-h100")
    proto = convolution(*args.shape, args.seed)
    relax_module = frontend.to_relax(proto, frontend.bind_input_shapes(proto))
    module = lower(rewrite(relax_module, "fp16", "nhwc", spec=spec).module).module
    [task] = [_anonymous(task) for task in ms.relax_integration.extract_tasks(module, spec.tvm_target)
              if "conv" in task.task_name]
    import_tensor_intrinsics()
    strategy = ms.search_strategy.EvolutionarySearch(population_size=256, genetic_num_iters=1)
    context = ms.relax_integration.extracted_tasks_to_tune_contexts([task], "/tmp/tensorcore_candidates",
                                                                    strategy=strategy, seed=args.seed)[0][0]
    context.search_strategy.pre_tuning(args.candidates, args.candidates,
                                       context.space_generator.generate_design_space(context.mod),
                                       ms.database.MemoryDatabase(),
                                       ms.cost_model.RandomModel(seed=args.seed))
    candidates = context.search_strategy.generate_measure_candidates()
    configs = {"default": {}, **{text: {text.split("=")[0]: text.split("=")[1].lower() == "true"}
                                  for text in args.config}}
    outcomes = {name: collections.Counter() for name in configs}
    by_intrinsics = collections.Counter()
    for candidate in candidates:
        trace = str(candidate.sch.trace)
        intrinsics = ", ".join(sorted(set(re.findall(r'"((?:wmma|mma)_[a-z0-9_]+)"', trace)))) or "none"
        for name, config in configs.items():
            outcome = _built(candidate.sch.mod, spec.tvm_target, config)
            outcomes[name][outcome] += 1
            if name == "default":
                by_intrinsics[f"{intrinsics} -> {outcome}"] += 1
    result = {"experiment": "fp16 tensor-core candidates of MetaSchedule's search built for the H100 "
                            "without a GPU",
              "device": "none: code generation and NVRTC on the CPU", "date": now()[:10],
              "tvm": tvm.__version__,
              "command": command("experiments.tensorcore_candidates"), "kernel": task.task_name,
              "shape": {"in_channels": args.shape[0], "out_channels": args.shape[1], "size": args.shape[2]},
              "candidates": len(candidates),
              "outcomes": {name: dict(counts) for name, counts in outcomes.items()},
              "by_intrinsics_default": dict(by_intrinsics)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({key: result[key] for key in ("kernel", "candidates", "outcomes")}))


def _built(mod, target, config: dict) -> str:
    """"built", or which of ERRORS (else "other") the build under pass configuration `config` failed with."""
    try:
        with tvm.transform.PassContext(config=config):
            tvm.compile(mod, target=target)
        return "built"
    except Exception as error:  # noqa: BLE001  (TVM raises its own error types)
        return next((name for text, name in ERRORS.items() if text in str(error)), "other")


if __name__ == "__main__":
    main()
