"""Random kernel graphs (random DAGs with random tensor sizes) for testing plans without compiling."""

from __future__ import annotations

import numpy as np

from tvmsched.graph import Kernel, KernelGraph, TensorRef


def random_graph(num_kernels: int, seed: int, max_inputs: int = 3) -> KernelGraph:
    """A DAG of `num_kernels` kernels: each reads 1..max_inputs earlier tensors (or the graph input), some
    write two outputs, and the last kernel's output plus one random other tensor are graph outputs."""
    rng = np.random.default_rng(seed)
    graph_input = TensorRef("input", (4,), "float32", "input")
    tensors = [graph_input]
    kernels = []
    for kernel_id in range(num_kernels):
        count = int(rng.integers(1, max_inputs + 1))
        picks = sorted({int(rng.integers(0, len(tensors))) for _ in range(count)})
        inputs = tuple(tensors[index] for index in picks)
        num_outputs = 2 if rng.random() < 0.15 else 1
        outputs = tuple(TensorRef(f"k{kernel_id}.{index}", (int(rng.integers(1, 64)),), "float32", "kernel",
                                  kernel_id, index) for index in range(num_outputs))
        tensors.extend(outputs)
        kernels.append(Kernel(kernel_id, f"f{kernel_id}", "0", inputs, outputs, 0,
                              sum(t.nbytes for t in inputs + outputs), ("synthetic",)))
    extra = tensors[int(rng.integers(1, len(tensors)))]
    outputs = (kernels[-1].outputs[0],) + ((extra,) if extra != kernels[-1].outputs[0] else ())
    return KernelGraph(tuple(kernels), (graph_input,), outputs, ())


def graph_of(producers: list[tuple[int, ...]], size: int = 4096) -> KernelGraph:
    """Kernel i reads the outputs of kernels `producers[i]` (the graph input where empty); each writes `size`
    floats, and the last kernel's output is the graph's."""
    graph_input = TensorRef("input", (size,), "float32", "input")
    kernels: list[Kernel] = []
    for kernel_id, reads in enumerate(producers):
        inputs = tuple(kernels[p].outputs[0] for p in reads) or (graph_input,)
        output = TensorRef(f"k{kernel_id}", (size,), "float32", "kernel", kernel_id)
        kernels.append(Kernel(kernel_id, f"f{kernel_id}", "0", inputs, (output,), 0,
                              sum(t.nbytes for t in inputs) + output.nbytes, ("synthetic",)))
    return KernelGraph(tuple(kernels), (graph_input,), (kernels[-1].outputs[0],), ())


def random_order(graph: KernelGraph, num_streams: int, seed: int) -> list[tuple[int, int]]:
    """A random topological order with a random stream for each kernel."""
    rng = np.random.default_rng(seed)
    remaining = {kernel.id: set(graph.dependencies(kernel.id)) for kernel in graph.kernels}
    order = []
    while remaining:
        ready = sorted(kernel for kernel, producers in remaining.items() if not producers)
        kernel = ready[int(rng.integers(0, len(ready)))]
        del remaining[kernel]
        for producers in remaining.values():
            producers.discard(kernel)
        order.append((kernel, int(rng.integers(0, num_streams))))
    return order
