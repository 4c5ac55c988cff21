"""Hot-key copies (storage/hot_keys.py): lookups that use them answer exactly what the log does,
and a damaged, stale or foreign copy never changes an answer."""

from __future__ import annotations

import copy
import logging
import random
import shutil
import zlib

import numpy as np
import pyarrow as pa
import pytest

from msgindex.errors import CorruptFileError
from msgindex.storage import hot_keys
from msgindex.storage import shard as shard_module
from msgindex.storage.hash_index import entry_sums
from msgindex.storage.maintenance.inspect import inspect_path
from msgindex.storage.maintenance.repair import repair_store
from msgindex.storage.message import MessageRecord, encode_text
from msgindex.storage.store import StoreSettings, open_store
from msgindex.storage.verified_reads import WantedKeys
from tests.storage.shard_model import KEY_POOL, TOPICS, ShardModel, make_record, model_lookup, table_rows

BASE = 1_700_000_000_000
SETTINGS = StoreSettings(hash_slot_num=7, index_num=700, segment_bytes=30_000, index_interval_bytes=300)
STRETCH = 500
PIECE = 125


@pytest.fixture(autouse=True)
def small_stretches(monkeypatch):
    """Stretches of 500 records in pieces of 125, a key on 5 of them hot: KEY_POOL's keys get copies."""
    monkeypatch.setattr(hot_keys, "STRETCH_RECORDS", STRETCH)
    monkeypatch.setattr(hot_keys, "PIECE_RECORDS", PIECE)
    monkeypatch.setattr(hot_keys, "MIN_ROWS", 5)
    monkeypatch.setattr(shard_module, "FEW_CANDIDATES", 0)  # every lookup may use copies


def write_store(root, seed: int = 5, batches: int = 16) -> ShardModel:
    rng = random.Random(seed)
    model = ShardModel("b")
    with open_store(root, create=True, settings=SETTINGS) as store, store.writer("b") as writer:
        offset = 0
        for batch_id in range(batches):
            batch = [make_record(rng, offset + i, base_ms=BASE + 5_000 * batch_id)
                     for i in range(rng.choice([1, 37, 200, 512]))]
            offset += len(batch)
            writer.append(batch)
            model.append(batch)
    return model


def copies_of(root):
    return [path for _, _, path in hot_keys.stretches(root / "broker=b" / hot_keys.DIRECTORY)]


def covered(copies) -> list[tuple[int, int]]:
    return [hot_keys.parse_copy_name(path.name) for path in copies]


def expected_cover(records: int, start: int = 0) -> list[tuple[int, int]]:
    """Whole stretches from `start`, then the filled pieces of the stretch being filled."""
    whole = (records - start) // STRETCH
    stretches = [(start + n * STRETCH, start + (n + 1) * STRETCH) for n in range(whole)]
    filling = start + whole * STRETCH
    return stretches + [(filling + n * PIECE, filling + (n + 1) * PIECE) for n in range((records - filling) // PIECE)]


def random_lookups(store, model, seed: int, count: int = 60) -> None:
    rng = random.Random(seed)
    for key in KEY_POOL:
        assert table_rows(store.lookup(key)) == model_lookup([model], [key]), key
    for _ in range(count):
        keys = rng.sample(KEY_POOL, rng.randint(1, 4))
        query = dict(topic=rng.choice([None, *TOPICS]), begin_ms=rng.choice([None, BASE + rng.randint(0, 50_000)]),
                     end_ms=rng.choice([None, BASE + rng.randint(20_000, 100_000)]),
                     partitions=rng.choice([None, [0], [1, 2]]), max_results=rng.choice([None, 0, 1, 17, 500]))
        assert table_rows(store.lookup(keys, **query)) == model_lookup([model], keys, **query), (keys, query)


def test_lookups_from_copies_answer_like_the_log(tmp_path, monkeypatch):
    root = tmp_path / "store"
    model = write_store(root)
    copies = copies_of(root)
    assert covered(copies) == expected_cover(len(model.records))
    groups = [hot_keys.HotKeyCopy.open(path).groups for path in copies]
    assert all(groups) and all(group.rows >= 5 for found in groups for group in found.values())
    used = []
    original = hot_keys.part_of
    monkeypatch.setattr(hot_keys, "part_of", lambda *a: used.append(1) or original(*a))
    with open_store(root) as store:
        random_lookups(store, model, seed=1)
    assert len(used) > 50  # the answers above really came (partly) from copies
    shutil.rmtree(root / "broker=b" / hot_keys.DIRECTORY)
    with open_store(root) as store:
        random_lookups(store, model, seed=1)


def test_the_stretch_being_filled_is_copied_in_pieces_that_its_copy_replaces(tmp_path, caplog):
    """After every commit the copies cover the log up to less than a piece before its end (the
    newest records too), whole stretches replacing their pieces; a reader opened before its
    pieces were replaced, and a piece left inside its stretch's copy, change no answer and warn
    of nothing."""
    root = tmp_path / "store"
    rng = random.Random(11)
    model = ShardModel("b")
    early = None
    with open_store(root, create=True, settings=SETTINGS) as store:
        for batch_id in range(14):
            batch = [make_record(rng, len(model.records) + i, base_ms=BASE + 5_000 * batch_id)
                     for i in range(rng.choice([40, 90, 130, 300]))]
            with store.writer("b") as writer:
                writer.append(batch)
            model.append(batch)
            assert covered(copies_of(root)) == expected_cover(len(model.records))
            if early is None and any(end - start == PIECE for start, end in covered(copies_of(root))):
                early, early_model = store.reader("b"), copy.deepcopy(model)  # lists pieces replaced later
                early.lookup(KEY_POOL[0])
    assert any(end - start == STRETCH for start, end in covered(copies_of(root)))
    with caplog.at_level(logging.WARNING, logger="msgindex.storage"):
        random_lookups(early, early_model, seed=5)
        early.close()
        with open_store(root) as store:
            random_lookups(store, model, seed=6)
            # a writer stopped between a stretch's copy and deleting its pieces
            piece = hot_keys.copy_path(root / "broker=b" / hot_keys.DIRECTORY, 0, PIECE)
            with store.reader("b") as reader:
                piece.write_bytes(hot_keys.build(reader.log, 0, PIECE))
        with open_store(root) as store:
            random_lookups(store, model, seed=7, count=30)
    assert not caplog.messages, caplog.messages
    extra = [make_record(rng, len(model.records), base_ms=BASE)]
    with open_store(root) as store, store.writer("b") as writer:
        writer.append(extra)  # the next commit deletes the piece
    model.append(extra)
    assert not piece.exists() and covered(copies_of(root)) == expected_cover(len(model.records))


def append_random(root, model: ShardModel, rng: random.Random, sizes) -> None:
    for size in sizes:
        batch = [make_record(rng, len(model.records) + i, base_ms=BASE + 5_000 * len(model.records)) for i in range(size)]
        with open_store(root) as store, store.writer("b") as writer:
            writer.append(batch)
        model.append(batch)


def test_pieces_after_retention_keep_the_stretch_grid(tmp_path, caplog):
    """Retention cutting into a copy moves no stretch: the next ones start where the cut copy
    ends, so a stretch's copy never overlaps a piece of another grid."""
    root = tmp_path / "store"
    model = write_store(root, batches=12)
    with open_store(root) as store:
        store.apply_retention(max_bytes=1)  # all but the active segment
        with store.reader("b") as reader:
            start = reader.checkpoint.log_start_seq
    model.log_start_seq = start
    assert start % STRETCH, "retention should cut into a stretch here"
    append_random(root, model, random.Random(3), [300, 450, 200])
    assert covered(copies_of(root)) == [c for c in expected_cover(len(model.records)) if c[1] > start]
    with caplog.at_level(logging.WARNING, logger="msgindex.storage"), open_store(root) as store:
        random_lookups(store, model, seed=8, count=30)
        assert inspect_path(root)["problems"] == []
    assert not caplog.messages, caplog.messages


def test_a_directory_where_a_piece_belongs_stops_no_copy(tmp_path, caplog):
    root = tmp_path / "store"
    model = ShardModel("b")
    rng = random.Random(4)
    with open_store(root, create=True, settings=SETTINGS):
        pass
    append_random(root, model, rng, [140, 140])
    piece = copies_of(root)[1]
    assert covered([piece]) == [(PIECE, 2 * PIECE)]
    piece.unlink()
    piece.mkdir()
    with caplog.at_level(logging.WARNING, logger="msgindex.storage"):
        append_random(root, model, rng, [300, 300, 200])
        with open_store(root) as store:
            random_lookups(store, model, seed=9, count=30)
    assert not caplog.messages, caplog.messages
    assert [c for c in covered(copies_of(root)) if c != (PIECE, 2 * PIECE)] == expected_cover(len(model.records))


def test_a_piece_replaced_between_listing_and_reading_is_no_problem(tmp_path, monkeypatch, caplog):
    """A commit may replace pieces after a reader or ``inspect`` listed them: neither warns."""
    root = tmp_path / "store"
    model = ShardModel("b")
    with open_store(root, create=True, settings=SETTINGS):
        pass
    append_random(root, model, random.Random(5), [140, 140])
    listed = hot_keys.stretches

    def listed_then_replaced(directory):
        found = listed(directory)
        for _start, _end, path in found:
            path.unlink(missing_ok=True)
        return found

    monkeypatch.setattr(hot_keys, "stretches", listed_then_replaced)
    with caplog.at_level(logging.WARNING, logger="msgindex.storage"), open_store(root) as store:
        random_lookups(store, model, seed=10, count=20)
        assert inspect_path(root)["problems"] == []
    assert not caplog.messages, caplog.messages


@pytest.mark.parametrize("damage", ["scribbled group", "truncated", "scribbled header", "another stretch's copy",
                                    "another log's copy", "a directory", "overlapping name"])
def test_a_bad_copy_never_changes_an_answer(tmp_path, damage, caplog):
    root = tmp_path / "store"
    model = write_store(root)
    copies = copies_of(root)
    victim = copies[2]
    raw = bytearray(victim.read_bytes())
    if damage == "scribbled group":
        raw[-40:-20] = bytes(20)
        victim.write_bytes(raw)
    elif damage == "truncated":
        victim.write_bytes(raw[: len(raw) // 2])
    elif damage == "scribbled header":
        raw[20] ^= 0xFF
        victim.write_bytes(raw)
    elif damage == "another stretch's copy":
        victim.write_bytes(copies[3].read_bytes())
    elif damage == "another log's copy":  # same stretch, other records (another seed's store)
        other = tmp_path / "other"
        write_store(other, seed=9)
        victim.write_bytes(copies_of(other)[2].read_bytes())
    elif damage == "a directory":
        victim.unlink()
        victim.mkdir()
    elif damage == "overlapping name":
        start, end = hot_keys.parse_copy_name(victim.name)
        victim.rename(hot_keys.copy_path(victim.parent, start, end + STRETCH // 2))
    with caplog.at_level(logging.WARNING, logger="msgindex.storage"), open_store(root) as store:
        random_lookups(store, model, seed=2, count=30)
    if damage != "overlapping name":
        assert any(str(victim) in message for message in caplog.messages), caplog.messages
    if damage not in ("a directory", "overlapping name"):
        report = inspect_path(victim)
        assert report["kind"] == "hot_key_copy" and report["problems"], report


def test_retention_recovery_and_inspect(tmp_path):
    root = tmp_path / "store"
    model = write_store(root, batches=24)
    copies = copies_of(root)
    report = inspect_path(copies[0])
    assert report["kind"] == "hot_key_copy" and report["groups"] and report["problems"] == []
    assert inspect_path(root)["problems"] == []  # copies made from the log, group by group
    assert inspect_path(copies[0].parent)["copies"] == [path.name for path in copies]
    with open_store(root) as store:
        store.apply_retention(max_bytes=1)  # all but the active segment
        with store.reader("b") as reader:
            start = reader.checkpoint.log_start_seq
    assert start > STRETCH
    assert all(hot_keys.parse_copy_name(path.name)[1] > start for path in copies_of(root))
    assert 0 < len(copies_of(root)) < len(copies)
    model.log_start_seq = start
    with open_store(root) as store:
        random_lookups(store, model, seed=3, count=30)
    # a copy past the commit (left by a longer shard before a repair) goes with the next writer
    last = copies_of(root)[-1]
    start_seq, end_seq = hot_keys.parse_copy_name(last.name)
    beyond = hot_keys.copy_path(last.parent, end_seq + 10**6, end_seq + 10**6 + STRETCH)
    shutil.copy(last, beyond)
    with open_store(root) as store, store.writer("b"):
        pass
    assert not beyond.exists() and last.exists()


def test_repair_removes_a_damaged_copy_and_the_next_commit_makes_it_again(tmp_path):
    root = tmp_path / "store"
    model = write_store(root)
    victim = copies_of(root)[1]
    made = victim.read_bytes()
    raw = bytearray(made)
    raw[-30:-10] = bytes(20)
    victim.write_bytes(raw)
    report = repair_store(root)
    assert not victim.exists() and not report.refused, report.lines()
    extra = make_record(random.Random(1), 10**6, base_ms=BASE)
    with open_store(root) as store, store.writer("b") as writer:
        writer.append([extra])
    model.append([extra])
    assert victim.read_bytes() == made  # the gap is copied again, from the same log
    with open_store(root) as store:
        random_lookups(store, model, seed=4, count=20)


@pytest.mark.parametrize("buckets", ["hashed", "one bucket"])
@pytest.mark.parametrize("budget", [hot_keys.MAX_SHARE, 10.0])  # 10: no budget
def test_the_hot_keys_of_a_stretch_are_counted_exactly(tmp_path, monkeypatch, buckets, budget):
    """The keys copied are exactly those a plain count finds on >= the threshold of records (each
    record once, also one that lists a key twice), hottest first within the budget; also when
    every key falls into one hash bucket (bucket counts only narrow what is counted exactly)."""
    if buckets == "one bucket":
        monkeypatch.setattr(hot_keys, "_BUCKET_MASK", 0)
    monkeypatch.setattr(hot_keys, "MAX_SHARE", budget)
    rng = random.Random(3)
    keys = [f"k{i}" for i in range(60)]
    records = []
    for offset in range(STRETCH):
        own = rng.choices(keys, weights=[1 / (i + 1) for i in range(len(keys))], k=rng.randint(1, 2))
        records.append(MessageRecord(rng.choice(TOPICS), 0, offset, BASE + offset, own[0], (*own, own[0]), -1, -1))
    with open_store(tmp_path, create=True, settings=SETTINGS) as store, store.writer("b") as writer:
        writer.append(records)
    (copy,) = copies_of(tmp_path)
    counts: dict[str, int] = {}
    for record in records:
        for key in set(record.keys):
            counts[key] = counts.get(key, 0) + 1
    threshold = max(hot_keys.MIN_ROWS, hot_keys.MIN_SHARE * STRETCH)
    hot, total = [], 0
    for key, n in sorted(((k, n) for k, n in counts.items() if n >= threshold), key=lambda item: -item[1]):
        total += n
        if total <= budget * STRETCH:
            hot.append(key)
    over = [k for k, n in counts.items() if n >= threshold]
    if budget < 1:
        assert 2 <= len(hot) < len(over)  # the budget cut some
    else:
        assert sorted(hot) == sorted(over) and min(counts[k] for k in over) < 2 * threshold, (counts, threshold)
    assert sorted(key.decode() for key in hot_keys.HotKeyCopy.open(copy).groups) == sorted(hot)


def test_walks_end_where_the_copies_end(tmp_path, monkeypatch):
    """A lookup whose keys the copies hold walks each hash chain only down to the first entry past
    the copies (ShardReader._floor_entry): the chains below are never read, the answers stay the log's."""
    from msgindex.storage.hash_index.index_file import FIRST_INDEX, IndexFile

    root = tmp_path / "store"
    model = write_store(root, batches=24)
    floors = []
    original = IndexFile.candidate_arrays

    def spy(self, hashes, *, limit_index_count=None, floor_entry=FIRST_INDEX):
        floors.append(floor_entry)
        return original(self, hashes, limit_index_count=limit_index_count, floor_entry=floor_entry)

    monkeypatch.setattr(IndexFile, "candidate_arrays", spy)
    with open_store(root) as store:
        random_lookups(store, model, seed=3)
    assert max(floors) > FIRST_INDEX and floors.count(FIRST_INDEX) < len(floors)


def test_a_copied_key_among_cold_ones_walks_only_past_its_copies(tmp_path, monkeypatch):
    """Of a many-key lookup, the key the copies hold is walked only down to its copies' end while
    the keys they do not hold are walked whole (one walk per distinct end): a hot key's chain no
    longer costs the lookup of 1,000 cold keys its whole length. Answers stay the log's."""
    from msgindex.storage.hash_index.index_file import FIRST_INDEX, IndexFile
    from msgindex.storage.hash_index.java_hash import index_hash
    from msgindex.storage.message import index_key

    root = tmp_path / "store"
    rng = random.Random(9)
    model = ShardModel("b")
    records = [MessageRecord("orders", 0, n, BASE + n, key, (key,))
               for n, key in enumerate("HOT" if rng.random() < 0.4 else f"k{n}" for n in range(3_100))]
    with open_store(root, create=True, settings=SETTINGS) as store, store.writer("b") as writer:
        for start in range(0, len(records), 250):
            writer.append(records[start : start + 250])
            model.append(records[start : start + 250])
    cold = [r.key for r in records if r.key != "HOT"][::300]
    asked = ["HOT", *cold, "absent"]
    walks = []
    original = IndexFile.candidate_arrays

    def spy(self, hashes, *, limit_index_count=None, floor_entry=FIRST_INDEX):
        walks.append((set(np.asarray(hashes).tolist()), floor_entry))
        return original(self, hashes, limit_index_count=limit_index_count, floor_entry=floor_entry)

    monkeypatch.setattr(IndexFile, "candidate_arrays", spy)
    with open_store(root) as store:
        for _ in range(2):  # (the copies are consulted from the second lookup of a reader on)
            walks.clear()
            answer = table_rows(store.lookup(asked))
    assert len(cold) >= 4
    assert answer == model_lookup([model], asked)
    hot = index_hash(index_key("orders", "HOT"))
    # copies hold 0..3000 (the last 100 records fill no piece): HOT is walked down to 3000 only
    assert any(hashes == {hot} and floor > FIRST_INDEX for hashes, floor in walks), walks
    assert all(floor == FIRST_INDEX for hashes, floor in walks if hot not in hashes)
    assert not any(hot in hashes and floor == FIRST_INDEX for hashes, floor in walks)


def test_a_damaged_entry_cannot_move_the_end_of_the_walks(tmp_path, monkeypatch):
    """An entry past the copies' end whose phyOffset was rewritten to a record before it misleads
    the binary search for where walks may end (to just past that entry); the entry is checked
    against its record, found wrong, and the lookup walks every entry, as it would without copies."""
    from msgindex.storage.hash_index.index_file import ENTRY_SIZE, FIRST_INDEX, HEADER_SIZE, SLOT_SIZE, IndexFile
    from msgindex.storage.hash_index.java_hash import index_hash
    from msgindex.storage.message import index_key

    root = tmp_path / "store"
    rng = random.Random(8)
    records = [MessageRecord("orders", 0, n, BASE + n, keys[0] if rng.random() < 0.6 else None, keys)
               for n, keys in enumerate(("HOT",) if rng.random() < 0.4 else (f"k{n}",) for n in range(3_300))]
    settings = StoreSettings(hash_slot_num=7, index_num=10_000, segment_bytes=30_000, index_interval_bytes=300)
    with open_store(root, create=True, settings=settings) as store, store.writer("b") as writer:
        for start in range(0, len(records), 250):
            writer.append(records[start : start + 250])
    key = "HOT"
    assert all(encode_text(key) in hot_keys.HotKeyCopy.open(path).groups for path in copies_of(root))
    with open_store(root) as store:
        store.lookup(key)
        store.lookup(key)  # (the copies are consulted from the second lookup of a reader on)
        reader = store.reader("b")
        copied = reader._copied_rows(WantedKeys.of(list(reader.topics), [key]))
        from_seq = int(copied.covered_below(len(reader.topics)).min())
        state, index_file = reader.index_files()[-1]
        assert from_seq > 0 and state.header.end_phy_offset >= from_seq
        boundary = index_file.first_entry_from(from_seq, state.index_count)
        path, count = index_file.path, state.index_count
        entries = index_file.entry_array()
        probe, low, high = None, FIRST_INDEX, count
        while low < high:  # the search's own path: its first probe at or past the boundary
            middle = (low + high) // 2
            if middle >= boundary:
                probe = middle
                break
            low = middle + 1
        assert probe is not None
        entry_hash = int(entries[probe]["key_hash"])
        del entries
    stray = next(seq for seq in range(from_seq) if entry_hash not in {
        index_hash(index_key(records[seq].topic, k)) for k in records[seq].keys})
    with open(path, "r+b") as f:  # (a valid-looking seq before the copies' end, of a record without the key)
        f.seek(HEADER_SIZE + settings.hash_slot_num * SLOT_SIZE + probe * ENTRY_SIZE + 4)
        f.write(stray.to_bytes(8, "big"))
    with IndexFile.open(path, settings.hash_slot_num, settings.index_num, read_only=True) as damaged:
        assert damaged.first_entry_from(from_seq, count) == probe + 1  # misled
    with open_store(root) as store, pytest.raises(CorruptFileError, match="fail their checksum"):
        store.lookup(key)  # the entry checksums (entry_sums) see the damage: an error naming the file
    entry_sums.sums_path(path).unlink()
    with open_store(root) as store, pytest.raises(CorruptFileError, match="phyOffset below the entry before it"):
        store.lookup(key)  # without them, the entries' shape: phyOffsets never go back
    # and with neither check, the floor's own: the misleading entry is refused, every entry walked
    monkeypatch.setattr(IndexFile, "_check_touched", lambda self, touched, limit: None)
    floors = []
    original = shard_module.ShardReader._floor_entry
    monkeypatch.setattr(shard_module.ShardReader, "_floor_entry",
                        lambda self, *a: floors.append(original(self, *a)) or floors[-1])
    with open_store(root) as store:
        store.lookup(key)
        walked = store.lookup(key)
    assert floors and floors[-1] == FIRST_INDEX  # refused: every entry walked
    monkeypatch.setattr(shard_module.ShardReader, "_floor_entry", lambda self, *a: FIRST_INDEX)
    with open_store(root) as store:
        store.lookup(key)
        assert walked.equals(store.lookup(key))


def test_stored_rows_are_shown_again_exactly(tmp_path):
    """STORED_SCHEMA (key dictionary, keys split into lead and rest, timestamp steps) gives back
    the shown rows exactly, whatever a row's keys are: none, the key first or elsewhere, repeated,
    no key, texts shown escaped."""
    rng = random.Random(4)
    texts = ["HOT", "k1", "", "ключ", "\\xff", "a\\x5cxb", "🔑"]
    rows = []
    stamp = BASE
    for n in range(400):
        key = rng.choice([*texts, None])
        keys = [rng.choice(texts) for _ in range(rng.choice([0, 1, 1, 2, 3]))]
        if key is not None and rng.random() < 0.6:
            keys = [key, *keys]
        stamp += rng.choice([0, 0, 1, 17, 4_000])
        rows.append({"topic": rng.choice(["orders", "Aa", "BB"]), "partition": rng.randint(0, 3), "offset": n,
                     "key": key, "keys": keys, "timestamp": stamp * 1000,
                     "commit_log_offset": rng.choice([None, n * 100]), "size": rng.choice([None, 7]), "seq": 10 * n})
    schema = hot_keys.COPY_SCHEMA
    columns = [pa.array([row["topic"] for row in rows]).dictionary_encode().cast(schema.field("topic").type)]
    columns += [pa.array([row[name] for row in rows], schema.field(name).type) for name in schema.names[1:]]
    table = pa.Table.from_arrays(columns, schema=schema)
    copy = table.cast(hot_keys.COPY_SCHEMA)
    stored = hot_keys.stored(copy)
    assert stored.schema == hot_keys.STORED_SCHEMA
    assert hot_keys.shown(stored).equals(copy)
    assert hot_keys.shown(hot_keys.stored(copy.slice(0, 0))).equals(copy.slice(0, 0))


def test_a_version_1_copy_is_still_read(tmp_path, monkeypatch):
    """Copies written before version 2 (COPY_SCHEMA streams as is) answer like the log, as before."""
    root = tmp_path / "store"
    model = write_store(root)
    for path in copies_of(root):  # the same copies, written as version 1 wrote them
        copy = hot_keys.HotKeyCopy.open(path)
        groups = [(key, copy.rows(group)) for key, group in sorted(copy.groups.items())]
        streams = []
        for _key, table in groups:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, hot_keys.COPY_SCHEMA,
                                   options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
                writer.write_table(table)
            streams.append(sink.getvalue().to_pybytes())
        directory, position = bytearray(), hot_keys.HEADER_SIZE + sum(hot_keys.GROUP_STRUCT.size + len(k) for k, _ in groups)
        for (key, table), stream in zip(groups, streams):
            directory += hot_keys.GROUP_STRUCT.pack(position, len(stream), table.num_rows, zlib.crc32(stream), len(key))
            directory += key
            position += len(stream)
        fields = [hot_keys.MAGIC, 1, len(groups), copy.start_seq, copy.end_seq, copy.log_fingerprint, len(directory),
                  zlib.crc32(directory), 0]
        fields[-1] = zlib.crc32(hot_keys.HEADER_STRUCT.pack(*fields)[:hot_keys.HEADER_CRC_OFFSET])
        path.write_bytes(hot_keys.HEADER_STRUCT.pack(*fields) + bytes(directory) + b"".join(streams))
        assert hot_keys.HotKeyCopy.open(path).version == 1
    used = []
    original = hot_keys.part_of
    monkeypatch.setattr(hot_keys, "part_of", lambda *a: used.append(1) or original(*a))
    with open_store(root) as store:
        random_lookups(store, model, seed=2)
    assert len(used) > 50
    assert not inspect_path(root)["problems"]
