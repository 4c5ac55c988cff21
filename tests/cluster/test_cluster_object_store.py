"""The indexing job on the standalone cluster with its index on an object store (moto's S3 server):
two 1-core workers (one on 127.0.0.2) with separate work directories and no path of the index
shared with anyone, executors whose Python has pyspark's Arrow dependencies and obstore but no
msgindex (the job ships it), real Kafka, ground truth from kafka-python.

Endpoint and credentials reach the job the two ways the README tells users: the AWS_* variables
in the driver's environment and in ``spark.executorEnv``, or ``--storage-option`` alone (the job
hands them to its tasks; Spark's S3A then gets its own ``spark.hadoop.fs.s3a.*`` settings, as a
spark-submit user gives them). Spark's checkpoint is in the bucket too, through Hadoop's S3A
(``s3a://``, the job's default under an ``s3://`` index, or given); ``assert_nothing_local`` checks
that nothing of the index or of the checkpoint is written to a local path.

Counts: a batch's records are each counted once, and as new when any attempt of the batch's tasks
committed them (a killed attempt before its retry, the loser of a speculative race whose result
Spark kept: attempt_counts.py): one job over records nobody indexed before reports them all new.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import time
from pathlib import Path

import pytest

from msgindex.kafka.loadgen import keyed_records, produce
from msgindex.spark.pipeline.progress import BATCH_LOG_DIR, read_batch_log
from tests.cluster.jobs import JOB_TIMEOUT_S, job_args, msgindex_index, spark_submit
from tests.pipeline.support import REPO, assert_index_equals, ground_truth

pytestmark = [pytest.mark.kafka, pytest.mark.cluster, pytest.mark.slow]
# Two scenarios run on an object store only when asked: their local-index versions run every time
# (tests/cluster/test_cluster_pipeline.py), the exactly-once rule they test is the store's (shared),
# and together they add ~20 minutes of cluster jobs to a CI run that must stay under an hour.
LONG_SCENARIOS = "MSGINDEX_LONG_CLUSTER_TESTS"
long_scenario = pytest.mark.skipif(
    os.environ.get(LONG_SCENARIOS) != "1",
    reason=f"the object-store variant of a scenario test_cluster_pipeline.py runs on a local index; "
           f"~10 minutes of cluster jobs: set {LONG_SCENARIOS}=1 to run it")

# What the index keeps (shards, versions, chunks, marks, the job's files beside them) and Spark's
# checkpoint: none of it may appear on a local disk when both are in the bucket ("s3:" and "s3a:"
# are what a URL taken for a folder makes).
INDEX_NAMES = re.compile(r"^(msgindex\.json|partition-brokers.*|_batches.*|_quarantine|_jobs|_shards|_commits|"
                         r"chunks|pipeline\.lock|pipeline-owner\.json|broker=.*|.*\.chunk|s3a?:|"
                         r"_checkpoint|checkpoints?|offsets|commits|sources)$")


def spark_checkpoint(url: str, name: str) -> str:
    """Spark's checkpoint of run `name`: in the bucket of the index at `url`, through S3A."""
    return f"s3a://{url.removeprefix('s3://').split('/', 1)[0]}/checkpoints/{name}"


def s3a_conf(s3) -> list[str]:
    """--conf spark.hadoop.fs.s3a.*=...: the server's endpoint and keys for Spark's S3A, for runs
    with no AWS_* variables (msgindex maps those itself unless told otherwise)."""
    settings = {"endpoint": s3.endpoint, "path.style.access": "true", "connection.ssl.enabled": "false",
                "endpoint.region": s3.options["region"], "access.key": s3.options["access_key_id"],
                "secret.key": s3.options["secret_access_key"]}
    return [f"spark.hadoop.fs.s3a.{name}={value}" for name, value in settings.items()]


def checkpoint_keys(s3, url: str) -> list[str]:
    """The keys of Spark's checkpoint at the s3a:// `url` (its offsets and commits, ...)."""
    bucket, prefix = url.removeprefix("s3a://").split("/", 1)
    pages = _boto3(s3.endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
    return [item["Key"] for page in pages for item in page.get("Contents", ())]


def executor_env(s3) -> list[str]:
    """--conf spark.executorEnv.AWS_*=...: the store's endpoint and credentials in the executors'
    environment, as the README tells users."""
    return [f"spark.executorEnv.{name}={value}" for name, value in s3.env.items()]


def storage_option_flags(s3) -> list[str]:
    return [word for name, value in s3.options.items() for word in ("--storage-option", f"{name}={value}")]


def assert_nothing_local(tmp_path: Path, cluster, cwd: Path) -> None:
    """The jobs' working directory is empty, and no piece of the index or of a checkpoint is under
    the test's directory (the jobs' logs), the workers' work directories or the repository."""
    assert list(cwd.iterdir()) == [], list(cwd.iterdir())
    found = [path for root in (tmp_path, *cluster.worker_dirs) for path in root.rglob("*") if INDEX_NAMES.match(path.name)]
    assert not found and not (REPO / "s3:").exists() and not (REPO / "s3a:").exists(), found


def assert_true_counts(url: str, s3, records: int, new: int, truth_size: int) -> None:
    """The summary's counts against the truth and against the batch log the job kept in the store."""
    assert records == truth_size
    logged = read_batch_log(url, s3.options)
    assert sum(e["records"] for e in logged) == records and sum(e["appended"] for e in logged) == new
    assert new == truth_size and all(e["already_committed"] == 0 for e in logged), logged


def _descendants(parents: list[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], list(parents)
    while todo:
        pid = todo.pop()
        found.extend(children.get(pid, ()))
        todo.extend(children.get(pid, ()))
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def python_workers(executor_pid: int) -> list[int]:
    """The Python workers an executor's pyspark daemon forked (they run the tasks' Python)."""
    daemons = [pid for pid in _descendants([executor_pid]) if b"pyspark.daemon" in _cmdline(pid)]
    return [pid for pid in daemons if pid in _descendants(daemons)]


@functools.cache
def _boto3(endpoint: str):
    import boto3

    from tests.object_store import ACCESS_KEY, REGION, SECRET_KEY

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                        region_name=REGION)


def written_so_far(s3, url: str) -> tuple[int, int]:
    """(chunk objects, batch log objects) under the index now: appends write the first (committed
    or not yet), the driver the second once a batch's tasks are all done."""
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    pages = _boto3(s3.endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
    keys = [item["Key"] for page in pages for item in page.get("Contents", ())]
    return sum(key.endswith(".chunk") for key in keys), sum(f"/{BATCH_LOG_DIR}/" in key for key in keys)


@long_scenario
@pytest.mark.timeout(3 * JOB_TIMEOUT_S + 120)  # three jobs one after the other
def test_object_store_split_ranges_then_new_checkpoints_via_master_and_spark_submit(
        kafka_bootstrap, kafka_topic, spark_cluster, object_executor_python, s3, tmp_path):
    """--master, partitions split over several tasks, AWS_* for the driver and in
    spark.executorEnv, Spark's checkpoint by default under the index (s3a://.../index/_checkpoint);
    then NEW queries over the same index: spark-submit with --storage-option alone (no AWS_*
    anywhere: S3A configured with --conf) and a checkpoint elsewhere in the bucket, then --master
    again after more records: every record indexed once, the ones indexed before reported as
    already committed."""
    topic = kafka_topic(partitions=2, prefix="objcluster")
    produce(kafka_bootstrap, keyed_records([topic], 20_000, key_pool=4_000, seed=91))
    truth = ground_truth(kafka_bootstrap, [topic])
    url, cwd = s3.url("index"), tmp_path / "cwd"
    cwd.mkdir()

    first = msgindex_index(spark_cluster, object_executor_python, tmp_path / "first.log",
                           job_args(kafka_bootstrap, topic, url, None, "--available-now",
                                    "--min-partitions", "6", "--max-offsets-per-trigger", "8000"),
                           *executor_env(s3), env=s3.env, cwd=cwd)
    assert first.finish() == (20_000, 20_000)
    assert_index_equals(url, truth, topics=[topic], storage_options=s3.options)
    default_checkpoint = f"s3a://{url.removeprefix('s3://')}/_checkpoint"
    assert any("/offsets/" in key for key in checkpoint_keys(s3, default_checkpoint)), first.failure("no checkpoint")

    second_checkpoint = spark_checkpoint(url, "second")
    second = spark_submit(spark_cluster, object_executor_python, tmp_path / "second.log",
                          job_args(kafka_bootstrap, topic, url, second_checkpoint, "--available-now",
                                   *storage_option_flags(s3)), *s3a_conf(s3), cwd=cwd, hadoop_urls=(second_checkpoint,))
    assert second.finish() == (20_000, 0)
    assert any("/commits/" in key for key in checkpoint_keys(s3, second_checkpoint)), second.failure("no checkpoint")
    assert_index_equals(url, truth, topics=[topic], storage_options=s3.options)

    produce(kafka_bootstrap, keyed_records([topic], 5_000, key_pool=4_000, seed=92))
    third = msgindex_index(spark_cluster, object_executor_python, tmp_path / "third.log",
                           job_args(kafka_bootstrap, topic, url, spark_checkpoint(url, "third"), "--available-now",
                                    "--min-partitions", "5"),
                           *executor_env(s3), env=s3.env, cwd=cwd)
    assert third.finish() == (25_000, 5_000)
    assert_index_equals(url, ground_truth(kafka_bootstrap, [topic]), topics=[topic], storage_options=s3.options)
    assert_nothing_local(tmp_path, spark_cluster, cwd)


def test_object_store_executor_and_python_workers_sigkilled_mid_batch(kafka_bootstrap, kafka_topic, spark_cluster,
                                                                      object_executor_python, s3, tmp_path):
    """An executor JVM SIGKILLed while a batch is being written (a chunk of it is in the bucket,
    the driver has not logged it), then a live executor's Python workers the same way:
    the tasks are retried elsewhere, appends race the killed attempts' leftovers, each record is
    indexed once."""
    topic = kafka_topic(partitions=2, prefix="objkilled")
    produce(kafka_bootstrap, keyed_records([topic], 30_000, key_pool=6_000, seed=93))
    truth = ground_truth(kafka_bootstrap, [topic])
    url, cwd = s3.url("index"), tmp_path / "cwd"
    cwd.mkdir()
    job = msgindex_index(spark_cluster, object_executor_python, tmp_path / "job.log",
                         job_args(kafka_bootstrap, topic, url, spark_checkpoint(url, "ck"), "--available-now",
                                  "--max-offsets-per-trigger", "2000"),
                         "spark.task.maxFailures=8", *executor_env(s3), env=s3.env, cwd=cwd)

    def mid_batch(after_batches: int) -> None:
        """Return once a batch after the first `after_batches` has a chunk in the bucket and is
        not done (the driver has not logged it)."""
        job.wait_for(lambda: job.batches_logged() >= after_batches, f"{after_batches} batches")
        before = written_so_far(s3, url)

        def in_flight() -> bool:
            nonlocal before
            now = written_so_far(s3, url)
            if now[1] != before[1]:  # a batch finished meanwhile: watch the next one
                before = now
                return False
            return now[0] > before[0]

        job.wait_for(in_flight, "a batch with a chunk written and not done")

    mid_batch(2)
    executors = spark_cluster.executor_pids()
    assert executors, job.failure("no executor JVM found")
    os.kill(executors[0], signal.SIGKILL)  # a JVM dies with its Python workers' tasks in flight

    deadline = time.monotonic() + 120
    victims = []
    while not victims and time.monotonic() < deadline:
        mid_batch(job.batches_logged() + 1)
        victims = [pid for executor in spark_cluster.executor_pids() if executor != executors[0]
                   for pid in python_workers(executor)]
    assert victims, job.failure("never found a live executor's Python workers mid-batch")
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)  # the tasks' Python dies, the executor lives on
        except ProcessLookupError:
            pass

    records, new = job.finish()
    assert_true_counts(url, s3, records, new, len(truth.messages))
    assert_index_equals(url, truth, topics=[topic], storage_options=s3.options)
    assert_nothing_local(tmp_path, spark_cluster, cwd)


@long_scenario
def test_object_store_speculative_copies_commit_each_record_once(kafka_bootstrap, kafka_topic, spark_cluster,
                                                                 object_executor_python, s3, tmp_path):
    """One slow task (a one-partition topic's backlog in one micro-batch) outlives the speculation
    threshold; Spark runs a copy on the other host; both append to the shard without a lock."""
    topic = kafka_topic(partitions=1, prefix="objspeculated")
    produce(kafka_bootstrap, keyed_records([topic], 60_000, key_pool=20_000, seed=94))
    truth = ground_truth(kafka_bootstrap, [topic])
    url, cwd, events = s3.url("index"), tmp_path / "cwd", tmp_path / "events"
    cwd.mkdir()
    events.mkdir()
    job = msgindex_index(spark_cluster, object_executor_python, tmp_path / "job.log",
                         job_args(kafka_bootstrap, topic, url, spark_checkpoint(url, "ck"), "--available-now",
                                  *storage_option_flags(s3)),
                         *s3a_conf(s3), "spark.speculation=true", "spark.speculation.task.duration.threshold=1s",
                         "spark.speculation.interval=100ms", "spark.eventLog.enabled=true",
                         "spark.eventLog.compress=false", f"spark.eventLog.dir={events.as_uri()}", cwd=cwd)
    records, new = job.finish()
    log = "".join(path.read_text(errors="replace") for path in events.rglob("*") if path.is_file())
    assert '"Speculative":true' in log, job.failure("Spark launched no speculative copy")
    assert_true_counts(url, s3, records, new, len(truth.messages))
    assert_index_equals(url, truth, topics=[topic], storage_options=s3.options)
    assert_nothing_local(tmp_path, spark_cluster, cwd)


def test_two_jobs_on_one_object_store_index_at_the_same_time_are_both_exact(
        kafka_bootstrap, kafka_topic, spark_cluster, object_executor_python, s3, tmp_path):
    """No lock on an object store: two jobs (each its own application with one executor, its own
    checkpoint) index the same topic into the same path at once. Each sees every record once
    (new or already committed by the other), together they add each record once, and the index
    equals Kafka's records."""
    topic = kafka_topic(partitions=2, prefix="objtwice")
    produce(kafka_bootstrap, keyed_records([topic], 24_000, key_pool=5_000, seed=95))
    truth = ground_truth(kafka_bootstrap, [topic])
    url, cwd = s3.url("index"), tmp_path / "cwd"
    cwd.mkdir()
    jobs = [msgindex_index(spark_cluster, object_executor_python, tmp_path / f"job{n}.log",
                           job_args(kafka_bootstrap, topic, url, spark_checkpoint(url, f"job{n}"), "--available-now",
                                    "--max-offsets-per-trigger", "2000", "--query-name", f"job{n}"),
                           "spark.cores.max=1", *executor_env(s3), env=s3.env, cwd=cwd)
            for n in (1, 2)]
    counts = [job.finish() for job in jobs]
    assert [records for records, _ in counts] == [len(truth.messages)] * 2, counts
    assert sum(new for _, new in counts) == len(truth.messages), counts
    assert_index_equals(url, truth, topics=[topic], storage_options=s3.options)

    # they ran at the same time: each logged batches while the other was between its first and last
    logged = read_batch_log(url, s3.options)
    spans = {}
    for entry in logged:
        first, last = spans.get(entry["job_id"], (entry["time_ms"], entry["time_ms"]))
        spans[entry["job_id"]] = (min(first, entry["time_ms"]), max(last, entry["time_ms"]))
    (a_first, a_last), (b_first, b_last) = spans.values()
    assert a_first < b_last and b_first < a_last, spans
    assert_nothing_local(tmp_path, spark_cluster, cwd)
