"""Retention that runs itself: the indexing job's shard writers apply `--retention-ms` /
`--retention-bytes` between appends (by default the longest `retention.ms` of the indexed
topics), the index stays bounded, and the rule "every record a scan returns is found by a lookup
of each of its keys" (R2) holds after every pass."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from msgindex.cli import index as index_cli
from msgindex.kafka.admin import OutgoingRecord, create_topics, produce
from msgindex.spark.pipeline import retention_policy
from tests.pipeline.support import job_args, run_job_in_process

pytestmark = pytest.mark.kafka

DAY_MS = 86_400_000
OLD, NEW = 6_000, 14_000  # records 30 days old, then records of now (one partition: log order is offset order)
MAX_BYTES = 1_500_000
SEGMENT_BYTES = 64 * 1024
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
