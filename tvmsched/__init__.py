"""tvmsched: fast DNN inference on NVIDIA GPUs with TVM: tuned kernels run by multi-stream schedules."""

import os

__version__ = "0.1.0"

from tvmsched.target import host_cores  # noqa: E402

# TVM's CPU thread pool takes half of the hardware threads on x86, taking every core for two of them; where
# the cores have one thread each (most small VMs, CI) it ran CPU kernels on half the cores. Every core,
# unless the user says otherwise; set before the pool exists (it is made on the first parallel kernel).
os.environ.setdefault("TVM_NUM_THREADS", str(host_cores()))

from tvmsched.api import CompiledModel, compile, load  # noqa: E402

__all__ = ["CompiledModel", "compile", "load", "__version__"]
