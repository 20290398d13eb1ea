"""Inception-v3 (Szegedy et al., 2016) as in torchvision (Mixed_5b … Mixed_7c), without the aux head."""

from tvmsched.zoo.onnx_builder import GraphBuilder


def inception_a(b: GraphBuilder, x: str, pool_features: int) -> str:
    return b.concat([b.conv_bn(x, 64, 1),
                     b.conv_bn(b.conv_bn(x, 48, 1), 64, 5),
                     b.conv_bn(b.conv_bn(b.conv_bn(x, 64, 1), 96, 3), 96, 3),
                     b.conv_bn(b.avg_pool(x, 3, 1, pad=1), pool_features, 1)])


def inception_b(b: GraphBuilder, x: str) -> str:
    return b.concat([b.conv_bn(x, 384, 3, 2, pad=0),
                     b.conv_bn(b.conv_bn(b.conv_bn(x, 64, 1), 96, 3), 96, 3, 2, pad=0),
                     b.max_pool(x, 3, 2)])


def inception_c(b: GraphBuilder, x: str, c7: int) -> str:
    seven = b.conv_bn(b.conv_bn(b.conv_bn(x, c7, 1), c7, (1, 7)), 192, (7, 1))
    double = b.conv_bn(x, c7, 1)
    for width, kernel in ((c7, (7, 1)), (c7, (1, 7)), (c7, (7, 1)), (192, (1, 7))):
        double = b.conv_bn(double, width, kernel)
    return b.concat([b.conv_bn(x, 192, 1), seven, double, b.conv_bn(b.avg_pool(x, 3, 1, pad=1), 192, 1)])


def inception_d(b: GraphBuilder, x: str) -> str:
    three = b.conv_bn(b.conv_bn(x, 192, 1), 320, 3, 2, pad=0)
    seven = b.conv_bn(b.conv_bn(b.conv_bn(x, 192, 1), 192, (1, 7)), 192, (7, 1))
    return b.concat([three, b.conv_bn(seven, 192, 3, 2, pad=0), b.max_pool(x, 3, 2)])


def inception_e(b: GraphBuilder, x: str) -> str:
    three = b.conv_bn(x, 384, 1)
    double = b.conv_bn(b.conv_bn(x, 448, 1), 384, 3)
    return b.concat([b.conv_bn(x, 320, 1),
                     b.conv_bn(three, 384, (1, 3)), b.conv_bn(three, 384, (3, 1)),
                     b.conv_bn(double, 384, (1, 3)), b.conv_bn(double, 384, (3, 1)),
                     b.conv_bn(b.avg_pool(x, 3, 1, pad=1), 192, 1)])


def build(b: GraphBuilder, num_classes: int) -> str:
    x = b.conv_bn(b.conv_bn(b.conv_bn("input", 32, 3, 2, pad=0), 32, 3, pad=0), 64, 3)
    x = b.max_pool(x, 3, 2)
    x = b.max_pool(b.conv_bn(b.conv_bn(x, 80, 1), 192, 3, pad=0), 3, 2)
    for pool_features in (32, 64, 64):
        x = inception_a(b, x, pool_features)
    x = inception_b(b, x)
    for c7 in (128, 160, 160, 192):
        x = inception_c(b, x, c7)
    x = inception_e(b, inception_e(b, inception_d(b, x)))
    return b.classifier(x, num_classes)
