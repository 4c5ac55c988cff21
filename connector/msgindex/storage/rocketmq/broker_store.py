"""A RocketMQ broker's store root queried like ``IndexService.queryOffset``, but verified, exact
to the millisecond and uncapped.

A store root is the broker's ``storePathRootDir``: the directory that holds ``commitlog/`` and
``index/``. A key lookup walks every index file (newest first, skipping files whose time range
misses the window) for the hashes of ``topic#key``, then reads each candidate from the commit log
and keeps it only when the message really is in that topic, really carries the key (``KEYS``
tokens or ``UNIQ_KEY``, see ``message_keys``) and its STORETIMESTAMP is in the window. So, unlike
the broker, a lookup returns no hash collisions (other keys, other topics), loses nothing to the
index's whole-second times and has no 64-message cap.

Why the window can be applied to the index first: an entry's time is its file's beginTimestamp
plus whole seconds, at most 999 ms before the message's real store time, so entries earlier than
``begin - 999`` cannot match. The one exception is a file's first entry, whose diff the broker
computed against the begin time the file inherited from the previous one before replacing it
(see ``index_file.put_key``): that entry's time can be later than the message's, so it is never
dropped by the window's end. Skipping whole files and bounding time scans by index headers relies
on store timestamps being non-decreasing in commit-log order, which the broker guarantees by
taking them under its put lock (``CommitLog.asyncPutMessage``).

Results are ordered like msgindex store lookups: (timestamp, broker, topic, partition, offset);
``max_results`` keeps the first ones in that order.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from msgindex.errors import CorruptFileError, InvalidArgumentError, InvalidOptionError, StoreNotFoundError
from msgindex.storage.hash_index.index_file import (
    DEFAULT_HASH_SLOT_NUM,
    DEFAULT_INDEX_NUM,
    FIRST_INDEX,
    TIME_DIFF_UNIT_MS,
    IndexFile,
)
from msgindex.storage.hash_index.java_hash import index_hash, index_hashes
from msgindex.storage.message import index_key
from msgindex.storage.query import KeysArg, Query, as_query
from msgindex.storage.rocketmq.commit_log import COMMIT_LOG_DIR, CommitLog, RecordKind, StoredMessage
from msgindex.storage.rocketmq.index_files import INDEX_DIR, IndexFileSet
from msgindex.times import TimeArg

MICROS_PER_MS = 1000
# an index entry's time is at most this much earlier than the message's store time
INDEX_TIME_SLACK_MS = TIME_DIFF_UNIT_MS - 1
SCAN_BATCH_ROWS = 8192
SCALAR_WALK_MAX_KEYS = 16  # up to this many hashes, chains are walked one by one (see _walk_chains)

# Rows of a verified lookup or scan (``spark.read.format("msgindex").option("mode", "rocketmq")``
# on a store root). `key` is the message's first KEYS token (its own key by RocketMQ convention),
# `keys` every key it is found under (distinct KEYS tokens, then UNIQ_KEY).
ROCKETMQ_ROW_SCHEMA = pa.schema([
    pa.field("broker", pa.string(), nullable=False),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),      # queue id
    pa.field("offset", pa.int64(), nullable=False),         # queue offset
    pa.field("key", pa.string(), nullable=True),
    pa.field("keys", pa.list_(pa.field("element", pa.string(), nullable=False)), nullable=False),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),  # STORETIMESTAMP, ms
    pa.field("commit_log_offset", pa.int64(), nullable=False),
    pa.field("size", pa.int32(), nullable=False),
    pa.field("verified", pa.bool_(), nullable=False),       # always true: read from the commit log
])
# with fetch_values: the body as the producer sent it, and every property (tags, user properties)
ROCKETMQ_VALUE_FIELDS = [
    pa.field("value", pa.binary(), nullable=True),
    pa.field("properties", pa.map_(pa.string(), pa.string()), nullable=False),
]
ROCKETMQ_VALUE_SCHEMA = pa.schema(list(ROCKETMQ_ROW_SCHEMA) + ROCKETMQ_VALUE_FIELDS)


_ROW_STRUCTS = {False: pa.struct(list(ROCKETMQ_ROW_SCHEMA)), True: pa.struct(list(ROCKETMQ_VALUE_SCHEMA))}


def row_schema(fetch_values: bool) -> pa.Schema:
    """The schema of verified rows, with or without values."""
    return ROCKETMQ_VALUE_SCHEMA if fetch_values else ROCKETMQ_ROW_SCHEMA


def is_broker_store(path: str | os.PathLike) -> bool:
    """True when `path` is a broker's store root (it holds ``commitlog/`` and ``index/``)."""
    root = Path(path)
    return (root / COMMIT_LOG_DIR).is_dir() and (root / INDEX_DIR).is_dir()


def open_rocketmq(store_root: str | os.PathLike, *, hash_slot_num: int = DEFAULT_HASH_SLOT_NUM,
                  index_num: int = DEFAULT_INDEX_NUM, broker_name: str | None = None) -> RocketMQBrokerStore:
    """Open a RocketMQ broker's store root for verified lookups and scans (read-only; the broker
    may keep running). `hash_slot_num` / `index_num`: the broker's maxHashSlotNum / maxIndexNum;
    `broker_name` (the rows' ``broker``) defaults to the store directory's name."""
    return RocketMQBrokerStore(store_root, hash_slot_num=hash_slot_num, index_num=index_num, broker_name=broker_name)


class RocketMQBrokerStore:
    """A broker's commit log and index files, read in place (see the module docstring)."""

    def __init__(self, store_root: str | os.PathLike, *, hash_slot_num: int = DEFAULT_HASH_SLOT_NUM,
                 index_num: int = DEFAULT_INDEX_NUM, broker_name: str | None = None) -> None:
        self.root = Path(store_root)
        if not is_broker_store(self.root):
            what = "does not exist" if not self.root.exists() else f"has no {COMMIT_LOG_DIR}/ and {INDEX_DIR}/ directories"
            raise StoreNotFoundError(f"{self.root}: not a RocketMQ broker store root (it {what})")
        self.broker_name = broker_name or self.root.resolve().name
        self.index_set = IndexFileSet(self.root / INDEX_DIR, hash_slot_num, index_num)
        self.commit_log = CommitLog(self.root / COMMIT_LOG_DIR)
        self._index_files: dict[Path, IndexFile] = {}  # oldest first
        self._index_version: int | None = None

    # ----------------------------------------------------------------- index files
    def index_files(self) -> list[IndexFile]:
        """The index files now on disk, oldest first. The broker adds and deletes files while it
        runs, and either changes the directory's mtime, so the directory is listed again (and new
        files' sizes checked) only when that changed; files stay mapped while present."""
        try:
            version = os.stat(self.index_set.directory).st_mtime_ns
        except FileNotFoundError:
            version = None
        if version is None or version != self._index_version:
            paths = self.index_set.paths(allow_empty=True)
            for gone in set(self._index_files) - set(paths):
                self._index_files.pop(gone).close()
            self._index_files = {path: self._index_files.get(path) or self.index_set.open(path) for path in paths}
            self._index_version = version
        return list(self._index_files.values())

    # ----------------------------------------------------------------- lookups
    def lookup(self, keys: KeysArg | Query, *, topic: str | Iterable[str] | None = None, begin: TimeArg | None = None,
               end: TimeArg | None = None, begin_ms: int | None = None, end_ms: int | None = None,
               max_results: int | None = None, partitions: Iterable[int] | None = None,
               fetch_values: bool = False) -> pa.Table:
        """Messages of `topic` (one or several) found under any of `keys`, each verified against
        the commit log, in the inclusive window [begin, end] of store time (as people type times,
        ``msgindex.times``; or [begin_ms, end_ms] in epoch ms), as rows of
        ``row_schema(fetch_values)`` ordered by (timestamp, topic, partition, offset). A
        ``Query`` (with topics: the index hashes topic + '#' + key) may stand for the keys and
        every restriction, as for ``Store.lookup``; its brokers, if any, must name this store's."""
        messages = self.lookup_messages(keys, topic=topic, begin=begin, end=end, begin_ms=begin_ms, end_ms=end_ms,
                                        max_results=max_results, partitions=partitions, with_body=fetch_values)
        return self.rows(messages, fetch_values=fetch_values)

    def lookup_messages(self, keys: KeysArg | Query, *, topic: str | Iterable[str] | None = None,
                        begin: TimeArg | None = None, end: TimeArg | None = None, begin_ms: int | None = None,
                        end_ms: int | None = None, max_results: int | None = None,
                        partitions: Iterable[int] | None = None, with_body: bool = False) -> list[StoredMessage]:
        """``lookup`` as StoredMessages (each message once, in result order)."""
        query = as_query(keys, topics=topic, begin=begin, end=end, begin_ms=begin_ms, end_ms=end_ms,
                         max_results=max_results, partitions=partitions)
        if query.keys is None:
            raise InvalidArgumentError("a lookup needs keys (a Query without keys is a scan: scan)")
        begin_ms, end_ms, max_results = query.begin_ms, query.end_ms, query.max_results
        topics = _topic_list(None if query.topics is None else sorted(query.topics))
        wanted_partitions = query.partitions
        targets = [(t, k) for t in topics for k in query.keys]
        if not targets or max_results == 0 or (begin_ms is not None and end_ms is not None and begin_ms > end_ms) or (
                query.brokers is not None and self.broker_name not in query.brokers):
            return []
        self.commit_log.refresh()
        full_keys = [index_key(t, k) for t, k in targets]
        # numpy's hashing pays off from a few dozen keys; one key is hashed faster in Python
        hashes = (np.fromiter((index_hash(k) for k in full_keys), np.int64, len(full_keys))
                  if len(full_keys) <= SCALAR_WALK_MAX_KEYS else index_hashes(full_keys))
        who, phys = self._candidates(hashes, begin_ms, end_ms)
        read: dict[int, StoredMessage | None] = {}
        found: dict[int, StoredMessage] = {}
        min_offset = self.commit_log.min_offset
        for target, phy in zip(who.tolist(), phys.tolist()):
            if phy in found:
                continue  # a repeated key, or an entry in two index files: one row per message
            if phy not in read:
                # an offset below the oldest file was deleted by the broker's retention
                read[phy] = self.commit_log.read_message(phy, with_body=with_body) if phy >= min_offset else None
            message = read[phy]
            if message is None:
                continue
            wanted_topic, wanted_key = targets[target]
            if (message.topic == wanted_topic and wanted_key in message.keys
                    and _in_window(message.store_timestamp, begin_ms, end_ms)
                    and (wanted_partitions is None or message.queue_id in wanted_partitions)):
                found[phy] = message
        ordered = sorted(found.values(), key=_result_order)
        return ordered if max_results is None else ordered[:max_results]

    def _candidates(self, hashes: np.ndarray, begin_ms: int | None, end_ms: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(target position, commit-log offset) of every index entry of the hashes that may be
        in the window, newest file first; hash collisions included."""
        who_parts, phy_parts = [], []
        for index in reversed(self.index_files()):
            header = index.header
            if header.index_count <= FIRST_INDEX:
                continue
            if (begin_ms is not None and header.end_timestamp < begin_ms) or (
                    end_ms is not None and header.begin_timestamp > end_ms):
                continue  # every message of this file was stored outside the window
            who, entry, phy, approx = _walk_chains(index, hashes)
            keep = np.ones(who.size, dtype=bool)
            if begin_ms is not None:
                keep &= approx >= begin_ms - INDEX_TIME_SLACK_MS
            if end_ms is not None:
                keep &= (approx <= end_ms) | (entry == FIRST_INDEX)
            who_parts.append(who[keep])
            phy_parts.append(phy[keep])
        if not who_parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(who_parts), np.concatenate(phy_parts)

    # ----------------------------------------------------------------- time scans
    def scan_bounds(self, begin_ms: int | None = None, end_ms: int | None = None) -> tuple[int, int | None]:
        """[start, stop) of the commit log that can hold messages stored in the window, from the
        index headers: it starts at the last message of the newest index file that ended before
        `begin_ms` and stops at the first message of the oldest file that began after `end_ms`
        (None: the end of the log)."""
        self.commit_log.refresh()
        start, stop = self.commit_log.min_offset, None
        for index in self.index_files():
            header = index.header
            if header.index_count <= FIRST_INDEX:
                continue
            if begin_ms is not None and header.end_timestamp < begin_ms:
                start = max(start, header.end_phy_offset)
            if end_ms is not None and header.begin_timestamp > end_ms:
                stop = header.begin_phy_offset
                break
        return start, stop

    def scan_ranges(self, begin_ms: int | None = None, end_ms: int | None = None) -> list[ScanPiece]:
        """``scan_bounds`` split at commit-log file boundaries (each piece starts at a message or
        a file start), for reading in parallel."""
        start, stop = self.scan_bounds(begin_ms, end_ms)
        pieces = []
        for file in self.commit_log.files:
            if file.end <= start or (stop is not None and file.start >= stop):
                continue
            if stop is not None and stop <= file.end:
                pieces.append(ScanPiece(max(start, file.start), stop, stop_is_message=True))
            else:
                # the broker preallocates the next file: the log may end (in zeros) before file.end
                pieces.append(ScanPiece(max(start, file.start), file.end, stop_is_message=False))
        return pieces

    def scan(self, *, begin: TimeArg | None = None, end: TimeArg | None = None, begin_ms: int | None = None,
             end_ms: int | None = None, topics: Iterable[str] | None = None,
             partitions: Iterable[int] | None = None, fetch_values: bool = False,
             batch_rows: int = SCAN_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """Every message stored in the window (inclusive; `begin`/`end` as people type times,
        `begin_ms`/`end_ms` in epoch ms), in commit-log order, as record batches of
        ``row_schema(fetch_values)``."""
        window = Query.of(begin=begin, end=end, begin_ms=begin_ms, end_ms=end_ms)
        begin_ms, end_ms = window.begin_ms, window.end_ms
        start, stop = self.scan_bounds(begin_ms, end_ms)
        yield from self.scan_range(start, stop, begin_ms=begin_ms, end_ms=end_ms, topics=topics,
                                   partitions=partitions, fetch_values=fetch_values, batch_rows=batch_rows,
                                   stop_is_message=stop is not None)

    def scan_range(self, start: int, stop: int | None, *, begin_ms: int | None = None, end_ms: int | None = None,
                   topics: Iterable[str] | None = None, partitions: Iterable[int] | None = None,
                   fetch_values: bool = False, batch_rows: int = SCAN_BATCH_ROWS,
                   stop_is_message: bool = False) -> Iterator[pa.RecordBatch]:
        """The messages of the commit log from offset `start` (a message or file start) up to
        `stop` that are in the window, topics and partitions. With `stop_is_message` (a stop taken
        from an index header), the log ending before `stop` is a CorruptFileError."""
        self.commit_log.refresh()
        wanted_topics = None if topics is None else frozenset(topics)
        wanted_partitions = None if partitions is None else frozenset(int(p) for p in partitions)
        pending: list[StoredMessage] = []
        for offset, kind in self.commit_log.iter_offsets(start, stop):
            if kind is RecordKind.END:
                if stop_is_message and stop is not None and offset < stop:
                    raise CorruptFileError(
                        f"{self.commit_log.directory}: the log ends at offset {offset}, but the "
                        f"index has messages up to {stop}"
                    )
                break
            message = self.commit_log.read_message(offset, with_body=fetch_values)
            if (_in_window(message.store_timestamp, begin_ms, end_ms)
                    and (wanted_topics is None or message.topic in wanted_topics)
                    and (wanted_partitions is None or message.queue_id in wanted_partitions)):
                pending.append(message)
                if len(pending) >= batch_rows:
                    yield from self.rows(pending, fetch_values=fetch_values).to_batches()
                    pending = []
        if pending:
            yield from self.rows(pending, fetch_values=fetch_values).to_batches()

    # ----------------------------------------------------------------- rows
    def rows(self, messages: list[StoredMessage], *, fetch_values: bool = False) -> pa.Table:
        """`messages` as rows of ``row_schema(fetch_values)``. One struct conversion instead of a
        conversion per column: pyarrow's per-call overhead dominates for the few rows of a lookup."""
        schema = row_schema(fetch_values)
        if not messages:
            return schema.empty_table()
        broker = self.broker_name
        if fetch_values:
            where = self.commit_log.directory
            rows = [(broker, m.topic, m.queue_id, m.queue_offset, m.first_key, m.keys, m.store_timestamp * MICROS_PER_MS,
                     m.commit_log_offset, m.size, True, m.decoded_body(where), list(m.properties.items()))
                    for m in messages]
        else:
            rows = [(broker, m.topic, m.queue_id, m.queue_offset, m.first_key, m.keys, m.store_timestamp * MICROS_PER_MS,
                     m.commit_log_offset, m.size, True) for m in messages]
        batch = pa.RecordBatch.from_struct_array(pa.array(rows, type=_ROW_STRUCTS[fetch_values]))
        return pa.Table.from_batches([batch.cast(schema) if batch.schema != schema else batch], schema=schema)

    # ----------------------------------------------------------------- lifecycle
    def close(self) -> None:
        for index in self._index_files.values():
            index.close()
        self._index_files.clear()
        self.commit_log.close()

    def __enter__(self) -> RocketMQBrokerStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RocketMQBrokerStore({str(self.root)!r}, broker={self.broker_name!r})"


def _walk_chains(index: IndexFile, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``IndexFile.candidate_arrays``: every entry of the hashes' chains whose hash matches. The
    lock-step numpy walk costs one round of array calls per chain step, so for a few keys with
    long chains (a hot key) walking each chain with the scalar ``candidates`` is faster."""
    if hashes.size > SCALAR_WALK_MAX_KEYS:
        return index.candidate_arrays(hashes)
    who, entries, phys, stamps = [], [], [], []
    for position, key_hash in enumerate(hashes.tolist()):
        for entry, phy, stamp in index.candidates(key_hash):
            who.append(position)
            entries.append(entry)
            phys.append(phy)
            stamps.append(stamp)
    return tuple(np.asarray(column, dtype=np.int64) for column in (who, entries, phys, stamps))


class ScanPiece(NamedTuple):
    """Commit-log offsets [start, stop) of one file to scan; `stop_is_message` when `stop` is a
    message the index knows (so the log must reach it), not just the end of a file."""

    start: int
    stop: int | None
    stop_is_message: bool


def _topic_list(topic: str | Iterable[str] | None) -> list[str]:
    """The topics of a lookup: RocketMQ hashes topic + "#" + key, so a lookup needs them."""
    if topic is None:
        raise InvalidOptionError("a RocketMQ key lookup needs a topic: the index hashes topic + '#' + key")
    topics = [topic] if isinstance(topic, str) else list(dict.fromkeys(topic))
    if not topics or not all(isinstance(t, str) and t for t in topics):
        raise InvalidOptionError(f"topic must be a non-empty str or a list of them, got {topic!r}")
    return topics


def _in_window(timestamp: int, begin_ms: int | None, end_ms: int | None) -> bool:
    return (begin_ms is None or timestamp >= begin_ms) and (end_ms is None or timestamp <= end_ms)


def _result_order(message: StoredMessage) -> tuple:
    return (message.store_timestamp, message.topic, message.queue_id, message.queue_offset, message.commit_log_offset)
