"""Kernel tactics: vendor libraries' implementations of fused kernels beside TVM's.

Built so far: recognition (`recognize`), which says for each fused kernel whether a vendor library could
compute exactly what TVM's kernel computes, and describes it as a `VendorOp` (`vendor_op`).
"""
