"""``fetchValues``: rows found in the index come back with their Kafka value and headers,
fetched from a real broker by topic/partition/offset."""

from __future__ import annotations

import pytest

from tests.datasource.conftest import assert_fetched, kafka_backed_store

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def test_fetch_values_from_real_kafka(spark, kafka_bootstrap, kafka_topic, tmp_path):
    topic = kafka_topic(partitions=2)
    sent = kafka_backed_store(kafka_bootstrap, topic, tmp_path / "store")
    rows = (spark.read.format("msgindex").option("key", "cust-1").option("fetchValues", "true")
            .option("kafka.bootstrap.servers", kafka_bootstrap).load(str(tmp_path / "store")).collect())
    assert_fetched([(row.partition, row.offset, row.value, row.headers and [(h.key, h.value) for h in row.headers])
                    for row in rows], sent, "cust-1")

