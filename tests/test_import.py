"""`import tvmsched` does not import torch (tvm_ffi would, at its own import), and torch imported afterwards
still imports."""

import os
import subprocess
import sys


def test_tvmsched_imports_tvm_without_torch_and_torch_imports_afterwards(tmp_path):
    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("import os\nos.environ['TORCH_IMPORTED'] = '1'\n")
    script = ("import os, sys\nimport tvmsched, tvm, tvm_ffi\n"
              "assert 'TORCH_IMPORTED' not in os.environ and 'torch' not in sys.modules\n"
              "import torch\nassert os.environ['TORCH_IMPORTED'] == '1'\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert done.returncode == 0, done.stderr[-2000:]
