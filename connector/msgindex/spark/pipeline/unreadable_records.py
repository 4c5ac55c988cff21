"""A micro-batch that holds Kafka records Spark's Kafka source cannot read is indexed around them.

Spark's Kafka source converts every record's timestamp to microseconds as it reads it, whatever
columns are used: one record with CreateTime 2^63-1 fails every task that reads it, and the
query with it, on every restart (timestamp_rule.py). Such a record is outside the one timestamp
rule anyway, so it belongs in the quarantine; but Spark cannot even hand it over. So when a
batch fails that way (sink.BatchWriter), the driver:

1. reads the batch's offset ranges from Spark's checkpoint (``offsets/<batch>``, the batch before
   it or ``sources/0/0`` for the starts);
2. reads the named record's partition from that offset with kafka-python (at most
   ``SCAN_RECORDS`` records) and notes every record whose timestamp overflows;
3. runs the batch again over Spark batch reads of the same ranges minus those offsets (each
   remaining piece one Spark input partition, so exactly once by offsets holds as in the
   stream); a failure naming another such record repeats 2-3 (at most ``MAX_ROUNDS`` times);
4. sets the unreadable records aside in the quarantine with the reason, exactly once by their
   offsets like every other quarantined record (each run of consecutive offsets is its own
   slice, so its file claims no offset it does not hold).

Then the batch returns normally and Spark commits it. A replay or a new checkpoint goes the same
way and finds everything committed. The cost (one more pass over the batch per round) is only
paid by batches that hold such records.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from msgindex.errors import MsgIndexError
from msgindex.spark.pipeline.commits import TaskCommit
from msgindex.spark.pipeline.kafka_source import KafkaSource, OffsetRange
from msgindex.spark.pipeline.progress import say
from msgindex.spark.pipeline.quarantine import (
    RAW_VALUE,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
    write_quarantine,
)
from msgindex.spark.pipeline.spark_checkpoint import batch_ranges
from msgindex.spark.pipeline.task_writer import INPUT_RECORDS
from msgindex.spark.pipeline.timestamp_rule import OverflowingRecord, overflowing_record, overflows_spark
from msgindex.storage.message import timestamp_problem

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from msgindex.kafka.admin import FetchedRecord

SCAN_RECORDS = 100_000  # records read with kafka-python per round, from the record Spark named
MAX_ROUNDS = 256


def _pieces(ranges: dict[tuple[str, int], OffsetRange],
            unreadable: dict[tuple[str, int], dict[int, FetchedRecord]]) -> dict[tuple[str, int], list[OffsetRange]]:
    """The batch's ranges minus the unreadable offsets (empty pieces dropped)."""
    pieces = {}
    for tp, whole in ranges.items():
        cuts, start, parts = sorted(unreadable.get(tp, {})), whole.start, []
        for offset in cuts:
            if start is None or start < offset:
                parts.append(OffsetRange(start, offset))
            start = offset + 1
        if start is None or start < whole.end:
            parts.append(OffsetRange(start, whole.end))
        if parts:
            pieces[tp] = parts
    return pieces


def _describe(record: OverflowingRecord) -> str:
    return (f"record {record.topic}-{record.partition} offset {record.offset} has timestamp {record.timestamp_ms} ms, "
            f"which Spark's Kafka source cannot read (it overflows Spark's microsecond timestamps)")


def salvage_batch(spark: SparkSession, batch_id: int, first: OverflowingRecord, *, source: KafkaSource,
                  checkpoint: str, quarantine_dir: str, input_kind: str, lock_timeout_s: float,
                  run: Callable[[DataFrame], list[TaskCommit]]) -> list[TaskCommit]:
    """Index batch `batch_id` without the records Spark cannot read and quarantine those (see
    the module docstring); `run` runs the batch's tasks over a DataFrame of Kafka rows and
    returns their commits. The commits of the whole batch, the quarantine's last."""
    from msgindex.kafka.admin import fetch_records, needs_java_client

    if needs_java_client(source.consumer_options):
        raise MsgIndexError(f"batch {batch_id}: {_describe(first)}; msgindex sets such records aside by reading them "
                            f"with kafka-python, which cannot use the Java client's security settings given with "
                            f"--kafka-option: fix or delete the record in Kafka")
    say(f"batch {batch_id}: {_describe(first)}; indexing the batch without such records and setting them aside")
    ranges = batch_ranges(spark, checkpoint, batch_id)
    unreadable: dict[tuple[str, int], dict[int, FetchedRecord]] = defaultdict(dict)
    report = first
    for _ in range(MAX_ROUNDS):
        tp = (report.topic, report.partition)
        window = ranges.get(tp)
        if window is None or window.end <= report.offset or (window.start or 0) > report.offset:
            raise MsgIndexError(f"batch {batch_id}: {_describe(report)}, and the batch's offset range of that partition "
                                f"could not be read from the Spark checkpoint {checkpoint}")
        if report.offset in unreadable[tp]:
            raise MsgIndexError(f"batch {batch_id}: {_describe(report)}; the batch still fails on it after leaving it out")
        fetched = fetch_records(source.bootstrap_servers, report.topic, report.partition, report.offset, window.end,
                                limit=SCAN_RECORDS, isolation_level=source.isolation_level)
        unreadable[tp].update({r.offset: r for r in fetched if overflows_spark(r.timestamp_ms)})
        if report.offset not in unreadable[tp]:
            raise MsgIndexError(f"batch {batch_id}: Spark says {_describe(report)}, but Kafka returns that offset "
                                f"with another timestamp (or not at all)")
        frame = source.read_pieces(spark, _pieces(ranges, unreadable))
        try:
            commits = run(frame) if frame is not None else []
            break
        except Exception as error:
            report = overflowing_record(error)
            if report is None:
                raise
    else:
        raise MsgIndexError(f"batch {batch_id}: more than {MAX_ROUNDS} rounds of records Spark's Kafka source cannot "
                            f"read (the last: {_describe(report)}); is a producer writing timestamps in micro- or "
                            f"nanoseconds? Fix the producer and the records in Kafka")
    return [*commits, _quarantine(unreadable, batch_id, quarantine_dir, input_kind, lock_timeout_s)]


def _quarantine(unreadable: dict[tuple[str, int], dict[int, FetchedRecord]], batch_id: int, quarantine_dir: str,
                input_kind: str, lock_timeout_s: float) -> TaskCommit:
    records = [(tp, record) for tp, found in sorted(unreadable.items()) for _, record in sorted(found.items())]
    if not records:
        return TaskCommit(None)
    offsets = np.array([record.offset for _, record in records], np.int64)
    partitions = [tp for tp, _ in records]
    # a new slice wherever the partition changes or the offsets stop being consecutive
    breaks = np.r_[True, (np.diff(offsets) != 1) | np.array([a != b for a, b in zip(partitions, partitions[1:])], bool)]
    table = pa.table({
        SOURCE_TOPIC: [topic for (topic, _), _ in records],
        SOURCE_PARTITION: pa.array([partition for (_, partition), _ in records], pa.int32()),
        SOURCE_OFFSET: pa.array(offsets),
        SOURCE_TIMESTAMP: pa.array([record.timestamp_ms for _, record in records], pa.int64()),
        RAW_VALUE: pa.array([record.value for _, record in records], pa.binary()),
    })
    prefix = "" if input_kind == INPUT_RECORDS else "the Kafka record's "
    reasons = [prefix + (timestamp_problem(record.timestamp_ms) or "") for _, record in records]
    result = write_quarantine(quarantine_dir, batch_id, table, reasons, np.cumsum(breaks) - 1, lock_timeout_s=lock_timeout_s)
    return TaskCommit(None, quarantined=result.written, quarantined_before=result.already)
