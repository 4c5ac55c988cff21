"""The executor side of the pipeline: one task of a micro-batch writes its own rows.

No shuffle: a task gets whole Kafka input partitions (the source's slices, possibly several,
coalesced), splits its rows by shard and appends each part to that shard under the shard lock,
one lock at a time (shard_owner.py). Rows carry their source coordinates and the id of the
slice they came from, so each append commits exactly the source offset ranges it covers
(storage/source_ranges.py): whatever attempt of whatever task wrote a row first, every other
one skips it. Rows that come with a ``reason`` (malformed metadata events; records or events
whose timestamp breaks the one timestamp rule, see timestamp_rule.py) go to the quarantine,
exactly once the same way, and never reach a shard.

A task appends in chunks of at most ``APPEND_ROWS`` rows (bounded memory in the Python worker
whatever the batch size) and reports one ``TaskCommit`` per shard it touched; ``SliceOrder``
checks the one assumption chunking adds.

This module must import on executors that have only pyspark and its Arrow dependencies (the job
ships msgindex itself): no kafka-python, no driver-side modules.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import MsgIndexError
from msgindex.spark.pipeline.attempt_counts import AttemptMarkers
from msgindex.spark.pipeline.commits import TaskCommit, commits_batch
from msgindex.spark.pipeline.completed_batches import settled_for
from msgindex.spark.pipeline.kafka_records import records_to_append
from msgindex.spark.pipeline.quarantine import (
    RAW_VALUE,
    REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
    write_quarantine,
)
from msgindex.spark.pipeline.shard_owner import RetentionPolicy, append_to_shard, disk_full
from msgindex.storage.fields import FieldDefinition
from msgindex.storage.message import APPEND_SCHEMA
from msgindex.storage.shard import BeforeCommit
from msgindex.storage.source_ranges import SourceRanges, SourceRows

INPUT_RECORDS = "records"
INPUT_METADATA = "metadata"
INPUT_KINDS = (INPUT_RECORDS, INPUT_METADATA)
DEFAULT_LOCK_TIMEOUT_S = 120.0
APPEND_ROWS = 131_072  # rows per append: big enough that the per-commit fsyncs are noise
BROKER, SLICE = "broker", "slice"  # the shard column, and the source slice (Spark input partition) of a row


@dataclass(frozen=True)
class SinkConfig:
    """Everything an executor needs to write a batch (pickled into the task function)."""

    root: str
    input_kind: str
    quarantine_dir: str
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
    retention: RetentionPolicy = RetentionPolicy()
    storage_options: tuple[tuple[str, str], ...] = ()  # object stores: the client options beyond AWS_* etc.
    fields: tuple[FieldDefinition, ...] = ()  # what --index-field/--index-header declared (field_values.py)

    @property
    def options(self) -> dict[str, str] | None:
        """`storage_options` as msgindex.open takes them."""
        return dict(self.storage_options) or None


def task_function(config: SinkConfig, batch_id: int, markers: AttemptMarkers | None = None, settled=None):
    """The ``mapInArrow`` function of batch `batch_id` (the id travels in its closure; it only
    labels quarantined events; `markers`: where appends record what they commit, see
    attempt_counts.py; `settled`: per shard, the offsets of completed batches its appends commit
    too, completed_batches.py). Deliberately without annotations: pyspark infers UDF kinds from
    type hints and fails on postponed ones."""

    def write(batches):
        return write_task(config, batch_id, batches, markers, settled)

    return write


@dataclass
class _Chunk:
    """Which append of which task this is (attempt_counts.py names its markers by it)."""

    task: int
    number: int
    markers: AttemptMarkers | None
    settled: Mapping[str, SourceRanges]  # per shard (completed_batches.py)

    @property
    def marker_requests(self) -> int:
        """Object-store requests the task's markers sent so far."""
        return self.markers.requests if self.markers is not None else 0

    def before_commit(self, broker: str) -> BeforeCommit | None:
        if self.markers is None:
            return None
        return lambda result: self.markers.record(self.task, self.number, broker, result)


def write_task(config: SinkConfig, batch_id: int, batches: Iterable[pa.RecordBatch],
               markers: AttemptMarkers | None = None,
               settled: Mapping[str, SourceRanges] | None = None) -> Iterator[pa.RecordBatch]:
    """Write one task's rows (Arrow batches of the prepared columns) and yield its commits."""
    totals: dict[str | None, TaskCommit] = {}
    order = SliceOrder()
    pending: list[pa.RecordBatch] = []
    rows = 0
    task, attempt = _task_and_attempt()
    chunks = 0
    for batch in batches:
        if batch.num_rows:
            pending.append(batch)
            rows += batch.num_rows
        if rows >= APPEND_ROWS:
            _merge(totals, _write_chunk(config, batch_id, pa.Table.from_batches(pending), order,
                                        _Chunk(task, chunks, markers, settled or {})))
            pending, rows, chunks = [], 0, chunks + 1
    if pending:
        _merge(totals, _write_chunk(config, batch_id, pa.Table.from_batches(pending), order,
                                    _Chunk(task, chunks, markers, settled or {})))
    if totals:
        yield commits_batch([replace(commit, attempt=attempt, task=task)
                             for _, commit in sorted(totals.items(), key=lambda i: i[0] or "")])


class SliceOrder:
    """Guards the rule chunked appends rely on: a chunk commits [min, max + 1) of its rows of each
    source slice, so the rows of one slice must arrive in offset order (Spark's Kafka source reads
    each offset range front to back). A row behind an earlier chunk of its slice would be skipped
    as committed: fail the task instead."""

    def __init__(self) -> None:
        self.high: dict[tuple[int, str, int], int] = {}

    def check(self, sources: SourceRows) -> None:
        for (topic, partition), where in sources.groups():
            slices, offsets = sources.slice_id[where], sources.offset[where]
            for slice_id in np.unique(slices).tolist():
                mine = offsets[slices == slice_id]
                key = (slice_id, topic, partition)
                if key in self.high and int(mine.min()) <= self.high[key]:
                    raise MsgIndexError(
                        f"{topic}-{partition}: offset {int(mine.min())} arrived after offset {self.high[key]} of the "
                        f"same source slice; the task's rows are not in offset order, refusing to commit ranges"
                    )
                self.high[key] = max(self.high.get(key, -1), int(mine.max()))


def _source_rows(config: SinkConfig, table: pa.Table) -> SourceRows:
    """Each row's source coordinates: the record's own for records, the event's Kafka ones for metadata."""
    names = (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET) if config.input_kind == INPUT_METADATA \
        else ("topic", "partition", "offset")
    return SourceRows.of(*(table.column(name) for name in names), table.column(SLICE))


def _write_chunk(config: SinkConfig, batch_id: int, table: pa.Table, order: SliceOrder, chunk: _Chunk) -> list[TaskCommit]:
    order.check(_source_rows(config, table))
    commits = []
    malformed = pc.is_valid(table.column(REASON))
    if pc.any(malformed).as_py():
        commits.append(_quarantine(config, batch_id, table.filter(malformed)))
        table = table.filter(pc.invert(malformed))
    brokers = table.column(BROKER)
    if brokers.null_count:  # records input only: a malformed event has a reason
        lost = table.filter(pc.is_null(brokers))
        raise MsgIndexError(
            f"batch {batch_id}: {lost.num_rows} records of partitions with no recorded broker (e.g. "
            f"{lost.column('topic')[0].as_py()}-{lost.column('partition')[0].as_py()}); the partition had no "
            f"leader when the batch started. The batch is retried on restart."
        )
    for broker in pc.unique(brokers).to_pylist():
        commits.append(_append(config, broker, table.filter(pc.equal(brokers, broker)), chunk))
    return commits


def _append(config: SinkConfig, broker: str, part: pa.Table, chunk: _Chunk) -> TaskCommit:
    started = time.perf_counter()
    sent_before = chunk.marker_requests
    if config.input_kind == INPUT_METADATA:
        records, unkeyed, counts = part.select(APPEND_SCHEMA.names), 0, {}
    else:
        records, unkeyed, counts = records_to_append(part, config.fields)
    done = append_to_shard(config.root, broker, records, _source_rows(config, part), fields=config.fields,
                           lock_timeout_s=config.lock_timeout_s,
                           adopt_legacy_offsets=config.input_kind == INPUT_RECORDS, retention=config.retention,
                           storage_options=config.options, before_commit=chunk.before_commit(broker),
                           settled=settled_for(chunk.settled, broker))
    result, retention = done.result, done.retention
    return TaskCommit(broker, appended=result.appended, already_committed=result.already_committed,
                      keys_indexed=result.keys_indexed, unkeyed=unkeyed, write_ms=(time.perf_counter() - started) * 1000,
                      deleted_segments=len(retention.deleted_segments),
                      deleted_index_files=len(retention.deleted_index_files), deleted_bytes=retention.bytes_freed,
                      requests=done.requests + chunk.marker_requests - sent_before,
                      field_counts=json.dumps(counts, sort_keys=True) if counts else "")


def quarantine_rows(input_kind: str, table: pa.Table) -> pa.Table:
    """The quarantine's columns of malformed rows: metadata events carry them; records are their
    own source (their value travels only for such rows, see kafka_records.project_records)."""
    if input_kind == INPUT_METADATA:
        return table
    return pa.table({SOURCE_TOPIC: table.column("topic"), SOURCE_PARTITION: table.column("partition"),
                     SOURCE_OFFSET: table.column("offset"), SOURCE_TIMESTAMP: table.column("timestamp_ms"),
                     RAW_VALUE: table.column(RAW_VALUE), REASON: table.column(REASON), SLICE: table.column(SLICE)})


def _quarantine(config: SinkConfig, batch_id: int, table: pa.Table) -> TaskCommit:
    started = time.perf_counter()
    rows = quarantine_rows(config.input_kind, table)
    slices = rows.column(SLICE).to_numpy(zero_copy_only=False).astype(np.int64)
    try:
        result = write_quarantine(config.quarantine_dir, batch_id, rows, rows.column(REASON).to_pylist(), slices,
                                  lock_timeout_s=config.lock_timeout_s, storage_options=config.options)
    except OSError as error:
        full = disk_full(error, "the quarantine", config.quarantine_dir)
        if full is not None:
            raise full from None
        raise
    return TaskCommit(None, quarantined=result.written, quarantined_before=result.already,
                      write_ms=(time.perf_counter() - started) * 1000)


def _merge(totals: dict[str | None, TaskCommit], commits: list[TaskCommit]) -> None:
    for commit in commits:
        have = totals.get(commit.broker)
        totals[commit.broker] = commit if have is None else have.plus(commit)


def _task_and_attempt() -> tuple[int, int]:
    """Spark's partition id of this task and the attempt number (0, 0 outside a Spark task)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return (context.partitionId(), context.attemptNumber()) if context is not None else (0, 0)

