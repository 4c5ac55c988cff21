"""A store with known contents (the ground truth), built once per test session.

It is made to be hard: Java hash collisions ("Aa"/"BB" and longer sequences of them, so
``orders#Aa`` and ``orders#BB`` share one hash), the same key in several topics, keys with
commas and non-ASCII, messages without a primary key, many keys per message, non-monotonic
timestamps, and tiny StoreSettings so that every shard rolls many hash index files and log
segments. Boundary records sit at begin-1, begin, end and end+1 ms of ``WINDOW``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from msgindex.storage.fields import FieldDefinition
from msgindex.storage.hash_index.index_file import IndexFile, index_file_name
from msgindex.storage.message import MessageRecord
from msgindex.storage.store import StoreSettings, open_store

BASE_MS = 1_763_700_000_000  # 2025-11-21T04:40:00Z
SPAN_MS = 10 * 60 * 1000
TOPICS = ("orders", "payments", "audit")
BROKERS = ("broker-a", "broker-b", "broker-c")
COLLIDING = ("Aa", "BB", "AaAa", "AaBB", "BBAa", "BBBB")  # one Java hash per length
SPECIAL = ("with,comma", "ключ-ünï", "emoji-\U0001F389", "quote\"d")
KEY_POOL = COLLIDING + SPECIAL + tuple(f"user-{i}" for i in range(40))
EDGE_KEY = "edge"
WINDOW = (BASE_MS + 200_000, BASE_MS + 260_000)  # inclusive, ms
RECORDS_PER_BROKER_BATCH = 150
SETTINGS = StoreSettings(hash_slot_num=64, index_num=200, segment_bytes=4096, index_interval_bytes=256)


@dataclass(frozen=True)
class Truth:
    """The store's path and every record in it, with its broker."""

    path: Path
    rows: tuple[tuple[str, MessageRecord], ...]

    def select(self, keys=None, topics=None, begin=None, end=None, brokers=None, partitions=None,
               primary=None) -> set[tuple[str, str, int, int]]:
        """(broker, topic, partition, offset) of the records matching, computed naively."""
        found = set()
        for broker, r in self.rows:
            if keys is not None and not set(keys) & set(r.keys):
                continue
            if primary is not None and r.key not in primary:
                continue
            if topics is not None and r.topic not in topics:
                continue
            if brokers is not None and broker not in brokers:
                continue
            if partitions is not None and r.partition not in partitions:
                continue
            if begin is not None and r.timestamp_ms < begin:
                continue
            if end is not None and r.timestamp_ms > end:
                continue
            found.add((broker, r.topic, r.partition, r.offset))
        return found


def generate_records(seed: int = 5, count: int = 2400) -> list[tuple[str, MessageRecord]]:
    """Deterministic records spread over BROKERS, with the edge records of WINDOW appended."""
    rng = random.Random(seed)
    next_offset: dict[tuple[str, int], int] = {}
    rows = []

    def record(topic: str, partition: int, ts: int, key: str | None, keys: tuple[str, ...]) -> MessageRecord:
        offset = next_offset.get((topic, partition), 0)
        next_offset[(topic, partition)] = offset + 1
        return MessageRecord(topic, partition, offset, ts, key, keys, commit_log_offset=offset * 100, size=100)

    for i in range(count):
        topic = rng.choice(TOPICS)
        partition = rng.randrange(3)
        # rising like real traffic, but not monotonic (producers' clocks, many partitions)
        ts = BASE_MS + i * SPAN_MS // count + rng.randrange(-3000, 3000)
        key = None if rng.random() < 0.1 else rng.choice(KEY_POOL)
        extra = rng.sample(KEY_POOL, rng.randrange(3))
        keys = tuple(dict.fromkeys(([key] if key is not None else []) + extra)) or (rng.choice(KEY_POOL),)
        rows.append((rng.choice(BROKERS), record(topic, partition, ts, key, keys)))
    begin, end = WINDOW
    for i, ts in enumerate((begin - 1, begin, end, end + 1)):
        rows.append((BROKERS[i % len(BROKERS)], record("orders", 0, ts, EDGE_KEY, (EDGE_KEY,))))
    return rows


def build_store(path: Path | str, rows: list[tuple[str, MessageRecord]], settings: StoreSettings = SETTINGS,
                storage_options: dict[str, str] | None = None) -> None:
    """Append `rows` shard by shard in batches, as the pipeline would (`path` may be an s3:// URL)."""
    with open_store(path, create=True, settings=settings, storage_options=storage_options) as store:
        for broker in BROKERS:
            records = [r for b, r in rows if b == broker]
            with store.writer(broker) as writer:
                for start in range(0, len(records), RECORDS_PER_BROKER_BATCH):
                    writer.append(records[start : start + RECORDS_PER_BROKER_BATCH])


# (partition, offset) -> (key, value, headers as sent) of what `kafka_backed_store` produced
SentRecords = dict[tuple[int, int], tuple[str, bytes, list[tuple[str, bytes]]]]
GONE_OFFSET = 1_000_000  # a message the index holds and Kafka no longer has (retention)


def kafka_backed_store(bootstrap: str, topic: str, path: Path | str, count: int = 40,
                       storage_options: dict[str, str] | None = None) -> SentRecords:
    """Produce `count` records with values and headers to `topic` (keys cust-0..3, each also under
    order-<i>) and index them into a new store at `path` (an s3:// URL too), plus one cust-1
    message at GONE_OFFSET that Kafka does not have: what fetchValues reads back."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)
    sent: SentRecords = {}
    records = []
    for i in range(count):
        key = f"cust-{i % 4}"
        value = f"payload-{i}".encode() * (1 + i % 3)
        headers = [("KEYS", f"order-{i}".encode()), ("trace", bytes([i, 0, 255]))]
        meta = producer.send(topic, key=key.encode(), value=value, headers=headers).get(timeout=30)
        sent[(meta.partition, meta.offset)] = (key, value, headers)
        records.append(MessageRecord(topic, meta.partition, meta.offset, meta.timestamp, key, (key, f"order-{i}")))
    producer.close()
    records.append(MessageRecord(topic, 0, GONE_OFFSET, records[0].timestamp_ms, "cust-1", ("cust-1",)))
    with open_store(path, create=True, storage_options=storage_options) as store, store.writer("b0") as writer:
        writer.append(records)
    return sent


def rows_of_json(rows: list[list]) -> list[tuple]:
    """fetchValues rows printed as JSON by a session of its own (plain_session.value_rows) as
    (partition, offset, value, [(header key, value)])."""
    return [(partition, offset, None if value is None else bytes.fromhex(value),
             None if headers is None else [(name, bytes.fromhex(raw)) for name, raw in headers])
            for partition, offset, value, headers in rows]


def assert_fetched(rows: list, sent: SentRecords, key: str) -> None:
    """(partition, offset, value, [(header key, value)]) rows of a fetchValues read of `key`: each
    message sent with the key once, with its value and headers, and the message Kafka no longer
    has with null ones."""
    expected = {po: v for po, v in sent.items() if v[0] == key}
    assert len(rows) == len(expected) + 1
    for partition, offset, value, headers in rows:
        if offset == GONE_OFFSET:
            assert value is None and headers is None
            continue
        _, sent_value, sent_headers = expected.pop((partition, offset))
        assert bytes(value) == sent_value
        assert [(name, bytes(raw)) for name, raw in headers] == sent_headers
    assert not expected


@pytest.fixture(scope="session")
def spark(spark):
    """The shared session with ``where`` pushdown enabled (``enable_pushdown`` registers the
    pushdown source through the API). The source Spark finds on its own is tested in sessions
    of their own (``spark.newSession()`` does not inherit the registration)."""
    from msgindex.spark import enable_pushdown

    enable_pushdown(spark)
    return spark


@pytest.fixture(scope="session")
def truth(tmp_path_factory) -> Truth:
    rows = generate_records()
    path = tmp_path_factory.mktemp("datasource") / "store"
    build_store(path, rows)
    return Truth(path, tuple(rows))


# A store with fields (storage/fields.py): what the field reads and field columns are tested on.
FIELD_BASE_MS = 1_763_700_000_000
ORDER_FIELD = FieldDefinition("order", "expression", "get_json_object(CAST(value AS STRING), '$.order')", "single")
TRACE_FIELD = FieldDefinition("trace", "header", "trace", "array")
FIELD_BROKERS = ("b0", "b1", "b2")
FIELDS_FROM = {"b2": 100}  # offsets of b2 below this were indexed before its fields existed


def build_field_store(path: Path | str, storage_options: dict[str, str] | None = None) -> list[tuple[str, MessageRecord]]:
    """A store whose records carry field ``order`` (one value, a record) and ``trace`` (0-2
    values): two topics, keys that look like order values, b2's first records indexed without
    fields (as before a job declared them). Returns the (broker, record) pairs it indexed."""
    rng = random.Random(5)
    written = []
    with open_store(path, create=True, storage_options=storage_options) as store:
        for number, broker in enumerate(FIELD_BROKERS):
            since = FIELDS_FROM.get(broker, 0)
            records = []
            for offset in range(400):
                topic = rng.choice(["orders", "refunds"])
                fields = (("order", f"o-{rng.randrange(20)}"),) + tuple(
                    ("trace", f"t-{rng.randrange(9)}") for _ in range(rng.randrange(3)))
                key = rng.choice(["o-1", f"k{offset}", None])
                records.append(MessageRecord(topic, number, offset, FIELD_BASE_MS + offset, key,
                                             () if key is None else (key,), fields=fields if offset >= since else ()))
            with store.writer(broker) as writer:
                if since:
                    writer.append(records[:since])
                writer.append(records[since:], fields=[ORDER_FIELD, TRACE_FIELD])
            written += [(broker, r) for r in records]
    return written


@pytest.fixture(scope="session")
def field_store(tmp_path_factory) -> tuple[Path, list[tuple[str, MessageRecord]]]:
    path = tmp_path_factory.mktemp("fields") / "index"
    return path, build_field_store(path)


# a bare directory of RocketMQ index files (mode=rocketmq without a commit log)
INDEX_DIR_SLOTS, INDEX_DIR_ENTRIES = 32, 60
INDEX_DIR_T0 = 1_763_700_000_000


@pytest.fixture(scope="session")
def rocketmq_dir(tmp_path_factory):
    """Two full-ish files as a broker would roll them; returns (dir, puts) where puts are
    (file name, entry number, full key, phy offset, store timestamp)."""
    folder = tmp_path_factory.mktemp("rocketmq") / "index"
    folder.mkdir()
    rng = random.Random(7)
    keys = ["orders#Aa", "orders#BB", "payments#Aa"] + [f"orders#k{i}" for i in range(30)]
    puts, phy, ts = [], 0, INDEX_DIR_T0
    index, name = None, None
    for _ in range(100):
        if index is None or index.is_full:
            end_phy, end_ts = (index.end_phy_offset, index.end_timestamp) if index else (0, 0)
            if index:
                index.close()
            name = index_file_name(ts, utc=True)
            index = IndexFile.create(folder / name, INDEX_DIR_SLOTS, INDEX_DIR_ENTRIES, end_phy, end_ts)
        key = rng.choice(keys)
        phy += rng.randrange(100, 500)
        ts += rng.randrange(0, 4000)
        entry = index.index_count
        assert index.put_key(key, phy, ts)
        puts.append((name, entry, key, phy, ts))
    index.close()
    (folder / "not-an-index.txt").write_text("ignored")
    return folder, puts
