"""Crashes: the job SIGKILLed (driver, JVM and Python workers at once) at several points of the
stream and restarted from its checkpoint; the index still equals Kafka's ground truth exactly."""

from __future__ import annotations

import os
import signal
import time

import pytest

from msgindex.kafka.loadgen import keyed_records, produce
from msgindex.storage.settings import StoreSettings
from msgindex.storage.store import open_store
from tests.pipeline.support import JobProcess, assert_index_equals, ground_truth, job_args, run_job_in_process

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

RECORDS = 12_000
PER_TRIGGER = 2_000  # several small batches, so kills land in different places
STARTUP_TIMEOUT_S = 240


def test_sigkill_at_several_points_then_restart(kafka_bootstrap, kafka_topic, spark, tmp_path):
    topics = [kafka_topic(partitions=3, prefix="crash"), kafka_topic(partitions=2, prefix="crash2")]
    produce(kafka_bootstrap, keyed_records(topics, RECORDS, key_pool=3_000, seed=9))
    truth = ground_truth(kafka_bootstrap, topics)
    index = tmp_path / "index"
    args = job_args(kafka_bootstrap, topics, index, "--available-now", "--max-offsets-per-trigger", str(PER_TRIGGER),
                    "--quiet-spark")

    # 0: a job killed while Spark wrote its first offset-log entry left only that entry's temporary
    # files, which Spark refuses at batch 0: the job clears them (and says so) instead of failing
    open_store(index, create=True, settings=StoreSettings(hash_slot_num=4099, index_num=20_000,
                                                          segment_bytes=256 * 1024)).close()  # SMALL_STORE
    offsets = index / "_checkpoint" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / ".0.ab33f013-09b3-490e-9f66-76274724a391.tmp").write_bytes(b"")
    (offsets / "..0.ab33f013-09b3-490e-9f66-76274724a391.tmp.crc").write_bytes(b"")
    # 1: while the very first batch runs (nothing committed yet, or only part of it)
    job = JobProcess(args, tmp_path / "run1.log")
    job.wait_for(lambda: "] indexing " in job.text(), STARTUP_TIMEOUT_S, "the query to start")
    assert "removed Spark's unfinished first offset-log entry" in job.text()
    time.sleep(1.5)
    job.kill()
    # 2: right as a batch has been reported (its successor is being planned or written)
    job = JobProcess(args, tmp_path / "run2.log")
    job.wait_for(lambda: job.batches_logged() >= 1, STARTUP_TIMEOUT_S, "a batch")
    job.kill()
    # 3: in the middle of a later batch
    job = JobProcess(args, tmp_path / "run3.log")
    job.wait_for(lambda: job.batches_logged() >= 2, STARTUP_TIMEOUT_S, "two batches")
    time.sleep(0.7)
    job.kill()

    committed = sorted(p.name for p in (index / "_checkpoint" / "commits").iterdir() if p.name.isdigit())
    assert committed, "no batch committed before the kills: the kill points proved nothing"
    history = run_job_in_process(args)  # the restart runs to the end
    assert history and history[0].batch_id <= int(committed[-1]) + 1
    assert_index_equals(index, truth, topics=topics)


def test_sigterm_to_the_whole_process_group_is_a_stop(kafka_bootstrap, kafka_topic, tmp_path):
    """systemd's default stop and `kill -- -PGID` signal every process of the job: Spark's JVM
    (which PySpark starts ignoring SIGINT, not SIGTERM) ends with the driver. Found by an attack
    run: exit 1 and a Py4J traceback; it is a stop: exit 0, and the index exact on restart."""
    topic = kafka_topic(partitions=2, prefix="term")
    produce(kafka_bootstrap, keyed_records([topic], 2_000, key_pool=300, seed=3))
    truth = ground_truth(kafka_bootstrap, [topic])
    index = tmp_path / "index"
    job = JobProcess(job_args(kafka_bootstrap, [topic], index, "--trigger-interval", "1 second", "--quiet-spark"),
                     tmp_path / "run.log")
    job.wait_for(lambda: job.batches_logged() >= 1, STARTUP_TIMEOUT_S, "a batch")
    os.killpg(job.process.pid, signal.SIGTERM)
    assert job.wait(120) == 0, job.text()[-3000:]
    assert "Traceback" not in job.text() and "Spark's JVM ended on the same signal" in job.text()
    run_job_in_process(job_args(kafka_bootstrap, [topic], index, "--available-now", "--quiet-spark"))
    assert_index_equals(index, truth, topics=[topic])
