"""Backfill (storage/backfill.py) on both kinds of store: fields indexed over records committed
before they existed are found exactly like fields indexed from the start, exactly once by
offsets, with coverage that grows only over what the shard holds and was evaluated."""

from __future__ import annotations

import random
import warnings

import pyarrow as pa
import pytest

from msgindex.errors import FieldCoverageWarning, InvalidOptionError, SourceMismatchError
from msgindex.storage.backfill import VALUES_SCHEMA, FieldBackfill
from msgindex.storage.fields import FieldDefinition
from msgindex.storage.message import MessageRecord
from msgindex.storage.query import Query
from msgindex.storage.source_ranges import SourceRanges
from tests.storage.kinds import committed_state, is_object_store, shard_contents
from tests.storage.shard_model import TINY

BASE = 1_700_000_000_000
ORDER = FieldDefinition("order", "expression", "get_json_object(CAST(value AS STRING), '$.order.id')", "single")
SKU = FieldDefinition("sku", "expression", "from_json(CAST(value AS STRING), 'struct<s:array<string>>').s", "array")
OTHER_ORDER = FieldDefinition("order", "expression", "get_json_object(CAST(value AS STRING), '$.id')", "single")


def _records(topic: str, offsets: range) -> list[MessageRecord]:
    """Two partitions' records in contiguous offset runs (partition = which hundred, odd or even)."""
    return [MessageRecord(topic, offset // 100 % 2, offset, BASE + offset, f"k{offset % 7}", (f"k{offset % 7}",))
            for offset in offsets]


def _values(records: list[MessageRecord], rng: random.Random) -> tuple[pa.Table, dict]:
    """Field values for `records` (some without a value) and the truth: (name, value) -> records."""
    rows, truth = [], {}
    for r in records:
        pairs = []
        if rng.random() < 0.8:
            pairs.append({"name": "order", "value": f"o-{rng.randrange(20)}"})
        pairs += [{"name": "sku", "value": s} for s in rng.sample(["a", "b", "k1", "o-3"], rng.randrange(3))]
        rows.append({"topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp_ms": r.timestamp_ms,
                     "fields": pairs or None})
        for pair in pairs:
            truth.setdefault((pair["name"], pair["value"]), set()).add((r.topic, r.partition, r.offset))
    return pa.Table.from_pylist(rows, schema=VALUES_SCHEMA), truth


def _found(table: pa.Table) -> set[tuple[str, int, int]]:
    return {(r["topic"], r["partition"], r["offset"]) for r in table.select(["topic", "partition", "offset"]).to_pylist()}


def _held(records: list[MessageRecord]) -> SourceRanges:
    from msgindex.storage.source_ranges import SourceRows

    return SourceRows.of([r.topic for r in records], [r.partition for r in records],
                         [r.offset for r in records]).ranges()


def _lookup(store, name: str, value: str) -> tuple[set, list]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = _found(store.lookup(Query.of(fields={name: [value]})))
    return found, [w for w in caught if issubclass(w.category, FieldCoverageWarning)]


def test_backfilled_fields_are_found_like_fields_indexed_from_the_start(stores):
    rng = random.Random(5)
    old = _records("orders", range(0, 300))
    new = _records("orders", range(300, 420))
    with stores.create(settings=TINY) as store:
        with store.writer("b0") as writer:
            for start in range(0, 300, 60):
                writer.append(old[start:start + 60])
        values, truth = _values(old, rng)
        new_values, new_truth = _values(new, rng)
        with store.writer("b0") as writer:  # the job with the new fields: from the next batch on
            table = pa.Table.from_pylist([{
                "topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp_ms": r.timestamp_ms,
                "key": r.key, "keys": list(r.keys), "commit_log_offset": r.commit_log_offset, "size": r.size,
                "fields": v["fields"]} for r, v in zip(new, new_values.to_pylist())])
            writer.append(table, fields=[ORDER, SKU])
        before = committed_state(store, "b0")
        found, warned = _lookup(store, "order", "o-3")
        assert found == new_truth.get(("order", "o-3"), set()) and warned  # old records: not covered, said so

        result = store.backfill("b0", FieldBackfill(values, (ORDER, SKU), _held(old)))
        assert result.changed and result.values_added == sum(len(v) for v in truth.values())
        assert committed_state(store, "b0") == before  # every record kept its sequence number
        for (name, value), want in {**truth, **{k: v for k, v in new_truth.items() if k not in truth}}.items():
            found, warned = _lookup(store, name, value)
            assert found == want | new_truth.get((name, value), set()), (name, value)
            assert not warned
        assert _found(store.lookup(["k1"])) == {(r.topic, r.partition, r.offset) for r in old + new if r.key == "k1"}
        assert sum(b.num_rows for b in store.scan()) == 420  # nothing twice, nothing lost

        again = store.backfill("b0", FieldBackfill(values, (ORDER, SKU), _held(old)))  # a retry: nothing twice
        assert not again.changed and committed_state(store, "b0") == before
        found, _ = _lookup(store, "order", "o-3")
        assert found == truth.get(("order", "o-3"), set()) | new_truth.get(("order", "o-3"), set())


def test_coverage_grows_only_over_what_the_shard_holds_and_was_evaluated(stores):
    rng = random.Random(6)
    records = _records("orders", range(0, 200))
    with stores.create(settings=TINY) as store:
        with store.writer("b0") as writer:
            writer.append(records)
        values, truth = _values(records, rng)
        evaluated = _held(records[100:]).union(_held(_records("orders", range(500, 600))))  # Kafka kept 100..; 500.. is not ours
        store.backfill("b0", FieldBackfill(values, (ORDER,), evaluated))
        with store.reader("b0") as reader:  # offsets the shard does not hold are never covered
            assert reader.field_coverage.get("order").ranges == _held(records[100:])
        found, warned = _lookup(store, "order", "o-3")
        want = {t for t in truth.get(("order", "o-3"), set()) if t[2] >= 100}
        assert found == want
        assert len(warned) == 1 and "field 'order' does not cover orders-0 offsets [0, 100) (" in str(warned[0].message)
        found, _ = _lookup(store, "sku", "a")  # not in the backfill's definitions: not indexed
        assert found == set()


def test_a_field_redefined_is_refused_and_nothing_changes(stores):
    records = _records("orders", range(0, 50))
    with stores.create(settings=TINY) as store:
        with store.writer("b0") as writer:
            writer.append(records)
        values, _ = _values(records, random.Random(7))
        store.backfill("b0", FieldBackfill(values, (ORDER,), _held(records)))
        before = shard_contents(store, "b0")
        with pytest.raises(InvalidOptionError, match="order"):
            store.backfill("b0", FieldBackfill(values, (OTHER_ORDER,), _held(records)))
        assert shard_contents(store, "b0") == before


def test_backfill_after_retention_keeps_the_retained_records_sequence_numbers(stores):
    records = _records("orders", range(0, 400))
    with stores.create(settings=TINY) as store:
        with store.writer("b0") as writer:
            for start in range(0, 400, 50):
                writer.append(records[start:start + 50])
        store.apply_retention(max_bytes=1)
        start, end = committed_state(store, "b0")
        assert start > 0
        values, truth = _values(records, random.Random(8))
        store.backfill("b0", FieldBackfill(values, (ORDER,), _held(records)))
        assert committed_state(store, "b0") == (start, end)
        kept = {(r["topic"], r["partition"], r["offset"]) for b in store.scan() for r in b.to_pylist()}
        found, _ = _lookup(store, "order", "o-4")
        assert found == truth.get(("order", "o-4"), set()) & kept
        if not is_object_store(store):
            assert not any(p.name.startswith("backfill") for p in (store.root / "broker=b0").iterdir())



@pytest.mark.parametrize("race", ["append", "append and compact"])
def test_a_version_lost_to_a_racing_append_is_redone_on_the_newest(stores, monkeypatch, race):
    if stores.is_local:
        pytest.skip("object stores only: a local backfill holds the shard's lock, nothing races it")
    from msgindex.storage.objects.shard import ObjectShardWriter

    rng = random.Random(9)
    old, new = _records("orders", range(0, 300)), _records("orders", range(300, 360))
    values, truth = _values(old, rng)
    new_values, new_truth = _values(new, rng)
    racing = pa.Table.from_pylist([{
        "topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp_ms": r.timestamp_ms, "key": r.key,
        "keys": list(r.keys), "commit_log_offset": r.commit_log_offset, "size": r.size, "fields": v["fields"]}
        for r, v in zip(new, new_values.to_pylist())])
    with stores.create(settings=TINY) as store:
        with store.writer("b0") as writer:
            for start in range(0, 300, 60):
                writer.append(old[start:start + 60])
        commit, raced = ObjectShardWriter._commit, {}

        def racing_commit(self, candidate):  # before the backfill's first version, a job with the fields commits
            if raced:
                return commit(self, candidate)
            raced["chunk"] = None
            with store.writer("b0") as other:
                other.append(racing, fields=[ORDER, SKU])
                raced["chunk"] = other.state.chunks[-1]
                if race == "append and compact":  # ... and compaction merges away every chunk the backfill rewrote
                    assert other.compact(everything=True) == 5
            raced["won"] = commit(self, candidate)
            return raced["won"]

        monkeypatch.setattr(ObjectShardWriter, "_commit", racing_commit)
        result = store.backfill("b0", FieldBackfill(values, (ORDER, SKU), _held(old)))
        monkeypatch.undo()
        assert raced["won"] is False
        assert result.values_added == sum(len(v) for v in truth.values())
        assert committed_state(store, "b0") == (0, 360)
        version = store.reader("b0").version
        if race == "append":  # the racing append's chunk stays as it committed it
            assert version.chunks[-1] == raced["chunk"]
        # every chunk object is listed or removed by the newest version: a rewrite of a chunk the race
        # compacted away was deleted, not left behind
        names = {ref.name for ref in version.chunks} | {r.name for r in version.removed}
        prefix = f"{store.shard_prefix('b0')}/"
        assert {info.key.removeprefix(prefix) for info in store.client.list(f"{prefix}chunks/")} <= names
        for name, value in set(truth) | set(new_truth):
            table = store.lookup(Query.of(fields={name: [value]}))
            want = truth.get((name, value), set()) | new_truth.get((name, value), set())
            assert _found(table) == want and table.num_rows == len(want), (name, value)  # each found once
            assert not _lookup(store, name, value)[1]  # covered: no warning
        assert sum(b.num_rows for b in store.scan()) == 360
        assert _found(store.lookup(["k1"])) == {(r.topic, r.partition, r.offset) for r in old + new if r.key == "k1"}


def test_a_swap_interrupted_midway_is_finished_by_the_next_writer(tmp_path, monkeypatch):
    from msgindex.storage import shard as shard_module
    from msgindex.storage.store import open_store

    records = _records("orders", range(0, 200))
    with open_store(tmp_path / "s", create=True, settings=TINY) as store:
        with store.writer("b0") as writer:
            writer.append(records)
        values, truth = _values(records, random.Random(9))
        renames = []
        real_rename = shard_module.os.rename

        def crash_on_second(source, target):
            renames.append(source)
            if len(renames) == 2:  # log/ moved aside, the rebuilt log/ not yet in its place
                raise OSError("killed")
            real_rename(source, target)

        monkeypatch.setattr(shard_module.os, "rename", crash_on_second)
        with pytest.raises(OSError, match="killed"):
            store.backfill("b0", FieldBackfill(values, (ORDER,), _held(records)))
        monkeypatch.setattr(shard_module.os, "rename", real_rename)
        assert (tmp_path / "s" / "broker=b0" / "backfill").is_file()
        with store.writer("b0") as writer:  # the next writer finishes the swap from the marker
            writer.append(_records("orders", range(200, 210)))
        assert not (tmp_path / "s" / "broker=b0" / "backfill").exists()
        found, _ = _lookup(store, "order", "o-2")
        assert found == truth.get(("order", "o-2"), set())
        assert sum(b.num_rows for b in store.scan()) == 210


def test_records_kafka_holds_otherwise_than_the_index_are_refused_and_nothing_changes(stores):
    """A topic deleted and created again holds other records at the same offsets: their values
    must never become old records' terms (a timestamp that differs tells them apart)."""
    records = _records("orders", range(0, 60))
    with stores.create(settings=TINY) as store:
        with store.writer("b0") as writer:
            writer.append(records)
        values, _ = _values(records, random.Random(10))
        stamps = values.column("timestamp_ms").to_numpy().copy()
        stamps[17] += 1
        values = values.set_column(values.schema.get_field_index("timestamp_ms"), "timestamp_ms", pa.array(stamps))
        before = shard_contents(store, "b0")
        with pytest.raises(SourceMismatchError, match="orders-0 offset 17: Kafka holds a record of"):
            store.backfill("b0", FieldBackfill(values, (ORDER,), _held(records)))
        assert shard_contents(store, "b0") == before
        if not is_object_store(store):
            assert not (store.root / "broker=b0" / "backfill.new").exists()


def test_a_field_no_record_has_grows_its_coverage_without_a_rewrite(stores):
    records = _records("orders", range(0, 80))
    with stores.create(settings=TINY) as store:
        with store.writer("b0") as writer:
            writer.append(records)
        before = {name: size for name, size in shard_contents(store, "b0").items() if "checkpoint" not in str(name)
                  and "versions" not in str(name) and "_shards" not in str(name)}
        empty = pa.Table.from_pylist([{"topic": r.topic, "partition": r.partition, "offset": r.offset,
                                       "timestamp_ms": r.timestamp_ms, "fields": None} for r in records],
                                     schema=VALUES_SCHEMA)
        result = store.backfill("b0", FieldBackfill(empty, (SKU,), _held(records)))
        assert result.changed and result.records_rewritten == 0
        after = {name: size for name, size in shard_contents(store, "b0").items() if name in before}
        assert after == before  # no log, index or chunk rewritten
        found, warned = _lookup(store, "sku", "a")
        assert found == set() and not warned  # covered: no record has a value
