"""``spark.read.format("msgindex").option("mode", "rocketmq")``: a RocketMQ broker's files.

Two kinds of path:

* a broker's **store root** (the directory holding ``commitlog/`` and ``index/``): rows of
  ``msgindex.storage.rocketmq.broker_store.row_schema`` — every index hit verified against the
  commit log (real topic, keys and store time in milliseconds), no hash collisions, no 64-message
  cap. Key lookups are one input partition; time scans one partition per commit-log file piece
  that the index headers say the window needs. Filters on broker, topic, partition, key and
  timestamp are pushed down exactly (``msgindex.spark.read.pushdown``); ``key`` is the message's first
  ``KEYS`` token, ``keys`` every key it is found under.
* a bare directory of broker IndexFiles (``store/index/``): raw entries
  (``ROCKETMQ_ENTRY_SCHEMA``). An IndexFile holds no key strings, so nothing found in it can be
  verified: every row carries ``verified = false``, and a key lookup returns every entry whose
  hash equals the key's (hash collisions included). Times are the file's beginTimestamp plus
  whole seconds, as RocketMQ stores them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import compress

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition

from msgindex.spark.read import pushdown
from msgindex.spark.read.options import ReadOptions, session_zone
from msgindex.spark.read.pushdown import task_query
from msgindex.storage.hash_index.index_file import FIRST_INDEX, TIME_DIFF_UNIT_MS, IndexFile
from msgindex.storage.message import index_key
from msgindex.storage.rocketmq.broker_store import RocketMQBrokerStore, open_rocketmq, row_schema
from msgindex.storage.rocketmq.index_files import IndexFileSet

MICROS_PER_MS = 1000
BATCH_ENTRIES = 1 << 20
BATCH_ROWS = 65_536

# the rows of mode "rocketmq" on a bare index directory
ROCKETMQ_ENTRY_SCHEMA = pa.schema([
    pa.field("file", pa.string(), nullable=False),          # index file name (yyyyMMddHHmmssSSS)
    pa.field("entry", pa.int32(), nullable=False),          # entry number inside the file
    pa.field("key_hash", pa.int32(), nullable=False),       # abs(String.hashCode(topic#key))
    pa.field("phy_offset", pa.int64(), nullable=False),     # commit-log offset of the message
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),  # second granularity
    pa.field("prev_index", pa.int32(), nullable=False),     # previous entry of the hash chain
    pa.field("lookup_key", pa.string(), nullable=True),     # the topic#key whose hash matched
    pa.field("verified", pa.bool_(), nullable=False),       # always false: hashes only
])


def rocketmq_arrow_schema(options: ReadOptions) -> pa.Schema:
    """The rows of a rocketmq-mode read: verified rows on a store root, raw entries otherwise."""
    return row_schema(options.fetch_values) if options.verified_rocketmq else ROCKETMQ_ENTRY_SCHEMA


def check_rocketmq_path(options: ReadOptions) -> None:
    """Fail at load() on a path that is neither a store root nor an index directory, or whose
    index files do not have the options' sizing."""
    if options.verified_rocketmq:
        with _open_store(options) as store:
            store.index_set.paths(allow_empty=True)
    else:
        RocketMQIndexDirectory(options.path, options.hash_slot_num, options.index_num).files()


def _open_store(options: ReadOptions) -> RocketMQBrokerStore:
    return open_rocketmq(options.path, hash_slot_num=options.hash_slot_num, index_num=options.index_num,
                         broker_name=options.broker_name)


# ------------------------------------------------------------------------------ verified rows
@dataclass(frozen=True)
class RocketMQLookup(InputPartition):
    """The key lookup of a read, in one task (a lookup takes milliseconds, a task far more)."""


@dataclass(frozen=True)
class RocketMQLogPiece(InputPartition):
    """Commit-log offsets [start, stop) of one file (``broker_store.ScanPiece``)."""

    start: int
    stop: int | None
    stop_is_message: bool


class VerifiedRocketMQReader(DataSourceReader):
    """Verified rows of a broker's store root, with the options' query only (what runs when
    filter pushdown is off)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.query = pushdown.IndexQuery.from_options(options)
        self.arrow_schema = row_schema(options.fetch_values)

    def partitions(self) -> Sequence[InputPartition]:
        query = self.query
        with _open_store(self.options) as store:
            if query.is_empty or (query.brokers is not None and store.broker_name not in query.brokers):
                return []
            if query.is_lookup and query.topics is not None:
                return [RocketMQLookup()]
            # no topic to hash with (a pushed key filter alone): a scan, filtered by key
            return [RocketMQLogPiece(*piece) for piece in store.scan_ranges(query.begin_ms, query.end_ms)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, (RocketMQLookup, RocketMQLogPiece)):
            return  # Spark's stand-in partition when partitions() found nothing to read
        query, fetch = task_query(self.query, self.options), self.options.fetch_values
        partitions = None if query.partitions is None else sorted(query.partitions)
        with _open_store(self.options) as store:
            if isinstance(partition, RocketMQLookup):
                # the primary-key filter comes before the limit: maxNum counts returned rows
                table = store.lookup(list(query.keys_to_look_up), topic=sorted(query.topics),
                                     begin_ms=query.begin_ms, end_ms=query.end_ms, partitions=partitions,
                                     fetch_values=fetch)
                table = self._keep_wanted_keys(table)
                if query.max_results is not None:
                    table = table.slice(0, query.max_results)
                batches = table.to_batches(BATCH_ROWS)
            else:
                batches = (self._keep_wanted_keys(batch) for batch in store.scan_range(
                    partition.start, partition.stop, begin_ms=query.begin_ms, end_ms=query.end_ms,
                    topics=None if query.topics is None else sorted(query.topics),
                    partitions=partitions, fetch_values=fetch, stop_is_message=partition.stop_is_message))
            for batch in batches:
                if batch.num_rows:
                    yield batch

    def _keep_wanted_keys(self, rows: pa.Table | pa.RecordBatch) -> pa.Table | pa.RecordBatch:
        """`rows` whose ``key`` is one of the pushed ``key`` values and whose ``keys`` hold one of
        the option keys (the lookup already ensures the latter; a scan does not)."""
        query = self.query
        if query.primary_keys is not None:
            rows = rows.filter(pc.is_in(rows["key"], value_set=pa.array(sorted(query.primary_keys), pa.string())))
        if query.lookup_keys is not None:
            rows = rows.filter(holds_any(rows["keys"], query.lookup_keys))
        return rows


def holds_any(lists: pa.Array | pa.ChunkedArray, wanted: Iterable[str]) -> pa.Array:
    """Per row of `lists` (list<string>), whether it holds one of `wanted`: a boolean array even
    when there are no rows (an empty answer is the common case of a lookup)."""
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    value_set = pa.array(sorted(set(wanted)), pa.string())
    hit = pc.is_in(pc.list_flatten(lists), value_set=value_set).fill_null(False).to_numpy(zero_copy_only=False)
    mask = np.zeros(len(lists), dtype=bool)
    mask[pc.list_parent_indices(lists).to_numpy()[hit]] = True
    return pa.array(mask, pa.bool_())


class PushdownVerifiedRocketMQReader(VerifiedRocketMQReader):
    """VerifiedRocketMQReader that also takes the filters answered exactly (``pushdown``)."""

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        self.query, rejected = pushdown.push(self.query, filters)
        return rejected


# ------------------------------------------------------------------------------ raw entries
class RocketMQIndexDirectory:
    """The IndexFiles of one directory, all of one sizing (RocketMQ's hashSlotNum/indexNum)."""

    def __init__(self, path: str, hash_slot_num: int, index_num: int) -> None:
        self.files_set = IndexFileSet(path, hash_slot_num, index_num)

    def files(self):
        """The index files, oldest first (errors name the option at fault)."""
        return self.files_set.paths()

    def read_file(self, name: str, *, keys: Iterable[str] | None = None, topics: Iterable[str] | None = None,
                  begin_ms: int | None = None, end_ms: int | None = None) -> Iterator[pa.RecordBatch]:
        """Entries of file `name`: all of them, or those of `keys` in `topics`; in the window."""
        with self.files_set.open(self.files_set.directory / name) as index:
            if keys is None:
                end = FIRST_INDEX + index.entry_count
                for start in range(FIRST_INDEX, end, BATCH_ENTRIES):  # a full file is 20M entries
                    numbers = np.arange(start, min(start + BATCH_ENTRIES, end), dtype=np.int64)
                    yield from _entry_batch(index, name, numbers, None, begin_ms, end_ms)
            else:
                full_keys = [index_key(topic, key) for topic in (topics or ()) for key in keys]
                numbers, matched = _matching_entries(index, full_keys)
                yield from _entry_batch(index, name, numbers, matched, begin_ms, end_ms)


class RocketMQReader(DataSourceReader):
    """Raw entries of a directory of RocketMQ broker IndexFiles, one partition per file. With a
    key (and topic) only the entries whose hash matches are returned, marked unverified."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def _directory(self) -> RocketMQIndexDirectory:
        return RocketMQIndexDirectory(self.options.path, self.options.hash_slot_num, self.options.index_num)

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(path.name) for path in self._directory().files()]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        options = self.options
        if partition.value is None:
            return
        begin_ms, end_ms = options.window_in(session_zone())
        yield from self._directory().read_file(
            partition.value, keys=options.keys, topics=options.topics, begin_ms=begin_ms, end_ms=end_ms,
        )


def _entry_batch(index: IndexFile, name: str, numbers: np.ndarray, lookup_keys: list[str] | None,
                 begin_ms: int | None, end_ms: int | None) -> Iterator[pa.RecordBatch]:
    """Entries `numbers` of `index` in the window as one ROCKETMQ_ENTRY_SCHEMA batch (copied out
    of the mapping), if any."""
    entries = index.entry_array()[numbers]
    stamps = index.begin_timestamp + entries["time_diff"].astype(np.int64) * TIME_DIFF_UNIT_MS
    keep = np.ones(entries.size, dtype=bool)
    if begin_ms is not None:
        keep &= stamps >= begin_ms
    if end_ms is not None:
        keep &= stamps <= end_ms
    rows = int(keep.sum())
    if rows == 0:
        return
    matched_keys = (pa.nulls(rows, pa.string()) if lookup_keys is None
                    else pa.array(list(compress(lookup_keys, keep)), pa.string()))
    yield pa.RecordBatch.from_arrays([
        pa.array([name] * rows, pa.string()),
        pa.array(numbers[keep].astype(np.int32)),
        pa.array(entries["key_hash"][keep].astype(np.int32)),
        pa.array(entries["phy_offset"][keep].astype(np.int64)),
        pa.array(stamps[keep] * MICROS_PER_MS, pa.timestamp("us", tz="UTC")),
        pa.array(entries["prev_index"][keep].astype(np.int32)),
        matched_keys,
        pa.array(np.zeros(rows, dtype=bool)),
    ], schema=ROCKETMQ_ENTRY_SCHEMA)


def _matching_entries(index: IndexFile, full_keys: list[str]) -> tuple[np.ndarray, list[str]]:
    """Entry numbers whose hash equals one of `full_keys`' (each chain walked to its end)."""
    numbers: list[int] = []
    matched: list[str] = []
    for full_key, chain in zip(full_keys, index.candidates_many(full_keys)):
        for entry_number, _phy, _stamp in chain:
            numbers.append(entry_number)
            matched.append(full_key)
    return np.asarray(numbers, dtype=np.int64), matched
