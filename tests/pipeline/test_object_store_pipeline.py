"""The indexing job with its index on an object store (moto's S3 server): every record exactly
once against Kafka's ground truth, replays and a new checkpoint change nothing, and nothing of the
index is written to a local path."""

from __future__ import annotations

import pytest

import msgindex
from msgindex.kafka.loadgen import keyed_records, produce
from msgindex.spark.pipeline.partition_brokers import PartitionBrokerMap
from msgindex.spark.pipeline.progress import read_batch_log
from tests.pipeline.support import assert_index_equals, ground_truth, job_args, run_job_in_process

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 6_000


def _options(s3) -> list[str]:
    return [arg for name, value in s3.options.items() for arg in ("--storage-option", f"{name}={value}")]


def test_the_job_indexes_into_an_object_store_exactly_once(kafka_bootstrap, kafka_topic, spark, s3, tmp_path,
                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may appear here (s3://... must never become a folder)
    topics = [kafka_topic(partitions=3, prefix="orders"), kafka_topic(partitions=2, prefix="payments")]
    produce(kafka_bootstrap, keyed_records(topics, RECORDS, key_pool=500, seed=21))
    truth = ground_truth(kafka_bootstrap, topics)
    url = s3.url("index")
    checkpoint = tmp_path / "checkpoints" / "first"
    history = run_job_in_process(job_args(kafka_bootstrap, topics, url, "--available-now", "--quiet-spark",
                                          "--max-offsets-per-trigger", "2500", "--checkpoint", str(checkpoint),
                                          *_options(s3)))
    assert len(history) >= 2
    assert sum(s.appended for s in history) == sum(s.records for s in history) == len(truth.messages)
    assert_index_equals(url, truth, topics=topics, storage_options=s3.options)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoints"]

    # what the job keeps beside the shards is in the bucket too
    assert PartitionBrokerMap(url, s3.options).as_dict()
    logged = read_batch_log(url, s3.options)
    assert [e["batch_id"] for e in logged] == [s.batch_id for s in history]

    # a new Spark checkpoint starts again from earliest: every record found committed
    again = run_job_in_process(job_args(kafka_bootstrap, topics, url, "--available-now", "--quiet-spark",
                                        "--checkpoint", str(tmp_path / "checkpoints" / "second"), *_options(s3)))
    assert sum(s.appended for s in again) == 0
    assert sum(s.already_committed for s in again) == len(truth.messages)
    assert_index_equals(url, truth, topics=topics, storage_options=s3.options)
    with msgindex.open(url, storage_options=s3.options) as store:
        assert sorted(store.brokers()) == sorted({b for s in history for b in s.brokers})


@pytest.mark.slow
def test_the_cli_job_keeps_everything_in_the_bucket_checkpoint_included(kafka_bootstrap, kafka_topic, s3, tmp_path):
    """`msgindex index --path s3://...` as a user runs it (endpoint and credentials in AWS_*): Spark's
    checkpoint defaults to s3a://.../_checkpoint through Hadoop's S3A, nothing is written to a
    local path, and a second run resumes from that checkpoint (nothing new: no batch)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    topic = kafka_topic(partitions=2, prefix="bucketed")
    produce(kafka_bootstrap, keyed_records([topic], 3_000, key_pool=300, seed=22))
    truth = ground_truth(kafka_bootstrap, [topic])
    url = s3.url("index")
    cli = str(Path(sys.executable).parent / "msgindex")
    env = {**os.environ, **s3.env}
    work = tmp_path / "cwd"
    work.mkdir()
    args = [cli, "index", "--bootstrap-servers", kafka_bootstrap, "--subscribe", topic, "--path", url,
            "--available-now", "--quiet-spark"]
    first = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "3,000 records (3,000 new)" in first.stdout, first.stdout[-2000:]
    assert_index_equals(url, truth, topics=[topic], storage_options=s3.options)
    with msgindex.open(url, storage_options=s3.options) as store:
        assert store.client.list("_checkpoint/offsets/"), "Spark's checkpoint is in the bucket"
    second = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "done: 0 batches" in second.stdout, second.stdout[-2000:]
    assert [p.name for p in work.iterdir() if not p.name.startswith("spark-")] == []
