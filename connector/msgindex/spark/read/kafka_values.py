"""Fetch found messages' values and headers from Kafka by (topic, partition, offset).

The index keeps metadata only; ``fetchValues`` completes the rows it found with the payload,
read back with kafka-python: per partition, seek to each wanted offset (in order) and poll until
the broker has returned a record at or past it. A message that retention or compaction removed
comes back with a null value and null headers.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import pyarrow as pa

from msgindex.errors import BrokerError

HEADER_TYPE = pa.struct([
    pa.field("key", pa.string(), nullable=False),
    pa.field("value", pa.binary(), nullable=True),
])
# appended to ROW_SCHEMA with fetchValues (Spark: value binary, headers array<struct<key,value>>)
VALUE_FIELDS = (
    pa.field("value", pa.binary(), nullable=True),
    pa.field("headers", pa.list_(pa.field("element", HEADER_TYPE, nullable=False)), nullable=True),
)
POLL_TIMEOUT_MS = 500
FETCH_DEADLINE_S = 30.0

# Python workers are reused between tasks: one consumer per bootstrap string and worker process
# saves a connection handshake per batch.
_consumers: dict[str, Any] = {}


def _consumer(bootstrap_servers: str):
    consumer = _consumers.get(bootstrap_servers)
    if consumer is None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        try:
            consumer = KafkaConsumer(
                bootstrap_servers=bootstrap_servers.split(","), group_id=None,
                enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                client_id="msgindex-fetch-values",
            )
        except KafkaError as error:
            raise BrokerError(
                f"option 'kafka.bootstrap.servers' = {bootstrap_servers!r}: cannot connect ({error})"
            ) from None
        _consumers[bootstrap_servers] = consumer
    return consumer


def fetch_values(bootstrap_servers: str, batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` (ROW_SCHEMA) with ``value`` and ``headers`` columns appended (no rows: Kafka is
    not asked, so an empty answer needs no broker)."""
    wanted: dict[tuple[str, int], set[int]] = defaultdict(set)
    topics = batch.column("topic").to_pylist()
    partitions = batch.column("partition").to_pylist()
    offsets = batch.column("offset").to_pylist()
    for topic, partition, offset in zip(topics, partitions, offsets):
        wanted[(topic, partition)].add(offset)
    found: dict[tuple[str, int, int], Any] = {}
    consumer = _consumer(bootstrap_servers) if wanted else None
    for (topic, partition), offsets_of_partition in wanted.items():
        for offset, record in _read_offsets(consumer, topic, partition, sorted(offsets_of_partition)).items():
            found[(topic, partition, offset)] = record
    values, headers = [], []
    for row in zip(topics, partitions, offsets):
        record = found.get(row)
        values.append(None if record is None else record.value)
        headers.append(None if record is None else [
            {"key": key, "value": value} for key, value in (record.headers or [])
        ])
    columns = batch.columns + [pa.array(values, VALUE_FIELDS[0].type), pa.array(headers, VALUE_FIELDS[1].type)]
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(list(batch.schema) + list(VALUE_FIELDS)))


def _read_offsets(consumer, topic: str, partition: int, offsets: list[int]) -> dict[int, Any]:
    """Records at `offsets` (sorted) of one partition; offsets no longer in the log are absent."""
    from kafka import TopicPartition

    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    first = consumer.beginning_offsets([tp])[tp]
    end = consumer.end_offsets([tp])[tp]
    records: dict[int, Any] = {}
    highest_seen = -1
    for offset in offsets:
        if offset < first or offset >= end or offset <= highest_seen:
            continue  # deleted, not yet written, or compacted away inside what was fetched
        consumer.seek(tp, offset)
        deadline = time.monotonic() + FETCH_DEADLINE_S
        while highest_seen < offset:
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"fetchValues: no record at or after offset {offset} of {topic}-{partition} "
                    f"arrived within {FETCH_DEADLINE_S:.0f}s (log end offset {end})"
                )
            for record in consumer.poll(timeout_ms=POLL_TIMEOUT_MS).get(tp, []):
                records[record.offset] = record
                highest_seen = max(highest_seen, record.offset)
    return records
