"""IndexFile on bad files and awkward keys: clear errors naming the file, never SIGBUS, never a hang."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from msgindex import IndexFile
from msgindex.errors import CorruptFileError, InvalidOptionError
from msgindex.storage.hash_index.index_file import HEADER_SIZE, INT32_MAX, time_diff_seconds
from msgindex.storage.hash_index.java_hash import index_hash

T0 = 1_700_000_000_000
SLOTS, NUM = 8, 16
SIZE = IndexFile.file_size(SLOTS, NUM)
ENTRIES_AT = HEADER_SIZE + 4 * SLOTS
pytestmark = pytest.mark.timeout(60)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("size", [0, 1, HEADER_SIZE - 1, HEADER_SIZE, ENTRIES_AT - 1, SIZE + 1, SIZE * 2])
def test_wrong_sizes_name_the_file_and_both_sizes(tmp_path: Path, size: int) -> None:
    path = write(tmp_path / "20240101000000000", b"\0" * size)
    with pytest.raises(CorruptFileError) as err:
        IndexFile.open(path, SLOTS, NUM)
    assert str(path) in str(err.value)
    assert f"{size} bytes" in str(err.value) and str(SIZE) in str(err.value)


@pytest.mark.parametrize("size", [ENTRIES_AT, ENTRIES_AT + 20, SIZE - 20, SIZE - 1])
def test_a_short_file_holds_the_entries_it_has_room_for(tmp_path: Path, size: int) -> None:
    """A file msgindex is still growing (index_file's module docstring) ends before its full size:
    the entries it has room for are read, the rest are the zeros RocketMQ's sparse tail holds (a
    partial last entry is an allocation still under way)."""
    path = write(tmp_path / "20240101000000000", b"\0" * size)
    with IndexFile.open(path, SLOTS, NUM, read_only=True) as f:
        assert f.capacity == (size - ENTRIES_AT) // 20 and f.entry_count == 0 and not f.is_full
        assert f.candidates("k") == [] and f.select_phy_offsets("k", 64, 0, 2**62) == []


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CorruptFileError, match="does not exist"):
        IndexFile.open(tmp_path / "nope", SLOTS, NUM)


def test_default_sizing_on_a_small_file_is_a_clear_error(tmp_path: Path) -> None:
    path = write(tmp_path / "f", b"\0" * SIZE)
    with pytest.raises(CorruptFileError, match="420000040"):
        IndexFile.open(path)


def test_header_count_beyond_the_file(tmp_path: Path) -> None:
    data = bytearray(SIZE)
    struct.pack_into(">i", data, 36, NUM + 1)
    path = write(tmp_path / "f", bytes(data))
    with pytest.raises(CorruptFileError, match=f"{path}.*indexCount {NUM + 1}"):
        IndexFile.open(path, SLOTS, NUM)


@pytest.mark.parametrize("seed", range(40))
def test_garbage_of_the_right_size_never_crashes_or_hangs(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    data = bytearray(rng.integers(0, 256, SIZE, dtype=np.uint8).tobytes())
    if seed % 2:  # a plausible header so that the walks really run over garbage slots/entries
        struct.pack_into(">i", data, 36, int(rng.integers(-3, NUM + 1)))
    path = write(tmp_path / "f", bytes(data))
    try:
        f = IndexFile.open(path, SLOTS, NUM)
    except CorruptFileError as e:
        assert str(path) in str(e)
        return
    with f:
        for key in ["a", "b", "", "polygenelubricants", "x" * 50]:
            found = f.select_phy_offsets(key, 1000, -(2**63), 2**63 - 1)
            assert len(found) <= 1000 and found == f.python_select_phy_offsets(key, 1000, -(2**63), 2**63 - 1)
            f.candidates(key)
            f.candidates(key, limit_index_count=3)
        f.candidates_many(["a", "b", "c"])
        list(f.iter_entries())
        if not f.is_full:
            f.put_key("k", 1, T0)  # invalid old slot values become prev 0


def test_invalid_old_slot_values_are_treated_as_empty(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 1, NUM) as f:
        f._slots[0] = -5
        assert f.put_key("a", 1, T0)
        assert f.entry_array()[1]["prev_index"] == 0 and f.hash_slot_count == 1
        f._slots[0] = 99  # beyond indexCount
        assert f.put_keys(["b"], [2], [T0]) == 1
        assert f.entry_array()[2]["prev_index"] == 0 and f.hash_slot_count == 2
        assert f.select_phy_offsets("b", 64, 0, 2**62) == [2]
        f._slots[0] = 3  # == indexCount: valid for a put (RocketMQ's rule is <= indexCount)
        f.put_key("c", 3, T0)
        assert f.entry_array()[3]["prev_index"] == 3


def test_integer_min_value_keys_share_slot_zero_with_the_empty_key(tmp_path: Path) -> None:
    keys = ["", "polygenelubricants", "GydZG_", "DESIGNING WORKHOUSES"]
    with IndexFile.create(tmp_path / "f", 7, NUM) as f:
        f.put_keys(keys, [1, 2, 3, 4], [T0] * 4)
        assert f.slot_array().tolist()[0] == 4 and f.hash_slot_count == 1
        assert f.entry_array()["key_hash"].tolist() == [0, 0, 0, 0, 0]
        assert f.select_phy_offsets("", 64, 0, 2**62) == [4, 3, 2, 1]
        assert [c[1] for c in f.candidates("GydZG_")] == [4, 3, 2, 1]


def test_huge_and_unicode_keys(tmp_path: Path) -> None:
    huge = "t#" + "\U0001F600é\udc80" * 350_000  # > 1 MiB of UTF-16
    keys = [huge, "t#\U0010FFFF", "t#\ud800", "t#中文", "t#"]
    with IndexFile.create(tmp_path / "f", 5, NUM) as f, IndexFile.create(tmp_path / "g", 5, NUM) as g:
        for i, k in enumerate(keys):
            f.put_key(k, i, T0 + i)
        g.put_keys(keys, range(5), [T0 + i for i in range(5)])
        for i, k in enumerate(keys):
            assert i in f.select_phy_offsets(k, 64, 0, 2**62)
            assert i in [c[1] for c in g.candidates(k)]
        assert f.entry_array()["key_hash"][1] == index_hash(huge)
    assert (tmp_path / "f").read_bytes() == (tmp_path / "g").read_bytes()


@pytest.mark.parametrize(
    ("stamp", "begin", "expected"),
    [
        (T0 + 1999, T0, 1),  # whole seconds, truncated
        (T0 - 1500, T0, 0),  # before begin: Java gives -1, clamped to 0
        (T0 + 10**13, T0, 10**10 if 10**10 <= INT32_MAX else INT32_MAX),
        (2**63 - 1, 1, INT32_MAX),  # clamp at Integer.MAX_VALUE
        (-(2**63), 5, INT32_MAX),  # Java's long subtraction wraps to a huge positive value
        (T0, 0, 0),  # no begin time yet
        (T0, -7, 0),
    ],
)
def test_time_diff_rules(stamp: int, begin: int, expected: int, tmp_path: Path) -> None:
    assert time_diff_seconds(stamp, begin) == expected
    with IndexFile.create(tmp_path / "f", 1, 4, end_timestamp=begin) as f:
        f.put_key("a", 1, stamp)  # the first put diffs against the inherited begin
        assert f.entry_array()[1]["time_diff"] == expected
    with IndexFile.create(tmp_path / "g", 1, 4, end_timestamp=begin) as g:
        g.put_keys(["a"], [1], [stamp])
        assert g.entry_array()[1]["time_diff"] == expected


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="hash_slot_num"):
        IndexFile.create(tmp_path / "a", 0, 10)
    with pytest.raises(InvalidOptionError, match="index_num"):
        IndexFile.create(tmp_path / "b", 10, 2**31)
    with IndexFile.create(tmp_path / "c", 4, 10) as f:
        with pytest.raises(InvalidOptionError, match="same length"):
            f.put_keys(["a", "b"], [1], [T0, T0])
        with pytest.raises(InvalidOptionError, match="Java long"):
            f.put_key("a", 2**63, T0)
        with pytest.raises(InvalidOptionError, match="phy_offsets"):
            f.put_keys(["a"], [2**64], [T0])
        with pytest.raises(TypeError):
            f.put_key(b"bytes", 1, T0)
        with pytest.raises(TypeError, match="key #1"):
            f.put_keys(["a", 5], [1, 2], [T0, T0])
        assert f.index_count == 1  # nothing half-written
    with pytest.raises(FileExistsError):
        IndexFile.create(tmp_path / "c", 4, 10)



def test_a_directory_is_not_an_index_file(tmp_path: Path) -> None:
    with pytest.raises(CorruptFileError, match=f"{tmp_path}.*is a directory"):
        IndexFile.open(tmp_path, SLOTS, NUM)
