"""tvmsched: fast DNN inference on NVIDIA GPUs with TVM: tuned kernels run by multi-stream schedules."""

__version__ = "0.1.0"

from tvmsched.api import CompiledModel, compile, load  # noqa: E402

__all__ = ["CompiledModel", "compile", "load", "__version__"]
