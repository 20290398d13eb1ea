"""SqueezeNet 1.1 (Iandola et al., 2016) as in torchvision: fire modules, no batch norm."""

from tvmsched.zoo.onnx_builder import GraphBuilder

FIRES = [(16, 64), (16, 64), "pool", (32, 128), (32, 128), "pool", (48, 192), (48, 192), (64, 256), (64, 256)]


def fire(builder: GraphBuilder, x: str, squeeze: int, expand: int) -> str:
    s = builder.relu(builder.conv(x, squeeze, 1, bias=True))
    return builder.concat([builder.relu(builder.conv(s, expand, 1, bias=True)),
                           builder.relu(builder.conv(s, expand, 3, bias=True))])


def build(builder: GraphBuilder, num_classes: int) -> str:
    x = builder.max_pool(builder.relu(builder.conv("input", 64, 3, 2, pad=0, bias=True)), 3, 2, ceil=True)
    for item in FIRES:
        x = builder.max_pool(x, 3, 2, ceil=True) if item == "pool" else fire(builder, x, *item)
    x = builder.relu(builder.conv(x, num_classes, 1, bias=True))
    return builder.flatten(builder.global_avg_pool(x), "output")
