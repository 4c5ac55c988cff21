"""ShardWriter / ShardReader: commits, idempotent replays, rollback, snapshots, verified lookups
(those of the Store API on both kinds of store: ``any_store``)."""

from __future__ import annotations

import random
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgindex.errors import CorruptFileError, InvalidAppendError, ShardLockedError
from msgindex.storage import shard as shard_module
from msgindex.storage.append_columns import MAX_LAG_PASSES
from msgindex.storage.checkpoint import CHECKPOINT_FILE, read_checkpoint
from msgindex.storage.hash_index.index_file import ENTRY_SIZE, HEADER_SIZE, IndexFile
from msgindex.storage.message import APPEND_SCHEMA, ROW_SCHEMA, MessageRecord, index_key
from msgindex.storage.shard import index_entries
from msgindex.storage.source_ranges import SourceRanges
from msgindex.storage.store import StoreSettings, open_store
from tests.storage.kinds import is_object_store, shard_contents
from tests.storage.shard_model import (
    KEY_POOL,
    TINY,
    TOPICS,
    ShardModel,
    make_batch,
    model_lookup,
    model_scan,
    shard_files,
    table_rows,
)

BASE = 1_700_000_000_000


def rec(offset, keys, ts=BASE, topic="orders", partition=0, key=None):
    """A record indexed under `keys`, its key the last of them (or `key`, which must be one)."""
    return MessageRecord(topic, partition, offset, ts, key if key is not None else (keys[-1] if keys else None),
                         tuple(keys))


@pytest.fixture
def store(tmp_path):
    with open_store(tmp_path / "store", create=True, settings=TINY) as s:
        yield s


@pytest.fixture
def any_store(stores):
    """A store of each kind in turn (tests of the Store API that hold for both)."""
    with stores.create(settings=TINY) as s:
        yield s


def test_append_commits_and_replay_is_skipped(any_store):
    with any_store.writer("b1") as writer:
        assert writer.committed_ranges == SourceRanges()
        first = writer.append([rec(0, ["a"]), rec(1, ["a", "b"])])
        assert (first.appended, first.already_committed, first.keys_indexed) == (2, 0, 3)
        replay = writer.append([rec(1, ["a"]), rec(0, ["zzz"])])  # offsets the shard holds
        assert (replay.appended, replay.already_committed, replay.records) == (0, 2, 2)
        assert writer.append([]).records == 0
        mixed = writer.append([rec(1, ["a"]), rec(2, ["a"]), rec(2, ["a"])])  # old, new, a repeat within the input
        assert (mixed.appended, mixed.already_committed) == (1, 2)
        other = writer.append([rec(0, ["a"], partition=1)])  # the same offset of another partition is new
        assert other.appended == 1
        assert writer.committed_ranges.to_json() == {"orders": {"0": [[0, 3]], "1": [[0, 1]]}}
    with any_store.reader("b1") as reader:
        assert reader.committed_ranges.to_json() == {"orders": {"0": [[0, 3]], "1": [[0, 1]]}}
        assert reader.record_count == 4
        assert sorted((r[3], r[4]) for r in table_rows(reader.lookup("a"))) == [(0, 0), (0, 1), (0, 2), (1, 0)]


def test_a_slice_commits_its_whole_range_gaps_included(any_store):
    """[min, max + 1) of each slice: offsets missing inside it (transaction markers, compaction,
    records of another shard) are committed too, and separate slices stay separate."""
    from msgindex.storage.source_ranges import SourceRows

    records = [rec(o, ["k"]) for o in (10, 13, 20, 22)]
    sources = SourceRows.of(["orders"] * 4, [0] * 4, [10, 13, 20, 22], slice_id=[1, 1, 2, 2])
    with any_store.writer("b") as writer:
        assert writer.append(records, sources).appended == 4
        assert writer.committed_ranges.to_json() == {"orders": {"0": [[10, 14], [20, 23]]}}
        late = writer.append([rec(12, ["k"]), rec(16, ["k"])], SourceRows.of(["orders"] * 2, [0, 0], [12, 16]))
        assert (late.appended, late.already_committed) == (1, 1)  # 12 lies in [10, 14), 16 does not
        assert writer.committed_ranges.to_json() == {"orders": {"0": [[10, 17], [20, 23]]}}
        by_source = writer.append([rec(30, ["k"])], SourceRows.of(["orders"], [0], [23]))
        assert by_source.appended == 1  # the source coordinates decide, not the record's own offset
        assert writer.committed_ranges.to_json() == {"orders": {"0": [[10, 17], [20, 24]]}}


def test_a_version_1_checkpoint_is_refused_then_upgraded_from_the_log(store):
    """A batch-id checkpoint (msgindex before offsets) is never read as offsets: appends are
    refused until adopt_log_offsets() rebuilds the ranges from the log's own offsets."""
    from msgindex.errors import LegacyCheckpointError
    from tests.storage.shard_model import downgrade_to_version_1

    with store.writer("b") as writer:
        writer.append([rec(o, ["k"]) for o in (0, 1, 2, 5, 6)] + [rec(0, ["k"], topic="t2", partition=3)])
    downgrade_to_version_1(store.root / "broker=b" / CHECKPOINT_FILE)
    with store.reader("b") as reader:
        assert reader.committed_ranges is None and reader.record_count == 6
    with store.writer("b") as writer:
        with pytest.raises(LegacyCheckpointError, match="version-1 checkpoint.*adopt_log_offsets"):
            writer.append([rec(7, ["k"])])
        writer.adopt_log_offsets()
        assert writer.committed_ranges.to_json() == {"orders": {"0": [[0, 3], [5, 7]]}, "t2": {"3": [[0, 1]]}}
        assert writer.append([rec(o, ["k"]) for o in range(8)]).appended == 3  # 3, 4 and 7
    with store.reader("b") as reader:
        assert reader.record_count == 9 and reader.checkpoint.source_ranges.to_json()["orders"] == {"0": [[0, 8]]}


def test_lookup_verifies_keys_topics_and_ms_windows(any_store):
    records = [
        rec(0, ["Aa"], BASE + 10),  # "Aa" and "BB" share a Java hash, so a hash slot
        rec(1, ["BB"], BASE + 20),
        rec(2, ["Aa"], BASE + 999, topic="payments"),  # same key, other topic
        rec(3, ["Aa", "Aa"], BASE + 1000),  # the key twice in one message
    ]
    with any_store.writer("b") as writer:
        writer.append(records)
    with any_store.reader("b") as reader:
        assert [r[4] for r in table_rows(reader.lookup("Aa", topic="orders"))] == [0, 3]
        assert [r[4] for r in table_rows(reader.lookup("BB", topic="orders"))] == [1]
        assert [r[2] for r in table_rows(reader.lookup("Aa"))] == ["orders", "payments", "orders"]
        # millisecond windows, inclusive at both ends, inside one second of RocketMQ's diff
        assert [r[4] for r in table_rows(reader.lookup("Aa", begin_ms=BASE + 11, end_ms=BASE + 999))] == [2]
        assert [r[4] for r in table_rows(reader.lookup("Aa", begin_ms=BASE + 10, end_ms=BASE + 10))] == [0]
        assert reader.lookup("Aa", begin_ms=BASE + 11, end_ms=BASE + 998).num_rows == 0
        assert reader.lookup("Aa", topic="nope").num_rows == 0
        assert reader.lookup(["Aa", "BB"], topic="orders", max_results=2).num_rows == 2
        assert reader.lookup("Aa", partitions=[1]).num_rows == 0
        table = reader.lookup(["Aa", "BB", "Aa"])
        assert table.schema == ROW_SCHEMA
        assert [r[4] for r in table_rows(table)] == [0, 1, 2, 3]  # one row per message


@pytest.mark.parametrize("few", [True, False], ids=["record by record", "vectorized"])
def test_two_entries_of_one_hash_on_one_record(store, monkeypatch, few):
    """The writer puts one entry per distinct key of a record, so two entries of one keyHash
    point at one record only when it carries two keys of that hash (colliding keys): right. An
    entry moved from its record onto another that carries the same key is damage that lookups
    would otherwise answer silently short: a CorruptFileError naming the file. (The lookup's own
    check, behind the entry checksums, which catch it first: test_entry_sums.py.)"""
    monkeypatch.setattr(shard_module, "FEW_CANDIDATES", 10**9 if few else 0)
    monkeypatch.setattr(IndexFile, "guard_entries", lambda self: None)
    with store.writer("b") as writer:
        writer.append([rec(0, ["Aa", "BB"]), rec(1, ["Aa"]), rec(2, ["k"]), rec(3, ["k"])])
        (state,) = writer.checkpoint.index_files
    with store.reader("b") as reader:
        assert [r[4] for r in table_rows(reader.lookup("Aa", topic="orders"))] == [0, 1]
        assert [r[4] for r in table_rows(reader.lookup(["BB"]))] == [0]
        assert [r[4] for r in table_rows(reader.lookup(["Aa", "BB"]))] == [0, 1]
    path = store.root / "broker=b" / "index" / state.name
    raw = bytearray(path.read_bytes())
    entries = HEADER_SIZE + TINY.hash_slot_num * 4
    phys = [struct.unpack_from(">q", raw, entries + n * ENTRY_SIZE + 4)[0] for n in range(1, state.index_count + 1)]
    struct.pack_into(">q", raw, entries + (phys.index(2) + 1) * ENTRY_SIZE + 4, 3)  # k's entry of seq 2 -> seq 3
    path.write_bytes(bytes(raw))
    with store.reader("b") as reader:
        with pytest.raises(CorruptFileError, match=rf"{state.name}: 2 committed hash entries of keyHash \d+ point at "
                                                   r"record seq 3, which carries 1 key"):
            reader.lookup("k")
        assert [r[4] for r in table_rows(reader.lookup("Aa", topic="orders"))] == [0, 1]  # other keys still answer


def test_no_result_cap_and_files_roll(store):
    records = [rec(i, ["hot"], BASE + (i * 7919) % 5000) for i in range(400)]
    with store.writer("b") as writer:
        writer.append(records[:100])
        writer.append(records[100:])
        names = [state.name for state in writer.checkpoint.index_files]
    assert len(names) == 400 // (TINY.index_num - 1)  # 8 entries per tiny file
    assert names == sorted(names) and len(set(names)) == len(names)
    model = ShardModel("b")
    model.append(records)
    with store.reader("b") as reader:
        rows = table_rows(reader.lookup("hot"))
        assert rows == model_lookup([model], ["hot"])
        assert table_rows(reader.lookup("hot", max_results=7)) == model_lookup([model], ["hot"], max_results=7)


def test_small_result_rows_equal_the_logs_rows(any_store):
    from msgindex.storage.query import rows_from_records

    records = make_batch(random.Random(5), 0, 60)
    with any_store.writer("b:1") as writer:
        writer.append(records)
    with any_store.reader("b:1") as reader:
        for seqs in ([3, 0, 59, 17], list(range(60)), []):  # every null / non-null field shape
            expected = pa.Table.from_batches([reader.log.read_rows(seqs, "b:1")])
            assert rows_from_records("b:1", seqs, reader.log.read_many(seqs)).equals(expected)


def test_rolled_file_inherits_end_fields(store):
    with store.writer("b") as writer:
        writer.append([rec(i, ["k"], BASE + i) for i in range(TINY.index_num)])
        first, second = writer.checkpoint.index_files
    assert first.header.index_count == TINY.index_num
    # RocketMQ: the new file starts from the full one's end; its first put then resets begin
    assert second.header.begin_phy_offset == TINY.index_num - 1
    assert second.header.end_timestamp == BASE + TINY.index_num - 1


def append_table(records, chunks=1, dictionary_topics=False):
    """`records` as an APPEND_SCHEMA table, maybe in several chunks or with dictionary topics."""
    rows = [
        {
            "topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp_ms": r.timestamp_ms,
            "key": r.key, "keys": list(r.keys), "commit_log_offset": r.commit_log_offset, "size": r.size,
        }
        for r in records
    ]
    step = max(1, -(-len(rows) // chunks))
    table = pa.Table.from_batches(
        [pa.RecordBatch.from_pylist(rows[i : i + step], schema=APPEND_SCHEMA) for i in range(0, len(rows), step)],
        schema=APPEND_SCHEMA,
    )
    if dictionary_topics:
        table = table.set_column(0, "topic", table["topic"].dictionary_encode())
    return table


def old_index_entries(records, first_seq):
    """The hash entries as the original per-record code made them: the oracle of the Arrow path."""
    entries = []
    for seq, record in enumerate(records, first_seq):
        for key in dict.fromkeys(record.keys):  # a repeated key: its first place only
            entries.append((index_key(record.topic, key), seq, record.timestamp_ms))
    return entries


def as_entries(keys, phy_offsets, timestamps):
    keys = keys.to_pylist() if isinstance(keys, pa.Array) else list(keys)
    return list(zip(keys, np.asarray(phy_offsets).tolist(), np.asarray(timestamps).tolist()))


ARROW_KEYS = [k for k in KEY_POOL if k.isprintable() and "\udc80" not in k] + ["k1 k2", "a#b", "#", "\0"]
MANY_TOPICS = TOPICS + [f"topic-{i}" for i in range(6)] + ["тема", "t#1"]


@st.composite
def record_batches(draw, key_pool, max_keys=5):
    batches, offset = [], 0
    for _ in range(draw(st.integers(1, 4))):
        batch = []
        for _ in range(draw(st.integers(0, 25))):
            keys = tuple(draw(st.lists(st.sampled_from(key_pool), max_size=max_keys)))  # repeats are likely
            batch.append(MessageRecord(
                topic=draw(st.sampled_from(MANY_TOPICS)),
                partition=draw(st.integers(0, 2)),
                offset=offset,
                timestamp_ms=BASE + draw(st.integers(-3_000, 20_000)),
                # a key is one of the keys (stored apart past the first), or empty (indexed under nothing)
                key=draw(st.sampled_from([None, keys[0] if keys else None, keys[-1] if keys else None, ""])),
                keys=keys,
                commit_log_offset=draw(st.sampled_from([-1, offset * 10])),
                size=draw(st.sampled_from([-1, 77])),
            ))
            offset += 1
        batches.append(batch)
    return batches


SHARD_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SHARD_SETTINGS
@given(batches=record_batches(ARROW_KEYS), chunks=st.integers(1, 3), dictionary_topics=st.booleans())
def test_table_input_equals_record_input(tmp_path_factory, batches, chunks, dictionary_topics):
    """Appending MessageRecords or the same rows as Arrow tables writes byte-identical shards,
    through rolls of tiny index files and log segments."""
    root = tmp_path_factory.mktemp("same")
    with open_store(root / "a", create=True, settings=TINY) as a, open_store(root / "b", create=True, settings=TINY) as b:
        with a.writer("x") as by_records, b.writer("x") as by_table:
            for batch in batches:
                first_seq = by_records.log.next_seq
                got = by_table.append(append_table(batch, chunks, dictionary_topics))
                assert by_records.append(batch) == got
                assert got.keys_indexed == len(old_index_entries(batch, first_seq))
        assert shard_files(root / "a" / "broker=x") == shard_files(root / "b" / "broker=x")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=record_batches(ARROW_KEYS), chunks=st.integers(1, 3), dictionary_topics=st.booleans())
def test_table_input_equals_record_input_on_an_object_store(s3, batches, chunks, dictionary_topics):
    """The same on an object store: byte-identical chunk objects, in the same order (fewer
    examples: each costs tens of requests)."""
    from msgindex.storage.location import parse_location
    from msgindex.storage.objects.store import open_object_store

    a, b = (open_object_store(parse_location(s3.url(), s3.options), create=True, settings=TINY) for _ in range(2))
    by_records, by_table = a.writer("x"), b.writer("x")
    for batch in batches:
        got = by_table.append(append_table(batch, chunks, dictionary_topics))
        assert by_records.append(batch) == got
    chunks_of = [[store.client.get(f"{store.shard_prefix('x')}/{ref.name}") for ref in writer.refresh().chunks]
                 for store, writer in ((a, by_records), (b, by_table))]
    assert chunks_of[0] == chunks_of[1]


@SHARD_SETTINGS
@given(batches=record_batches(KEY_POOL, max_keys=MAX_LAG_PASSES + 4), first_seq=st.integers(0, 1 << 40))
def test_index_entries_are_the_per_record_ones(batches, first_seq):
    """The vectorized entries equal the per-record loop's, lone surrogates in keys included, for
    records with few keys (repeats found by neighbour comparison) and many (by sorting)."""
    for batch in batches:
        expected = old_index_entries(batch, first_seq)
        assert as_entries(*index_entries(batch, range(first_seq, first_seq + len(batch)))) == expected
        if all(k in ARROW_KEYS for r in batch for k in r.keys):
            assert as_entries(*index_entries(append_table(batch), range(first_seq, first_seq + len(batch)))) == expected


def test_index_entries_of_a_sliced_table():
    records = [rec(i, ["a", "b", "a"][: i % 4], BASE + i, topic=f"t{i % 3}") for i in range(12)]
    table = append_table(records).slice(5, 6)
    assert as_entries(*index_entries(table, range(100, 106))) == old_index_entries(records[5:11], 100)


def test_index_entries_of_a_record_with_many_repeated_keys():
    keys = [f"k{i % 7}" for i in range(40)]  # more keys than neighbour comparison handles
    records = [rec(0, ["x", "x"]), rec(1, keys, topic="t"), rec(2, []), rec(3, ["k1", "k1", "x"])]
    entries = as_entries(*index_entries(records, range(5, 9)))
    assert entries == old_index_entries(records, 5)
    assert [k for k, seq, _ in entries if seq == 6] == [f"t#k{i}" for i in range(7)]


def test_one_writer_at_a_time(store):
    with store.writer("b"):
        with pytest.raises(ShardLockedError, match="broker=b"):
            store.writer("b")
    store.writer("b").close()  # released on close


def test_reader_sees_only_the_committed_prefix(any_store):
    with any_store.writer("b") as writer:
        writer.append([rec(0, ["k"])])
        reader = any_store.reader("b")
        writer.append([rec(1, ["k"]), rec(2, ["k"])] + [rec(3 + i, ["f"]) for i in range(20)])
        assert table_rows(reader.lookup("k"))[0][4] == 0 and reader.lookup("k").num_rows == 1
        assert sum(b.num_rows for s, e in reader.scan_ranges() for b in reader.scan_range(s, e)) == 1
        reader.close()
        with any_store.reader("b") as fresh:
            assert fresh.lookup("k").num_rows == 3


def test_uncommitted_bytes_are_rolled_back_on_open(store, tmp_path):
    rng = random.Random(7)
    with store.writer("b") as writer:
        writer.append(make_batch(rng, 0, 30))
    shard = store.root / "broker=b"
    committed = shard_files(shard)
    lost = make_batch(rng, 30, 30)
    # a writer that dies after writing a whole batch but before its checkpoint
    writer = store.writer("b")
    checkpoint = writer.checkpoint
    seqs = writer.log.append(lost)
    writer._put_keys(*index_entries(lost, seqs))
    writer.log.flush()
    writer.close()
    assert read_checkpoint(shard / CHECKPOINT_FILE) == checkpoint
    with store.reader("b") as reader:  # readers ignore the torn batch
        assert reader.record_count == 30
    store.writer("b").close()  # rolls back
    assert shard_files(shard) == committed


def test_scan_ranges_cover_the_window(any_store):
    rng = random.Random(3)
    model = ShardModel("b")
    with any_store.writer("b") as writer:
        for batch_id in range(6):
            batch = make_batch(rng, batch_id * 25, 25)
            writer.append(batch)
            model.append(batch)
    with any_store.reader("b") as reader:
        assert len(reader.scan_ranges()) > 1  # several segments
        for begin, end in [(None, None), (BASE + 5000, None), (None, BASE + 3000), (BASE + 4000, BASE + 4500)]:
            got = [row for s, e in reader.scan_ranges(begin, end)
                   for row in table_rows(reader.scan_range(s, e, begin_ms=begin, end_ms=end))]
            assert got == model_scan([model], begin_ms=begin, end_ms=end)
        got = [row for s, e in reader.scan_ranges() for row in table_rows(reader.scan_range(s, e, topics=["BB"], partitions=[1]))]
        assert got == [r for r in model_scan([model]) if r[2] == "BB" and r[3] == 1]
        for keys in (["Aa"], ["BB", "k1"], [""], ["🔑"], ["\udc80raw"]):
            assert table_rows(reader.lookup(keys)) == model_lookup([model], keys)


def test_bytes_keys_are_kafka_key_bytes(any_store):
    with any_store.writer("b") as writer:
        writer.append([rec(0, ["\udcffbin"]), rec(1, ["plain"])])
    with any_store.reader("b") as reader:
        assert reader.lookup(b"\xffbin").num_rows == 1
        assert reader.lookup([b"plain", "plain"]).num_rows == 1


def test_bad_records_are_rejected_before_anything_is_written(any_store):
    with any_store.writer("b") as writer:
        with pytest.raises(InvalidAppendError, match="topic"):
            writer.append([rec(0, ["a"]), "not a record"])
        with pytest.raises(InvalidAppendError, match="shard 'b': record 1"):
            writer.append([rec(0, ["a"]), MessageRecord("t", 0, 1, BASE, None, ("k", 5))])
        with pytest.raises(InvalidAppendError, match="2 source coordinates for 1 records"):
            from msgindex.storage.source_ranges import SourceRows

            writer.append([rec(0, ["a"])], SourceRows.of(["t", "t"], [0, 0], [1, 2]))
        # (an attack run: accepted, its interval ended past int64, and every later append of the
        # partition failed with a bare OverflowError)
        with pytest.raises(InvalidAppendError, match=r"offset 9223372036854775807 in t-0: the largest Java long"):
            writer.append([MessageRecord("t", 0, 2**63 - 1, BASE, "a", ("a",))])
        # (an attack run: accepted, then `where key = 'P'` pushed to the index found none of them)
        with pytest.raises(InvalidAppendError, match=r"record 1 of the batch \(t-0 offset 4\): its key 'P' is not among"):
            writer.append([MessageRecord("t", 0, 3, BASE, "x", ("y", "x")), MessageRecord("t", 0, 4, BASE, "P", ("Q",))])
        assert writer.committed_ranges == SourceRanges()
        if is_object_store(any_store):
            assert any_store.brokers() == [] and shard_contents(any_store, "b") == {}  # not one object written
        else:
            assert writer.checkpoint.record_count == 0


def test_corrupt_checkpoint_is_named(store):
    with store.writer("b") as writer:
        writer.append([rec(0, ["a"])])
    path = store.root / "broker=b" / CHECKPOINT_FILE
    raw = path.read_bytes()
    for damaged in (raw[:-10], b"", b"garbage", raw.replace(b'"record_count":1', b'"record_count":7')):
        path.write_bytes(damaged)
        with pytest.raises(CorruptFileError, match="checkpoint"):
            store.reader("b")
        with pytest.raises(CorruptFileError, match="checkpoint"):
            store.writer("b")


def test_missing_index_file_is_named(store):
    with store.writer("b") as writer:
        writer.append([rec(0, ["a"])])
        name = writer.checkpoint.index_files[0].name
    (store.root / "broker=b" / "index" / name).unlink()
    with pytest.raises(CorruptFileError, match=name):
        store.reader("b")
    with pytest.raises(CorruptFileError, match=name):
        store.writer("b")


def test_wrong_size_index_file_is_named(store):
    with store.writer("b") as writer:
        writer.append([rec(0, ["a"])])
        name = writer.checkpoint.index_files[0].name
    path = store.root / "broker=b" / "index" / name
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CorruptFileError, match=name):
        store.reader("b")


def test_files_without_a_checkpoint_are_refused_not_wiped(store):
    """No checkpoint but log bytes or hash index files: a lost checkpoint, not a torn first
    batch (a shard commits an empty checkpoint before its first append), so readers and writers
    refuse and delete nothing (issue 10, F4)."""
    shard = store.root / "broker=g"
    (shard / "index").mkdir(parents=True)
    (shard / "index" / "20240101000000000").write_bytes(b"\xff" * 1000)
    (shard / "log").mkdir()
    (shard / "log" / "00000000000000000000.log").write_bytes(b"\x00garbage")
    before = sorted((p.relative_to(shard), p.read_bytes()) for p in shard.rglob("*") if p.is_file())
    with pytest.raises(CorruptFileError, match="msgindex repair"):
        store.reader("g")
    with pytest.raises(CorruptFileError, match="msgindex repair"):
        store.writer("g")
    after = sorted((p.relative_to(shard), p.read_bytes()) for p in shard.rglob("*") if p.is_file() and p.name != "lock")
    assert after == before


def test_a_shard_whose_creation_died_starts_empty(store):
    """Empty files and no checkpoint: a writer died creating the shard; nothing was committed."""
    shard = store.root / "broker=g"
    (shard / "index").mkdir(parents=True)
    (shard / "log").mkdir()
    (shard / "log" / "00000000000000000000.log").write_bytes(b"")
    with store.reader("g") as reader:
        assert reader.record_count == 0 and reader.lookup("a").num_rows == 0
    with store.writer("g") as writer:
        writer.append([rec(0, ["a"])])
    with store.reader("g") as reader:
        assert reader.lookup("a").num_rows == 1


def test_default_settings_file_sizes(tmp_path):
    settings = StoreSettings(hash_slot_num=1000, index_num=4000)
    with open_store(tmp_path / "s", create=True, settings=settings) as store:
        with store.writer("b") as writer:
            writer.append([rec(0, ["a"])])
            path = writer.index_file_paths()[0]
        assert path.stat().st_size == IndexFile.file_size(1000, 4000)


@pytest.mark.parametrize("lag_header", [False, True])
def test_rollback_undoes_uncommitted_entries_even_past_the_header(tmp_path, lag_header):
    from msgindex.storage.hash_index.index_file import HEADER_STRUCT

    keys = [f"t#{k}" for k in ["Aa", "BB", "x", "Aa", "AaAa", "BBBB", "y", "Aa", "BB", "z"] * 3]
    clean, dirty = tmp_path / "clean", tmp_path / "dirty"
    for path in (clean, dirty):
        with IndexFile.create(path, 7, 64) as f:
            f.put_keys(keys[:12], list(range(12)), [BASE + 500 * i for i in range(12)])
            committed = f.header
    with IndexFile.open(dirty, 7, 64) as f:
        committed_header = f.header
        f.put_keys(keys[12:], list(range(12, 30)), [BASE - 5000 + 700 * i for i in range(18)])
        if lag_header:  # killed after the entries and slots, before the header
            HEADER_STRUCT.pack_into(f._mm, 0, *[getattr(committed_header, n) for n in committed_header.__dataclass_fields__])
    assert dirty.read_bytes() != clean.read_bytes()
    with IndexFile.open(dirty, 7, 64) as f:
        assert f.rollback_to(committed.index_count, committed)
    assert dirty.read_bytes() == clean.read_bytes()
    with IndexFile.open(dirty, 7, 64) as f:
        assert not f.rollback_to(committed.index_count, committed)  # idempotent


def test_failed_append_is_forgotten(store, tmp_path, monkeypatch):
    from msgindex.storage import shard as shard_module

    rng = random.Random(9)
    first, second = make_batch(rng, 0, 20), make_batch(rng, 20, 30)
    with open_store(tmp_path / "clean", create=True, settings=TINY) as clean, clean.writer("b") as writer:
        writer.append(first)
        writer.append(second)
    with store.writer("b") as writer:
        writer.append(first)
        real_commit = shard_module.ShardWriter._commit

        def disk_full(self, *args):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(shard_module.ShardWriter, "_commit", disk_full)
        with pytest.raises(OSError, match="No space"):
            writer.append(second)
        monkeypatch.setattr(shard_module.ShardWriter, "_commit", real_commit)
        assert writer.checkpoint.record_count == len(first)
        writer.append(second)  # the same batch again, on a writer that forgot the failed one
    assert shard_files(store.root / "broker=b") == shard_files(tmp_path / "clean" / "broker=b")


def test_source_offsets_beyond_what_a_log_batch_carries_are_refused_saying_why(tmp_path):
    """Every append carries the shard's committed source offsets in its log batch (a lost
    checkpoint is rebuilt from them), at most 1 MiB: beyond it the error says what grew and what
    to do, not only the annotation's size (an attack run: 36,000 topics, or 50,000 gaps)."""
    from msgindex.storage.source_ranges import SourceRows

    count = 100_000  # every other offset, each its own slice: 100,000 ranges
    records = [MessageRecord("t", 0, 2 * i, BASE, "k", ("k",)) for i in range(count)]
    sources = SourceRows.of(["t"] * count, [0] * count, [2 * i for i in range(count)], list(range(count)))
    with open_store(tmp_path / "s", create=True) as store, store.writer("b") as writer:
        with pytest.raises(InvalidAppendError, match=r"shard 'b': its committed source offsets \(1 topic-partitions in "
                                                      r"100,000 ranges\) take .* bytes, more than the 1,048,576 a log batch"):
            writer.append(records, sources)
        assert writer.committed_ranges == SourceRanges()
