"""NASNet-A Mobile (Zoph et al., "Learning Transferable Architectures", 2018), as in TF-slim's nasnet.py:
a 3x3/2 stem conv, two reduction stem cells, then three stacks of 4 normal cells with 44, 88 and 176
filters separated by reduction cells. Separable convolutions are applied twice (ReLU → depthwise →
pointwise → BN, two times); a previous input of another resolution passes a factorized reduction.
"""

from tvmsched.zoo.onnx_builder import GraphBuilder

# (operation, input state) pairs of the five blocks of each cell (states 0 and 1 are the cell's inputs,
# block i writes state i + 2), and the states left out of the cell's output concatenation.
NORMAL = ([(("sep5", 0), ("sep3", 1)), (("sep5", 1), ("sep3", 1)), (("avg", 0), ("id", 1)),
           (("avg", 1), ("avg", 1)), (("sep3", 0), ("id", 0))], {0})
REDUCTION = ([(("sep5", 0), ("sep7", 1)), (("max", 0), ("sep7", 1)), (("avg", 0), ("sep5", 1)),
              (("id", 3), ("avg", 2)), (("sep3", 2), ("max", 0))], {0, 1, 2})
FILTERS, CELLS_PER_STACK, STEM_FILTERS = 44, 4, 32


def separable(b: GraphBuilder, x: str, filters: int, kernel: int, stride: int) -> str:
    for step_stride in (stride, 1):
        x = b.conv(b.relu(x), b.channels[x], kernel, step_stride, groups=b.channels[x])
        x = b.batch_norm(b.conv(x, filters, 1, gain=1.0))
    return x


def operation(b: GraphBuilder, name: str, x: str, filters: int, stride: int) -> str:
    if name.startswith("sep"):
        return separable(b, x, filters, int(name[3:]), stride)
    if name == "id":
        return x
    pooled = b.avg_pool(x, 3, stride, pad=1, count_include_pad=False) if name == "avg" else b.max_pool(
        x, 3, stride, pad=1)
    return pooled if b.channels[pooled] == filters else b.conv_bn(pooled, filters, 1, relu=False)


def factorized_reduction(b: GraphBuilder, x: str, filters: int) -> str:
    """Halve the resolution without losing pixels: two strided 1x1 paths, one shifted by a pixel."""
    x = b.relu(x)
    paths = [b.conv(b.avg_pool(source, 1, 2), filters // 2, 1) for source in (x, b.crop_top_left(x))]
    return b.batch_norm(b.concat(paths))


def adjust_previous(b: GraphBuilder, previous: str, filters: int, previous_is_larger: bool) -> str:
    if previous_is_larger:
        return factorized_reduction(b, previous, filters)
    if b.channels[previous] == filters:
        return previous
    return b.conv_bn(b.relu(previous), filters, 1, relu=False)


def cell(b: GraphBuilder, current: str, previous: str, filters: int, kind, previous_is_larger: bool) -> str:
    blocks, left_out = kind
    reduce = kind is REDUCTION
    states = [adjust_previous(b, previous, filters, previous_is_larger),
              b.conv_bn(b.relu(current), filters, 1, relu=False)]
    for (left_op, left), (right_op, right) in blocks:
        outputs = [operation(b, op, states[index], filters, 2 if reduce and index < 2 else 1)
                   for op, index in ((left_op, left), (right_op, right))]
        states.append(b.add(outputs))
    return b.concat([state for index, state in enumerate(states) if index not in left_out])


def build(b: GraphBuilder, num_classes: int) -> str:
    stem = b.conv_bn("input", STEM_FILTERS, 3, 2, pad=0, relu=False)
    previous, current = stem, cell(b, stem, stem, FILTERS // 4, REDUCTION, False)
    previous, current = current, cell(b, current, stem, FILTERS // 2, REDUCTION, True)
    filters, previous_is_larger = FILTERS, True
    for stack in range(3):
        if stack:
            filters *= 2
            previous, current = current, cell(b, current, previous, filters, REDUCTION, False)
            previous_is_larger = True
        for _ in range(CELLS_PER_STACK):
            previous, current = current, cell(b, current, previous, filters, NORMAL, previous_is_larger)
            previous_is_larger = False
    return b.classifier(b.relu(current), num_classes)
