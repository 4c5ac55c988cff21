"""Retention that runs itself: the indexing job's shard writers apply `--retention-ms` /
`--retention-bytes` between appends (by default the longest `retention.ms` of the indexed
topics), the index stays bounded, and the rule "every record a scan returns is found by a lookup
of each of its keys" (R2) holds after every pass."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from msgindex.cli import index as index_cli
from msgindex.kafka.admin import OutgoingRecord, create_topics, produce
from msgindex.spark.pipeline.job import index_kafka, retention_policy
from msgindex.spark.pipeline.shard_owner import RetentionPolicy
from tests.pipeline.support import SMALL_STORE, job_args, run_job_in_process

pytestmark = pytest.mark.kafka

DAY_MS = 86_400_000
OLD, NEW = 6_000, 14_000  # records 30 days old, then records of now (one partition: log order is offset order)
MAX_BYTES = 1_500_000
# An append of 2,500 of these records takes ~20 kB of log (batch version 3; 24 kB in version 2):
# each append rolls a segment of its own, so the old records' first two are wholly older than a day
# (at 64 kB three appends shared one, and the third holds new records).
SEGMENT_BYTES = 16 * 1024
LATER_SEGMENT_BYTES = 8 * 1024  # the later topic's old records fill several segments
INDEX_FILE_BYTES = 40 + 4099 * 4 + 20000 * 20  # support.SMALL_STORE's hash index file


def _options(bootstrap: str, topics: list[str], path: Path, *extra: str):
    return index_cli.options_from_args(index_cli.build_parser().parse_args(job_args(bootstrap, topics, path, *extra)))


def test_the_default_age_is_the_longest_retention_of_the_indexed_topics(kafka_bootstrap, tmp_path):
    hour, two_hours, forever = (f"ret-{uuid.uuid4().hex[:10]}" for _ in range(3))
    create_topics(kafka_bootstrap, {hour: 1}, configs={"retention.ms": "3600000"})
    create_topics(kafka_bootstrap, {two_hours: 1}, configs={"retention.ms": "7200000"})
    create_topics(kafka_bootstrap, {forever: 1}, configs={"retention.ms": "-1"})

    policy, line = retention_policy(_options(kafka_bootstrap, [hour, two_hours], tmp_path), [hour, two_hours])
    assert (policy.max_age_ms, policy.max_bytes) == (7_200_000, None)
    assert f"segments older than 2 h (the longest retention.ms of the indexed topics: {two_hours})" in line
    policy, line = retention_policy(_options(kafka_bootstrap, [hour, forever], tmp_path), [hour, forever])
    assert policy.max_age_ms is None and "no age limit" in line  # a topic that keeps everything: so does the index
    explicit = _options(kafka_bootstrap, [hour], tmp_path, "--retention-ms", "30m", "--retention-bytes", "2MiB")
    policy, line = retention_policy(explicit, [hour])
    assert (policy.max_age_ms, policy.max_bytes) == (1_800_000, 2 << 20) and "(--retention-ms)" in line


def test_the_default_age_follows_topics_indexed_later():
    """A pattern subscription may match topics created after the job started: their retention.ms
    joins the default age limit (never shortens it); an explicit --retention-ms stays."""
    policy = RetentionPolicy(max_age_ms=3_600_000, age_from_topics=("a",))
    assert policy.widened({"b": 7_200_000}) == RetentionPolicy(max_age_ms=7_200_000, age_from_topics=("a", "b"))
    assert policy.widened({"b": 60_000}).max_age_ms == 3_600_000
    assert policy.widened({"b": 60_000, "c": -1}).max_age_ms is None and not policy.widened({"c": -1}).follows_topics
    assert policy.widened({"b": -1}).age_text == "no age limit" and policy.age_text == "segments older than 1 h"
    explicit = RetentionPolicy(max_age_ms=1_800_000)
    assert explicit.widened({"b": -1}) is explicit


def test_a_new_topic_whose_retention_cannot_be_read_lifts_the_age_limit(tmp_path, monkeypatch, capsys):
    """A unit test of the fallback (Kafka answers, then not about the new topic's config): the
    index never deletes what Kafka might still keep."""
    from msgindex.errors import BrokerError
    from msgindex.kafka import admin
    from msgindex.spark.pipeline.kafka_source import KafkaSource
    from msgindex.spark.pipeline.sink import BatchWriter
    from msgindex.spark.pipeline.task_writer import SinkConfig

    def unreadable(bootstrap, topics):
        raise BrokerError(f"reading retention.ms of topics {list(topics)} on {bootstrap} failed")

    monkeypatch.setattr(admin, "topic_retention_ms", unreadable)
    config = SinkConfig(str(tmp_path), "records", str(tmp_path / "q"),
                        retention=RetentionPolicy(max_age_ms=3_600_000, age_from_topics=("a",)))
    writer = BatchWriter(config, source=KafkaSource("127.0.0.1:9", subscribe_pattern="[ab]"))
    writer.partition_brokers.extend({("a", 0): "1", ("b", 0): "1"})
    writer._follow_new_topics()
    assert writer.config.retention.max_age_ms is None and writer.config.retention.age_from_topics == ("a", "b")
    assert "retention: now no age limit (the retention.ms of new topics could not be read: " in capsys.readouterr().out


def _indexed(index: Path, topic: str) -> int:
    import msgindex

    try:
        with msgindex.open(index) as store:
            return sum(batch.num_rows for batch in store.scan(topics=[topic]))
    except Exception:  # noqa: BLE001 - not created yet
        return 0


@pytest.mark.spark
def test_a_topic_matched_later_keeps_its_records_for_its_own_retention(kafka_bootstrap, spark, tmp_path, capsys):
    """`--subscribe-pattern` without --retention-ms: the age limit settled at start (1 h) must
    not delete the records of a topic created later that Kafka keeps forever."""
    prefix = f"later-{uuid.uuid4().hex[:8]}"
    hour, forever = f"{prefix}-hour", f"{prefix}-forever"
    create_topics(kafka_bootstrap, {hour: 1}, configs={"retention.ms": "3600000"})
    # 2 h old: the index may drop them (so may Kafka), and with them any segment after them that
    # only holds old records: retention deletes a prefix of the log
    two_hours_ago = int(time.time() * 1000) - 2 * 3_600_000
    produce(kafka_bootstrap, hour, [OutgoingRecord(f"h{n}", b"v", timestamp_ms=two_hours_ago + n, keys=(f"h{n}",))
                                    for n in range(100)])
    index = tmp_path / "index"
    args = ["--bootstrap-servers", kafka_bootstrap, "--subscribe-pattern", f"{prefix}-.*", "--path", str(index),
            *SMALL_STORE, "--segment-bytes", str(LATER_SEGMENT_BYTES), "--trigger-interval", "1 second",
            "--retention-interval", "0.001", "--quiet-spark", "--kafka-option", "metadata.max.age.ms=1000"]
    stop, outcome = threading.Event(), {}

    def job() -> None:
        try:
            outcome["history"] = index_kafka(index_cli.options_from_args(index_cli.build_parser().parse_args(args)),
                                             stop=stop)
        except Exception as error:  # noqa: BLE001 - reported below
            outcome["error"] = error

    runner = threading.Thread(target=job, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 240
        while _indexed(index, hour) < 100:
            assert runner.is_alive() and time.monotonic() < deadline, outcome
            time.sleep(0.5)
        create_topics(kafka_bootstrap, {forever: 1}, configs={"retention.ms": "-1"})
        month_ago = int(time.time() * 1000) - 30 * DAY_MS
        produce(kafka_bootstrap, forever, [OutgoingRecord(f"f{n}", b"v", timestamp_ms=month_ago + n, keys=(f"f{n % 300}",))
                                           for n in range(OLD)])
        while _indexed(index, forever) < OLD:
            assert runner.is_alive() and time.monotonic() < deadline, outcome
            time.sleep(0.5)
        # one more append (and retention pass) after the old records' segments were sealed
        produce(kafka_bootstrap, hour, [OutgoingRecord(f"h{n}", b"v", keys=(f"h{n}",)) for n in range(100, 200)])
        while _indexed(index, hour) < 200:
            assert runner.is_alive() and time.monotonic() < deadline, outcome
            time.sleep(0.5)
    finally:
        stop.set()
        runner.join(120)
    assert "error" not in outcome, outcome
    assert _indexed(index, forever) == OLD  # none of them deleted by the 1 h limit settled at start
    assert _indexed(index, hour) == 200
    out = capsys.readouterr().out
    assert "retention: segments older than 1 h" in out and "retention: now no age limit" in out, out[-3000:]


def _shard_bytes(index: Path) -> int:
    return sum(f.stat().st_size for shard in index.glob("broker=*") for f in shard.rglob("*") if f.is_file())


@pytest.mark.spark
def test_a_job_with_retention_keeps_the_index_bounded_and_every_scanned_record_found(kafka_bootstrap, spark, tmp_path):
    topic = f"ret-{uuid.uuid4().hex[:10]}"
    create_topics(kafka_bootstrap, {topic: 1}, configs={"retention.ms": "-1"})  # Kafka itself keeps the old ones
    now = int(time.time() * 1000)
    produce(kafka_bootstrap, topic, [OutgoingRecord(f"k{n}", b"v", timestamp_ms=now - 30 * DAY_MS + n, keys=(f"o{n % 500}",))
                                     for n in range(OLD)])
    produce(kafka_bootstrap, topic, [OutgoingRecord(f"k{n}", b"v", keys=(f"o{n % 500}",)) for n in range(OLD, OLD + NEW)])

    index = tmp_path / "index"
    args = job_args(kafka_bootstrap, [topic], index, "--available-now", "--quiet-spark", "--max-offsets-per-trigger", "2500",
                    "--segment-bytes", str(SEGMENT_BYTES), "--retention-ms", "1d", "--retention-bytes", str(MAX_BYTES),
                    "--retention-interval", "0.001")
    history = run_job_in_process(args)
    assert sum(s.appended for s in history) == OLD + NEW
    assert sum(s.deleted_segments for s in history) > 0 and sum(s.deleted_bytes for s in history) > 0

    import msgindex

    with msgindex.open(index) as store:
        rows = [row for batch in store.scan(topics=[topic]) for row in batch.to_pylist()]
        offsets = sorted(row["offset"] for row in rows)
        # retention drops whole segments from the front: what is left is a suffix of the log
        assert offsets == list(range(offsets[0], OLD + NEW)) and 0 < offsets[0]
        old_left = sum(row["timestamp"].timestamp() * 1000 < now - DAY_MS for row in rows)
        assert old_left < OLD // 4, old_left  # at most the tail of the segment where old met new
        # R2: every record a scan returns is found by a lookup of each of its keys, and no lookup
        # returns a record the scan does not (nothing deleted is still indexed)
        scanned = {row["offset"] for row in rows}
        keys = sorted({key for row in rows for key in row["keys"]})
        found = store.lookup(keys, topic=topic)
        assert set(found.column("offset").to_pylist()) == scanned
        for row in rows[:: max(len(rows) // 40, 1)]:  # and key by key, for a sample
            for key in row["keys"]:
                assert row["offset"] in store.lookup(key, topic=topic).column("offset").to_pylist(), (key, row["offset"])
    # bounded: the byte limit, plus the files retention may never delete (the active segment and index file)
    assert _shard_bytes(index) <= MAX_BYTES + SEGMENT_BYTES + INDEX_FILE_BYTES, _shard_bytes(index)
