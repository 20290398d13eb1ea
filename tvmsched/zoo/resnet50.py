"""ResNet-50 (He et al., 2016) as in torchvision: bottleneck blocks [3, 4, 6, 3], stride on the 3x3 conv."""

from tvmsched.zoo.onnx_builder import GraphBuilder


def bottleneck(builder: GraphBuilder, x: str, width: int, stride: int) -> str:
    y = builder.conv_bn(x, width, 1)
    y = builder.conv_bn(y, width, 3, stride)
    y = builder.conv_bn(y, width * 4, 1, relu=False, gamma=0.2)  # small residual branches keep scale
    if stride != 1 or builder.channels[x] != width * 4:
        x = builder.conv_bn(x, width * 4, 1, stride, pad=0, relu=False)
    return builder.relu(builder.add([y, x]))


def build(builder: GraphBuilder, num_classes: int) -> str:
    x = builder.max_pool(builder.conv_bn("input", 64, 7, 2), 3, 2, pad=1)
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
        for block in range(blocks):
            x = bottleneck(builder, x, width, 2 if stage > 0 and block == 0 else 1)
    return builder.classifier(x, num_classes)
