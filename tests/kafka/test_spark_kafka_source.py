"""Records produced with kafka-python come back unchanged through Spark's own `kafka` batch source,
read in the shared SparkSession (connector jars staged locally, no Ivy)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime

import pyspark
import pytest

from msgindex.kafka.admin import (
    KEYS_HEADER,
    UNIQ_KEY_HEADER,
    OutgoingRecord,
    broker_addresses,
    latest_offsets,
    partition_leaders,
    produce,
)
from msgindex.spark.runtime.session import _artifact_of, _pyspark_jars_dir, kafka_connector_jars

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

PARTITIONS = 3
BASE_TS = 1_700_000_000_000


def _records() -> list[OutgoingRecord]:
    records = []
    for i in range(60):
        records.append(OutgoingRecord(
            key=f"order-{i % 17}",
            value=f"payload {i}",
            partition=i % PARTITIONS,
            timestamp_ms=BASE_TS + i * 1_001,
            keys=(f"k{i}", f"shared-{i % 5}") if i % 3 else (),
            uniq_key=f"UNIQ{i:04d}" if i % 2 == 0 else None,
            headers=(("trace", bytes([i, 0, 255])),),
        ))
    # the awkward ones: no key, a key that is not UTF-8, an empty key, a non-ASCII key
    records.append(OutgoingRecord(key=None, value="no key", partition=0, timestamp_ms=BASE_TS))
    records.append(OutgoingRecord(key=b"\xff\xfe raw", value=None, partition=1, timestamp_ms=BASE_TS))
    records.append(OutgoingRecord(key="", value="empty key", partition=2, timestamp_ms=BASE_TS))
    records.append(OutgoingRecord(key="ключ-键", value="unicode", partition=2, timestamp_ms=BASE_TS,
                                  keys=("ключ", "键")))
    return records


def _as_bytes(value):
    return value.encode() if isinstance(value, str) else value


def _expected_rows(topic, records, placed):
    rows = set()
    for record, (partition, offset) in zip(records, placed):
        headers = tuple((name, bytes(value)) for name, value in record.header_list())
        rows.add((topic, partition, offset, _as_bytes(record.key), _as_bytes(record.value),
                  record.timestamp_ms, headers))
    return rows


@pytest.fixture(scope="module")
def produced(kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=PARTITIONS, prefix="spark-src")
    records = _records()
    placed = produce(kafka_bootstrap, topic, records)
    return topic, records, placed


def _read_back(spark, bootstrap, topic):
    # Every partition and its end offset named explicitly: Spark's own discovery of a topic created
    # a moment ago can lag its metadata (seen once: a partition missing from the read).
    ends = {str(partition): end for (_, partition), end in latest_offsets(bootstrap, [topic]).items()}
    frame = (spark.read.format("kafka")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("assign", json.dumps({topic: sorted(map(int, ends))}))
             .option("includeHeaders", "true")
             .option("startingOffsets", json.dumps({topic: {p: -2 for p in ends}}))
             .option("endingOffsets", json.dumps({topic: ends}))
             .load())
    rows = set()
    for row in frame.collect():
        ts = row.timestamp
        assert ts.tzinfo is None  # Spark returns session-time-zone (UTC) wall clock
        millis = int(ts.replace(tzinfo=UTC).timestamp() * 1000 + 0.5)
        headers = tuple((h.key, bytes(h.value)) for h in (row.headers or []))
        rows.add((row.topic, row.partition, row.offset,
                  None if row.key is None else bytes(row.key),
                  None if row.value is None else bytes(row.value), millis, headers))
    return frame, rows


def test_spark_reads_back_exactly_what_kafka_python_produced(spark, kafka_bootstrap, produced):
    topic, records, placed = produced
    frame, rows = _read_back(spark, kafka_bootstrap, topic)
    assert [f.name for f in frame.schema.fields] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    assert rows == _expected_rows(topic, records, placed)
    assert len(rows) == len(records)
    per_partition = Counter(partition for _, partition, *_ in rows)
    assert sorted(per_partition) == list(range(PARTITIONS))


def test_keys_and_uniq_key_headers_survive_the_round_trip(spark, kafka_bootstrap, produced):
    topic, records, _ = produced
    _, rows = _read_back(spark, kafka_bootstrap, topic)
    seen_keys = Counter()
    seen_uniq = set()
    for *_, headers in rows:
        for name, value in headers:
            if name == KEYS_HEADER:
                seen_keys.update(value.decode().split(" "))
            elif name == UNIQ_KEY_HEADER:
                seen_uniq.add(value.decode())
    assert seen_keys["shared-1"] == sum(1 for i in range(60) if i % 3 and i % 5 == 1)
    assert {"ключ", "键", "k1", "k59"} <= set(seen_keys)
    assert seen_uniq == {f"UNIQ{i:04d}" for i in range(0, 60, 2)}


def test_admin_helpers_agree_with_what_was_produced(kafka_bootstrap, produced):
    topic, records, placed = produced
    ends = latest_offsets(kafka_bootstrap, [topic])
    counts = Counter(partition for partition, _ in placed)
    assert ends == {(topic, p): counts[p] for p in range(PARTITIONS)}
    leaders = partition_leaders(kafka_bootstrap, [topic])
    assert set(leaders) == {(topic, p) for p in range(PARTITIONS)}
    assert set(leaders.values()) <= set(broker_addresses(kafka_bootstrap))


def test_connector_jars_match_pyspark_and_skip_what_pyspark_ships():
    jars = kafka_connector_jars()
    names = {_artifact_of(jar): jar.name for jar in jars}
    assert names["spark-sql-kafka-0-10_2.13"] == f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar"
    assert {"spark-token-provider-kafka-0-10_2.13", "kafka-clients", "commons-pool2"} <= set(names)
    # from_avro/to_avro: spark-avro at the same version; Avro itself and xz come with pyspark
    assert names["spark-avro_2.13"] == f"spark-avro_2.13-{pyspark.__version__}.jar"
    assert len(names) == len(jars)  # each artifact once
    if pyspark.__version__ == "4.2.0":  # the versions spark-parent 4.2.0's pom pins
        assert names["kafka-clients"] == "kafka-clients-3.9.2.jar"
        assert names["commons-pool2"] == "commons-pool2-2.13.1.jar"
    shipped = {_artifact_of(jar) for jar in _pyspark_jars_dir().glob("*.jar")}
    assert not shipped & set(names)
    assert all(jar.is_file() for jar in jars)


def test_session_has_the_settings_msgindex_relies_on(spark):
    conf = spark.conf
    assert conf.get("spark.sql.session.timeZone") == "UTC"
    assert conf.get("spark.sql.python.filterPushdown.enabled") == "true"
    assert conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    jars = spark.sparkContext.getConf().get("spark.jars")
    assert f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar" in jars
    assert f"spark-avro_2.13-{pyspark.__version__}.jar" in jars
    # the session's clock reads UTC: a known instant renders as its UTC wall time
    shown = spark.sql("SELECT CAST(TIMESTAMP_MILLIS(0) AS STRING) AS t").first().t
    assert shown == datetime(1970, 1, 1, tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S")


def test_session_conf_lets_callers_override_but_keeps_the_connector_jars():
    from msgindex.spark.runtime.session import session_conf

    conf = session_conf("x", "local[1]", {"spark.sql.shuffle.partitions": 7, "spark.jars": "/opt/extra.jar"},
                        user_conf={})  # only the caller's settings (not those of a JVM this test session runs)
    assert conf["spark.master"] == "local[1]" and conf["spark.app.name"] == "x"
    assert conf["spark.sql.shuffle.partitions"] == "7"
    jars = conf["spark.jars"].split(",")
    assert jars[-1] == "/opt/extra.jar"
    assert [str(jar) for jar in kafka_connector_jars()] == jars[:-1]
