"""cuBLASLt through nvmath-python's bindings (`nvmath.bindings.cublasLt`): a fused matmul kernel as one
cuBLASLt matmul with its epilogue.

A row-major product C = A·B is the column-major product Cᵀ = Bᵀ·Aᵀ, so cuBLASLt gets B as its first
operand and A as its second, neither transposed, and writes D column-major with N rows: a bias along the
output's last axis is cuBLASLt's bias vector (one value per row of D). cuBLASLt computes
epilogue(A·B + β·C + bias): the kernel's epilogue is served when it is a bias, a residual of the output's
shape (C, β = 1), both in either order, then at most a relu; casts may only be to the output's type or to
float32 (cuBLASLt rounds once, to the output's type).
Operands are float32, float16 or bfloat16, summed in float32 (`COMPUTE_32F`: fp32 stays exact fp32, no
TF32); batches are strided, a broadcast one with stride 0, and a B without batch folds A's batches into M.

The plans are cuBLASLt's heuristic ranking for the problem; a plan is named by its algorithm's 64 bytes in
hex, which a later run passes back to cuBLASLt as they are.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np

from tvmsched.tactics.library import Candidate, Launcher, VendorLibrary, register_library
from tvmsched.tactics.vendor_op import Matmul, VendorOp

TYPES = {"float32": "CUDA_R_32F", "float16": "CUDA_R_16F", "bfloat16": "CUDA_R_16BF"}
MAX_WORKSPACE = 32 << 20
ALIGNMENT = 16  # bytes every operand's address is assumed to have (the launcher checks)


def _lt():
    from nvmath.bindings import cublasLt

    return cublasLt


@dataclass(frozen=True)
class Gemm:
    """A VendorOp as one cuBLASLt call, column-major: D (n x m) = first (n x k) · second (k x m), `batch`
    times with the element strides given, then `epilogue` ("DEFAULT", "BIAS", "RELU" or "RELU_BIAS");
    `bias` and `residual` are kernel parameter positions."""

    m: int
    n: int
    k: int
    batch: int
    first_stride: int
    second_stride: int
    out_stride: int
    in_dtype: str
    out_dtype: str
    epilogue: str
    bias: int | None
    residual: int | None

    @classmethod
    def of(cls, vendor_op: VendorOp) -> Gemm | None:
        """The call computing `vendor_op`; None where cuBLASLt cannot compute it exactly."""
        anchor, out_dtype = vendor_op.anchor, vendor_op.out_dtype
        if not isinstance(anchor, Matmul) or anchor.dtype not in TYPES or out_dtype not in (anchor.dtype,
                                                                                             "float32"):
            return None
        if vendor_op.rounds_between:
            return None
        served = _epilogue(vendor_op)
        if served is None:
            return None
        product = anchor.batched()
        if product is None:
            return None
        return cls(product.m, product.n, product.k, product.batch, product.b_stride, product.a_stride,
                   product.m * product.n, anchor.dtype, out_dtype, *served)


def _epilogue(vendor_op: VendorOp) -> tuple[str, int | None, int | None] | None:
    """(cuBLASLt epilogue, bias position, residual position) of the VendorOp's epilogue, if it has one."""
    bias = residual = None
    relu = False
    for op in vendor_op.epilogue:
        if op.kind == "cast":  # to the output's type or float32 (`rounds_between`): what cuBLASLt does
            continue
        if relu or (op.kind in ("bias", "residual") and op.dtype != vendor_op.out_dtype):
            return None
        if op.kind == "bias" and bias is None:
            bias = op.operand
        elif op.kind == "residual" and residual is None:
            residual = op.operand
        elif op.kind == "relu":
            relu = True
        else:
            return None
    name = "_".join(["RELU"] * relu + ["BIAS"] * (bias is not None)) or "DEFAULT"
    return name, bias, residual


@register_library("cublaslt")
class CublasLtLibrary(VendorLibrary):
    """cuBLASLt on the current device: one handle, and each VendorOp's descriptors made once."""

    def __init__(self):
        self.handle = _lt().create()
        self.problems: dict[VendorOp, _Problem | None] = {}

    @staticmethod
    def version() -> str | None:
        try:
            return str(_lt().get_version())
        except Exception:  # noqa: BLE001  (not installed, or no driver or cuBLASLt library to load)
            return None

    def candidates(self, vendor_op: VendorOp, limit: int) -> list[Candidate]:
        problem = self._problem(vendor_op)
        return problem.candidates(self.handle, limit) if problem else []

    def launcher(self, vendor_op: VendorOp, plan: str, arguments: list, workspace,
                 owner: ExitStack) -> Launcher:
        problem = self._problem(vendor_op)
        if problem is None:
            raise LookupError(f"cuBLASLt does not compute {vendor_op.name}; rebuild the model")
        return problem.launcher(self.handle, vendor_op, plan, arguments, workspace, owner)

    def _problem(self, vendor_op: VendorOp) -> _Problem | None:
        if vendor_op not in self.problems:
            gemm = Gemm.of(vendor_op)
            self.problems[vendor_op] = gemm and _Problem(gemm)
        return self.problems[vendor_op]


class _Problem:
    """A Gemm's cuBLASLt descriptors (matmul, the four matrix layouts), kept with the library; a launcher's
    matmul descriptor with its bias pointer is released with the launcher's owner."""

    def __init__(self, gemm: Gemm):
        import nvmath
        from nvmath.bindings import cublas

        lt = _lt()
        self.gemm = gemm
        self.compute = (cublas.ComputeType.COMPUTE_32F, nvmath.CudaDataType.CUDA_R_32F)
        self.desc = self._matmul_desc(None, None)
        in_type, out_type = (getattr(nvmath.CudaDataType, TYPES[dtype]) for dtype in (gemm.in_dtype,
                                                                                       gemm.out_dtype))
        self.first = self._layout(in_type, gemm.n, gemm.k, gemm.first_stride)
        self.second = self._layout(in_type, gemm.k, gemm.m, gemm.second_stride)
        self.out = self._layout(out_type, gemm.n, gemm.m, gemm.out_stride)
        self.preference = lt.matmul_preference_create()
        attribute = lt.MatmulPreferenceAttribute
        for name, value in [("MAX_WORKSPACE_BYTES", MAX_WORKSPACE)] + [
                (f"MIN_ALIGNMENT_{operand}_BYTES", ALIGNMENT) for operand in "ABCD"]:
            self._set(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype,
                      self.preference, getattr(attribute, name), value)

    def _matmul_desc(self, bias_pointer: int | None, owner: ExitStack | None) -> int:
        """The matmul's descriptor with its epilogue (and the bias at `bias_pointer`), destroyed when `owner`
        closes (kept with the library where None)."""
        lt = _lt()
        desc = lt.matmul_desc_create(*self.compute)
        if owner is not None:
            owner.callback(lt.matmul_desc_destroy, desc)
        attribute = lt.MatmulDescAttribute
        for name, value in [("EPILOGUE", getattr(lt.Epilogue, self.gemm.epilogue))] + \
                [("BIAS_POINTER", bias_pointer)] * (bias_pointer is not None):
            self._set(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, desc,
                      getattr(attribute, name), value)
        return desc

    def _layout(self, data_type, rows: int, columns: int, stride: int) -> int:
        """A column-major matrix layout, `batch` times `stride` elements apart."""
        lt = _lt()
        layout = lt.matrix_layout_create(data_type, rows, columns, rows)
        if self.gemm.batch > 1:
            for name, value in (("BATCH_COUNT", self.gemm.batch), ("STRIDED_BATCH_OFFSET", stride)):
                self._set(lt.matrix_layout_set_attribute, lt.get_matrix_layout_attribute_dtype, layout,
                          getattr(lt.MatrixLayoutAttribute, name), value)
        return layout

    @staticmethod
    def _set(setter, dtype_of, descriptor: int, attribute, value) -> None:
        buffer = np.array([value], dtype=dtype_of(attribute))
        setter(descriptor, attribute, buffer.ctypes.data, buffer.nbytes)

    def candidates(self, handle: int, limit: int) -> list[Candidate]:
        lt = _lt()
        rows, count = np.zeros(limit, lt.matmul_heuristic_result_dtype), np.zeros(1, np.int32)
        try:
            lt.matmul_algo_get_heuristic(handle, self.desc, self.first, self.second, self.out, self.out,
                                         self.preference, limit, lt.MatmulHeuristicResult.from_data(rows).ptr,
                                         count.ctypes.data)
        except lt.cuBLASLtError:  # NOT_SUPPORTED: no algorithm for the problem
            return []
        rows = rows[:int(count[0])]
        return [Candidate(row["algo"].tobytes().hex(), int(row["workspace_size"])) for row in rows
                if row["state"] == 0]

    def launcher(self, handle: int, vendor_op: VendorOp, plan: str, arguments: list, workspace,
                 owner: ExitStack) -> Launcher:
        lt, gemm = _lt(), self.gemm
        algo = np.frombuffer(bytes.fromhex(plan), dtype=np.uint8).copy()
        pointers = {position: arguments[position].data_ptr() for position in
                    (vendor_op.data, vendor_op.weight, vendor_op.output, gemm.bias, gemm.residual)
                    if position is not None}
        misaligned = [position for position, pointer in pointers.items() if pointer % ALIGNMENT]
        if misaligned:
            raise ValueError(f"cuBLASLt plans assume {ALIGNMENT}-byte aligned operands; parameters "
                             f"{misaligned} are not")
        desc = self._matmul_desc(pointers[gemm.bias], owner) if gemm.bias is not None else self.desc
        alpha = np.array([1.0], np.float32)
        beta = np.array([1.0 if gemm.residual is not None else 0.0], np.float32)
        output = pointers[vendor_op.output]
        added = pointers.get(gemm.residual, output)
        workspace_pointer, workspace_size = (0, 0) if workspace is None else (workspace.data_ptr(),
                                                                              workspace.shape[0])
        first, second, out = self.first, self.second, self.out
        a, b = pointers[vendor_op.data], pointers[vendor_op.weight]

        def launch(stream) -> None:  # alpha, beta and algo are host arrays this closure keeps alive
            lt.matmul(handle, desc, alpha.ctypes.data, b, first, a, second, beta.ctypes.data, added, out,
                      output, out, algo.ctypes.data, workspace_pointer, workspace_size, int(stream or 0))
        return launch
