"""--layout nhwc on the CPU: channels-last convolutions compute what the model computes, in the model's input
and output layout, are recognized for the vendor libraries as NHWC, and combine with fp16 and merge (saving
and the compile flag: tests/test_precision.py)."""


import numpy as np
import pytest
from conftest import onnxruntime_outputs
from test_precision import TOLERANCE, relative_error
from test_tactics_select import network

import tvmsched
from tvmsched.errors import UsageError
from tvmsched.tactics.vendor_op import Conv2d


def test_nhwc_computes_what_the_model_computes():
    proto = network()
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype("float32")
    model = tvmsched.compile(proto, target="llvm", batch=2, layout="nhwc")
    assert model.meta.layout == "nhwc"
    [expected] = onnxruntime_outputs(proto, {"input": x})
    np.testing.assert_allclose(model(x), expected, rtol=1e-4, atol=1e-5)
    convolutions = [kernel.vendor_op.anchor for kernel in model.graph.kernels
                    if kernel.vendor_op is not None and isinstance(kernel.vendor_op.anchor, Conv2d)]
    assert convolutions and {anchor.layout for anchor in convolutions} == {"NHWC"}
    half = tvmsched.compile(proto, target="llvm", batch=2, layout="nhwc", precision="fp16")
    assert relative_error(half(x), expected) <= TOLERANCE


def test_an_unknown_layout_is_refused_before_compiling(branchy_model):
    with pytest.raises(UsageError, match="unknown layout 'NHWC'"):
        tvmsched.compile(branchy_model, target="llvm", layout="NHWC",
                         progress=lambda stage: pytest.fail(f"started {stage}"))


def test_merge_comes_first_and_composes_with_nhwc_and_fp16():
    proto = network()  # two 1x1 convolutions read one tensor
    x = np.random.default_rng(6).standard_normal((2, 3, 8, 8)).astype("float32")
    [expected] = onnxruntime_outputs(proto, {"input": x})
    for precision, tolerance in (("fp32", 1e-5), ("fp16", TOLERANCE)):
        model = tvmsched.compile(proto, target="llvm", batch=2, merge=True, layout="nhwc",
                                 precision=precision)
        assert model.meta.merged_convolutions == (2,)
        assert relative_error(model(x), expected) <= tolerance
