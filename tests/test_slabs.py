"""Device tensors carved from slabs (`tvmsched.executor.slabs`), on the CPU."""

import gc

import numpy as np
import tvm

from tvmsched.executor.slabs import ALIGNMENT, Slabs


def test_tensors_are_aligned_disjoint_views_and_big_ones_are_allocated_alone():
    slabs = Slabs(tvm.cpu(), slab_bytes=4096)
    shapes = [((3, 5), "float32"), ((7,), "int8"), ((0, 4), "float32"), ((100,), "float64"), ((2,), "int64")]
    tensors = [slabs.empty(shape, dtype) for shape, dtype in shapes]
    big = slabs.empty((512,), "float32")  # 2048 bytes, over a quarter of the slab
    assert all(tensor.data_ptr() % ALIGNMENT == 0 for tensor in tensors)
    starts = sorted((tensor.data_ptr(), tensor.data_ptr() + max(tensor.numpy().nbytes, 1))
                    for tensor in tensors)
    assert all(end <= start for (_, end), (start, _) in zip(starts, starts[1:]))
    assert not any(start <= big.data_ptr() < end for start, end in starts)
    for (shape, dtype), tensor in zip(shapes, tensors):
        assert tuple(tensor.shape) == shape and tensor.dtype == dtype
    values = [np.arange(np.prod(shape), dtype=dtype).reshape(shape) for shape, dtype in shapes]
    for tensor, value in zip(tensors, values):
        tensor.copyfrom(value)
    for tensor, value in zip(tensors, values):
        np.testing.assert_array_equal(tensor.numpy(), value)


def test_a_zero_size_first_tensor_opens_a_slab():
    tensor = Slabs(tvm.cpu(), slab_bytes=4096).empty((0,), "float32")
    assert tuple(tensor.shape) == (0,) and tensor.data_ptr() % ALIGNMENT == 0


def test_a_full_slab_opens_the_next_and_views_keep_their_slab_alive():
    slabs = Slabs(tvm.cpu(), slab_bytes=4096)
    first = slabs.empty((256,), "float32")  # 1024 bytes each: at most four fit a slab
    first.copyfrom(np.full(256, 3.0, "float32"))
    others = [slabs.empty((256,), "float32") for _ in range(4)]
    assert others[-1].data_ptr() - first.data_ptr() not in range(0, 4096)  # the fifth is in a new slab
    del slabs, others
    gc.collect()
    litter = [tvm.runtime.tensor(np.full(4096, 9, "uint8")) for _ in range(8)]
    np.testing.assert_array_equal(first.numpy(), np.full(256, 3.0, "float32"))
    assert litter
