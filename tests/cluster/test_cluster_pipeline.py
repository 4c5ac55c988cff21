"""The indexing job on a real Spark standalone cluster (two 1-core executors whose Python has no
msgindex: the job ships it), against real Kafka, with ground truth from kafka-python.

Every case ends with the index equal to Kafka's records (each (topic, partition, offset) exactly
once, with exactly its keys) and the job's own counts equal to what was produced.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from msgindex.kafka.loadgen import keyed_records, produce
from msgindex.spark.runtime.session import kafka_connector_jars
from tests.pipeline.support import INDEX_JOB, REPO, SMALL_STORE, assert_index_equals, ground_truth

pytestmark = [pytest.mark.kafka, pytest.mark.cluster, pytest.mark.slow]

JOB_TIMEOUT_S = 420
SUMMARY = re.compile(r"\] (done|stopped): (\d+) batches, ([\d,]+) records \(([\d,]+) new")
MSGINDEX_CLI = str(Path(sys.executable).parent / "msgindex")
SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")


def cluster_conf(executor_python: str, *extra: str) -> list[str]:
    """--conf flags every cluster run gets: the executors' Python (no msgindex in it), the driver
    on loopback (executors live on 127.0.0.1 and 127.0.0.2), small executors."""
    settings = [f"spark.pyspark.python={executor_python}", "spark.driver.host=127.0.0.1",
                "spark.driver.bindAddress=127.0.0.1", "spark.executor.memory=512m", *extra]
    return [word for setting in settings for word in ("--conf", setting)]


class ClusterJob:
    """One run of the indexing job as a subprocess (its own process group)."""

    def __init__(self, command: list[str], log: Path, cluster) -> None:
        self.log, self.cluster = log, cluster
        env = {key: value for key, value in os.environ.items() if not key.startswith(("PYSPARK_", "SPARK_"))}
        # as in an activated venv: spark-submit finds pyspark (its SPARK_HOME) through `python3` on PATH
        env.update(PYTHONUNBUFFERED="1", SPARK_LOCAL_IP="127.0.0.1",
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
        self.handle = open(log, "w")
        self.process = subprocess.Popen(command, stdout=self.handle, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                        start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def failure(self, what: str) -> str:
        return f"{what}\n--- job ---\n{self.text()[-6000:]}\n{self.cluster.executor_logs()}"

    def wait_for(self, condition, what: str, timeout: float = JOB_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(self.failure(f"job exited ({self.process.returncode}) before {what}"))
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(self.failure(f"timed out waiting for {what}"))
            time.sleep(0.2)

    def batches_logged(self) -> int:
        return sum(1 for line in self.text().splitlines() if "] batch " in line)

    def finish(self, timeout: float = JOB_TIMEOUT_S) -> tuple[int, int]:
        """Wait for a clean exit; (records, new records) from the job's summary line."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(self.failure(f"job did not finish in {timeout} s")) from None
        self.handle.close()
        assert code == 0, self.failure(f"job exited with {code}")
        match = SUMMARY.search(self.text())
        assert match, self.failure("no summary line")
        return int(match.group(3).replace(",", "")), int(match.group(4).replace(",", ""))

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(30)
        self.handle.close()


def msgindex_index(cluster, executor_python: str, log: Path, args: list[str], *conf: str) -> ClusterJob:
    """`msgindex index --master spark://...`"""
    command = [MSGINDEX_CLI, "index", "--master", cluster.master_url, *cluster_conf(executor_python, *conf), *args]
    return ClusterJob(command, log, cluster)


def spark_submit(cluster, executor_python: str, log: Path, args: list[str], *conf: str) -> ClusterJob:
    """`spark-submit --master spark://... streaming_jobs/index_job.py ...`, as the README says."""
    jars = ",".join(str(jar) for jar in kafka_connector_jars())
    command = [SPARK_SUBMIT, "--master", cluster.master_url, "--jars", jars,
               *cluster_conf(executor_python, f"spark.pyspark.driver.python={sys.executable}", *conf),
               str(INDEX_JOB), *args]
    return ClusterJob(command, log, cluster)


def job_args(bootstrap: str, topic: str, index: Path, checkpoint: str, *extra: str) -> list[str]:
    return ["--bootstrap-servers", bootstrap, "--subscribe", topic, "--path", str(index), "--checkpoint", checkpoint,
            *SMALL_STORE, "--quiet-spark", *extra]


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
    assert (records, new) == (len(truth.messages), len(truth.messages)), job.failure("counts differ")
    log = "".join(path.read_text(errors="replace") for path in events.rglob("*") if path.is_file())
    assert '"Speculative":true' in log, job.failure("Spark launched no speculative copy")
    assert_index_equals(index, truth, topics=[topic])
