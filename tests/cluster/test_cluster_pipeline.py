"""The indexing job on a real Spark standalone cluster (two 1-core executors whose Python has no
msgindex: the job ships it), against real Kafka, with ground truth from kafka-python.

Every case ends with the index equal to Kafka's records (each (topic, partition, offset) exactly
once, with exactly its keys) and the job's own counts equal to what was produced.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from msgindex.kafka.loadgen import keyed_records, produce
from tests.cluster.jobs import job_args, msgindex_index, spark_submit
from tests.pipeline.support import assert_index_equals, ground_truth

pytestmark = [pytest.mark.kafka, pytest.mark.cluster, pytest.mark.slow]


def test_split_ranges_then_new_checkpoints_via_master_and_spark_submit(kafka_bootstrap, kafka_topic, spark_cluster,
                                                                        executor_python, tmp_path):
    """--master with partitions split over several tasks (minPartitions); then NEW queries over the
    same index -- spark-submit with a file:// checkpoint (after pipeline-owner.json was deleted),
    then --master with a new local one -- start again from earliest: every record already indexed
    is reported as such and never written twice."""
    topic = kafka_topic(partitions=2, prefix="cluster")
    produce(kafka_bootstrap, keyed_records([topic], 20_000, key_pool=4_000, seed=81))
    index = tmp_path / "index"

    first = msgindex_index(spark_cluster, executor_python, tmp_path / "first.log",
                           job_args(kafka_bootstrap, topic, index, str(tmp_path / "ck1"), "--available-now",
                                    "--min-partitions", "6", "--max-offsets-per-trigger", "8000"))
    assert first.finish() == (20_000, 20_000)
    truth = ground_truth(kafka_bootstrap, [topic])
    assert_index_equals(index, truth, topics=[topic])

    (index / "pipeline-owner.json").unlink()  # nothing depends on it any more (it only says who runs)
    second = spark_submit(spark_cluster, executor_python, tmp_path / "second.log",
                          job_args(kafka_bootstrap, topic, index, (tmp_path / "ck2").as_uri(), "--available-now"))
    assert second.finish() == (20_000, 0)
    assert_index_equals(index, truth, topics=[topic])

    produce(kafka_bootstrap, keyed_records([topic], 5_000, key_pool=4_000, seed=82))
    third = msgindex_index(spark_cluster, executor_python, tmp_path / "third.log",
                           job_args(kafka_bootstrap, topic, index, str(tmp_path / "ck3"), "--available-now",
                                    "--min-partitions", "5"))
    assert third.finish() == (25_000, 5_000)
    assert_index_equals(index, ground_truth(kafka_bootstrap, [topic]), topics=[topic])


def _lock_holders(lock_file: Path) -> list[int]:
    """Pids holding an flock on `lock_file` (from /proc/locks: pid, then major:minor:inode)."""
    inode = os.stat(lock_file).st_ino
    holders = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue
        if int(fields[5].rsplit(":", 1)[1]) == inode:
            holders.append(int(fields[4]))
    return holders


def test_sigkill_executor_and_shard_lock_holder_mid_stream(kafka_bootstrap, kafka_topic, spark_cluster,
                                                           executor_python, tmp_path):
    topic = kafka_topic(partitions=2, prefix="killed")
    produce(kafka_bootstrap, keyed_records([topic], 30_000, key_pool=6_000, seed=83))
    truth = ground_truth(kafka_bootstrap, [topic])
    index = tmp_path / "index"
    job = msgindex_index(spark_cluster, executor_python, tmp_path / "job.log",
                         job_args(kafka_bootstrap, topic, index, str(tmp_path / "ck"), "--available-now",
                                  "--max-offsets-per-trigger", "2000"),
                         "spark.task.maxFailures=8")
    job.wait_for(lambda: job.batches_logged() >= 2, "two batches")
    executors = spark_cluster.executor_pids()
    assert executors, job.failure("no executor JVM found")
    os.kill(executors[0], signal.SIGKILL)  # an executor JVM dies with its Python workers' tasks in flight

    job.wait_for(lambda: any(index.glob("broker=*/lock")), "a shard")
    lock_file = next(index.glob("broker=*/lock"))
    deadline, victim = time.monotonic() + 120, None
    while victim is None and time.monotonic() < deadline and job.process.poll() is None:
        holders = [pid for pid in _lock_holders(lock_file) if b"pyspark" in Path(f"/proc/{pid}/cmdline").read_bytes()] \
            if lock_file.exists() else []
        if holders:
            victim = holders[0]
            os.kill(victim, signal.SIGKILL)  # the Python worker holding the shard lock, mid-append
        time.sleep(0.002)
    assert victim is not None, job.failure("never caught a Python worker holding the shard lock")
    records, new = job.finish()
    assert (records, new) == (len(truth.messages), len(truth.messages)), job.failure("counts differ")
    assert_index_equals(index, truth, topics=[topic])


def test_speculative_copies_commit_each_record_once(kafka_bootstrap, kafka_topic, spark_cluster, executor_python,
                                                    tmp_path):
    """One slow task (a one-partition topic's whole backlog in one micro-batch) outlives the
    speculation threshold; Spark runs a copy on the other host; both write, one commits each row."""
    topic = kafka_topic(partitions=1, prefix="speculated")
    produce(kafka_bootstrap, keyed_records([topic], 60_000, key_pool=20_000, seed=84))
    truth = ground_truth(kafka_bootstrap, [topic])
    index, events = tmp_path / "index", tmp_path / "events"
    events.mkdir()
    job = msgindex_index(spark_cluster, executor_python, tmp_path / "job.log",
                         job_args(kafka_bootstrap, topic, index, str(tmp_path / "ck"), "--available-now"),
                         "spark.speculation=true", "spark.speculation.task.duration.threshold=1s",
                         "spark.speculation.interval=100ms", "spark.eventLog.enabled=true", "spark.eventLog.compress=false",
                         f"spark.eventLog.dir={events.as_uri()}")
    records, new = job.finish()
    log = "".join(path.read_text(errors="replace") for path in events.rglob("*") if path.is_file())
    assert '"Speculative":true' in log, job.failure("Spark launched no speculative copy")
    assert_index_equals(index, truth, topics=[topic])
    # whichever attempt Spark accepted (the loser of the shard's lock may finish first), the line
    # counts the records this batch committed as new (attempt_counts.py)
    assert (records, new) == (len(truth.messages), len(truth.messages)), job.failure("counts differ")
