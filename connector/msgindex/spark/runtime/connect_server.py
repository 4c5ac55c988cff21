"""A local Spark Connect server from pyspark's own jars, with what msgindex needs on the server.

pyspark's wheel ships the server (``jars/spark-connect_2.13-<version>.jar``) and ``spark-submit``;
``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` runs it, as
Spark's ``sbin/start-connect-server.sh`` does. What msgindex adds, for a server on one machine
(tests, benchmarks, trying Connect out):

* Spark's Kafka connector and spark-avro jars (``kafka_connector_jars``) on ``spark.jars``, for the
  indexing job (``from_avro`` in its fields);
* the Python that Spark starts for its workers is this interpreter (``PYSPARK_PYTHON`` in the
  server's environment, which is where Spark looks when it scans for ``pyspark_*`` data sources;
  ``spark.pyspark.python`` for everything else), so ``format("msgindex")`` is found and read;
* the settings of ``msgindex.spark.runtime.session.session_conf`` (UTC, Arrow, loopback, small driver).

A server for a cluster is started the same way with the cluster's ``--master``; its Python workers
must then import msgindex on every host (``pip install msgindex`` there).

    with LocalConnectServer(workdir) as server:
        url = server.start()            # sc://127.0.0.1:<port>
        ...                             # SparkSession.builder.remote(url).getOrCreate() elsewhere
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from msgindex.errors import ConnectServerError

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# spark-submit's placeholder primary resource for classes already on Spark's own classpath
INTERNAL_RESOURCE = "spark-internal"
HOST = "127.0.0.1"
STDOUT_FILE = "connect-server.out"
READY_POLL_SECONDS = 0.25


def spark_submit() -> Path:
    """pyspark's own ``spark-submit`` script."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit"


def server_command(port: int, *, master: str = "local[2]", python: str = sys.executable,
                   extra_conf: Mapping[str, str] | None = None) -> list[str]:
    """The ``spark-submit`` command line of a Connect server on HOST:`port`."""
    from msgindex.spark.runtime.session import session_conf

    conf = session_conf("msgindex-connect-server", master, {
        "spark.connect.grpc.binding.address": HOST,
        "spark.connect.grpc.binding.port": str(port),
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
        **(extra_conf or {}),
    })
    command = [str(spark_submit()), "--class", SERVER_CLASS]
    for name, value in conf.items():
        command += ["--conf", f"{name}={value}"]
    return [*command, INTERNAL_RESOURCE]


def server_environment(python: str = sys.executable) -> dict[str, str]:
    """The server's environment: Spark scans for ``pyspark_*`` data sources with the Python it
    reads from PYSPARK_DRIVER_PYTHON / PYSPARK_PYTHON (environment, not configuration)."""
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = python
    env["PYSPARK_DRIVER_PYTHON"] = python
    env.setdefault("SPARK_LOCAL_IP", HOST)
    return env


class LocalConnectServer:
    """One Spark Connect server process on this machine (its output in ``workdir``)."""

    def __init__(self, workdir: str | os.PathLike, port: int | None = None, *,
                 master: str = "local[2]", extra_conf: Mapping[str, str] | None = None) -> None:
        from msgindex.kafka.broker import free_port

        self.workdir = Path(workdir)
        self.port = port if port is not None else free_port(HOST)
        self.master = master
        self.extra_conf = dict(extra_conf or {})
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The client's address: ``SparkSession.builder.remote(url)``."""
        return f"sc://{HOST}:{self.port}"

    @property
    def output(self) -> Path:
        return self.workdir / STDOUT_FILE

    def start(self, timeout: float = 240.0) -> str:
        """Start the server and return its URL once it accepts connections."""
        if self._process is not None and self._process.poll() is None:
            return self.url
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = server_command(self.port, master=self.master, extra_conf=self.extra_conf)
        with open(self.output, "ab") as out:
            # its own session: stop() signals the whole group (spark-submit's scripts exec java)
            self._process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, cwd=self.workdir,
                                             env=server_environment(), start_new_session=True)
        deadline = time.monotonic() + timeout
        while not _accepts_connections(HOST, self.port):
            if self._process.poll() is not None:
                raise self._failure(f"exited with code {self._process.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise self._failure(f"did not listen on {HOST}:{self.port} within {timeout:.0f} s")
            time.sleep(READY_POLL_SECONDS)
        return self.url

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the server's process group (Spark shuts down cleanly), SIGKILL after
        `timeout` seconds."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def __enter__(self) -> LocalConnectServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _failure(self, what: str) -> ConnectServerError:
        tail = self.output.read_text(errors="replace")[-4000:] if self.output.is_file() else ""
        return ConnectServerError(f"Spark Connect server on port {self.port} {what}; its output "
                                  f"({self.output}) ends with:\n{tail}")


def _accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False
