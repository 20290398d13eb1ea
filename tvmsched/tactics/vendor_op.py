"""VendorOp: a fused kernel as a vendor library would be asked to compute it, as plain data.

An anchor (a 2-D convolution or a matrix product) followed by an epilogue of pointwise ops, each naming the
kernel parameters it reads by position (the kernel is called as `symbol(*inputs, *outputs)`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from tvmsched.errors import GraphError

SCHEMA = 1


@dataclass(frozen=True)
class Conv2d:
    """`relax.nn.conv2d`: layout NCHW (weight OIHW) or NHWC (weight OHWI); padding is (top, left, bottom,
    right); the products are summed in `accumulate_dtype`, which is the anchor's output dtype."""

    layout: str
    data_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]
    dilation: tuple[int, int]
    groups: int
    dtype: str
    accumulate_dtype: str

    @property
    def channel_axis(self) -> int:
        """The output's (and a per-channel epilogue operand's) channel axis."""
        return 3 if self.layout == "NHWC" else 1


@dataclass(frozen=True)
class Matmul:
    """`relax.matmul` of A (..., M, K) and B (..., K, N), both row-major, their batch dimensions broadcast
    (numpy's rules); summed in `accumulate_dtype`, the anchor's output dtype."""

    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    dtype: str
    accumulate_dtype: str

    def batched(self) -> BatchedMatmul | None:
        """The product as `batch` row-major products of contiguous operands; None where the batch dimensions
        broadcast otherwise than wholly (all of A's or all of B's of size 1)."""
        *a_batch, m, k = self.a_shape
        *b_batch, _, n = self.b_shape
        batch, a_count, b_count = (math.prod(dims) for dims in (self.out_shape[:-2], a_batch, b_batch))
        if b_count == 1:  # A's batches are rows of one product
            return BatchedMatmul(1, m * a_count, k, n, m * a_count * k, k * n)
        if a_count in (1, batch) and b_count == batch:
            return BatchedMatmul(batch, m, k, n, m * k if a_count > 1 else 0, k * n)
        return None


@dataclass(frozen=True)
class BatchedMatmul:
    """`batch` products of A (m x k) and B (k x n), row-major, each A `a_stride` and each B `b_stride`
    elements after the one before (0: one broadcast to all; a lone product's are its packed sizes); the
    outputs m x n apart."""

    batch: int
    m: int
    k: int
    n: int
    a_stride: int
    b_stride: int


@dataclass(frozen=True)
class EpilogueOp:
    """One pointwise op on the value x so far, giving a value of `dtype`. `bias` adds kernel input `operand`,
    which varies along output axis `axis` only; `residual` adds input `operand` of the output's shape;
    `subtract`, `multiply` and `divide` (x - c, x * c, x / c) take either kind of `operand` (`axis` None:
    of the output's shape); `clip` bounds by `bounds` (None: unbounded on that side); `relu`, `sigmoid`,
    `silu` (x * sigmoid(x)), `gelu` (x * (1 + erf(x / √2)) / 2); `cast` converts."""

    kind: str
    dtype: str
    operand: int | None = None
    axis: int | None = None
    bounds: tuple[float | None, float | None] | None = None


ANCHORS = {"conv2d": Conv2d, "matmul": Matmul}


@dataclass(frozen=True)
class VendorOp:
    """The anchor on kernel inputs `data` and `weight` (A and B of a matmul), then `epilogue` in order,
    written to the kernel parameter `output` (its one output)."""

    anchor: Conv2d | Matmul
    data: int
    weight: int
    epilogue: tuple[EpilogueOp, ...]
    output: int

    @property
    def out_dtype(self) -> str:
        return self.epilogue[-1].dtype if self.epilogue else self.anchor.accumulate_dtype

    @property
    def rounds_between(self) -> bool:
        """Whether the kernel rounds its value on the way to a type other than its output's or float32 (an
        anchor summing in it, a cast to it). The libraries keep float32 inside and round once, to the
        output's type: they cannot compute such a kernel as TVM does."""
        types = {self.anchor.accumulate_dtype} | {op.dtype for op in self.epilogue if op.kind == "cast"}
        return bool(types - {self.out_dtype, "float32"})

    @property
    def parameters(self) -> tuple[int, ...]:
        """The positions of the kernel parameters the op reads: data, weight and the epilogue's operands."""
        return (self.data, self.weight, *(op.operand for op in self.epilogue if op.operand is not None))

    def head(self, count: int) -> VendorOp:
        """The anchor and the first `count` epilogue ops alone."""
        return replace(self, epilogue=self.epilogue[:count])

    @property
    def name(self) -> str:
        """`conv2d+bias+relu`: the anchor's kind and the epilogue's ops."""
        return "+".join([_kind(self.anchor), *(op.kind for op in self.epilogue)])

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "anchor": {"kind": _kind(self.anchor), **asdict(self.anchor)},
                "data": self.data, "weight": self.weight, "output": self.output,
                "epilogue": [asdict(op) for op in self.epilogue]}

    @classmethod
    def from_json(cls, data: dict) -> VendorOp:
        if data.get("schema") != SCHEMA:
            raise GraphError(f"vendor op schema {data.get('schema')} is not {SCHEMA}; rebuild the model")
        fields = dict(data["anchor"])
        anchor_type = ANCHORS[fields.pop("kind")]
        anchor = anchor_type(**{key: tuple(value) if isinstance(value, list) else value
                                for key, value in fields.items()})
        epilogue = tuple(EpilogueOp(**{**op, "bounds": op["bounds"] and tuple(op["bounds"])})
                         for op in data["epilogue"])
        return cls(anchor, data["data"], data["weight"], epilogue, data["output"])


def _kind(anchor: Conv2d | Matmul) -> str:
    return next(name for name, anchor_type in ANCHORS.items() if isinstance(anchor, anchor_type))
