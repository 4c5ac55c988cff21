"""IndexFile: RocketMQ's putKey/selectPhyOffset rules, the vectorized batch put, msgindex's chain
walks, rollback, and the numpy views. Byte-compatibility with the real RocketMQ jar is proven in
tests/interop/test_rocketmq_index_file.py."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgindex import IndexFile
from msgindex.errors import InvalidOptionError, MsgIndexError
from msgindex.storage.hash_index.index_file import (
    ENTRY_SIZE,
    HEADER_SIZE,
    HEADER_STRUCT,
    SLOT_SIZE,
    IndexEntry,
    IndexHeader,
    index_file_name,
    parse_index_file_name,
)
from msgindex.storage.hash_index.java_hash import index_hash

T0 = 1_700_000_000_000
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# A small key alphabet so that chains and slot collisions happen; "Aa"/"BB" share a hash.
keys_st = st.sampled_from(["a", "b", "Aa", "BB", "", "polygenelubricants", "t#\U0001F600", "t#\udc80", "k1", "k2", "k3"])
stamp_st = st.one_of(st.integers(T0 - 5000, T0 + 50_000), st.sampled_from([0, -1, T0, 2**63 - 1, -(2**63)]))
offset_st = st.integers(-(2**63), 2**63 - 1)
put_st = st.tuples(keys_st, offset_st, stamp_st)


def entry(index_file: IndexFile, i: int) -> tuple[int, int, int, int]:
    row = index_file.entry_array()[i]
    return int(row["key_hash"]), int(row["phy_offset"]), int(row["time_diff"]), int(row["prev_index"])


def test_create_writes_an_empty_header_and_size(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 11, 6) as f:
        assert f.header == IndexHeader(0, 0, 0, 0, 0, 1)
        assert f.index_count == 1 and f.entry_count == 0 and not f.is_full
        assert f.select_phy_offsets("a", 64, 0, 2**62) == []
        assert f.candidates("a") == []
    assert (tmp_path / "f").stat().st_size == IndexFile.file_size(11, 6) == 40 + 11 * 4 + 6 * 20
    assert IndexFile.file_size(5_000_000, 20_000_000) == 420_000_040


def test_put_key_layout_chain_and_header(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 3, 10) as f:
        assert f.put_key("a", 100, T0)  # hash 97, slot 1
        assert f.put_key("d", 101, T0 + 2999)  # hash 100, slot 1: chains onto entry 1
        assert f.put_key("b", 102, T0 + 1000)  # hash 98, slot 2
        assert f.header == IndexHeader(T0, T0 + 1000, 100, 102, 2, 4)
        assert entry(f, 1) == (97, 100, 0, 0)
        assert entry(f, 2) == (100, 101, 2, 1)
        assert entry(f, 3) == (98, 102, 1, 0)
        assert f.slot_array().tolist() == [0, 2, 3]
        assert list(f.iter_entries()) == [IndexEntry(1, 97, 100, 0, 0), IndexEntry(2, 100, 101, 2, 1),
                                          IndexEntry(3, 98, 102, 1, 0)]
    raw = (tmp_path / "f").read_bytes()
    assert struct.unpack_from(">qqqqii", raw, 0) == (T0, T0 + 1000, 100, 102, 2, 4)
    assert struct.unpack_from(">iqii", raw, HEADER_SIZE + 3 * SLOT_SIZE + 2 * ENTRY_SIZE) == (100, 101, 2, 1)


def test_first_entry_of_inherited_file_diffs_against_inherited_begin(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 5, 5, end_phy_offset=777, end_timestamp=T0) as f:
        assert f.header == IndexHeader(T0, T0, 777, 777, 0, 1)
        f.put_key("a", 800, T0 + 7_500)
        # diff computed against the inherited begin, then begin := this message
        assert entry(f, 1)[2] == 7
        assert (f.begin_timestamp, f.begin_phy_offset) == (T0 + 7_500, 800)
        f.put_key("a", 801, T0 + 9_000)
        assert entry(f, 2)[2] == 1  # (9000 - 7500) // 1000 against the new begin


def test_non_positive_inherited_values_are_ignored(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 5, 5, end_phy_offset=-4, end_timestamp=0) as f:
        assert f.header == IndexHeader()


def test_full_file_refuses_puts(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 2, 4) as f:
        assert [f.put_key(f"k{i}", i, T0) for i in range(5)] == [True, True, True, False, False]
        assert f.is_full and f.index_count == 4
        assert f.put_keys(["x"], [1], [T0]) == 0
    with IndexFile.create(tmp_path / "g", 2, 4) as g:
        assert g.put_keys([f"k{i}" for i in range(5)], range(5), [T0] * 5) == 3
        assert g.is_full
    assert (tmp_path / "f").read_bytes() == (tmp_path / "g").read_bytes()


def test_hash_slot_count_counts_only_puts_into_empty_slots(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 4, 20) as f:
        f.put_keys(["a", "a", "e", "b"], range(4), [T0] * 4)  # a(97)->1, e(101)->1, b(98)->2
        assert f.hash_slot_count == 2
        assert f.hash_slot_count == int(np.count_nonzero(f.slot_array()))


@SETTINGS
@given(puts=st.lists(put_st, max_size=40), cuts=st.lists(st.integers(0, 40), max_size=6),
       slots=st.integers(1, 7), num=st.integers(1, 30), end_phy=st.sampled_from([0, 9, -1]),
       end_ts=st.sampled_from([0, T0 - 3000]))
def test_put_keys_gives_the_bytes_of_put_key_one_by_one(tmp_path_factory, puts, cuts, slots, num, end_phy, end_ts) -> None:
    folder = tmp_path_factory.mktemp("pk")
    one, many = folder / "one", folder / "many"
    with IndexFile.create(one, slots, num, end_phy, end_ts) as f:
        written_one = sum(f.put_key(*p) for p in puts)
    with IndexFile.create(many, slots, num, end_phy, end_ts) as g:
        written_many = 0
        bounds = sorted({0, len(puts), *(c for c in cuts if c <= len(puts))})
        for lo, hi in zip(bounds, bounds[1:]):
            chunk = puts[lo:hi]
            written_many += g.put_keys([p[0] for p in chunk], [p[1] for p in chunk], [p[2] for p in chunk])
    assert written_one == written_many
    assert one.read_bytes() == many.read_bytes()


def test_put_keys_accepts_arrow_and_numpy(tmp_path: Path) -> None:
    import pyarrow as pa

    keys = [f"t#{i % 13}" for i in range(500)]
    with IndexFile.create(tmp_path / "a", 17, 600) as a, IndexFile.create(tmp_path / "b", 17, 600) as b:
        a.put_keys(keys, np.arange(500), np.full(500, T0))
        b.put_keys(pa.array(keys), pa.array(range(500), pa.int64()).to_numpy(), [T0] * 500)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def test_reopen_and_continue_equals_one_session(tmp_path: Path) -> None:
    puts = [(f"k{i % 5}", i, T0 + 700 * i) for i in range(30)]
    with IndexFile.create(tmp_path / "a", 3, 40) as a:
        for p in puts:
            a.put_key(*p)
    with IndexFile.create(tmp_path / "b", 3, 40) as b:
        b.put_keys(*zip(*puts[:11]))
    with IndexFile.open(tmp_path / "b", 3, 40) as b:
        b.put_keys(*zip(*puts[11:]))
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def test_select_matches_by_hash_only_with_second_granularity(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 7, 20) as f:
        f.put_key("Aa", 1, T0)
        f.put_key("BB", 2, T0 + 1500)  # same Java hash as "Aa"
        f.put_key("Aa", 3, T0 + 2999)
        # RocketMQ answers by hash: "BB"'s entry comes back for "Aa"
        assert f.select_phy_offsets("Aa", 64, 0, 2**62) == [3, 2, 1]
        assert f.select_phy_offsets("Aa", 2, 0, 2**62) == [3, 2]
        # stored times are begin + whole seconds: T0+2999 is seen as T0+2000
        assert f.select_phy_offsets("Aa", 64, T0 + 2500, T0 + 3000) == []
        assert f.select_phy_offsets("Aa", 64, T0 + 2000, T0 + 2000) == [3]
        assert f.select_phy_offsets("zz", 64, 0, 2**62) == []
        assert f.select_phy_offsets("Aa", 0, 0, 2**62) == []


def test_select_stops_early_at_an_older_entry_but_candidates_do_not(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 7, 20) as f:
        for phy, seconds in [(1, 0), (2, 100), (3, 10), (4, 200)]:  # not monotonic
            f.put_key("k", phy, T0 + seconds * 1000)
        # newest first: entry 4 (+200 s) matches, entry 3 (+10 s) is older than begin: stop,
        # although entry 2 (+100 s) is inside the window
        assert f.select_phy_offsets("k", 64, T0 + 50_000, T0 + 10**9) == [4]
        assert f.candidates("k") == [(4, 4, T0 + 200_000), (3, 3, T0 + 10_000), (2, 2, T0 + 100_000), (1, 1, T0)]


def test_candidates_skip_uncommitted_entries_but_follow_them(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 1, 20) as f:
        f.put_keys(["a", "b", "a", "a", "b"], [10, 11, 12, 13, 14], [T0] * 5)
        assert [c[0] for c in f.candidates("a")] == [4, 3, 1]
        assert [c[0] for c in f.candidates("a", limit_index_count=4)] == [3, 1]
        assert [c[0] for c in f.candidates(index_hash("b"), limit_index_count=3)] == [2]
        assert f.candidates("a", limit_index_count=1) == []


def test_candidates_stop_on_a_cycle_or_a_forward_prev(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 1, 20) as f:
        f.put_keys(["a", "a", "a"], [1, 2, 3], [T0] * 3)
        entries = f._entries
        entries[1]["prev_index"] = 3  # corrupt: 3 -> 2 -> 1 -> 3 -> ...
        assert [c[0] for c in f.candidates("a")] == [3, 2, 1]
        assert f.select_phy_offsets("a", 7, 0, 2**62) == [3, 2, 1, 3, 2, 1, 3]  # as the JVM: until maxNum
        assert f.select_phy_offsets("b", 7, 0, 2**62) == []  # where the JVM would spin forever
        entries[3]["prev_index"] = 3  # self-loop
        assert [c[0] for c in f.candidates("a")] == [3]
        assert f.candidates_many(["a"]) == [f.candidates("a")]


@SETTINGS
@given(puts=st.lists(put_st, max_size=40), limit=st.integers(1, 45), slots=st.integers(1, 5))
def test_candidates_many_equals_candidates(tmp_path_factory, puts, limit, slots) -> None:
    path = tmp_path_factory.mktemp("cm") / "f"
    with IndexFile.create(path, slots, 50) as f:
        if puts:
            f.put_keys(*zip(*puts))
        keys = ["a", "b", "Aa", "", "k1", "missing", "polygenelubricants"]
        assert f.candidates_many(keys, limit_index_count=limit) == [
            f.candidates(k, limit_index_count=limit) for k in keys]
        assert f.candidates_many([]) == []


@SETTINGS
@given(before=st.lists(put_st, max_size=25), after=st.lists(put_st, min_size=1, max_size=25),
       slots=st.integers(1, 6), end_ts=st.sampled_from([0, T0]))
def test_rollback_restores_the_exact_bytes(tmp_path_factory, before, after, slots, end_ts) -> None:
    folder = tmp_path_factory.mktemp("rb")
    with IndexFile.create(folder / "short", slots, 60, 5, end_ts) as short:
        for p in before:
            short.put_key(*p)
        saved = short.header
    with IndexFile.create(folder / "long", slots, 60, 5, end_ts) as long:
        for p in before:
            long.put_key(*p)
        long.put_keys(*zip(*after))
        long.rollback_to(saved.index_count, saved)
        assert long.header == saved
    assert (folder / "long").read_bytes() == (folder / "short").read_bytes()


def test_rollback_argument_checks(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 3, 10) as f:
        f.put_keys(["a", "b"], [1, 2], [T0, T0])
        with pytest.raises(InvalidOptionError, match="roll back to index_count 5"):
            f.rollback_to(5, IndexHeader(index_count=5))
        with pytest.raises(InvalidOptionError):
            f.rollback_to(2, IndexHeader(index_count=1))


def test_views_and_inspection(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 4, 10) as f:
        f.put_keys(["a", "e", "b"], [5, 6, 7], [T0, T0 + 1000, T0 + 2000])
        slots, entries = f.slot_array(), f.entry_array()
        assert entries.shape == (4,) and entries.dtype.itemsize == ENTRY_SIZE
        assert entries["phy_offset"].tolist() == [0, 5, 6, 7]
        assert entries["prev_index"].tolist() == [0, 0, 1, 0]
        assert slots.tolist() == [0, 2, 3, 0]
        with pytest.raises(ValueError):
            slots[0] = 1  # views are read-only
        assert f.is_time_matched(T0 + 500, T0 + 600) and not f.is_time_matched(T0 + 3000, T0 + 4000)
        del slots, entries


def test_read_only_and_closed_files(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 4, 10) as f:
        f.put_key("a", 1, T0)
    with IndexFile.open(tmp_path / "f", 4, 10, read_only=True) as r:
        assert r.select_phy_offsets("a", 64, 0, 2**62) == [1]
        with pytest.raises(MsgIndexError, match="read-only"):
            r.put_key("b", 2, T0)
    with pytest.raises(MsgIndexError, match="closed"):
        r.select_phy_offsets("a", 64, 0, 2**62)
    r.close()  # idempotent


def test_close_with_a_view_still_alive(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path / "f", 4, 10)
    f.put_key("a", 1, T0)
    view = f.slot_array()
    f.close()
    assert view.tolist() == [0, 1, 0, 0]  # the mapping lives as long as the view


def test_reader_sees_a_writers_puts_live(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 4, 10) as w, IndexFile.open(tmp_path / "f", 4, 10, read_only=True) as r:
        w.put_key("a", 1, T0)
        committed = r.index_count
        w.put_key("a", 2, T0)
        assert [c[1] for c in r.candidates("a", limit_index_count=committed)] == [1]
        assert [c[1] for c in r.candidates("a")] == [2, 1]


def test_file_names() -> None:
    assert index_file_name(1_700_000_000_123, utc=True) == "20231114221320123"
    assert parse_index_file_name("20231114221320123", utc=True) == 1_700_000_000_123
    local = index_file_name(1_700_000_000_123)
    assert len(local) == 17 and parse_index_file_name(local) == 1_700_000_000_123
    for bad in ["", "2023111422132012", "2023111422132012x", "20231314221320123", "abc", "٢٠٢٣١١١٤٢٢١٣٢٠١٢٣"]:
        assert parse_index_file_name(bad) is None


def test_rollback_finds_an_all_zero_entry_the_header_never_counted(tmp_path: Path) -> None:
    # key "" hashes to 0, phy 0, time diff 0 and prev 0: the entry's 20 bytes are all zero, so
    # only the slot pointing at it shows it was written before the writer died.
    with IndexFile.create(tmp_path / "f", 3, 10) as f:
        empty = f.header
        f.put_key("", 0, T0)
        HEADER_STRUCT.pack_into(f._mm, 0, *dataclasses.astuple(empty))  # killed before the header
        assert f.slot_array()[0] == 1
        assert f.rollback_to(empty.index_count, empty)
        assert f.slot_array()[0] == 0 and f.header == empty
    IndexFile.create(tmp_path / "fresh", 3, 10).close()
    assert (tmp_path / "f").read_bytes() == (tmp_path / "fresh").read_bytes()
