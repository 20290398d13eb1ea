"""Half-precision MatMul, Gemm and Conv sum in float32 and round once, as onnxruntime does."""

import numpy as np
import pytest
from onnx import helper
from single_node import check_node

from tvmsched import frontend
from tvmsched.accumulate import accumulate_in_float32

RNG = np.random.default_rng(0)


def half(shape, dtype="float16"):
    return RNG.uniform(-1, 1, shape).astype(dtype)


def test_float16_matmul_over_a_long_inner_axis_matches_onnxruntime():
    """2048 terms summed in float16 are off by tens of ulp; in float32, by at most one rounding."""
    check_node(helper.make_node("MatMul", ["a", "b"], ["y"]), {"a": half((4, 2048)), "b": half((2048, 8))},
               rtol=1e-3, atol=1e-3)


def test_float16_gemm_and_conv_match_onnxruntime():
    check_node(helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1),
               {"a": half((3, 1024)), "b": half((5, 1024)), "c": half((5,))}, rtol=1e-3, atol=1e-3)
    check_node(helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
               {"x": half((1, 256, 6, 6)), "w": half((4, 256, 3, 3))}, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_each_half_product_gets_a_float32_out_dtype_and_a_cast_back_once(dtype):
    import onnx
    from single_node import node_model

    model = node_model(helper.make_node("MatMul", ["a", "b"], ["y"]), {"a": half((2, 8)), "b": half((8, 3))},
                       18)
    if dtype == "bfloat16":
        for value in [*model.graph.input, *model.graph.output]:
            value.type.tensor_type.elem_type = onnx.TensorProto.BFLOAT16
    main = accumulate_in_float32(frontend.to_relax(model, frontend.bind_input_shapes(model)))["main"].script()
    assert 'R.matmul(a, b, out_dtype="float32")' in main and f'R.astype(lv, dtype="{dtype}")' in main
    assert main.count("out_dtype") == 1, "a second pass leaves the module as it was"


def test_float32_products_are_left_alone():
    from single_node import node_model

    model = node_model(helper.make_node("MatMul", ["a", "b"], ["y"]),
                       {"a": half((2, 8), "float32"), "b": half((8, 3), "float32")}, 18)
    main = frontend.to_relax(model, frontend.bind_input_shapes(model))["main"].script()
    assert "astype" not in main
