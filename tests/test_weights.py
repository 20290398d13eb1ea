"""A build's weights on disk (`tvmsched.weights`): one aligned binary file mapped at load, and builds of
`constants.npz` from before it still loading."""

import hashlib
import json

import numpy as np
import pytest

import tvmsched
from tvmsched import weights
from tvmsched.errors import ArtifactError


def test_constants_round_trip_aligned_and_mapped_read_only(tmp_path):
    rng = np.random.default_rng(0)
    constants = {"w": rng.standard_normal((3, 5, 7)).astype("float32"), "scalar": np.array(2.5, "float64"),
                 "empty": np.zeros((0, 4), "int64"), "half": rng.standard_normal(9).astype("float16"),
                 "flags": np.array([True, False])}
    folded = {(3, None): [rng.standard_normal((2, 2)).astype("float32"), np.ones(2, "float64")],
              (5, 1): [np.arange(3, dtype="float16")]}
    index = weights.layout(constants, folded)
    placed = index.constants + index.folded
    assert all(entry.offset % weights.ALIGNMENT == 0 for entry in placed)
    assert len({entry.offset for entry in placed if entry.shape != (0, 4)}) == 7  # none overlap
    weights.write_binary(tmp_path / weights.BINARY, index, constants, folded)
    (tmp_path / weights.INDEX).write_text(json.dumps(index.to_json()))
    read, read_folded = weights.read(tmp_path)
    assert list(read_folded) == list(folded)
    for key, arrays in folded.items():
        assert [array.dtype for array in read_folded[key]] == [array.dtype for array in arrays]
        for got, want in zip(read_folded[key], arrays):
            np.testing.assert_array_equal(got, want)
            assert got.base is read["w"].base  # one mapping
    assert list(read) == list(constants)
    for name, array in constants.items():
        assert read[name].dtype == array.dtype and read[name].shape == array.shape
        np.testing.assert_array_equal(read[name], array)
    assert not read["w"].flags.writeable and isinstance(read["w"].base, np.memmap)


def test_a_binary_file_cut_short_is_refused(tmp_path, branchy_model):
    build = tvmsched.compile(branchy_model, batch=1).save(tmp_path / "build")
    data = (build / weights.BINARY).read_bytes()
    (build / weights.BINARY).write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match="weights.bin' is corrupt or was replaced"):
        tvmsched.load(build)
    meta = json.loads((build / "meta.json").read_text())  # even where the digest was made to match
    meta["digests"][weights.BINARY] = hashlib.sha256(data[: len(data) // 2]).hexdigest()
    (build / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="ends before constant"):
        tvmsched.load(build)


def test_a_build_that_kept_constants_npz_still_loads(tmp_path, branchy_model):
    model = tvmsched.compile(branchy_model, batch=1)
    build = model.save(tmp_path / "build")
    np.savez(build / weights.ARCHIVE, **model.constants)
    (build / weights.BINARY).unlink()
    (build / weights.INDEX).unlink()
    meta = json.loads((build / "meta.json").read_text())
    meta["digests"] = {"model.so": meta["digests"]["model.so"],
                       weights.ARCHIVE: hashlib.sha256((build / weights.ARCHIVE).read_bytes()).hexdigest()}
    (build / "meta.json").write_text(json.dumps(meta))
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype("float32")
    np.testing.assert_array_equal(tvmsched.load(build)(x), model(x))
    model.save(build)  # saved again: the binary file, and the archive gone
    assert weights.files(build) == (weights.BINARY, weights.INDEX) and not (build / weights.ARCHIVE).exists()
    np.testing.assert_array_equal(tvmsched.load(build)(x), model(x))


@pytest.mark.parametrize("edit", [{"offset": -4096}, {"offset": 8}, {"dtype": "|O"}, {"shape": [-1]}])
def test_an_index_that_places_a_constant_impossibly_is_refused(tmp_path, edit):
    constants = {"w": np.ones((4, 4), "float32")}
    index = weights.layout(constants)
    weights.write_binary(tmp_path / weights.BINARY, index, constants)
    index = index.to_json()
    index["constants"][0].update(edit)
    (tmp_path / weights.INDEX).write_text(json.dumps(index))
    with pytest.raises(ValueError, match="places constant 'w' impossibly"):
        weights.read(tmp_path)


def test_an_edited_index_fails_the_digest_check(tmp_path, branchy_model):
    build = tvmsched.compile(branchy_model, batch=1).save(tmp_path / "build")
    index = json.loads((build / weights.INDEX).read_text())
    index["constants"][0]["offset"] = -4096
    (build / weights.INDEX).write_text(json.dumps(index))
    with pytest.raises(ArtifactError, match="weights.json' is corrupt or was replaced"):
        tvmsched.load(build)


def test_the_mapped_weights_are_page_locked_until_the_mapping_is_freed(tmp_path, fake_cuda):
    """`pinned.pin_mapping` registers the one mapping the arrays view, read-only, and undoes it when the
    mapping is freed; arrays that view no mapping (a build in memory) are left as they are."""
    import gc

    from tvmsched.pinned import pin_mapping

    constants = {"w": np.ones((64, 64), "float32"), "b": np.arange(5, dtype="int64")}
    index = weights.layout(constants)
    weights.write_binary(tmp_path / weights.BINARY, index, constants)
    (tmp_path / weights.INDEX).write_text(json.dumps(index.to_json()))
    read, _ = weights.read(tmp_path)
    mapping = read["w"].base
    assert pin_mapping(read)
    assert fake_cuda.registered == {mapping.ctypes.data: (tmp_path / weights.BINARY).stat().st_size}
    del read, mapping
    gc.collect()
    assert fake_cuda.registered == {}
    assert not pin_mapping(constants) and fake_cuda.registered == {}
