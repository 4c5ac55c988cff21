"""A real Spark standalone cluster for the test session: a master and two 1-core workers started
from pyspark's own ``spark-class`` on loopback (the second worker on 127.0.0.2, so Spark may place
speculative copies: it never runs a copy on the host of the original), and an executor Python
WITHOUT msgindex or kafka-python (a venv with only pyspark and its Arrow dependencies, cached under
``.msgindex/`` keyed by the requirement set), so every cluster test proves the job ships its code.

Everything started here is stopped at the end of the session, also when a test fails.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata

import pytest

from msgindex.jvm import msgindex_home
from msgindex.spark.runtime.standalone import LocalStandaloneCluster

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
    code = "import pyspark, pyarrow\ntry:\n import msgindex\nexcept ImportError:\n print('clean')"
    probe = subprocess.run([str(python), "-c", code],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "clean", "the executor Python must not have msgindex installed"
    return str(python)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStandaloneCluster]:
    cluster = LocalStandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), worker_hosts=("127.0.0.1", "127.0.0.2"),
                                     memory_per_worker=WORKER_MEMORY)
    try:
        yield cluster.start(START_TIMEOUT_S)
    finally:
        cluster.stop()
