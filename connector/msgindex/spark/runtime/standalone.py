"""A Spark standalone cluster on this machine, from pyspark's own ``spark-class`` (tests, benchmarks).

One master and one worker per given host address (loopback: 127.0.0.1, 127.0.0.2, ...), each
worker with its own work directory (executors' stdout/stderr land in
``<work dir>/app-*/<executor id>/``). Every process runs in its own process group and is stopped,
executors and their Python workers included, by ``stop()``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from msgindex.errors import MsgIndexError

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0


def _free_port() -> int:
    from msgindex.kafka.broker import free_port

    return free_port()


def spark_home() -> Path:
    """pyspark's package directory: SPARK_HOME of a pip-installed pyspark."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class LocalStandaloneCluster:
    """A running (after ``start``) standalone master with one worker per host in `worker_hosts`."""

    directory: Path
    worker_hosts: tuple[str, ...] = ("127.0.0.1",)
    cores_per_worker: int = 1
    memory_per_worker: str = "1g"
    master_url: str = ""
    web_url: str = ""
    processes: list[subprocess.Popen] = field(default_factory=list)
    worker_dirs: list[Path] = field(default_factory=list)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> LocalStandaloneCluster:
        self.directory = Path(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        port, web_port = _free_port(), _free_port()
        self.master_url, self.web_url = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}"
        try:
            self._launch("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                                    "--webui-port", str(web_port)], "127.0.0.1")
            for n, host in enumerate(self.worker_hosts):
                work = self.directory / f"worker{n}"
                work.mkdir(exist_ok=True)
                self.worker_dirs.append(work)
                self._launch(f"worker{n}", ["org.apache.spark.deploy.worker.Worker", "--host", host,
                                            "--webui-port", str(_free_port()), "--cores", str(self.cores_per_worker),
                                            "--memory", self.memory_per_worker, "--work-dir", str(work),
                                            self.master_url], host)
            self._wait_for_workers(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, name: str, args: list[str], host: str) -> None:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("PYSPARK_", "SPARK_"))}
        env.update(SPARK_HOME=str(spark_home()), SPARK_NO_DAEMONIZE="1", SPARK_DAEMON_MEMORY="256m", SPARK_LOCAL_IP=host)
        with open(self.directory / f"{name}.log", "w") as log:
            self.processes.append(subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args], stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=self.directory, start_new_session=True))

    def _wait_for_workers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.alive_workers() == len(self.worker_hosts):
                    return
            except OSError:
                pass
            dead = [p for p in self.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-2000:]}"
                                 for p in sorted(self.directory.glob("*.log")))
                raise MsgIndexError(f"the standalone cluster in {self.directory} did not come up:\n{logs}")
            time.sleep(0.5)

    def alive_workers(self) -> int:
        with urllib.request.urlopen(self.web_url + "/json/", timeout=5) as response:
            return int(json.load(response).get("aliveworkers", 0))

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.processes[1:]]

    def executor_pids(self) -> list[int]:
        """Executor JVMs running now (children of the workers)."""
        return [pid for pid in _children(self.worker_pids()) if b"CoarseGrainedExecutorBackend" in _cmdline(pid)]

    def executor_logs(self, tail: int = 4000) -> str:
        """The tails of the executors' stderr files, for failure messages."""
        parts = []
        for directory in self.worker_dirs:
            for log in sorted(directory.glob("app-*/*/stderr")):
                parts.append(f"--- {log} ---\n{log.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for process in reversed(self.processes):
            _stop_group(process)
        self.processes = []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _children(parents: list[int]) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) in parents:
            found.append(int(stat.parent.name))
    return found


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the process group (a worker takes its executors down), SIGKILL if it lingers."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            return
    try:
        os.killpg(process.pid, signal.SIGKILL)  # whatever of the group is left (executors, Python workers)
    except ProcessLookupError:
        pass
    process.wait(STOP_TIMEOUT_S)
