"""``fetchValues``: rows found in the index come back with their Kafka value and headers,
fetched from a real broker by topic/partition/offset."""

from __future__ import annotations

import time

import pytest

from msgindex.cli.failure import explain
from msgindex.storage.message import MessageRecord
from msgindex.storage.store import open_store
from tests.datasource.conftest import assert_fetched, kafka_backed_store

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def test_fetch_values_from_real_kafka(spark, kafka_bootstrap, kafka_topic, tmp_path):
    topic = kafka_topic(partitions=2)
    sent = kafka_backed_store(kafka_bootstrap, topic, tmp_path / "store")
    rows = (spark.read.format("msgindex").option("key", "cust-1").option("fetchValues", "true")
            .option("kafka.bootstrap.servers", kafka_bootstrap).load(str(tmp_path / "store")).collect())
    assert_fetched([(row.partition, row.offset, row.value, row.headers and [(h.key, h.value) for h in row.headers])
                    for row in rows], sent, "cust-1")


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
