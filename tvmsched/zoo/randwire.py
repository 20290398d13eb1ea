"""RandWire-WS, small regime (Xie et al., "Exploring Randomly Wired Neural Networks", 2019).

conv1 (3x3/2, C/2) and conv2 (3x3/2, C) are followed by three random stages of N nodes with C, 2C and 4C
channels, each wired by its own Watts–Strogatz graph WS(N, K, P) drawn from the seed and made acyclic by
node index. A node sums its inputs with sigmoid-positive weights, then ReLU → 3x3 separable conv → BN
(stride 2 at the stage's input nodes); the stage output averages its output nodes. A 1x1 conv to 1280
channels, global pooling and a linear layer classify.
"""

import numpy as np

from tvmsched.zoo.onnx_builder import GraphBuilder

CHANNELS, NODES, NEIGHBOURS, REWIRE = 78, 32, 4, 0.75


def watts_strogatz(nodes: int, neighbours: int, rewire: float, rng: np.random.Generator) -> list[set[int]]:
    """Each node's producers: a ring lattice whose edges are rewired with probability `rewire`, every edge
    then pointing from the lower to the higher index."""
    edges = {frozenset((node, (node + offset) % nodes)) for node in range(nodes)
             for offset in range(1, neighbours // 2 + 1)}
    for node in range(nodes):
        for offset in range(1, neighbours // 2 + 1):
            edge = frozenset((node, (node + offset) % nodes))
            if edge in edges and rng.random() < rewire:
                choices = [other for other in range(nodes)
                           if other != node and frozenset((node, other)) not in edges]
                if choices:
                    edges.remove(edge)
                    edges.add(frozenset((node, int(rng.choice(choices)))))
    producers = [set() for _ in range(nodes)]
    for edge in edges:
        low, high = sorted(edge)
        producers[high].add(low)
    return producers


def node_op(b: GraphBuilder, x: str, channels: int, stride: int) -> str:
    y = b.relu(x)
    y = b.conv(y, b.channels[y], 3, stride, groups=b.channels[y])
    return b.batch_norm(b.conv(y, channels, 1, gain=1.0))


def stage(b: GraphBuilder, x: str, channels: int, producers: list[set[int]]) -> str:
    consumed = {producer for node in producers for producer in node}
    outputs: list[str] = []
    for inputs in producers:
        if not inputs:
            outputs.append(node_op(b, x, channels, 2))
            continue
        weights = 1.0 / (1.0 + np.exp(-b.rng.standard_normal(len(inputs))))
        parts = [outputs[producer] if len(inputs) == 1 else b.scale(outputs[producer], float(weight))
                 for producer, weight in zip(sorted(inputs), weights)]
        outputs.append(node_op(b, b.add(parts), channels, 1))
    sinks = [outputs[node] for node in range(len(producers)) if node not in consumed]
    return b.scale(b.add(sinks), 1.0 / len(sinks)) if len(sinks) > 1 else sinks[0]


def build(b: GraphBuilder, num_classes: int) -> str:
    x = b.conv_bn(b.conv_bn("input", CHANNELS // 2, 3, 2), CHANNELS, 3, 2, relu=False)
    for multiple in (1, 2, 4):
        x = stage(b, x, CHANNELS * multiple, watts_strogatz(NODES, NEIGHBOURS, REWIRE, b.rng))
    return b.classifier(b.conv_bn(x, 1280, 1), num_classes)
