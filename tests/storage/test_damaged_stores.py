"""Issue 10's silent wrong answers, one test each: a damaged store gives a clear error naming
what is wrong (or, for a sparse index, still the right answer), and nothing committed is deleted."""

from __future__ import annotations

import struct

import pytest

from msgindex.cli import main
from msgindex.errors import CorruptFileError
from msgindex.storage.checkpoint import read_checkpoint
from msgindex.storage.hash_index.index_file import ENTRY_SIZE, HEADER_SIZE
from msgindex.storage.message import MessageRecord
from msgindex.storage.store import open_store
from tests.storage import damage
from tests.storage.shard_model import model_lookup, model_scan, table_rows


@pytest.fixture
def small(tmp_path):
    return damage.build(tmp_path / "store")


def lookup_all(root, keys):
    with open_store(root) as store:
        return table_rows(store.lookup(keys))


def scan_all(root, **window):
    with open_store(root) as store:
        return table_rows(list(store.scan(**window)))


def inspect_exit(root, capsys) -> tuple[int, str]:
    code = main(["inspect", str(root)])
    out = capsys.readouterr()
    return code, out.out + out.err


# --- F1: hash index files -----------------------------------------------------------------------
def test_a_zeroed_hash_index_file_is_an_error_naming_it(small, capsys):
    victim = damage.index_files(small, "b1")[0]  # a full (sealed) file
    damage.zero(victim)
    with pytest.raises(CorruptFileError, match=str(victim)):
        lookup_all(small.root, small.keys())
    code, said = inspect_exit(small.root, capsys)
    assert code == 2 and str(victim) in said


def test_a_zeroed_slot_table_is_an_error(small, capsys):
    victim = damage.index_files(small, "b1")[1]
    damage.zero(victim, HEADER_SIZE, small_settings().hash_slot_num * 4)
    with pytest.raises(CorruptFileError, match=f"{victim}.*slot"):
        lookup_all(small.root, ["k0-1"])
    assert inspect_exit(small.root, capsys)[0] == 2


def test_the_active_file_zeroed_is_an_error(small):
    victim = damage.index_files(small, "b2")[-1]
    damage.zero(victim)
    with pytest.raises(CorruptFileError, match=str(victim)):
        lookup_all(small.root, ["k1-3"])
    with pytest.raises(CorruptFileError, match=str(victim)), open_store(small.root) as store:
        with store.writer("b2") as writer:  # the writer refuses too: it would index over a wreck
            writer.append([damage.record(1, 10_000)])


def test_a_header_behind_the_commit_is_an_error(small):
    victim = damage.index_files(small, "b1")[-1]
    count = struct.unpack_from(">i", victim.read_bytes(), 36)[0]
    with open(victim, "r+b") as f:
        f.seek(36)
        f.write(struct.pack(">i", count - 1))
    with pytest.raises(CorruptFileError, match=f"{victim}.*commit"):
        lookup_all(small.root, ["k0-1"])


def test_scribbled_entries_are_found_by_inspect(small, capsys):
    victim = damage.index_files(small, "b1")[0]
    entries = HEADER_SIZE + small_settings().hash_slot_num * 4
    damage.scribble(victim, entries + 5 * ENTRY_SIZE + 4, 8)  # the phyOffset of entry 5
    code, said = inspect_exit(small.root, capsys)
    assert code == 2 and str(victim) in said and "entry 5" in said


# --- F2: a log segment deleted ------------------------------------------------------------------
def test_the_oldest_segment_deleted_is_an_error_not_a_short_scan(small):
    oldest = damage.segments(small, "b1")[0]
    oldest.unlink()
    with pytest.raises(CorruptFileError, match=oldest.name):
        scan_all(small.root)
    with pytest.raises(CorruptFileError, match=oldest.name):  # not a bare IndexError
        lookup_all(small.root, small.keys())


def test_a_middle_segment_deleted_is_an_error(small):
    middle = damage.segments(small, "b2")[1]
    middle.unlink()
    with pytest.raises(CorruptFileError):
        scan_all(small.root)


# --- F3: a sparse time index is a hint -----------------------------------------------------------
def test_an_edited_time_index_entry_drops_no_record(tmp_path):
    small = damage.build(tmp_path / "s", brokers=("b1",), appends=30, per_append=3,
                         settings=damage.StoreSettings(hash_slot_num=16, index_num=400, segment_bytes=1 << 16,
                                                       index_interval_bytes=100))
    timeindex = damage.segments(small, "b1", ".timeindex")[0]
    raw = bytearray(timeindex.read_bytes())
    assert len(raw) >= 3 * 12, "the test needs a time index with a few entries"
    ts, seq = struct.unpack_from(">qi", raw, 12)
    next_seq = struct.unpack_from(">qi", raw, 24)[1]
    struct.pack_into(">qi", raw, 12, ts, (seq + next_seq) // 2 if next_seq - seq > 1 else seq + 1)
    timeindex.write_bytes(bytes(raw))
    model = small.models["b1"]
    for begin, end in ((damage.BASE_MS, damage.BASE_MS + 20_000), (damage.BASE_MS + 10_000, damage.BASE_MS + 30_000)):
        assert scan_all(small.root, begin_ms=begin, end_ms=end) == model_scan([model], begin_ms=begin, end_ms=end)


# --- F4: the checkpoint deleted ------------------------------------------------------------------
def test_a_deleted_checkpoint_deletes_nothing_and_says_how_to_recover(small):
    checkpoint = damage.shard(small, "b1") / "checkpoint"
    checkpoint.unlink()
    before = damage.listing(small.root)
    with pytest.raises(CorruptFileError, match="msgindex repair"):
        lookup_all(small.root, small.keys())
    with pytest.raises(CorruptFileError, match="msgindex repair"):
        scan_all(small.root)
    with pytest.raises(CorruptFileError, match="msgindex repair"), open_store(small.root) as store:
        with store.writer("b1") as writer:
            writer.append([damage.record(0, 99_999)])
    assert damage.listing(small.root) == before  # committed data is never deleted


def test_an_unreadable_checkpoint_says_how_to_recover(small):
    checkpoint = damage.shard(small, "b2") / "checkpoint"
    damage.scribble(checkpoint, 10, 5)
    with pytest.raises(CorruptFileError, match="msgindex repair"):
        lookup_all(small.root, small.keys())
    with pytest.raises(CorruptFileError, match="msgindex repair"), open_store(small.root) as store:
        store.writer("b2").close()


# --- F6: a shard directory deleted ---------------------------------------------------------------
def test_a_deleted_shard_directory_is_an_error(small, capsys):
    damage.remove(damage.shard(small, "b2"))
    with pytest.raises(CorruptFileError, match="broker=b2"):
        lookup_all(small.root, small.keys())
    with pytest.raises(CorruptFileError, match="broker=b2"):
        scan_all(small.root)
    code, said = inspect_exit(small.root, capsys)
    assert code == 2 and "broker=b2" in said


def test_a_new_shard_is_registered_and_found(small):
    with open_store(small.root) as store:
        with store.writer("b3") as writer:
            writer.append([MessageRecord("t", 0, 0, damage.BASE_MS, "new", ("new",))])
        assert store.brokers() == ["b1", "b2", "b3"]
    assert lookup_all(small.root, ["new"])[0][6] == "new"


def test_intact_store_reads_right(small):
    keys = small.keys()
    assert lookup_all(small.root, keys) == model_lookup(small.models.values(), keys)
    assert scan_all(small.root) == model_scan(small.models.values())
    assert read_checkpoint(damage.shard(small, "b1") / "checkpoint").record_count == 72


def small_settings():
    return damage.SMALL
