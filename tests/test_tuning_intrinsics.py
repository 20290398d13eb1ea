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
