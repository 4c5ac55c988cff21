"""``spark.read.format("msgindex")``: a msgindex store (or a RocketMQ index directory) as a
DataFrame, with key and time lookups answered by the index.

Usage::

    df = spark.read.format("msgindex").load("/data/index")              # every record
    spark.read.format("msgindex").option("key", "order-42").load(path)   # hash-index lookup

    enable_pushdown(spark)                                               # once per session, then
    df.where("key = 'order-42' AND topic = 'orders'")                    # hash-index lookup
    df.where("timestamp >= '2026-11-21 05:00:00'")                       # sparse time index

Without ``enable_pushdown`` (the source Spark finds on its own, ``pyspark_msgindex``), ``where``
filters are evaluated by Spark over a full read: right, but a scan. The options use the index
either way.

Columns (stable names; the store's ``ROW_SCHEMA``)::

    broker string, topic string, partition int, offset bigint, key string (primary key, nullable),
    keys array<string> (every key the message is indexed under), timestamp timestamp (UTC, ms),
    commit_log_offset bigint, size int (null/-1 when the source has none), seq bigint (position in
    the shard's metadata log)
    + one column per field the store indexes (storage/fields.py; read from the shards' coverage
      when the DataFrame is loaded), in name order: a string for a field of shape ``single``, an
      array<string> for ``array``; the record's values from its stored field terms, null where it
      carries none (or was indexed before the field existed). A store without fields has none.
    + any_key string, and any_<name> string per array field   (the pushdown source: ``pushdown``)
    + value binary, headers array<struct<key string, value binary>>   (with fetchValues=true)

With ``.option("mode", "rocketmq")`` the path is a RocketMQ broker's store root (verified rows,
exact to the millisecond, uncapped) or its bare index directory (raw entries): see
``msgindex.spark.read.rocketmq_reader``.

Options: see ``msgindex.spark.read.options``; accepted filters: see ``msgindex.spark.read.pushdown``.

How a read is planned: field values (a ``field.<name>`` option or a pushed filter on a field's
column) are looked up by one partition, which then checks the other pushed conditions on the rows
found. With keys (options or a pushed ``key`` filter) each input partition looks
a slice of at most ``KEYS_PER_LOOKUP_TASK`` keys up in every shard (one partition for a few keys:
a Spark task costs far more than their lookups; a single one with ``maxNum``, whose cap is
global); without a key, one partition per piece of log that the sparse time index says the
window needs (all of it for a full read). Each partition reads Arrow batches.

Spark 4.2 caveat: Spark caches the planned read on the loaded relation, so a query *without*
pushable filters run on a DataFrame that earlier ran a query *with* pushed filters reuses the
old plan (fixed upstream after 4.2). Load the DataFrame afresh per query (``load()`` is cheap),
or use the options, which are part of the relation and never stale.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, Filter, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from msgindex.errors import InvalidOptionError, StoreNotFoundError
from msgindex.spark.read import pushdown
from msgindex.spark.read.bulk_lookup import first_asked, shown_keys
from msgindex.spark.read.kafka_values import VALUE_FIELDS, consumer_for, fetch_values
from msgindex.spark.read.options import FIELD_OPTION_PREFIX, MODE_ROCKETMQ, ReadOptions
from msgindex.spark.read.rocketmq_reader import (
    PushdownVerifiedRocketMQReader,
    RocketMQReader,
    VerifiedRocketMQReader,
    check_rocketmq_path,
    rocketmq_arrow_schema,
)
from msgindex.storage.fields import SHAPE_ARRAY, SHAPE_SINGLE, check_field_names, store_fields
from msgindex.storage.log.batch_format import field_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from msgindex.storage.objects.store import StorePin

SOURCE_NAME = "msgindex"
# Spark's flag; with it off, a reader that defines pushFilters fails planning
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
# A key lookup task looks its keys up in every shard. A few keys take milliseconds, less than a
# task's own cost (measured, 3 shards on local[2]: 0.47 s per query with a task per shard, 0.31 s
# with one); a thousand keys of ten messages each take ~0.2 s (1M-record shard), so from this
# many keys on the keys are split over tasks, which run in parallel whatever the shard count.
KEYS_PER_LOOKUP_TASK = 500


ANY_KEY_FIELD = pa.field(pushdown.ANY_KEY_COLUMN, pa.string(), nullable=True)
FieldColumns = tuple[tuple[str, str], ...]  # the store's fields as columns: (name, shape), name order


def lookup_fields(fields: FieldColumns) -> list[pa.Field]:
    """The pushdown source's lookup columns: ``any_key``, then ``any_<name>`` per array field."""
    return [ANY_KEY_FIELD, *(pa.field(pushdown.lookup_column(name), pa.string(), nullable=True)
                             for name, shape in fields if shape == SHAPE_ARRAY)]


def output_arrow_schema(options: ReadOptions, *, any_key: bool = False, fields: FieldColumns = ()) -> pa.Schema:
    """The Arrow schema of every batch a read yields (the declared Spark schema, in Arrow): the
    rows, a column per field of `fields`, with `any_key` the pushdown source's lookup columns
    (a msgindex store's rows only), then fetchValues' columns."""
    if options.mode == MODE_ROCKETMQ:
        return rocketmq_arrow_schema(options)
    rows = field_schema(tuple((name, name, shape) for name, shape in fields))
    return pa.schema([*rows, *(lookup_fields(fields) if any_key else []),
                      *(VALUE_FIELDS if options.fetch_values else [])])


def spark_schema(options: ReadOptions, *, any_key: bool = False, fields: FieldColumns = ()) -> StructType:
    """The DataFrame schema, derived from the Arrow schema (one source of truth)."""
    return from_arrow_schema(output_arrow_schema(options, any_key=any_key, fields=fields))


class MsgIndexDataSource(DataSource):
    """The ``msgindex`` Python data source, auto-registered through ``pyspark_msgindex``.

    Its reader answers the options with the index and leaves ``where`` filters to Spark, so it
    reads right under any value of Spark's pushdown setting (a reader that implements
    ``pushFilters`` is refused by Spark when the setting is off). ``enable_pushdown`` swaps in
    ``MsgIndexPushdownDataSource`` for a session."""

    def __init__(self, options) -> None:
        super().__init__(options)
        # validated here so that a bad option fails at load(), naming the option and value
        self.parsed = ReadOptions.parse(dict(options))
        self.fields = _check_path(self.parsed)
        check_field_names(self.fields, (name for name, _ in self.parsed.fields or ()),
                          lambda name: f"option '{FIELD_OPTION_PREFIX}{name}'")
        if self.parsed.fetch_values and self.parsed.mode != MODE_ROCKETMQ:
            consumer_for(self.parsed.bootstrap_servers)  # Kafka unreachable: said at load(), in seconds

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return spark_schema(self.parsed, fields=self.fields)

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.parsed.verified_rocketmq:
            return VerifiedRocketMQReader(self.parsed)
        if self.parsed.mode == MODE_ROCKETMQ:
            return RocketMQReader(self.parsed)
        return MsgIndexReader(self.parsed, self.fields)


class MsgIndexPushdownDataSource(MsgIndexDataSource):
    """``msgindex`` whose reader also answers ``where`` filters with the index (see ``pushdown``).

    Needs ``spark.sql.python.filterPushdown.enabled=true`` in the session: with it off, Spark
    refuses the reader's ``pushFilters`` with DATA_SOURCE_PUSHDOWN_DISABLED, naming the setting.
    Spark tells a data source nothing about its settings, so the choice between the two sources
    is made per session by ``enable_pushdown``, never guessed.

    Its rows of a msgindex store have one more column, ``any_key``: ``where any_key = 'k'`` is
    "indexed under k", answered by the hash index (see ``pushdown``). The source without
    pushdown has no such column, so that the same condition there is an error naming the
    column rather than a scan that finds nothing."""

    def schema(self) -> StructType:
        return spark_schema(self.parsed, any_key=True, fields=self.fields)

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.parsed.verified_rocketmq:
            return PushdownVerifiedRocketMQReader(self.parsed)
        if self.parsed.mode == MODE_ROCKETMQ:
            return RocketMQReader(self.parsed)
        return PushdownMsgIndexReader(self.parsed, self.fields)


def enable_pushdown(spark: SparkSession) -> None:
    """Make ``where`` filters on ``key``, ``topic``, ``broker``, ``partition`` and ``timestamp``
    use the index in this SparkSession (classic or Spark Connect): turns Spark's Python data
    source filter pushdown on and registers ``MsgIndexPushdownDataSource`` as ``msgindex``.

    Turning the setting off again afterwards makes reads of this session fail with Spark's
    DATA_SOURCE_PUSHDOWN_DISABLED, which names the setting; a new session reads without.
    WorkerPythonError when Spark's local Python workers cannot import msgindex."""
    from msgindex.spark.runtime.worker_python import check_worker_python

    check_worker_python(spark)
    register_pushdown(spark)


def register_pushdown(spark: SparkSession) -> None:
    """``enable_pushdown`` without its check of the workers' Python: for sessions whose executors
    get msgindex shipped with the job (``build_spark_session``: the indexing job adds it as a zip
    once the session exists, so a probe before that would find it missing)."""
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(MsgIndexPushdownDataSource)


def _check_path(options: ReadOptions) -> FieldColumns:
    """Check the path exists; the fields its store indexes (none in mode rocketmq)."""
    if options.mode == MODE_ROCKETMQ:
        check_rocketmq_path(options)
        return ()
    from msgindex.storage.store import open_store

    try:
        with open_store(options.path, storage_options=options.store_options) as store:
            return store_fields(store)
    except StoreNotFoundError as missing:
        raise StoreNotFoundError(f"option 'path' = {options.path!r}: {missing}") from None


@dataclass(frozen=True)
class KeyLookup(InputPartition):
    """Hash-index lookups of the keys ``keys_to_look_up[start:end]`` in the shards `brokers`.
    The reader (shipped with every task) holds the keys; a partition only names its slice."""

    brokers: tuple[str, ...]
    start: int
    end: int
    pin: StorePin | None = None  # an object store's versions, pinned by the driver (ObjectStore.pin)


@dataclass(frozen=True)
class LogRange(InputPartition):
    """Records [start_seq, end_seq) of one shard's metadata log (a scan piece)."""

    broker: str
    start_seq: int
    end_seq: int
    pin: StorePin | None = None


class MsgIndexReader(DataSourceReader):
    """Reads a store with the options' query only (what runs when pushdown is off)."""

    BATCH_ROWS = 65_536
    ANY_KEY = False  # whether rows carry the ``any_key`` column (the pushdown source's)

    def __init__(self, options: ReadOptions, fields: FieldColumns = ()) -> None:
        self.options = options
        self.fields = fields
        self.query = pushdown.IndexQuery.from_options(options, fields)
        self.arrow_schema = output_arrow_schema(options, any_key=self.ANY_KEY, fields=fields)

    # --- planning (driver) --------------------------------------------------------------------
    def partitions(self) -> Sequence[InputPartition]:
        if self.query.is_empty:
            return []
        from msgindex.storage.store import open_store

        with open_store(self.options.path, storage_options=self.options.store_options) as store:
            # one snapshot for the whole query: the tasks read the versions seen here (an object
            # store's; a local store's readers read the last commit), without asking again
            pin = store.pin()
            brokers = self._brokers(store)
            if self.query.is_lookup:
                return self._lookup_partitions(brokers, pin)
            return [
                LogRange(broker, start, end, pin)
                for broker in brokers
                for start, end in _scan_ranges(store, broker, self.query)
            ]

    def _lookup_partitions(self, brokers: list[str], pin: StorePin | None) -> list[InputPartition]:
        if not brokers:
            return []
        count = len(self.query.keys_to_look_up)
        # field values (the other conditions checked on the rows found), or a global cap: one
        # task sees every row
        if self.query.by_fields or self.query.max_results is not None:
            return [KeyLookup(tuple(brokers), 0, count, pin)]
        return [KeyLookup(tuple(brokers), start, min(start + KEYS_PER_LOOKUP_TASK, count), pin)
                for start in range(0, count, KEYS_PER_LOOKUP_TASK)]

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

        if not isinstance(partition, (LogRange, KeyLookup)):
            return  # Spark's stand-in partition when partitions() found nothing to read
        query = pushdown.task_query(self.query, self.options)
        with open_store(self.options.path, storage_options=self.options.store_options, pin=partition.pin) as store:
            if isinstance(partition, LogRange):
                batches = self._with_lookup_columns(self._scan(store, partition, query), {})
            else:
                table, shown = self._lookup(store, partition, query)
                batches = self._with_lookup_columns(table.to_batches(self.BATCH_ROWS), shown)
            for batch in batches:
                if batch.num_rows:
                    yield self._finish(batch)

    def _lookup(self, store, partition: KeyLookup,
                query: pushdown.IndexQuery) -> tuple[pa.Table, dict[str, pa.Array]]:
        """The rows this partition finds, each once over the whole read, and the lookup columns
        they show (by name; absent: null): a message indexed under asked keys of several
        partitions is returned by the partition of the first of them (the ``any_key`` it shows)."""
        if query.by_fields:
            return self._field_lookup(store, partition, query)
        asked = query.keys_to_look_up
        table = self._with_fields(store.lookup(query.store_query(asked[partition.start : partition.end],
                                                                 partition.brokers)))
        if query.primary_keys is not None:
            table = table.filter(pc.is_in(table["key"], pa.array(sorted(query.primary_keys), pa.string())))
        wanted = shown_keys(list(asked))
        first = first_asked(table, wanted)
        mine = first >= partition.start
        if not mine.all():
            table, first = table.filter(pa.array(mine)), first[mine]
        return table, {pushdown.ANY_KEY_COLUMN: wanted.take(pa.array(first))}

    def _field_lookup(self, store, partition: KeyLookup,
                      query: pushdown.IndexQuery) -> tuple[pa.Table, dict[str, pa.Array]]:
        """The rows field values find (one partition: ``_lookup_partitions``), kept where every
        other pushed condition holds on their columns (``pushdown``: they intersect)."""
        table = self._with_fields(store.lookup(query.store_query((), partition.brokers)))
        keep = np.ones(table.num_rows, dtype=bool)
        shown: dict[str, tuple[pa.Array, np.ndarray]] = {}
        shapes = dict(self.fields)
        for name, values in query.field_filters:
            asked = pa.array(sorted(values), pa.string())
            if shapes[name] == SHAPE_SINGLE:
                keep &= pc.is_in(table[name], asked).fill_null(False).to_numpy(zero_copy_only=False)
            else:
                first = first_asked(table, asked, column=name)
                keep &= first >= 0
                shown[pushdown.lookup_column(name)] = (asked, first)
        if query.lookup_keys is not None:
            asked = shown_keys(list(query.lookup_keys))
            first = first_asked(table, asked)
            keep &= first >= 0
            shown[pushdown.ANY_KEY_COLUMN] = (asked, first)
        if query.primary_keys is not None:
            keep &= pc.is_in(table["key"], pa.array(sorted(query.primary_keys), pa.string())).to_numpy(
                zero_copy_only=False)
        if not keep.all():
            table = table.filter(pa.array(keep))
        return table, {column: asked.take(pa.array(first[keep])) for column, (asked, first) in shown.items()}

    def _with_fields(self, table: pa.Table) -> pa.Table:
        """A store result with this read's field columns (a result without rows has none)."""
        if not self.fields or table.num_rows:
            return table
        return field_schema(tuple((name, name, shape) for name, shape in self.fields)).empty_table()

    def _scan(self, store, piece: LogRange, query: pushdown.IndexQuery) -> Iterator[pa.RecordBatch]:
        reader = store.reader(piece.broker)
        try:
            yield from reader.scan_range(piece.start_seq, piece.end_seq, query.store_query(None, [piece.broker]))
        finally:
            reader.close()

    def _with_lookup_columns(self, batches: Iterator[pa.RecordBatch],
                             shown: dict[str, pa.Array]) -> Iterator[pa.RecordBatch]:
        """`batches` with the lookup columns when this reader's rows have them: each one's
        values of `shown` (over all batches), null where it is absent (always in scans)."""
        if not self.ANY_KEY:
            yield from batches
            return
        added = lookup_fields(self.fields)
        done = 0
        for batch in batches:
            columns = [pa.nulls(batch.num_rows, pa.string()) if field.name not in shown
                       else shown[field.name].slice(done, batch.num_rows) for field in added]
            done += batch.num_rows
            yield pa.RecordBatch.from_arrays([*batch.columns, *columns], schema=pa.schema([*batch.schema, *added]))

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

    ANY_KEY = True

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        self.query, rejected = pushdown.push(self.query, filters)
        return rejected


