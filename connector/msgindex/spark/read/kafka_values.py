"""Fetch found messages' values and headers from Kafka by (topic, partition, offset).

The index keeps metadata only; ``fetchValues`` (and ``msgindex lookup --values``, and the search
page's payloads) complete the rows it found with the payload, read back with kafka-python: per
partition, seek to each wanted offset (in order) and poll until the broker has returned a record
at or past it. A message that retention or compaction removed comes back with a null value and
null headers.

What goes wrong says so at once, in one line naming it: no broker answering at the bootstrap
address (within ``CONNECT_TIMEOUT_S``), a topic or partition the cluster does not have (the
index holds messages of it: deleted since, or another cluster), a broker that stops answering.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from msgindex.errors import BrokerError, KafkaUnreachableError, TopicNotFoundError
from msgindex.kafka.admin import bootstrap_addresses

if TYPE_CHECKING:
    from kafka import KafkaConsumer

HEADER_TYPE = pa.struct([
    pa.field("key", pa.string(), nullable=False),
    pa.field("value", pa.binary(), nullable=True),
])
# appended to ROW_SCHEMA with fetchValues (Spark: value binary, headers array<struct<key,value>>)
VALUE_FIELDS = (
    pa.field("value", pa.binary(), nullable=True),
    pa.field("headers", pa.list_(pa.field("element", HEADER_TYPE, nullable=False)), nullable=True),
)
OPTION = "option 'kafka.bootstrap.servers'"
CONNECT_TIMEOUT_S = 5.0  # kafka-python waits 30 s for its bootstrap by default
REQUEST_TIMEOUT_S = 10.0
POLL_TIMEOUT_MS = 500
FETCH_DEADLINE_S = 10.0

MessageId = tuple[str, int, int]  # (topic, partition, offset)

# Python workers are reused between tasks: one consumer per bootstrap string and worker process
# saves a connection handshake per batch.
_consumers: dict[str, Any] = {}


def consumer_for(bootstrap_servers: str, *, what: str = OPTION) -> KafkaConsumer:
    """A (cached) consumer of `bootstrap_servers`; KafkaUnreachableError naming `what` and the
    address when no broker answers within CONNECT_TIMEOUT_S."""
    consumer = _consumers.get(bootstrap_servers)
    if consumer is None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        bootstrap_addresses(bootstrap_servers, option=what)
        try:
            consumer = KafkaConsumer(
                bootstrap_servers=bootstrap_servers.split(","), group_id=None,
                enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                client_id="msgindex-fetch-values", bootstrap_timeout_ms=int(CONNECT_TIMEOUT_S * 1000),
                request_timeout_ms=int(REQUEST_TIMEOUT_S * 1000),
            )
        except KafkaError as error:
            raise KafkaUnreachableError(
                f"{what} = {bootstrap_servers!r}: no Kafka broker answered within {CONNECT_TIMEOUT_S:.0f} s "
                f"({type(error).__name__})") from None
        _consumers[bootstrap_servers] = consumer
    return consumer


def fetch_messages(bootstrap_servers: str, wanted: Iterable[MessageId], *, what: str = OPTION) -> dict[MessageId, Any]:
    """The Kafka records (kafka-python ConsumerRecords) at `wanted`; ids no longer in the log
    are absent. TopicNotFoundError / KafkaUnreachableError / BrokerError say what is wrong."""
    by_partition: dict[tuple[str, int], set[int]] = defaultdict(set)
    for topic, partition, offset in wanted:
        by_partition[(topic, partition)].add(offset)
    consumer = consumer_for(bootstrap_servers, what=what)
    found: dict[MessageId, Any] = {}
    try:
        for (topic, partition), offsets in sorted(by_partition.items()):
            _check_partition(consumer, bootstrap_servers, topic, partition)
            for offset, record in _read_offsets(consumer, bootstrap_servers, topic, partition, sorted(offsets)).items():
                found[(topic, partition, offset)] = record
    except BrokerError:
        _forget(bootstrap_servers)
        raise
    return found


def fetch_values(bootstrap_servers: str, batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` (ROW_SCHEMA, possibly with more columns) with ``value`` and ``headers`` appended (no
    rows: Kafka is not asked, so an empty answer needs no broker)."""
    topics = batch.column("topic").to_pylist()
    partitions = batch.column("partition").to_pylist()
    offsets = batch.column("offset").to_pylist()
    ids = list(zip(topics, partitions, offsets))
    found = fetch_messages(bootstrap_servers, ids) if ids else {}
    values, headers = [], []
    for row in ids:
        record = found.get(row)
        values.append(None if record is None else record.value)
        headers.append(None if record is None else [
            {"key": key, "value": value} for key, value in (record.headers or [])
        ])
    columns = batch.columns + [pa.array(values, VALUE_FIELDS[0].type), pa.array(headers, VALUE_FIELDS[1].type)]
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(list(batch.schema) + list(VALUE_FIELDS)))


def _check_partition(consumer, bootstrap_servers: str, topic: str, partition: int) -> None:
    partitions = consumer.partitions_for_topic(topic)
    if not partitions or partition not in partitions:
        consumer.topics()  # cached metadata may predate the topic: ask the cluster again
        partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        raise TopicNotFoundError(
            f"Kafka at {bootstrap_servers} has no topic {topic!r}, which the index holds messages of "
            f"(deleted since, or another cluster?)")
    if partition not in partitions:
        raise TopicNotFoundError(
            f"Kafka at {bootstrap_servers} has no partition {partition} of topic {topic!r} (it has "
            f"{len(partitions)}), which the index holds messages of")


def _read_offsets(consumer, bootstrap_servers: str, topic: str, partition: int, offsets: list[int]) -> dict[int, Any]:
    """Records at `offsets` (sorted) of one partition; offsets no longer in the log are absent."""
    from kafka import TopicPartition
    from kafka.errors import KafkaError

    tp = TopicPartition(topic, partition)
    try:
        consumer.assign([tp])
        first = consumer.beginning_offsets([tp])[tp]
        end = consumer.end_offsets([tp])[tp]
    except KafkaError as error:
        raise BrokerError(f"Kafka at {bootstrap_servers} did not answer for {topic}-{partition} within "
                          f"{REQUEST_TIMEOUT_S:.0f} s ({type(error).__name__})") from None
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
                    f"Kafka at {bootstrap_servers}: no record at or after offset {offset} of {topic}-{partition} "
                    f"arrived within {FETCH_DEADLINE_S:.0f} s (log end offset {end})"
                )
            for record in consumer.poll(timeout_ms=POLL_TIMEOUT_MS).get(tp, []):
                records[record.offset] = record
                highest_seen = max(highest_seen, record.offset)
    return records


def _forget(bootstrap_servers: str) -> None:
    consumer = _consumers.pop(bootstrap_servers, None)
    if consumer is not None:
        try:
            consumer.close()
        except Exception:  # closing a consumer of a dead broker may fail too; it is dropped either way
            pass
