"""The reserved device address range an offloadable executor carves its tensors from
(`tvmsched.executor.mapped`), over a stand-in for cuda-python's driver: the "device" is a CPU tensor as
large as the reservation; the stand-in records what is mapped and can run out of memory."""

import pytest
import tvm
from fakecuda import GRANULARITY

from tvmsched.errors import TargetError
from tvmsched.executor import mapped
from tvmsched.executor.slabs import ALIGNMENT


@pytest.fixture
def fake(fake_driver):
    return fake_driver


def test_tensors_are_carved_in_order_and_mapped_back_in_one_piece(fake):
    arena = mapped.MappedArena(tvm.cpu(), 16 << 20)
    tensors = [arena.empty(shape, dtype) for shape, dtype in (((1 << 18,), "float32"), ((3,), "int8"),
                                                               ((1 << 19,), "float32"))]
    assert [tensor.data_ptr() - arena.base for tensor in tensors] == [0, 1 << 20, (1 << 20) + ALIGNMENT]
    assert sorted(fake.maps.values()) == [GRANULARITY, GRANULARITY]  # grown by a chunk for the third
    arena.release()
    assert arena.released and not fake.maps and not fake.handles
    arena.restore()
    assert fake.maps == {arena.base: 2 * GRANULARITY} and len(fake.handles) == 1 and not arena.released
    arena.close()
    assert not fake.reserved and not fake.handles


def test_a_restore_that_runs_out_of_memory_can_be_tried_again(fake):
    arena = mapped.MappedArena(tvm.cpu(), 16 << 20)
    arena.empty((16,), "float32")
    arena.release()
    fake.out_of_memory = True
    with pytest.raises(TargetError, match="CUDA_ERROR_OUT_OF_MEMORY"):
        arena.restore()
    assert arena.released and not fake.maps
    fake.out_of_memory = False
    arena.restore()
    assert fake.maps == {arena.base: GRANULARITY}
    arena.close()


def test_a_failed_construction_and_a_closed_arena_keep_nothing(fake):
    fake.out_of_memory = True
    with pytest.raises(TargetError):
        mapped.MappedArena(tvm.cpu(), 16 << 20)
    assert not fake.reserved
    fake.out_of_memory = False
    arena = mapped.MappedArena(tvm.cpu(), 16 << 20)
    arena.close()
    arena.close()
    arena.restore()  # maps nothing into the addresses given back
    assert not fake.reserved and not fake.maps and not fake.handles


def test_the_reload_graph_merges_only_weights_placed_as_neighbours_and_orders_each_kernels_event_after_them():
    from tvmsched.executor.streams import MERGED_BYTES, _merged

    page = 4096
    copies = [[(1000, 50_000, 100, 1), (1000 + page, 50_000 + page, 200, 1)],  # a weight, its neighbour
              [(1000 + 2 * page, 50_000 + 2 * page, 8, 1)],  # the next kernel's, merged too
              [],  # a kernel that reads an earlier kernel's weights: its event after them
              [(90_000, 10_000, 16, 1)],  # elsewhere: a copy of its own
              [(90_000 + page, 10_000 + page, 16, 1)],  # at the same distance, but not placed as a neighbour
              [(90_000 + 2 * page, 10_000 + 2 * page, 8, 2)]]  # placed as one, but in another host region
    follows = {1000 + page: 1000, 1000 + 2 * page: 1000 + page, 90_000 + 2 * page: 90_000 + page}
    assert _merged(copies, ["a", "b", "c", None, "e", None], follows) == [
        (1000, 50_000, 2 * page + 8), "a", "b", "c", (90_000, 10_000, 16), (90_000 + page, 10_000 + page, 16),
        "e", (90_000 + 2 * page, 10_000 + 2 * page, 8)]
    big = MERGED_BYTES // 2 + page
    halves = [[(0, 0, big, 1)], [(big, big, big, 1)]]  # together over MERGED_BYTES
    assert _merged(halves, ["x", "y"], {big: 0}) == [(0, 0, big), "x", (big, big, big), "y"]
    # copied in another order than placed (file F1, F3, F2; launches 2, 1, 3): F2 is not merged over
    f1, f3, f2 = (0, 0, 2048, 1), (page, page, 2048, 1), (2 * page, 2 * page, 2048, 1)
    order = _merged([[f2], [f1], [f3]], ["e2", "e1", "e3"], {page: 0, 2 * page: page})
    assert order == [(2 * page, 2 * page, 2048), "e2", (0, 0, page + 2048), "e1", "e3"]
