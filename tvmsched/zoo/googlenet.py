"""GoogLeNet (Szegedy et al., 2015) as in torchvision, without the auxiliary heads."""

from tvmsched.zoo.onnx_builder import GraphBuilder

# (1x1, 3x3 reduce, 3x3, "5x5" reduce, "5x5" (a 3x3 in torchvision), pool projection)
INCEPTIONS = {"3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
              "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
              "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
              "4e": (256, 160, 320, 32, 128, 128), "5a": (256, 160, 320, 32, 128, 128),
              "5b": (384, 192, 384, 48, 128, 128)}


def inception(builder: GraphBuilder, x: str, widths: tuple[int, ...]) -> str:
    one, reduce3, three, reduce5, five, pool = widths
    branches = [builder.conv_bn(x, one, 1),
                builder.conv_bn(builder.conv_bn(x, reduce3, 1), three, 3),
                builder.conv_bn(builder.conv_bn(x, reduce5, 1), five, 3),
                builder.conv_bn(builder.max_pool(x, 3, 1, pad=1, ceil=True), pool, 1)]
    return builder.concat(branches)


def build(builder: GraphBuilder, num_classes: int) -> str:
    x = builder.max_pool(builder.conv_bn("input", 64, 7, 2), 3, 2, ceil=True)
    x = builder.conv_bn(builder.conv_bn(x, 64, 1), 192, 3)
    x = builder.max_pool(x, 3, 2, ceil=True)
    for name, widths in INCEPTIONS.items():
        x = inception(builder, x, widths)
        if name in ("3b", "4e"):
            x = builder.max_pool(x, 3 if name == "3b" else 2, 2, ceil=True)
    return builder.classifier(x, num_classes)
