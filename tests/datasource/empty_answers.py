"""Reads whose right answer is empty, on every kind of path ``format("msgindex")`` reads: a msgindex
store, a RocketMQ broker's store root (``mode=rocketmq``, verified) and a bare directory of RocketMQ
index files (raw entries). Three ways to find nothing: a key nobody used, a window that ends just
before (or starts just after) a message of the key, and a key of another topic whose ``topic#key``
hashes like an indexed one (the index has entries for it; verification must drop them all).

A case is plain JSON (path, options, an optional ``where``) so that the same cases run in the
shared SparkSession, through Spark Connect (``tests/connect/client.py``) and, where the CLI can say
them, through ``msgindex lookup``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from msgindex.storage.hash_index.java_hash import index_hash
from msgindex.storage.message import index_key

_FIRST = ord("A")  # the colliding key is written in 'A'..'_' (31 letters: one per base-31 digit)
_JAVA_INT = 1 << 32


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units), as an unsigned 32-bit value."""
    value = 0
    raw = text.encode("utf-16-be")
    for at in range(0, len(raw), 2):
        value = (value * 31 + int.from_bytes(raw[at : at + 2], "big")) % _JAVA_INT
    return value


def colliding_key(topic: str, indexed_topic: str, indexed_key: str, length: int = 7) -> str:
    """A key K of `length` letters such that ``topic#K`` has the Java hash of
    ``indexed_topic#indexed_key``: RocketMQ's index finds the indexed key's entries for it."""
    assert 31 ** length >= _JAVA_INT, "too short to reach every hash"
    target = java_string_hash(index_key(indexed_topic, indexed_key))
    prefix = java_string_hash(f"{topic}#")
    # hash(prefix + K) = hash(prefix) * 31^len(K) + hash(K); the letters add _FIRST per position
    want = (target - prefix * pow(31, length, _JAVA_INT) - sum(_FIRST * 31 ** i for i in range(length))) % _JAVA_INT
    digits = []
    for _ in range(length):
        want, digit = divmod(want, 31)
        digits.append(chr(_FIRST + digit))
    key = "".join(reversed(digits))
    assert index_hash(index_key(topic, key)) == index_hash(index_key(indexed_topic, indexed_key)), key
    assert key != indexed_key
    return key


@dataclass(frozen=True)
class EmptyRead:
    """One read that must find nothing: ``spark.read.format("msgindex")`` with `options` on `path`,
    then `where` (a SQL condition) if given."""

    name: str
    path: str
    options: dict[str, str]
    where: str | None = None
    cli: list[str] = field(default_factory=list)  # `msgindex lookup` arguments after PATH; [] = no CLI form

    def to_json(self) -> dict:
        return asdict(self)


def isolated(messages, candidate_keys, all_keys, stamp_of, gap_ms: int = 1000) -> tuple[str, int, object]:
    """(key, timestamp ms, message): a message and one of its `candidate_keys` that no other message
    carrying that key (by `all_keys`) comes within `gap_ms` of."""
    stamps: dict[str, list[int]] = {}
    for message in messages:
        for key in all_keys(message):
            stamps.setdefault(key, []).append(stamp_of(message))
    for message in messages:
        stamp = stamp_of(message)
        for key in sorted(candidate_keys(message)):
            near = [other for other in stamps[key] if abs(other - stamp) <= gap_ms]
            if len(near) == 1:
                return key, stamp, message
    raise AssertionError("no message is alone with its key for a second")


def _window_cases(prefix: str, path: str, base: dict[str, str], key: str, topic: str, stamp: int,
                  cli_base: list[str]) -> list[EmptyRead]:
    """The window just before and just after `stamp`, the key's only message (same second: the
    index's whole-second times cannot tell, the verified read must)."""
    cases = []
    for side, (begin, end) in (("before", (stamp - 500, stamp - 1)), ("after", (stamp + 1, stamp + 500))):
        cases.append(EmptyRead(f"{prefix}_window_{side}_options", path,
                               {**base, "key": key, "topic": topic, "begin": str(begin), "end": str(end)},
                               cli=[*cli_base, "--key", key, "--topic", topic, "--begin", str(begin), "--end", str(end)]))
        cases.append(EmptyRead(f"{prefix}_window_{side}_where", path, base,
                               where=f"key = '{key}' AND topic = '{topic}' AND timestamp >= timestamp_millis({begin}) "
                                     f"AND timestamp <= timestamp_millis({end})"))
    return cases


def store_cases(path: str, rows) -> list[EmptyRead]:
    """On a msgindex store (tests/datasource/conftest.py's ``Truth.rows``: (broker, MessageRecord))."""
    key, stamp, (_, record) = isolated(rows, lambda row: {row[1].key} - {None}, lambda row: set(row[1].keys),
                                       lambda row: row[1].timestamp_ms)
    other_topic = next(topic for _, r in rows for topic in [r.topic] if topic != record.topic)
    collision = colliding_key(other_topic, record.topic, key)
    cases = [
        EmptyRead("store_absent_options", path, {"key": "no-such-key"}, cli=["--key", "no-such-key"]),
        EmptyRead("store_absent_where", path, {}, where="key = 'no-such-key'"),
        EmptyRead("store_absent_topic_where", path, {}, where="key = 'no-such-key' AND topic = 'orders'"),
        EmptyRead("store_collision_options", path, {"key": collision, "topic": other_topic},
                  cli=["--key", collision, "--topic", other_topic]),
        EmptyRead("store_collision_where", path, {}, where=f"key = '{collision}' AND topic = '{other_topic}'"),
        # (fetchValues with nothing found: load() checks the broker first, in 5 s, so an empty answer
        # with fetchValues needs a live one; test_fetch_values.py covers a broker that does not answer)
    ]
    return cases + _window_cases("store", path, {}, key, record.topic, stamp, [])


def rocketmq_root_cases(dataset, hash_slot_num: int, index_num: int) -> list[EmptyRead]:
    """On a real broker's store root (tests/rocketmq/dataset.py's ``BrokerDataset``)."""
    path = str(dataset.store_root)
    base = {"mode": "rocketmq", "hashSlotNum": str(hash_slot_num), "indexNum": str(index_num)}
    cli_base = ["--mode", "rocketmq", "--hash-slot-num", str(hash_slot_num), "--index-num", str(index_num)]
    # `where key = ...` is about the first KEYS token
    first, stamp, message = isolated(dataset.messages, lambda m: set(m.tokens[:1]), lambda m: m.keys,
                                     lambda m: m.store_timestamp)
    other_topic = next(m.topic for m in dataset.messages if m.topic != message.topic)
    collision = colliding_key(other_topic, message.topic, first)
    cases = [
        EmptyRead("rocketmq_absent_options", path, {**base, "key": "no-such-key", "topic": message.topic},
                  cli=[*cli_base, "--key", "no-such-key", "--topic", message.topic]),
        EmptyRead("rocketmq_absent_where", path, base, where=f"key = 'no-such-key' AND topic = '{message.topic}'"),
        EmptyRead("rocketmq_absent_scan_where", path, base, where="key = 'no-such-key'"),
        EmptyRead("rocketmq_collision_options", path, {**base, "key": collision, "topic": other_topic},
                  cli=[*cli_base, "--key", collision, "--topic", other_topic]),
        EmptyRead("rocketmq_collision_where", path, base, where=f"key = '{collision}' AND topic = '{other_topic}'"),
        EmptyRead("rocketmq_collision_values_options", path, {**base, "key": collision, "topic": other_topic,
                                                              "fetchValues": "true"}),
        EmptyRead("rocketmq_empty_scan_window", path, {**base, "begin": "1000", "end": "2000"},
                  cli=[*cli_base, "--scan", "--begin", "1000", "--end", "2000"]),
    ]
    return cases + _window_cases("rocketmq", path, base, first, message.topic, stamp, cli_base)


def index_directory_cases(path: str, hash_slot_num: int, index_num: int, first_ms: int) -> list[EmptyRead]:
    """On a bare directory of index files (raw, unverified entries: a colliding key is found by
    design, so only an absent key and windows outside every entry)."""
    base = {"mode": "rocketmq", "hashSlotNum": str(hash_slot_num), "indexNum": str(index_num)}
    return [
        EmptyRead("index_dir_absent_options", path, {**base, "key": "no-such-key", "topic": "orders"}),
        EmptyRead("index_dir_window_options", path, {**base, "begin": str(first_ms - 60_000),
                                                     "end": str(first_ms - 30_000)}),
        EmptyRead("index_dir_key_window_options", path, {**base, "key": "Aa", "topic": "orders",
                                                         "begin": str(first_ms - 60_000), "end": str(first_ms - 1_000)}),
    ]


def count_rows(spark, case: dict) -> int:
    """Rows of one case's read (a dict from ``EmptyRead.to_json``) in `spark` (local or Connect)."""
    reader = spark.read.format("msgindex")
    for name, value in case["options"].items():
        reader = reader.option(name, value)
    frame = reader.load(case["path"])
    if case["where"]:
        frame = frame.where(case["where"])
    return len(frame.collect())
