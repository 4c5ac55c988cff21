"""A real Spark standalone cluster for the test session: a master and two 1-core workers started
from pyspark's own ``spark-class`` on loopback (the second worker on 127.0.0.2, so Spark may place
speculative copies: it never runs a copy on the host of the original), and an executor Python
WITHOUT msgindex or kafka-python (a venv with only pyspark and its Arrow dependencies, cached under
``.msgindex/`` keyed by the requirement set), so every cluster test proves the job ships its code.

Everything started here is stopped at the end of the session, also when a test fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Iterator

import pytest

from msgindex.jvm import msgindex_home
from msgindex.kafka.broker import free_port

EXECUTOR_REQUIREMENTS = ("pyspark", "numpy", "pyarrow", "pandas")  # pyspark's Arrow functions need these
START_TIMEOUT_S = 180
WORKER_MEMORY = "1g"


def _requirements() -> list[str]:
    return [f"{name}=={metadata.version(name)}" for name in EXECUTOR_REQUIREMENTS]


@pytest.fixture(scope="session")
def executor_python() -> str:
    """A Python with the project's exact pyspark/numpy/pyarrow/pandas and nothing else."""
    requirements = _requirements()
    key = hashlib.sha1(" ".join([sys.version, *requirements]).encode()).hexdigest()[:12]
    venv = msgindex_home() / f"executor-venv-{key}"
    python = venv / "bin" / "python"
    if not python.is_file():
        building = venv.with_name(venv.name + f".building-{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(building)], check=True)
        subprocess.run([str(building / "bin" / "pip"), "install", "--quiet", *requirements], check=True, timeout=900)
        # venv scripts name their directory: rebuild them in place after the rename
        building.rename(venv)
        subprocess.run([sys.executable, "-m", "venv", "--upgrade", str(venv)], check=True)
    probe = subprocess.run([str(python), "-c", "import pyspark, pyarrow\ntry:\n import msgindex\nexcept ImportError:\n print('clean')"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "clean", "the executor Python must not have msgindex installed"
    return str(python)


@dataclass
class StandaloneCluster:
    """A running master and its workers."""

    master_url: str
    web_url: str
    directory: Path
    processes: list[subprocess.Popen] = field(default_factory=list)
    worker_dirs: list[Path] = field(default_factory=list)

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.processes[1:]]

    def executor_pids(self) -> list[int]:
        """Executor JVMs (children of the workers) running now."""
        return [pid for pid in _children(self.worker_pids()) if b"CoarseGrainedExecutorBackend" in _cmdline(pid)]

    def alive_workers(self) -> int:
        with urllib.request.urlopen(self.web_url + "/json/", timeout=5) as response:
            return int(json.load(response).get("aliveworkers", 0))

    def executor_logs(self, tail: int = 4000) -> str:
        """The executors' stderr files (``<work dir>/app-*/<n>/stderr``), tails, for failure messages."""
        parts = []
        for directory in self.worker_dirs:
            for log in sorted(directory.glob("app-*/*/stderr")):
                text = log.read_text(errors="replace")
                parts.append(f"--- {log} ---\n{text[-tail:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for process in reversed(self.processes):
            _kill_group(process)


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


def _kill_group(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(20)


def _spark_class() -> tuple[Path, Path]:
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    return home, home / "bin" / "spark-class"


def _start(cluster: StandaloneCluster, name: str, args: list[str], env: dict) -> subprocess.Popen:
    home, spark_class = _spark_class()
    log = open(cluster.directory / f"{name}.log", "w")
    process = subprocess.Popen([str(spark_class), *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                               cwd=cluster.directory, start_new_session=True)
    cluster.processes.append(process)
    return process


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    home, _ = _spark_class()
    directory = tmp_path_factory.mktemp("spark-cluster")
    port, web_port = free_port(), free_port()
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}", directory)
    base_env = {key: value for key, value in os.environ.items() if not key.startswith(("PYSPARK_", "SPARK_"))}
    base_env.update(SPARK_HOME=str(home), SPARK_NO_DAEMONIZE="1", SPARK_DAEMON_MEMORY="256m")
    try:
        _start(cluster, "master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                                   "--webui-port", str(web_port)], dict(base_env, SPARK_LOCAL_IP="127.0.0.1"))
        for n, host in enumerate(("127.0.0.1", "127.0.0.2")):
            work = directory / f"worker{n}"
            work.mkdir()
            cluster.worker_dirs.append(work)
            _start(cluster, f"worker{n}", ["org.apache.spark.deploy.worker.Worker", "--host", host,
                                           "--webui-port", str(free_port()), "--cores", "1", "--memory", WORKER_MEMORY,
                                           "--work-dir", str(work), cluster.master_url],
                   dict(base_env, SPARK_LOCAL_IP=host))
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if cluster.alive_workers() == 2:
                    break
            except OSError:
                pass
            dead = [p for p in cluster.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name} ---\n{p.read_text()[-2000:]}" for p in directory.glob("*.log"))
                raise RuntimeError(f"standalone cluster did not come up (exited: {[p.args[1] for p in dead]}):\n{logs}")
            time.sleep(0.5)
        yield cluster
    finally:
        cluster.stop()
