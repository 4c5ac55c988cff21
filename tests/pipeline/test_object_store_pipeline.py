"""The indexing job with its index on an object store (moto's S3 server): every record exactly
once against Kafka's ground truth, replays and a new checkpoint change nothing, and nothing of the
index is written to a local path; a wrong endpoint, a missing bucket and wrong credentials through
the real CLI are one line each, exit 2, nothing written or lost. (On a standalone cluster, with
faults, and two jobs at once: tests/cluster/test_cluster_object_store.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import uuid

import pytest

import msgindex
from msgindex.kafka.broker import free_port
from msgindex.kafka.loadgen import keyed_records, produce
from msgindex.spark.pipeline.partition_brokers import PartitionBrokerMap
from msgindex.spark.pipeline.progress import read_batch_log
from tests.datasource.conftest import build_store, generate_records
from tests.object_store import bucket_as, require_credentials, start_s3_server
from tests.pipeline.support import assert_index_equals, ground_truth, job_args, run_job_in_process
from tests.pipeline.test_cli_failures import MSGINDEX, assert_one_line

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 6_000
SLOT = "slot=CAST(offset % 7 AS STRING)"  # a field from a Kafka column: its truth is the offsets


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
                                          "--index-field", SLOT, *_options(s3)))
    assert len(history) >= 2
    assert sum(s.appended for s in history) == sum(s.records for s in history) == len(truth.messages)
    assert_index_equals(url, truth, topics=topics, storage_options=s3.options)
    with msgindex.open(url, storage_options=s3.options) as store:  # a field, in the bucket's shards too
        found = store.lookup(fields={"slot": "3"}).select(["topic", "partition", "offset"]).to_pylist()
        assert sorted((r["topic"], r["partition"], r["offset"]) for r in found) == sorted(
            where for where in truth.messages if where[2] % 7 == 3)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoints"]

    # what the job keeps beside the shards is in the bucket too
    assert PartitionBrokerMap(url, s3.options).as_dict()
    logged = read_batch_log(url, s3.options)
    assert [e["batch_id"] for e in logged] == [s.batch_id for s in history]

    # a new Spark checkpoint starts again from earliest: every record found committed
    again = run_job_in_process(job_args(kafka_bootstrap, topics, url, "--available-now", "--quiet-spark",
                                        "--checkpoint", str(tmp_path / "checkpoints" / "second"),
                                        "--index-field", SLOT, *_options(s3)))
    assert sum(s.appended for s in again) == 0
    assert sum(s.already_committed for s in again) == len(truth.messages)
    assert_index_equals(url, truth, topics=topics, storage_options=s3.options)
    with msgindex.open(url, storage_options=s3.options) as store:
        assert sorted(store.brokers()) == sorted({b for s in history for b in s.brokers})


@pytest.mark.slow
def test_the_cli_job_keeps_everything_in_the_bucket_checkpoint_included(kafka_bootstrap, kafka_topic, s3, tmp_path):
    """`msgindex index --path s3://...` as a user runs it (endpoint and credentials in AWS_*): Spark's
    checkpoint defaults to s3a://.../_checkpoint through Hadoop's S3A, nothing is written to a
    local path, and a second run resumes from that checkpoint (nothing new: no batch), given the
    endpoint and keys as --storage-option instead."""
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
    assert "| lag 0" in first.stdout, first.stdout[-2000:]  # Spark's offset log read from the bucket
    assert_index_equals(url, truth, topics=[topic], storage_options=s3.options)
    with msgindex.open(url, storage_options=s3.options) as store:
        assert store.client.list("_checkpoint/offsets/"), "Spark's checkpoint is in the bucket"
    # the second run names the bucket's endpoint and keys with --storage-option only: Spark's S3A
    # reaches the checkpoint with them too (it resumes: nothing new)
    no_variables = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    second = subprocess.run([*args, *_options(s3)], cwd=work, env=no_variables, capture_output=True, text=True,
                            timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "done: 0 batches" in second.stdout, second.stdout[-2000:]
    assert [p.name for p in work.iterdir() if not p.name.startswith("spark-")] == []


@pytest.fixture(scope="module")
def checked_s3(tmp_path_factory):
    """An S3 server of its own that checks credentials (tests/object_store.require_credentials),
    and the storage options of its "writer" (may do anything) and "nobody" (may do nothing)."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed (the dev extra installs it)")
    process, server = start_s3_server(str(tmp_path_factory.mktemp("s3-auth") / "moto.log"))
    try:
        yield server, require_credentials(server)
    finally:
        process.kill()
        process.wait(timeout=30)


def _objects(server, options: dict[str, str], bucket: str) -> dict[str, str]:
    """Every object of `bucket`: key -> ETag."""
    import boto3

    client = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=options["access_key_id"],
                          aws_secret_access_key=options["secret_access_key"], region_name=options["region"])
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {item["Key"]: item["ETag"] for page in pages for item in page.get("Contents", ())}


def test_bad_store_settings_are_one_line_exit_2_and_write_nothing(kafka_bootstrap, kafka_topic, s3, checked_s3, tmp_path):
    """`msgindex index` (the real CLI, endpoint and credentials in the AWS_* variables as users
    set them) with a wrong endpoint, a bucket that does not exist, a wrong secret and keys without
    permission: one line naming what is wrong, exit 2, before Spark starts; an index already in
    the bucket is untouched and nothing is written to a local path."""
    topic = kafka_topic(partitions=1, prefix="badstore")
    server, identities = checked_s3
    writer = identities["writer"]
    existing = f"s3://{bucket_as(server, writer)}/index"
    rows = generate_records(count=50)
    build_store(existing, rows, storage_options=writer)
    before = _objects(server, writer, existing.split("/")[2])
    missing_bucket = f"nothing-here-{uuid.uuid4().hex[:8]}"
    dead_endpoint = f"http://127.0.0.1:{free_port()}"

    def env_of(options: dict[str, str], **override: str) -> dict[str, str]:
        names = {"endpoint": "AWS_ENDPOINT_URL", "access_key_id": "AWS_ACCESS_KEY_ID",
                 "secret_access_key": "AWS_SECRET_ACCESS_KEY", "region": "AWS_REGION"}
        return {names[k]: v for k, v in {**options, **override}.items() if k in names}

    cases = {  # name: (--path, AWS_* variables, what the line must say)
        "endpoint": (s3.url("index"), env_of(s3.options, endpoint=dead_endpoint),
                     [f"the endpoint {dead_endpoint} does not answer", "AWS_ENDPOINT_URL"]),
        "bucket": (f"s3://{missing_bucket}/index", s3.env, [f"bucket '{missing_bucket}' does not exist"]),
        "secret": (existing, env_of(writer, secret_access_key="not-the-secret"), [server.endpoint]),
        "permission": (existing, env_of(identities["nobody"]), ["access denied", server.endpoint]),
    }
    runs = {}
    for name, (url, env, _) in cases.items():
        cwd = tmp_path / name
        cwd.mkdir()
        args = job_args(kafka_bootstrap, [topic], url, "--available-now", "--checkpoint", str(cwd / "checkpoint"))
        clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        runs[name] = subprocess.Popen([MSGINDEX, "index", *args], env={**clean, **env}, cwd=cwd, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for name, run in runs.items():
        stdout, stderr = run.communicate(timeout=300)
        line = assert_one_line(subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr), *cases[name][2])
        assert cases[name][0] in line, line  # the store named
        assert list((tmp_path / name).iterdir()) == [], name  # no checkpoint, no index, no "s3:" folder
        if name == "secret":  # (which key is wrong: the secret, in the words of either version of the message)
            assert re.search(r"secret.access.key", line, re.IGNORECASE), line
    assert _objects(server, writer, existing.split("/")[2]) == before  # nothing written, nothing lost
    with msgindex.open(existing, storage_options=writer) as store:
        assert sum(batch.num_rows for batch in store.scan()) == len(rows)
