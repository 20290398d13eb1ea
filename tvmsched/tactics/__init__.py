"""Kernel tactics: vendor libraries' implementations of fused kernels beside TVM's.

Recognition (`recognize`) says for each fused kernel whether a vendor library could compute exactly what
TVM's kernel computes, and describes it as a `VendorOp` (`vendor_op`); each library (`library`, one file
each: `cudnn` for convolutions, `cublaslt` for matmuls) offers plans for it; selection (`select`) times
them against TVM's function and records the winner in the kernel graph as a `Tactic`, which the executors
launch. Where a library declines a kernel's epilogue, a split tactic (`tail`) runs the library's plan for its
anchor and bias and TVM's function for the rest.
"""

from tvmsched.tactics import cublaslt, cudnn  # noqa: F401  (register the libraries)
