"""The frame stack the tensor intrinsics are imported under gives TVMScript's parser what `inspect.stack`
gives it: the same frames, and the source lines it reads."""

import inspect

from tvmsched.tuning.intrinsics import WITH_SOURCE, shallow_stack


def _both():
    return inspect.stack(), shallow_stack()


def _nested(depth: int):
    return _nested(depth - 1) if depth else _both()


def test_a_shallow_stack_has_every_frame_and_the_innermost_source_lines():
    full, shallow = _nested(4)
    assert len(shallow) == len(full) > WITH_SOURCE
    for index, (expected, frame) in enumerate(zip(full, shallow)):
        assert frame.frame is expected.frame
        assert (frame.filename, frame.lineno, frame.function) == (expected.filename, expected.lineno,
                                                                   expected.function)
        if index < WITH_SOURCE:
            assert frame.code_context == expected.code_context and frame.index == expected.index
        else:
            assert frame.code_context is None


def test_fp16_tuning_on_the_h100_searches_tensor_core_schedules():
    """MetaSchedule's rules for the H100 target include its tensor-core tiling: a float16 matmul's design
    space tensorizes with the MMA intrinsics (which `import_tensor_intrinsics` registers); a float32
    one's does not (MetaSchedule has no TF32 rules)."""
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    from tvmsched.target import resolve_target
    from tvmsched.tuning.intrinsics import import_tensor_intrinsics

    import_tensor_intrinsics()

    def space(dtype: str) -> str:
        a, b = te.placeholder((256, 256), dtype, name="a"), te.placeholder((256, 256), dtype, name="b")
        k = te.reduce_axis((0, 256), "k")
        c = te.compute((256, 256), lambda i, j: te.sum(a[i, k].astype("float32") * b[k, j].astype("float32"),
                                                       axis=k), name="c")
        context = ms.TuneContext(mod=tvm.IRModule({"main": te.create_prim_func([a, b, c])}),
                                 target=resolve_target("nvidia/nvidia-h100").tvm_target,
                                 space_generator="post-order-apply", task_name="matmul")
        return "\n".join(str(schedule.trace) for schedule in context.generate_design_space())

    assert "tensorize" in space("float16") and "mma" in space("float16")
    assert "tensorize" not in space("float32")
