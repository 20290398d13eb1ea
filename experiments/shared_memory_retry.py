"""The cost of a library that TVM's shared-memory planning refuses (`tvmsched.shared_memory`): googlenet in
fp16 for the H100, compiled here (no GPU needed); prints the seconds and how many library builds TVM refused.
Run it twice in fresh processes to see the second build start with merged shared memory:

    TVMSCHED_CACHE=/tmp/fresh python -m experiments.shared_memory_retry
"""

from __future__ import annotations

import json
import time

import tvmsched
from tvmsched import codegen, shared_memory


def main() -> None:
    refused = []
    inner = codegen.built_retrying_merged

    def counted(build, kind, key=None):
        def counted_build():
            try:
                return build()
            except Exception as error:
                if shared_memory.REFUSED in str(error):
                    refused.append(error)
                raise
        return inner(counted_build, kind, key)

    codegen.built_retrying_merged = counted
    start = time.perf_counter()
    model = tvmsched.compile("googlenet", target="nvidia/nvidia-h100", precision="fp16", kernels="tvm")
    print(json.dumps({"seconds": round(time.perf_counter() - start, 1), "refused_builds": len(refused),
                      "tuned_kernels": len(model.meta.tuned_kernels)}))


if __name__ == "__main__":
    main()
