"""CUDA builds refused by TVM's shared-memory planning are built again with static shared allocations
merged (`tvmsched.shared_memory`): the rule itself, and on MetaSchedule's fp16 tensor-core candidates for
the H100, compiled here without a GPU, in tune's builder and in a model's library."""

import pytest
import tvm

from tvmsched.shared_memory import MERGED, REFUSED, built_retrying_merged


def test_only_a_cuda_build_refused_so_is_built_again_with_merged_shared_memory():
    configs = []

    def build():
        configs.append(dict(tvm.transform.PassContext.current().config))
        if len(configs) == 1:
            raise RuntimeError(f"Check failed: ... : {REFUSED} the source buffer")
        return "built"

    with tvm.transform.PassContext(config={"tirx.disable_vectorize": True}):
        assert built_retrying_merged(build, "cuda") == "built"
    assert configs[1] == {"tirx.disable_vectorize": True, **MERGED} and not configs[0].get(
        "tirx.merge_static_smem")
    for kind, message in (("llvm", REFUSED), ("cuda", "another error")):  # raised as they are, once
        calls = []

        def fails(message=message, calls=calls):
            calls.append(message)
            raise RuntimeError(message)
        with pytest.raises(RuntimeError, match=message):
            built_retrying_merged(fails, kind)
        assert len(calls) == 1


def test_a_build_that_needed_merged_shared_memory_is_built_with_it_at_once_next_time(monkeypatch):
    """A refused build's key is remembered, in this process and in the cache for another (stood in for by
    forgetting this process's): the next build of that key tries no plain build first; another key does."""
    from tvmsched import shared_memory

    def build(configs):
        configs.append(bool(tvm.transform.PassContext.current().config.get("tirx.merge_static_smem")))
        if not configs[-1]:
            raise RuntimeError(f"{REFUSED} (float16 vs float32)")
        return "built"

    first, again, other = [], [], []
    assert built_retrying_merged(lambda: build(first), "cuda", "kernels/h100") == "built"
    monkeypatch.setattr(shared_memory.NEEDED, "known", {})
    assert built_retrying_merged(lambda: build(again), "cuda", "kernels/h100") == "built"
    assert built_retrying_merged(lambda: build(other), "cuda", "others/h100") == "built"
    assert first == [False, True] and again == [True] and other == [False, True]


@pytest.fixture(scope="module")
def refused():
    """An fp16 NHWC convolution lowered for the H100, its MetaSchedule task, and the candidates of a
    seeded search that TVM refuses to build as it builds them."""
    from tvm.s_tir import meta_schedule as ms

    from experiments.tensorcore_candidates import convolution
    from tvmsched import frontend
    from tvmsched.lower import lower
    from tvmsched.rewrite import rewrite
    from tvmsched.target import resolve_target
    from tvmsched.tuning.intrinsics import import_tensor_intrinsics
    from tvmsched.tuning.tune import _anonymous

    spec = resolve_target("nvidia/nvidia-h100")
    proto = convolution(128, 192, 14, seed=1)
    lowered = lower(rewrite(frontend.to_relax(proto, frontend.bind_input_shapes(proto)), "fp16", "nhwc",
                            spec=spec).module)
    [task] = [_anonymous(task) for task in ms.relax_integration.extract_tasks(lowered.module, spec.tvm_target)
              if "conv" in task.task_name]
    import_tensor_intrinsics()
    strategy = ms.search_strategy.EvolutionarySearch(population_size=64, genetic_num_iters=1,
                                                     init_min_unmeasured=4)
    context = ms.relax_integration.extracted_tasks_to_tune_contexts([task], "/tmp/test_shared_memory",
                                                                    strategy=strategy, seed=1)[0][0]
    context.search_strategy.pre_tuning(4, 4, context.space_generator.generate_design_space(context.mod),
                                       ms.database.MemoryDatabase(), ms.cost_model.RandomModel(seed=1))
    candidates = []
    for candidate in context.search_strategy.generate_measure_candidates():
        try:
            tvm.compile(candidate.sch.mod, target=spec.tvm_target)
        except Exception as error:  # noqa: BLE001
            if REFUSED in str(error):
                candidates.append(candidate)
    assert candidates  # as TVM builds them
    return spec, lowered, task, candidates


def test_tune_builds_the_candidates_tvm_refuses(refused):
    from tvmsched.tuning.builder import build_kernel

    spec, _, _, candidates = refused
    for candidate in candidates:
        assert build_kernel(candidate.sch.mod, spec.tvm_target).imports  # the CUDA module


def test_a_model_library_applies_a_record_tvm_refuses_instead_of_falling_back(refused):
    from tvm.s_tir import meta_schedule as ms

    from tvmsched.codegen import build_library
    from tvmsched.lower import kernel_module

    spec, lowered, task, [candidate, *_] = refused
    database = ms.database.MemoryDatabase()
    workload = database.commit_workload(task.dispatched[0])
    database.commit_tuning_record(ms.database.TuningRecord(
        candidate.sch.trace, workload, [1e-5], spec.tvm_target,
        ms.arg_info.ArgInfo.from_prim_func(task.dispatched[0]["main"])))
    library = build_library(kernel_module(lowered), spec, database)
    assert library.tuned and not library.fallbacks


@pytest.mark.gpu
def test_the_candidates_tvm_refuses_compute_the_convolution_once_built_with_merged_shared_memory(refused):
    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    from tvmsched.tuning.builder import build_kernel

    if tvm.cuda().compute_version != "9.0":
        pytest.skip("the candidates are compiled for the H100 (sm_90a)")
    spec, _, task, candidates = refused
    function = task.dispatched[0]
    rng = np.random.default_rng(2)
    arguments = [rng.standard_normal([int(dim) for dim in info.shape]).astype(info.dtype)
                 for info in ms.arg_info.ArgInfo.from_prim_func(function["main"])]
    arguments[-1][:] = 0  # the output
    on_cpu = [tvm.runtime.tensor(value, tvm.cpu()) for value in arguments]
    tvm.compile(function, target="llvm")["main"](*on_cpu)
    expected = on_cpu[-1].numpy().astype("float32")
    assert np.abs(expected).max() > 0
    for candidate in candidates[:8]:
        on_gpu = [tvm.runtime.tensor(value, tvm.cuda()) for value in arguments]
        build_kernel(candidate.sch.mod, spec.tvm_target)["main"](*on_gpu)
        error = np.abs(on_gpu[-1].numpy().astype("float32") - expected).max() / np.abs(expected).max()
        assert error <= 1e-2, error
