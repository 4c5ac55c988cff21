"""A straightforward in-memory model of a shard/store, and record generators, for the shard,
store, retention, model-based and crash-safety tests."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from msgindex.storage.message import MessageRecord, arrow_text
from msgindex.storage.store import StoreSettings

# Tiny files so that hash index files, segments and sparse index entries roll all the time.
TINY = StoreSettings(hash_slot_num=5, index_num=9, segment_bytes=700, index_interval_bytes=150)

# "Aa" and "BB" have the same Java String.hashCode, and so do "AaAa", "AaBB", "BBAa", "BBBB";
# with the same topic prefix the index keys collide too.
COLLIDING_KEYS = ["Aa", "BB", "AaAa", "AaBB", "BBAa", "BBBB"]
KEY_POOL = COLLIDING_KEYS + ["k1", "k2", "", "ключ", "🔑", "\udc80raw"]
# "Aa" and "BB" as topics make "Aa#k" and "BB#k" collide: the same key in two topics, one hash
TOPICS = ["orders", "Aa", "BB"]


def make_record(rng: random.Random, offset: int, *, base_ms: int = 1_700_000_000_000) -> MessageRecord:
    """A record with 0-3 keys from KEY_POOL (sometimes repeated) and a non-monotonic timestamp."""
    keys = tuple(rng.choice(KEY_POOL) for _ in range(rng.randint(0, 3)))
    return MessageRecord(
        topic=rng.choice(TOPICS),
        partition=rng.randint(0, 2),
        offset=offset,
        timestamp_ms=base_ms + rng.randint(0, 20_000),  # spans several seconds, in any order
        key=keys[0] if keys and rng.random() < 0.7 else None,
        keys=keys,
        commit_log_offset=rng.choice([-1, offset * 100]),
        size=rng.choice([-1, 123]),
    )


def make_batch(rng: random.Random, first_offset: int, size: int) -> list[MessageRecord]:
    return [make_record(rng, first_offset + i) for i in range(size)]


CRASH_BATCHES = 6


def crash_batches(seed: int) -> list[list[MessageRecord]]:
    """The batches every crash trial with `seed` writes (parent and child agree on them)."""
    rng = random.Random(seed)
    batches, offset = [], 0
    for _ in range(CRASH_BATCHES):
        size = rng.randint(5, 40)
        batches.append(make_batch(rng, offset, size))
        offset += size
    return batches


@dataclass
class ShardModel:
    """The committed records of one shard, in append (seq) order, and the source offsets it holds
    (the rule of storage/source_ranges.py, written out plainly)."""

    broker: str
    records: list[MessageRecord] = field(default_factory=list)
    committed: dict[tuple[str, int], list[tuple[int, int]]] = field(default_factory=dict)
    log_start_seq: int = 0

    def holds(self, topic: str, partition: int, offset: int) -> bool:
        return any(start <= offset < end for start, end in self.committed.get((topic, partition), ()))

    def append(self, records: list[MessageRecord]) -> int:
        """Append the records whose offsets are not held yet; returns how many."""
        fresh, seen = [], set()
        for record in records:
            position = (record.topic, record.partition, record.offset)
            if position not in seen and not self.holds(*position):
                fresh.append(record)
            seen.add(position)
        by_partition: dict[tuple[str, int], list[int]] = {}
        for record in records:
            by_partition.setdefault((record.topic, record.partition), []).append(record.offset)
        for source, offsets in by_partition.items():
            self._commit(source, min(offsets), max(offsets) + 1)
        self.records.extend(fresh)
        return len(fresh)

    def _commit(self, source: tuple[str, int], start: int, end: int) -> None:
        merged = []
        for low, high in sorted(self.committed.get(source, []) + [(start, end)]):
            if merged and low <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], high))
            else:
                merged.append((low, high))
        self.committed[source] = merged

    def ranges_json(self) -> dict:
        """The committed ranges in SourceRanges' JSON form."""
        out: dict = {}
        for (topic, partition), intervals in sorted(self.committed.items()):
            out.setdefault(topic, {})[str(partition)] = [list(i) for i in intervals]
        return out

    def rows(self) -> list[tuple[int, MessageRecord]]:
        return [(seq, r) for seq, r in enumerate(self.records) if seq >= self.log_start_seq]


def model_lookup(
    shards: Iterable[ShardModel],
    keys: list[str],
    *,
    topic: str | None = None,
    begin_ms: int | None = None,
    end_ms: int | None = None,
    partitions: Iterable[int] | None = None,
    max_results: int | None = None,
) -> list[tuple]:
    partitions = None if partitions is None else set(partitions)
    found = []
    for shard in shards:
        for seq, record in shard.rows():
            if topic is not None and record.topic != topic:
                continue
            if not set(keys) & set(record.keys):
                continue
            if begin_ms is not None and record.timestamp_ms < begin_ms:
                continue
            if end_ms is not None and record.timestamp_ms > end_ms:
                continue
            if partitions is not None and record.partition not in partitions:
                continue
            found.append(row_of(shard.broker, seq, record))
    found.sort(key=order_key)
    return found if max_results is None else found[:max_results]


def model_scan(
    shards: Iterable[ShardModel],
    *,
    begin_ms: int | None = None,
    end_ms: int | None = None,
    topics: Iterable[str] | None = None,
) -> list[tuple]:
    topics = None if topics is None else set(topics)
    found = []
    for shard in shards:
        for seq, record in shard.rows():
            if begin_ms is not None and record.timestamp_ms < begin_ms:
                continue
            if end_ms is not None and record.timestamp_ms > end_ms:
                continue
            if topics is not None and record.topic not in topics:
                continue
            found.append(row_of(shard.broker, seq, record))
    return found


def row_of(broker: str, seq: int, record: MessageRecord) -> tuple:
    """A result row as compared in tests (Arrow renders keys with arrow_text)."""
    return (
        record.timestamp_ms,
        broker,
        record.topic,
        record.partition,
        record.offset,
        seq,
        None if record.key is None else arrow_text(record.key),
        tuple(arrow_text(k) for k in record.keys),
        None if record.commit_log_offset == -1 else record.commit_log_offset,
        None if record.size == -1 else record.size,
    )


def order_key(row: tuple) -> tuple:
    return row[:6]


def table_rows(table: pa.Table | Iterable[pa.RecordBatch]) -> list[tuple]:
    """ROW_SCHEMA rows in the tuple shape of `row_of` (timestamps back to ms)."""
    batches = table.to_batches() if isinstance(table, pa.Table) else list(table)
    rows = []
    for batch in batches:
        data = batch.to_pydict()
        for i in range(batch.num_rows):
            ts = data["timestamp"][i]
            rows.append(
                (
                    _ms(ts),
                    data["broker"][i],
                    data["topic"][i],
                    data["partition"][i],
                    data["offset"][i],
                    data["seq"][i],
                    data["key"][i],
                    tuple(data["keys"][i]),
                    data["commit_log_offset"][i],
                    data["size"][i],
                )
            )
    return rows


def _ms(ts) -> int:
    # to_pydict gives datetime (or pandas Timestamp); go through the epoch in microseconds
    import datetime as _dt

    epoch = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
    delta = ts - epoch
    return (delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds) // 1000


def downgrade_to_version_1(checkpoint_file: Path, batch_id: int = 41) -> None:
    """Rewrite a shard checkpoint as msgindex before offsets wrote it: version 1, a batch id, no
    source ranges (with a valid checksum)."""
    import json
    import zlib

    body = json.loads(checkpoint_file.read_bytes())
    del body["crc32"], body["source_ranges"]
    body.update(version=1, batch_id=batch_id)
    canonical = lambda d: json.dumps(d, sort_keys=True, separators=(",", ":")).encode()  # noqa: E731
    body["crc32"] = zlib.crc32(canonical(body))
    checkpoint_file.write_bytes(canonical(body) + b"\n")


def shard_files(directory: Path) -> dict[str, bytes]:
    """Every file of a shard (relative path -> bytes), except the lock file."""
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != "lock"
    }
