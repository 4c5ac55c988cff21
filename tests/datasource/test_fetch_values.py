"""``fetchValues``: rows found in the index come back with their Kafka value and headers,
fetched from a real broker by topic/partition/offset."""

from __future__ import annotations

import time

import pytest

from msgindex.cli.failure import explain
from msgindex.storage.message import MessageRecord
from msgindex.storage.store import open_store

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def test_fetch_values_from_real_kafka(spark, kafka_bootstrap, kafka_topic, tmp_path):
    from kafka import KafkaProducer

    topic = kafka_topic(partitions=2)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    sent = {}
    for i in range(40):
        key = f"cust-{i % 4}".encode()
        value = f"payload-{i}".encode() * (1 + i % 3)
        headers = [("KEYS", f"order-{i}".encode()), ("trace", bytes([i, 0, 255]))]
        meta = producer.send(topic, key=key, value=value, headers=headers).get(timeout=30)
        sent[(meta.partition, meta.offset)] = (key.decode(), i, value, headers, meta.timestamp)
    producer.close()

    records = [
        MessageRecord(topic, partition, offset, ts, key, (key, f"order-{i}"))
        for (partition, offset), (key, i, _, _, ts) in sent.items()
    ]
    # a message the log no longer has (retention): the row stays, with a null value
    records.append(MessageRecord(topic, 0, 1_000_000, records[0].timestamp_ms, "cust-1", ("cust-1",)))
    with open_store(tmp_path / "store", create=True) as store, store.writer("b0") as writer:
        writer.append(records)

    rows = (spark.read.format("msgindex").option("key", "cust-1").option("fetchValues", "true")
            .option("kafka.bootstrap.servers", kafka_bootstrap).load(str(tmp_path / "store")).collect())
    expected = {po: v for po, v in sent.items() if v[0] == "cust-1"}
    assert len(rows) == len(expected) + 1
    for row in rows:
        if row.offset == 1_000_000:
            assert row.value is None and row.headers is None
            continue
        _, _, value, headers, _ = expected[(row.partition, row.offset)]
        assert bytes(row.value) == value
        assert [(h.key, bytes(h.value)) for h in row.headers] == headers


def test_fetch_values_from_a_broker_that_does_not_answer_fails_at_load_naming_it(spark, truth):
    started = time.monotonic()
    with pytest.raises(Exception) as failure:
        spark.read.format("msgindex").option("key", "Aa").option("fetchValues", "true") \
            .option("kafka.bootstrap.servers", "127.0.0.1:1").load(str(truth.path))
    assert time.monotonic() - started < 20
    assert "KafkaUnreachableError: option 'kafka.bootstrap.servers' = '127.0.0.1:1': no Kafka broker answered " \
           "within 5 s" in str(failure.value)


def test_fetch_values_of_a_topic_kafka_does_not_have_names_it_within_seconds(spark, kafka_bootstrap, tmp_path):
    with open_store(tmp_path / "store", create=True) as store, store.writer("b0") as writer:
        writer.append([MessageRecord("deleted-topic", 0, 5, 1_700_000_000_000, "k", ("k",))])
    started = time.monotonic()
    spark.read.format("msgindex").option("key", "k").load(str(tmp_path / "store")).collect()
    plain_read_s = time.monotonic() - started  # what the same read costs without Kafka (a busy machine is slow)
    started = time.monotonic()
    with pytest.raises(Exception) as failure:
        spark.read.format("msgindex").option("key", "k").option("fetchValues", "true") \
            .option("kafka.bootstrap.servers", kafka_bootstrap).load(str(tmp_path / "store")).collect()
    assert time.monotonic() - started < plain_read_s + 10  # it used to wait 30 s for offsets
    message = explain(failure.value).line
    assert message == (f"Kafka at {kafka_bootstrap} has no topic 'deleted-topic', which the index holds messages "
                       f"of (deleted since, or another cluster?)")
