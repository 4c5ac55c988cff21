"""``msgindex index --backfill-fields``: index the job's fields over records committed before them.

A field declared on an existing index applies from the job's next batch; the offsets its shards
committed before stay uncovered (lookups warn, naming them). With ``--backfill-fields``, before the
streaming query starts, the job:

1. finds per shard the offsets it holds that some declared field does not cover
   (``fields.uncovered``), and keeps those Kafka still retains (the partitions' earliest offsets,
   read once): what Kafka deleted cannot be evaluated and stays uncovered, said in a line;
2. re-reads those offsets from Kafka in one batch query (Spark's Kafka source, exactly these
   ranges) and evaluates the fields as the streaming query does (the same projection,
   ``kafka_records.record_columns``, the same lenient evaluation);
3. sends each shard's rows to one task (a shuffle by shard: a shard is rebuilt by one owner, on an
   executor like every write), which hands them to the store's backfill (storage/backfill.py)
   with the offsets the rows vouch for (``received_within``: what retention took meanwhile is
   not covered): exactly once by offsets, so a job stopped halfway and started again backfills
   only what is still uncovered. The task holds a shard's values in memory (~60 bytes a record
   with one value).

The streaming query then starts as usual, and its batches index the fields from there on. Only
``--input records`` jobs declare fields (so far), so a record's source offsets are its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import InvalidOptionError
from msgindex.spark.pipeline.kafka_source import KafkaSource, OffsetRange
from msgindex.spark.pipeline.task_writer import BROKER, SinkConfig
from msgindex.storage import fields
from msgindex.storage.fields import FieldDefinition
from msgindex.storage.source_ranges import SourceRanges, SourceRows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from msgindex.storage.message import MessageRecord
    from msgindex.storage.objects.store import ObjectStore
    from msgindex.storage.store import Store

RESULT_DDL = "broker string, line string, records_with_values long, values_added long"
NO_FIELDS_TO_BACKFILL = "--backfill-fields: declare the fields to backfill (--index-field / --index-header)"


def uncovered_by_shard(store: Store | ObjectStore, definitions: Sequence[FieldDefinition]) -> dict[str, SourceRanges]:
    """Per shard, the offsets it holds that some of `definitions` does not cover (empty ones left out)."""
    missing = {}
    for broker in store.brokers():
        with store.reader(broker) as reader:
            held = reader.committed_ranges or SourceRanges()
            coverage = reader.field_coverage
        union = SourceRanges()
        for definition in definitions:
            union = union.union(fields.uncovered(definition.name, held, coverage))
        if union.ranges:
            missing[broker] = union
    return missing


def retained(ranges: SourceRanges, earliest: Mapping[tuple[str, int], int]) -> SourceRanges:
    """`ranges` from each partition's earliest retained offset on (a partition Kafka no longer
    has: nothing)."""
    kept = {}
    for tp, intervals in ranges.ranges.items():
        if tp not in earliest:
            continue
        clipped = tuple((max(start, earliest[tp]), end) for start, end in intervals if end > earliest[tp])
        if clipped:
            kept[tp] = clipped
    return SourceRanges(kept)


def backfill_fields(spark: SparkSession, source: KafkaSource, store: Store | ObjectStore, config: SinkConfig,
                    say: Callable[[str], None] = print) -> list[str]:
    """Steps 1-3 of the module docstring for the job's fields (`config.fields`); the lines said."""
    from msgindex.kafka.admin import earliest_offsets, needs_java_client
    from msgindex.spark.pipeline.kafka_records import record_columns
    from msgindex.spark.pipeline.partition_brokers import PartitionBrokerMap
    from msgindex.spark.pipeline.sink import broker_column

    definitions = config.fields
    if not definitions:
        raise InvalidOptionError(NO_FIELDS_TO_BACKFILL)
    missing = uncovered_by_shard(store, definitions)
    lines = []
    if not missing:
        lines.append("backfill: every field already covers every offset the index holds")
        say(lines[-1])
        return lines
    if needs_java_client(source.consumer_options):
        raise InvalidOptionError("--backfill-fields reads the partitions' earliest offsets with the Python Kafka "
                                 "client, which these --kafka-option settings (SASL/SSL) rule out")
    partitions = sorted({tp for ranges in missing.values() for tp in ranges.ranges})
    earliest = earliest_offsets(source.bootstrap_servers, partitions)
    evaluated = {broker: retained(ranges, earliest) for broker, ranges in missing.items()}
    for broker, ranges in sorted(missing.items()):
        gone = ranges.minus(evaluated[broker])
        if gone.ranges:
            lines.append(f"backfill: shard {broker}: Kafka no longer retains {fields.describe_ranges(gone)}: "
                         f"those offsets stay uncovered")
            say(lines[-1])
    pieces: dict[tuple[str, int], list[OffsetRange]] = {}
    for ranges in evaluated.values():
        for tp, intervals in ranges.ranges.items():
            pieces.setdefault(tp, []).extend(OffsetRange(start, end) for start, end in intervals)
    # every record, aborted transactions' too: the index may hold them (built with read_uncommitted);
    # values of records it does not hold are never matched (storage/backfill.py, by offset)
    kafka_df = source.reading_every_record().read_pieces(spark, {tp: _merged(intervals) for tp, intervals in pieces.items()})
    if kafka_df is None:
        return lines
    mapping = PartitionBrokerMap(config.root, config.options).as_dict()
    rows = kafka_df.select(*record_columns(broker_column(mapping), definitions))
    shards = sorted(evaluated)
    task = backfill_task(config, {broker: evaluated[broker] for broker in shards})
    results = rows.repartition(len(shards), BROKER).mapInArrow(task, RESULT_DDL).collect()
    for row in sorted(results, key=lambda r: r["broker"]):
        lines.append(f"backfill: {row['line']}")
        say(lines[-1])
    return lines


def _merged(ranges: Iterable[OffsetRange]) -> list[OffsetRange]:
    """Overlapping or touching ranges of one partition as one (two shards never hold one offset,
    but one range per partition is one Spark input partition the less)."""
    merged: list[OffsetRange] = []
    for piece in sorted(ranges, key=lambda r: r.start):
        if merged and piece.start <= merged[-1].end:
            merged[-1] = OffsetRange(merged[-1].start, max(merged[-1].end, piece.end))
        else:
            merged.append(piece)
    return merged


def backfill_task(config: SinkConfig, evaluated: Mapping[str, SourceRanges]) -> Callable:
    """The ``mapInArrow`` function: each shard's rows (all of them reach one task) handed to its
    backfill. Without annotations: pyspark infers UDF kinds from type hints."""

    def run(batches):
        return _backfill_shards(config, evaluated, batches)

    return run


def _backfill_shards(config: SinkConfig, evaluated: Mapping[str, SourceRanges],
                     batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from msgindex.spark.pipeline.kafka_records import records_to_append
    from msgindex.spark.pipeline.quarantine import REASON
    from msgindex.storage.backfill import VALUES_SCHEMA, FieldBackfill
    from msgindex.storage.store import open_store

    by_shard: dict[str, list[pa.Table]] = {}
    for batch in batches:
        if not batch.num_rows:
            continue
        table = pa.Table.from_batches([batch])
        for broker in pc.unique(table.column(BROKER)).to_pylist():
            if broker in evaluated:
                by_shard.setdefault(broker, []).append(table.filter(pc.equal(table.column(BROKER), broker)))
    out = []
    with open_store(config.root, storage_options=config.options) as store:
        for broker, parts in sorted(by_shard.items()):
            rows = pa.concat_tables(parts)
            read = received_within(evaluated[broker], SourceRows.of(rows.column("topic"), rows.column("partition"),
                                                                    rows.column("offset")))
            rows = rows.filter(pc.is_null(rows.column(REASON)))  # set aside by the job: never in a shard
            appended, _, _ = records_to_append(rows, config.fields)
            values = _values_table(appended, VALUES_SCHEMA)
            result = store.backfill(broker, FieldBackfill(values, tuple(config.fields), read),
                                    lock_timeout_s=config.lock_timeout_s)
            out.append({"broker": broker, "line": result.line(), "records_with_values": result.records_with_values,
                        "values_added": result.values_added})
    if out:
        yield pa.RecordBatch.from_pylist(out, schema=pa.schema([
            ("broker", pa.string()), ("line", pa.string()), ("records_with_values", pa.int64()),
            ("values_added", pa.int64())]))


def received_within(requested: SourceRanges, rows: SourceRows) -> SourceRanges:
    """The offsets of `requested` the rows Kafka returned vouch for: each interval from the first
    offset returned in it on (Kafka's retention may have deleted the front since the earliest
    offsets were read: with failOnDataLoss off, Spark skips it silently), intervals nothing was
    returned of left out. Gaps after the first offset are Kafka's own (transaction markers,
    compaction): there is no record there to give a value."""
    kept: dict[tuple[str, int], tuple[tuple[int, int], ...]] = {}
    for source, where in rows.groups():
        intervals = requested.ranges.get(source)
        if not intervals:
            continue
        offsets = np.sort(rows.offset[where])
        vouched = []
        for start, end in intervals:
            first = int(np.searchsorted(offsets, start))
            if first < len(offsets) and offsets[first] < end:
                vouched.append((int(offsets[first]), end))
        if vouched:
            kept[source] = tuple(vouched)
    return SourceRanges(kept)


def _values_table(appended: pa.Table | list[MessageRecord], schema: pa.Schema) -> pa.Table:
    """The append's records (an Arrow table, or MessageRecords when a key is not UTF-8) as
    backfill values: their coordinates and field pairs."""
    if isinstance(appended, pa.Table):
        if "fields" not in appended.column_names:
            return schema.empty_table()
        return appended.select([f.name for f in schema]).cast(schema)
    return pa.Table.from_pylist([
        {"topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp_ms": r.timestamp_ms,
         "fields": [{"name": n, "value": v} for n, v in r.fields] or None} for r in appended], schema=schema)
