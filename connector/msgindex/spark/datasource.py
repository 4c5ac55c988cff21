"""``spark.read.format("msgindex")``: a msgindex store (or a RocketMQ index directory) as a
DataFrame, with key and time lookups answered by the index.

Usage::

    df = spark.read.format("msgindex").load("/data/index")              # every record
    df.where("key = 'order-42' AND topic = 'orders'")                    # hash-index lookup
    spark.read.format("msgindex").option("key", "order-42").load(path)   # same, no pushdown needed
    df.where("timestamp >= '2026-11-21 05:00:00'")                       # sparse time index

Columns (stable names; the store's ``ROW_SCHEMA``)::

    broker string, topic string, partition int, offset bigint, key string (primary key, nullable),
    keys array<string> (every key the message is indexed under), timestamp timestamp (UTC, ms),
    commit_log_offset bigint, size int (null/-1 when the source has none), seq bigint (position in
    the shard's metadata log)
    + value binary, headers array<struct<key string, value binary>>   (with fetchValues=true)

With ``.option("mode", "rocketmq")`` the path is a RocketMQ broker's store root (verified rows,
exact to the millisecond, uncapped) or its bare index directory (raw entries): see
``msgindex.spark.rocketmq_reader``.

Options: see ``msgindex.spark.read_options``; accepted filters: see ``msgindex.spark.pushdown``.

How a read is planned: with a key (option or pushed ``key`` filter) there is one input
partition doing the hash-index lookups in every shard (a Spark task costs far more than the
lookups), or one per shard when very many keys are asked for (``PER_SHARD_LOOKUP_KEYS``; never
with ``maxNum``, whose cap is global); without a key, one partition per piece of log that the
sparse time index says the window needs (all of it for a full read). Each partition reads
Arrow batches.

Spark 4.2 caveat: Spark caches the planned read on the loaded relation, so a query *without*
pushable filters run on a DataFrame that earlier ran a query *with* pushed filters reuses the
old plan (fixed upstream after 4.2). Load the DataFrame afresh per query (``load()`` is cheap),
or use the options, which are part of the relation and never stale.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, Filter, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from msgindex.errors import InvalidOptionError, StoreNotFoundError
from msgindex.spark import pushdown
from msgindex.spark.kafka_values import VALUE_FIELDS, fetch_values
from msgindex.spark.read_options import MODE_ROCKETMQ, ReadOptions
from msgindex.spark.rocketmq_reader import (
    PushdownVerifiedRocketMQReader,
    RocketMQReader,
    VerifiedRocketMQReader,
    check_rocketmq_path,
    rocketmq_arrow_schema,
)
from msgindex.storage.message import ROW_SCHEMA

SOURCE_NAME = "msgindex"
SPARK_TIMEZONE = "UTC"  # ROW_SCHEMA's timestamps are timestamp[us, tz=UTC]
# Spark's flag; with it off, a reader that defines pushFilters fails planning
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
# A store lookup of a few keys takes milliseconds, a Spark task with a Python worker ~0.1 s
# (measured, 3 shards on local[2]: 0.47 s per query with a task per shard, 0.31 s with one), so
# a lookup is one task over all shards; from this many keys on, per-shard tasks pay off.
PER_SHARD_LOOKUP_KEYS = 10_000


def output_arrow_schema(options: ReadOptions) -> pa.Schema:
    """The Arrow schema of every batch a read yields (the declared Spark schema, in Arrow)."""
    if options.mode == MODE_ROCKETMQ:
        return rocketmq_arrow_schema(options)
    if options.fetch_values:
        return pa.schema(list(ROW_SCHEMA) + list(VALUE_FIELDS))
    return ROW_SCHEMA


def spark_schema(options: ReadOptions) -> StructType:
    """The DataFrame schema, derived from the Arrow schema (one source of truth)."""
    return from_arrow_schema(output_arrow_schema(options))


class MsgIndexDataSource(DataSource):
    """The ``msgindex`` Python data source (auto-registered through ``pyspark_msgindex``)."""

    def __init__(self, options) -> None:
        super().__init__(options)
        # validated here so that a bad option fails at load(), naming the option and value
        self.parsed = ReadOptions.parse(dict(options))
        _check_path(self.parsed)

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return spark_schema(self.parsed)

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.parsed.verified_rocketmq:
            if _pushdown_disabled_for_this_plan():
                return VerifiedRocketMQReader(self.parsed)
            return PushdownVerifiedRocketMQReader(self.parsed)
        if self.parsed.mode == MODE_ROCKETMQ:
            return RocketMQReader(self.parsed)
        if _pushdown_disabled_for_this_plan():
            return MsgIndexReader(self.parsed)
        return PushdownMsgIndexReader(self.parsed)


def _check_path(options: ReadOptions) -> None:
    if options.mode == MODE_ROCKETMQ:
        check_rocketmq_path(options)
        return
    from msgindex.storage.store import open_store

    try:
        open_store(options.path).close()
    except StoreNotFoundError as missing:
        raise StoreNotFoundError(f"option 'path' = {options.path!r}: {missing}") from None


def _pushdown_disabled_for_this_plan() -> bool:
    """True when Spark plans this read with filter pushdown switched off.

    Spark passes its flag to the planning worker but not to the data source, and that worker
    rejects any reader class that overrides pushFilters while the flag is off. The flag is a
    local variable (``enable_pushdown``) of the planning function that calls ``reader()``, so it
    is read from the caller's frame; when it is not there (the pushdown worker, which has no such
    flag, or another pyspark), pushdown is assumed on."""
    frame = sys._getframe(1)
    while frame is not None:
        if "enable_pushdown" in frame.f_locals and "data_source" in frame.f_locals:
            return frame.f_locals["enable_pushdown"] is False
        frame = frame.f_back
    return False


@dataclass(frozen=True)
class ShardLookup(InputPartition):
    """Hash-index lookup in one shard."""

    broker: str


@dataclass(frozen=True)
class StoreLookup(InputPartition):
    """Hash-index lookup over several shards in one task (few keys, or a global ``maxNum``)."""

    brokers: tuple[str, ...]


@dataclass(frozen=True)
class LogRange(InputPartition):
    """Records [start_seq, end_seq) of one shard's metadata log (a scan piece)."""

    broker: str
    start_seq: int
    end_seq: int


class MsgIndexReader(DataSourceReader):
    """Reads a store with the options' query only (what runs when pushdown is off)."""

    BATCH_ROWS = 65_536

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.query = pushdown.IndexQuery.from_options(options)
        self.arrow_schema = output_arrow_schema(options)

    # --- planning (driver) --------------------------------------------------------------------
    def partitions(self) -> Sequence[InputPartition]:
        if self.query.is_empty:
            return []
        from msgindex.storage.store import open_store

        with open_store(self.options.path) as store:
            brokers = self._brokers(store)
            if self.query.is_lookup:
                return self._lookup_partitions(brokers)
            return [
                LogRange(broker, start, end)
                for broker in brokers
                for start, end in _scan_ranges(store, broker, self.query)
            ]

    def _lookup_partitions(self, brokers: list[str]) -> list[InputPartition]:
        if not brokers:
            return []
        query = self.query
        if query.max_results is not None or len(query.keys_to_look_up) < PER_SHARD_LOOKUP_KEYS:
            return [StoreLookup(tuple(brokers))]
        return [ShardLookup(broker) for broker in brokers]

    def _brokers(self, store) -> list[str]:
        present = store.brokers()
        unknown = sorted(set(self.options.brokers or ()) - set(present))
        if unknown:
            raise InvalidOptionError(
                f"option 'brokers' = {','.join(self.options.brokers)!r}: no shard named {unknown[0]!r} "
                f"in {self.options.path} (shards: {', '.join(present)})"
            )
        wanted = self.query.brokers  # the option and any pushed broker filters, intersected
        return [broker for broker in present if wanted is None or broker in wanted]

    # --- reading (executors) ------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from msgindex.storage.store import open_store

        if not isinstance(partition, (LogRange, ShardLookup, StoreLookup)):
            return  # Spark's stand-in partition when partitions() found nothing to read
        with open_store(self.options.path) as store:
            if isinstance(partition, LogRange):
                batches = self._scan(store, partition)
            else:
                brokers = partition.brokers if isinstance(partition, StoreLookup) else (partition.broker,)
                batches = self._lookup(store, brokers).to_batches(self.BATCH_ROWS)
            for batch in batches:
                if batch.num_rows:
                    yield self._finish(batch)

    def _lookup(self, store, brokers: Sequence[str]) -> pa.Table:
        query = self.query
        topics = sorted(query.topics) if query.topics is not None else [None]
        tables = [
            store.lookup(
                list(query.keys_to_look_up), topic=topic, begin_ms=query.begin_ms,
                end_ms=query.end_ms, max_results=query.max_results, brokers=list(brokers),
                partitions=None if query.partitions is None else sorted(query.partitions),
            )
            for topic in topics
        ]
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if query.primary_keys is not None:
            table = table.filter(pc.is_in(table["key"], pa.array(sorted(query.primary_keys), pa.string())))
        if query.max_results is not None and len(topics) > 1:
            from msgindex.storage.query import sort_and_limit

            table = sort_and_limit([table], query.max_results)
        return table

    def _scan(self, store, piece: LogRange) -> Iterator[pa.RecordBatch]:
        query = self.query
        reader = store.reader(piece.broker)
        try:
            yield from reader.scan_range(
                piece.start_seq, piece.end_seq, begin_ms=query.begin_ms, end_ms=query.end_ms,
                topics=None if query.topics is None else sorted(query.topics),
                partitions=None if query.partitions is None else sorted(query.partitions),
            )
        finally:
            reader.close()

    def _finish(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch in the declared schema (values fetched from Kafka when asked)."""
        if self.options.fetch_values:
            batch = fetch_values(self.options.bootstrap_servers, batch)
        return batch.cast(self.arrow_schema) if batch.schema != self.arrow_schema else batch


def _scan_ranges(store, broker: str, query: pushdown.IndexQuery) -> list[tuple[int, int]]:
    reader = store.reader(broker)
    try:
        return [(start, end) for start, end in reader.scan_ranges(query.begin_ms, query.end_ms) if end > start]
    finally:
        reader.close()


class PushdownMsgIndexReader(MsgIndexReader):
    """MsgIndexReader that also takes the filters the index answers exactly (``pushdown``)."""

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        self.query, rejected = pushdown.push(self.query, filters)
        return rejected


def declared_arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow form of a Spark schema, as Spark expects the batches of a read of it."""
    return to_arrow_schema(schema, timezone=SPARK_TIMEZONE)
