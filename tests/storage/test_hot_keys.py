"""Hot-key copies (storage/hot_keys.py): lookups that use them answer exactly what the log does,
and a damaged, stale or foreign copy never changes an answer."""

from __future__ import annotations

import logging
import random
import shutil

import pytest

from msgindex.storage import hot_keys
from msgindex.storage import shard as shard_module
from msgindex.storage.inspect import inspect_path
from msgindex.storage.message import MessageRecord
from msgindex.storage.repair import repair_store
from msgindex.storage.store import StoreSettings, open_store
from tests.storage.shard_model import KEY_POOL, TOPICS, ShardModel, make_record, model_lookup, table_rows

BASE = 1_700_000_000_000
SETTINGS = StoreSettings(hash_slot_num=7, index_num=700, segment_bytes=30_000, index_interval_bytes=300)
STRETCH = 500


@pytest.fixture(autouse=True)
def small_stretches(monkeypatch):
    """Stretches of 500 records, a key on 5 of them hot: KEY_POOL's keys get copies."""
    monkeypatch.setattr(hot_keys, "STRETCH_RECORDS", STRETCH)
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
    assert len(copies) == len(model.records) // STRETCH
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
