"""The indexing job on the test cluster as users start it: ``msgindex index --master spark://...``
or ``spark-submit ... streaming_jobs/index_job.py``, each a subprocess in its own process group
(``ClusterJob``), with the summary line's counts read back."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from msgindex.spark.runtime.session import kafka_connector_jars, object_store_jars
from tests.pipeline.support import INDEX_JOB, REPO, SMALL_STORE

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
    """One run of the indexing job as a subprocess (its own process group). `env`: variables
    added to the user's environment (which has no AWS_* of its own here); `cwd`: where it runs."""

    def __init__(self, command: list[str], log: Path, cluster, env: dict[str, str] | None = None,
                 cwd: Path = REPO) -> None:
        self.log, self.cluster = log, cluster
        base = {key: value for key, value in os.environ.items() if not key.startswith(("PYSPARK_", "SPARK_", "AWS_"))}
        # as in an activated venv: spark-submit finds pyspark (its SPARK_HOME) through `python3` on PATH
        base.update(PYTHONUNBUFFERED="1", SPARK_LOCAL_IP="127.0.0.1",
                    PATH=f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}", **(env or {}))
        self.handle = open(log, "w")
        self.process = subprocess.Popen(command, stdout=self.handle, stderr=subprocess.STDOUT, env=base, cwd=cwd,
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


def msgindex_index(cluster, executor_python: str, log: Path, args: list[str], *conf: str,
                   env: dict[str, str] | None = None, cwd: Path = REPO) -> ClusterJob:
    """`msgindex index --master spark://...`"""
    command = [MSGINDEX_CLI, "index", "--master", cluster.master_url, *cluster_conf(executor_python, *conf), *args]
    return ClusterJob(command, log, cluster, env, cwd)


def spark_submit(cluster, executor_python: str, log: Path, args: list[str], *conf: str,
                 env: dict[str, str] | None = None, cwd: Path = REPO, hadoop_urls: tuple[str, ...] = ()) -> ClusterJob:
    """`spark-submit --master spark://... streaming_jobs/index_job.py ...`, as the README says
    (`hadoop_urls`: the job's s3a:// checkpoint: its connector's jars join the Kafka connector's in
    --jars, the list `msgindex kafka jars --object-store s3a` prints)."""
    jars = ",".join(str(jar) for jar in [*kafka_connector_jars(), *object_store_jars(hadoop_urls)])
    command = [SPARK_SUBMIT, "--master", cluster.master_url, "--jars", jars,
               *cluster_conf(executor_python, f"spark.pyspark.driver.python={sys.executable}", *conf),
               str(INDEX_JOB), *args]
    return ClusterJob(command, log, cluster, env, cwd)


def job_args(bootstrap: str, topic: str, index: Path | str, checkpoint: str | None, *extra: str) -> list[str]:
    """The job's flags (`checkpoint` None: the job's default, under the index)."""
    given = [] if checkpoint is None else ["--checkpoint", checkpoint]
    return ["--bootstrap-servers", bootstrap, "--subscribe", topic, "--path", str(index), *given,
            *SMALL_STORE, "--quiet-spark", *extra]
