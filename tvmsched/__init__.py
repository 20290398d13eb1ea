"""tvmsched: fast DNN inference on NVIDIA GPUs with TVM: tuned kernels run by multi-stream schedules."""

import os
import sys

__version__ = "0.1.0"


def _import_tvm_without_torch() -> None:
    """Import TVM without importing torch. tvm_ffi imports torch at its own import wherever torch is
    installed (its workaround for a symbol clash on Windows), and tvmsched uses none of it: on the H100
    host `import tvmsched` took 6.0-7.1 s so, 1.9-2.7 s without
    (experiments/results/import_time_h100_2026-11-26.json).
    A process that imported torch first keeps TVM's torch support. Torch imported later works, and its
    tensors still reach TVM through DLPack, but TVM's torch conveniences (torch dtypes and streams) stay off
    in that process; so does an `import torch` on another thread while tvmsched is being imported."""
    if "torch" in sys.modules or "tvm_ffi" in sys.modules:
        return
    sys.modules["torch"] = None  # `import torch` raises ImportError while TVM is imported
    try:
        import tvm  # noqa: F401
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]


_import_tvm_without_torch()

from tvmsched.target import host_cores  # noqa: E402

# TVM's CPU thread pool takes half of the hardware threads on x86, taking every core for two of them; where
# the cores have one thread each (most small VMs, CI) it ran CPU kernels on half the cores. Every core,
# unless the user says otherwise; set before the pool exists (it is made on the first parallel kernel).
os.environ.setdefault("TVM_NUM_THREADS", str(host_cores()))

from tvmsched.api import CompiledModel, compile, load  # noqa: E402

__all__ = ["CompiledModel", "compile", "load", "__version__"]
