"""Kafka-format sparse indexes: lookups against a brute-force model, truncation, trimming, bad files."""

from __future__ import annotations

import bisect
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msgindex.errors import CorruptFileError, IndexFullError, InvalidAppendError
from msgindex.storage.log.sparse_index import NO_TIMESTAMP, WARM_SECTION_BYTES, OffsetIndex, TimeIndex

MAX = 1 << 20


def _largest_le(keys: list[int], target: int) -> int:
    return bisect.bisect_right(keys, target) - 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=0, max_size=3000), st.integers(0, 2**40), st.data())
def test_offset_lookup_matches_model(gaps, base, data):
    # Up to 3000 entries: more than the warm section (1024 offset entries), so both branches run.
    index = OffsetIndex.in_memory(base, MAX)
    seqs, positions, seq, position = [], [], base, 0
    for gap in gaps:
        seq, position = seq + gap, position + gap * 3
        index.append(seq, position)
        seqs.append(seq)
        positions.append(position)
    targets = data.draw(st.lists(st.integers(base - 5, seq + 5), max_size=40)) + seqs[-3:] + [base]
    for target in targets:
        slot = _largest_le(seqs, target)
        assert index.lookup(target) == ((base, 0) if slot < 0 else (seqs[slot], positions[slot]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3)), max_size=2500), st.data())
def test_time_lookup_matches_model(steps, data):
    index = TimeIndex.in_memory(100, MAX)
    stamps, seqs, ts, seq = [], [], 1_000, 100
    for dt, ds in steps:
        ts, seq = ts + dt, seq + ds
        index.maybe_append(ts, seq)
        if not stamps or ts > stamps[-1]:  # only growing timestamps make an entry
            stamps.append(ts)
            seqs.append(seq)
    assert index.entries == len(stamps)
    for target in data.draw(st.lists(st.integers(900, ts + 10), max_size=40)) + stamps[-2:]:
        slot = _largest_le(stamps, target)
        assert index.lookup(target) == ((NO_TIMESTAMP, 100) if slot < 0 else (stamps[slot], seqs[slot]))


def test_warm_section_boundary_lookups():
    index = OffsetIndex.in_memory(0, MAX)
    warm = WARM_SECTION_BYTES // 8
    for i in range(1, 3 * warm):
        index.append(2 * i, 10 * i)
    first_hot = index.entries - 1 - warm
    for n in (0, first_hot - 1, first_hot, first_hot + 1, index.entries - 1):
        seq, position = index.entry(n)
        assert index.lookup(seq) == (seq, position)
        assert index.lookup(seq + 1) == (seq, position)
        assert index.lookup(seq - 1) == (index.entry(n - 1) if n else (0, 0))


def test_truncate_to_follows_kafka(tmp_path):
    index = OffsetIndex.open(tmp_path / "a.index", 10, MAX, writable=True)
    for seq in (12, 15, 20, 30):
        index.append(seq, seq * 100)
    index.truncate_to(31)  # past the last: no effect
    assert index.entries == 4
    index.truncate_to(20)  # exact entry: it goes too
    assert [index.entry(n)[0] for n in range(index.entries)] == [12, 15]
    index.truncate_to(14)  # between entries: keep those below
    assert [index.entry(n)[0] for n in range(index.entries)] == [12]
    index.truncate_to(5)  # below everything
    assert index.entries == 0
    index.append(11, 7)  # appending resumes where the entries end
    assert index.entry(0) == (11, 7)

    times = TimeIndex.in_memory(10, MAX)
    for ts, seq in ((5, 10), (9, 14), (12, 20)):
        times.maybe_append(ts, seq)
    times.truncate_to(14)
    assert times.entries == 1 and times.last_entry() == (5, 10)
    times.maybe_append(6, 11)
    assert times.last_entry() == (6, 11)


def test_trim_reopen_and_reset(tmp_path):
    path = tmp_path / "00000000000000000005.timeindex"
    index = TimeIndex.open(path, 5, 12 * 100 + 7, writable=True)
    assert path.stat().st_size == 0 and index.max_entries == 100  # grows with its entries
    for i in range(10):
        index.maybe_append(1000 + i, 5 + i)
    assert path.stat().st_size == 1200  # a growth step, but at most max_index_bytes in whole entries
    index.close()
    assert path.stat().st_size == 120  # trimmed on close
    again = TimeIndex.open(path, 5, 1200, writable=True)
    assert again.entries == 10 and again.last_entry() == (1009, 14)
    again.sanity_check(record_count=10)
    again.reset()
    assert again.entries == 0 and path.stat().st_size == 120  # kept: appends write over it
    again.close()
    assert path.stat().st_size == 0
    empty = TimeIndex.open(path, 5, 1200, writable=False)  # a zero-length index is an empty index
    assert empty.entries == 0 and empty.lookup(99) == (NO_TIMESTAMP, 5)


@pytest.mark.parametrize("kind", [OffsetIndex, TimeIndex])
def test_a_writers_index_grows_in_steps_ahead_of_its_entries(tmp_path, kind):
    """Every byte under a writer's mapping is allocated (mapped_file), so the file grows with its
    entries, by whole GROWTH_BYTES, instead of taking max_index_bytes when it is created."""
    from msgindex.storage.log.sparse_index import GROWTH_BYTES, round_down

    path = tmp_path / f"00000000000000000000{'.index' if kind is OffsetIndex else '.timeindex'}"
    index = kind.open(path, 0, 10 << 20, writable=True)
    step = round_down(GROWTH_BYTES, kind.ENTRY.size)
    per_step = step // kind.ENTRY.size
    sizes = []
    for start in range(0, 3 * per_step, 1000):
        seqs = np.arange(start + 1, start + 1001, dtype=np.int64)
        if kind is OffsetIndex:
            index.append_many(seqs, seqs * 8)
        else:
            index.maybe_append_many(seqs * 3, seqs)
        sizes.append(path.stat().st_size)
        assert sizes[-1] == -(-index.entries // per_step) * step
        assert path.stat().st_blocks * 512 >= sizes[-1]  # allocated, no hole under the mapping
    assert sizes[0] == step and sizes[-1] == 4 * step and index.max_entries == (10 << 20) // kind.ENTRY.size
    entries = index.entries
    index.close()
    assert path.stat().st_size == entries * kind.ENTRY.size  # trimmed on close, as Kafka does
    again = kind.open(path, 0, 10 << 20, writable=False)
    assert again.entries == entries


def test_committed_entry_count_hides_later_entries(tmp_path):
    path = tmp_path / "x.index"
    writer = OffsetIndex.open(path, 0, 800, writable=True)
    for i in range(1, 8):
        writer.append(i, i * 10)
    writer.flush()
    reader = OffsetIndex.open(path, 0, 800, writable=False, entries=3)
    assert reader.lookup(100) == (3, 30)
    with pytest.raises(CorruptFileError, match="should hold 101 entries but has room for 100"):
        OffsetIndex.open(path, 0, 800, writable=False, entries=101)


def test_append_rules():
    index = OffsetIndex.in_memory(100, 8 * 3)
    with pytest.raises(InvalidAppendError, match="not within 2"):
        index.append(99, 0)
    with pytest.raises(InvalidAppendError, match="not within 2"):
        index.append(100 + 2**31, 0)
    for seq in (101, 102, 103):
        index.append(seq, seq)
    with pytest.raises(IndexFullError):
        index.append(104, 104)


@pytest.mark.parametrize("cls", [OffsetIndex, TimeIndex])
def test_wrong_size_file_names_the_file(tmp_path, cls):
    path = tmp_path / "00000000000000000000.idx"
    path.write_bytes(b"\x00" * (cls.ENTRY.size * 3 + 1))
    with pytest.raises(CorruptFileError, match=f"{path}.*not a multiple"):
        cls.open(path, 0, MAX, writable=False)


@pytest.mark.parametrize("cls", [OffsetIndex, TimeIndex])
def test_garbage_fails_sanity_check(tmp_path, cls):
    path = tmp_path / "garbage"
    path.write_bytes(os.urandom(cls.ENTRY.size * 50))
    index = cls.open(path, 0, MAX, writable=False)
    with pytest.raises(CorruptFileError, match=str(path)):
        index.sanity_check()


def test_sanity_check_catches_entries_past_the_segment():
    index = OffsetIndex.in_memory(0, MAX)
    index.append(9, 100)
    index.sanity_check(record_count=10)
    with pytest.raises(CorruptFileError, match="past the segment's 9 records"):
        index.sanity_check(record_count=9)


def test_missing_file_read_only(tmp_path):
    with pytest.raises(CorruptFileError, match="does not exist"):
        OffsetIndex.open(tmp_path / "nope.index", 0, MAX, writable=False)
    assert not (tmp_path / "nope.index").exists()  # a reader never creates files


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 4), st.integers(0, 3)), max_size=30), st.integers(1, 3),
       st.booleans())
def test_bulk_appends_equal_one_by_one_appends(steps, pieces, start_with_entry):
    """append_many / maybe_append_many (what segments use) write what single calls write."""
    stamps, seqs = [], []
    ts, seq = -6, 100
    for dt, ds in steps:  # non-decreasing, as running maxima and their records are
        ts, seq = ts + abs(dt), seq + ds
        stamps.append(ts)
        seqs.append(seq)
    single_t, bulk_t = TimeIndex.in_memory(100, 12 * 64), TimeIndex.in_memory(100, 12 * 64)
    single_o, bulk_o = OffsetIndex.in_memory(100, 8 * 64), OffsetIndex.in_memory(100, 8 * 64)
    if start_with_entry:
        for index in (single_t, bulk_t):
            index.maybe_append(-6, 100)
    for t, s in zip(stamps, seqs):
        single_t.maybe_append(t, s)
    offsets = sorted(set(seqs))
    for s in offsets:
        single_o.append(s, 10 * s)
    cut = max(1, len(stamps) // pieces)
    for i in range(0, len(stamps), cut):
        bulk_t.maybe_append_many(np.array(stamps[i : i + cut]), np.array(seqs[i : i + cut]))
    for i in range(0, len(offsets), cut):
        part = np.array(offsets[i : i + cut])
        bulk_o.append_many(part, 10 * part)
    assert bulk_t.entries_array().tobytes() == single_t.entries_array().tobytes()
    assert bulk_t.last_entry() == single_t.last_entry()
    assert bulk_o.entries_array().tobytes() == single_o.entries_array().tobytes()


def test_bulk_appends_are_checked_before_writing():
    index = OffsetIndex.in_memory(100, 8 * 4)
    with pytest.raises(InvalidAppendError, match="sequence 102 is not larger than the last one indexed, 103"):
        index.append_many(np.array([101, 103, 102]), np.array([1, 2, 3]))
    with pytest.raises(IndexFullError):
        index.append_many(np.arange(101, 106), np.arange(5))
    assert index.entries == 0
    times = TimeIndex.in_memory(100, 12 * 8)
    with pytest.raises(InvalidAppendError, match="timestamps to append must not decrease"):
        times.maybe_append_many(np.array([5, 4]), np.array([100, 101]))
    assert times.entries == 0
