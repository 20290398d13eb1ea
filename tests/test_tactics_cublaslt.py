"""cuBLASLt's view of a matmul kernel (`tactics.cublaslt.Gemm`), checked on the CPU: the column-major call
it describes, carried out with numpy on the kernel's flat buffers as cuBLASLt reads and writes them,
computes what the stand-in library computes from the VendorOp; epilogues and batches cuBLASLt cannot
serve exactly are declined."""

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import helper
from test_tactics_recognize import only_kernel, weights
from vendor_standin import compute

from tvmsched.tactics.cublaslt import Gemm
from tvmsched.tactics.vendor_op import Conv2d, EpilogueOp, Matmul, VendorOp

RNG = np.random.default_rng(1)


def column_major(flat: np.ndarray, rows: int, columns: int) -> np.ndarray:
    return flat[:rows * columns].reshape(columns, rows).T


def run_gemm(gemm: Gemm, vendor_op: VendorOp, arguments: list[np.ndarray]) -> np.ndarray:
    """What cuBLASLt writes for `gemm` (float64), given the kernel's parameters as arrays."""
    first = arguments[vendor_op.weight].astype(np.float64).ravel()
    second = arguments[vendor_op.data].astype(np.float64).ravel()
    out = np.zeros(vendor_op.anchor.out_shape).ravel()
    added = arguments[gemm.residual].astype(np.float64).ravel() if gemm.residual is not None else None
    for index in range(gemm.batch):
        value = column_major(first[index * gemm.first_stride:], gemm.n, gemm.k) @ \
            column_major(second[index * gemm.second_stride:], gemm.k, gemm.m)
        if added is not None:
            value = value + column_major(added[index * gemm.out_stride:], gemm.n, gemm.m)
        if gemm.bias is not None:
            value = value + arguments[gemm.bias].astype(np.float64).reshape(-1, 1)
        if "RELU" in gemm.epilogue:
            value = np.maximum(value, 0)
        out[index * gemm.out_stride:index * gemm.out_stride + gemm.n * gemm.m] = value.T.ravel()
    return out.reshape(vendor_op.anchor.out_shape)


def assert_computes(gemm: Gemm, vendor_op: VendorOp, arguments: list[np.ndarray]) -> None:
    expected = compute(vendor_op, arguments)  # rounded to float32 after each op
    np.testing.assert_allclose(run_gemm(gemm, vendor_op, arguments), expected, rtol=1e-5, atol=1e-5)


def matmul_op(a_shape, b_shape, out_shape, epilogue=(), dtype="float32"):
    return VendorOp(Matmul(a_shape, b_shape, out_shape, dtype, "float32"), 0, 1, tuple(epilogue),
                    2 + sum(op.operand is not None for op in epilogue))


def arguments_of(vendor_op: VendorOp) -> list[np.ndarray]:
    anchor = vendor_op.anchor
    arrays = [RNG.standard_normal(anchor.a_shape), RNG.standard_normal(anchor.b_shape)]
    for op in vendor_op.epilogue:
        if op.operand is not None:
            shape = anchor.out_shape[-1:] if op.kind == "bias" else anchor.out_shape
            arrays.append(RNG.standard_normal(shape))
    return arrays


RELU = EpilogueOp("relu", "float32")


@pytest.mark.parametrize("a_shape, b_shape, out_shape, batch", [
    ((5, 16), (16, 8), (5, 8), 1),
    ((2, 3, 4, 16), (16, 8), (2, 3, 4, 8), 1),  # A's batches fold into M
    ((3, 4, 16), (3, 16, 8), (3, 4, 8), 3),  # strided batches
    ((4, 16), (3, 16, 8), (3, 4, 8), 3),  # A broadcast: stride 0
    ((1, 4, 16), (2, 3, 16, 8), (2, 3, 4, 8), 6),
])
def test_batches_compute_the_matmul(a_shape, b_shape, out_shape, batch):
    vendor_op = matmul_op(a_shape, b_shape, out_shape, [EpilogueOp("bias", "float32", 2, len(out_shape) - 1)])
    gemm = Gemm.of(vendor_op)
    assert gemm is not None and gemm.batch == batch and gemm.epilogue == "BIAS"
    arguments = arguments_of(vendor_op)
    assert_computes(gemm, vendor_op, arguments)


@pytest.mark.parametrize("epilogue, name", [
    ([], "DEFAULT"),
    ([RELU], "RELU"),
    ([EpilogueOp("bias", "float32", 2, 2), RELU], "RELU_BIAS"),
    ([EpilogueOp("residual", "float32", 2)], "DEFAULT"),
    ([EpilogueOp("bias", "float32", 2, 2), EpilogueOp("residual", "float32", 3), RELU], "RELU_BIAS"),
    ([EpilogueOp("residual", "float32", 2), EpilogueOp("bias", "float32", 3, 2)], "BIAS"),
])
def test_epilogues_served(epilogue, name):
    vendor_op = matmul_op((2, 6, 16), (16, 8), (2, 6, 8), epilogue)
    gemm = Gemm.of(vendor_op)
    assert gemm is not None and gemm.epilogue == name
    arguments = arguments_of(vendor_op)
    assert_computes(gemm, vendor_op, arguments)


@pytest.mark.parametrize("epilogue", [
    [RELU, EpilogueOp("bias", "float32", 2, 1)],  # relu must come last
    [EpilogueOp("silu", "float32")],
    [EpilogueOp("multiply", "float32", 2, 1)],
    [EpilogueOp("bias", "float32", 2, 1), EpilogueOp("bias", "float32", 3, 1)],
    [EpilogueOp("clip", "float32", bounds=(0.0, 6.0))],
])
def test_epilogues_declined(epilogue):
    assert Gemm.of(matmul_op((4, 16), (16, 8), (4, 8), epilogue)) is None


def test_declined_batches_dtypes_and_anchors():
    assert Gemm.of(matmul_op((2, 1, 4, 16), (1, 3, 16, 8), (2, 3, 4, 8))) is None  # both broadcast
    fp32_to_half = matmul_op((4, 16), (16, 8), (4, 8), [EpilogueOp("cast", "float16")])
    assert Gemm.of(fp32_to_half) is None
    half = VendorOp(Matmul((4, 16), (16, 8), (4, 8), "float16", "float32"), 0, 1,
                    (EpilogueOp("cast", "float16"), EpilogueOp("bias", "float16", 2, 1)), 3)
    assert (Gemm.of(half).in_dtype, Gemm.of(half).out_dtype) == ("float16", "float16")
    mixed_bias = VendorOp(half.anchor, 0, 1,
                          (EpilogueOp("bias", "float32", 2, 1), EpilogueOp("cast", "float16")), 3)
    assert Gemm.of(mixed_bias) is None  # cuBLASLt's bias has the output's type
    casts = (EpilogueOp("cast", "float16"), EpilogueOp("cast", "float32"))
    rounded_between = VendorOp(half.anchor, 0, 1, casts, 2)
    assert Gemm.of(rounded_between) is None  # cuBLASLt would not round to float16 before the float32 output
    summed_in_half = VendorOp(Matmul((4, 16), (16, 8), (4, 8), "float16", "float16"), 0, 1,
                              (EpilogueOp("cast", "float32"),), 2)
    assert Gemm.of(summed_in_half) is None
    conv = VendorOp(Conv2d("NCHW", (1, 4, 8, 8), (8, 4, 3, 3), (1, 8, 6, 6), (1, 1), (0, 0, 0, 0), (1, 1), 1,
                           "float32", "float32"), 0, 1, (), 2)
    assert Gemm.of(conv) is None


def test_a_transformer_projection_with_residual_is_served():
    """MatMul + bias + residual, as a transformer's output projection: recognized and served in one call."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Add", ["a", "r"], ["y"])]
    kernel = only_kernel(make_model(nodes, [tensor("x", [2, 5, 16]), tensor("r", [2, 5, 8])],
                                    [tensor("y", [2, 5, 8])], weights(w=(16, 8), b=(8,))))
    gemm = Gemm.of(kernel.vendor_op)
    assert gemm is not None and (gemm.batch, gemm.epilogue, gemm.residual) == (1, "BIAS", 3)
    arguments = [RNG.standard_normal(tensor.shape) for tensor in kernel.inputs]
    assert_computes(gemm, kernel.vendor_op, arguments)

