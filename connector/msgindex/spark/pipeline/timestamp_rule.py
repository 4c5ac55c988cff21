"""The one timestamp rule (``storage.message.timestamp_problem``: years 0001..9999) where the
pipeline applies it, and the narrower limit of Spark's own Kafka source.

* In the JVM: ``timestamp_reason(ms)`` is a column that holds exactly ``timestamp_problem(ms)``'s
  text for a timestamp outside the rule and null otherwise, so that records (their Kafka
  timestamp) and metadata events (their ``storeTimestamp``) are set aside with the same reason
  the storage layer would give, without a Python call per row.
* Spark's Kafka source turns a record's millisecond timestamp into microseconds when it reads
  the record, whatever columns are selected; a timestamp beyond ``SPARK_KAFKA_MAX_MS`` (e.g.
  CreateTime 2^63-1) overflows and fails the task with ``KafkaIllegalStateException`` naming the
  record. ``overflowing_record(error)`` recognises that failure (see sink.py for what the batch
  then does); ``overflows_spark(ms)`` is the same test for a timestamp read with another client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from msgindex.storage.message import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS, timestamp_problem

if TYPE_CHECKING:
    from pyspark.sql import Column

# Spark's TimestampType holds microseconds in a signed 64-bit integer.
SPARK_KAFKA_MAX_MS = (2**63 - 1) // 1000
SPARK_KAFKA_MIN_MS = -(2**63) // 1000 + 1

# timestamp_problem's text around the number: the JVM builds the same text
_PROBE = MAX_TIMESTAMP_MS + 1
_PREFIX, _, _SUFFIX = timestamp_problem(_PROBE).partition(str(_PROBE))
assert _PREFIX and _SUFFIX and timestamp_problem(_PROBE) == f"{_PREFIX}{_PROBE}{_SUFFIX}"

# KafkaRecordToRowConverter's message (spark-sql-kafka-0-10 4.x)
_OVERFLOW = re.compile(r"Record at topic (?P<topic>\S+) partition (?P<partition>\d+) offset (?P<offset>\d+) "
                       r"has timestamp value (?P<timestamp>-?\d+) that overflows")


def timestamp_reason(ms: Column, field: str | None = None) -> Column:
    """``timestamp_problem(ms)`` as a Spark column (null when `ms` is inside the rule or null),
    prefixed with ``"<field>: "`` when a field is named."""
    from pyspark.sql import functions as F

    text = F.concat(F.lit((f"{field}: " if field else "") + _PREFIX), ms.cast("string"), F.lit(_SUFFIX))
    return F.when((ms < F.lit(MIN_TIMESTAMP_MS)) | (ms > F.lit(MAX_TIMESTAMP_MS)), text)


def overflows_spark(timestamp_ms: int) -> bool:
    """Whether Spark's Kafka source fails on a record with this timestamp."""
    return not SPARK_KAFKA_MIN_MS <= timestamp_ms <= SPARK_KAFKA_MAX_MS


@dataclass(frozen=True)
class OverflowingRecord:
    """A Kafka record that Spark's Kafka source cannot read (its timestamp overflows)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


def overflowing_record(error: BaseException) -> OverflowingRecord | None:
    """The record named by Spark's timestamp-overflow failure inside `error`'s text (a Py4J or
    Spark Connect error of a job reading Kafka), or None when `error` is something else."""
    texts = [str(error)]
    java = getattr(error, "java_exception", None)
    if java is not None:
        try:
            texts.append(str(java.toString()))
        except Exception:  # the JVM may be gone: the Python text is all there is
            pass
    for text in texts:
        found = _OVERFLOW.search(text)
        if found:
            return OverflowingRecord(found["topic"], int(found["partition"]), int(found["offset"]), int(found["timestamp"]))
    return None
