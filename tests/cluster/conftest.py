"""A real Spark standalone cluster for the test session: a master and two 1-core workers started
from pyspark's own ``spark-class`` on loopback (the second worker on 127.0.0.2, so Spark may place
speculative copies: it never runs a copy on the host of the original), and an executor Python
WITHOUT msgindex or kafka-python (a venv with only pyspark and its Arrow dependencies, cached under
``.msgindex/`` keyed by the requirement set), so every cluster test proves the job ships its code.
The object-store tests' executors have obstore besides (``object_executor_python``): reading and
writing an ``s3://`` index is what the README says executors need it for.

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
OBJECT_STORE_REQUIREMENTS = ("obstore",)  # and an object-store index this client library
START_TIMEOUT_S = 180
WORKER_MEMORY = "1g"


def _requirements(names: tuple[str, ...]) -> list[str]:
    return [f"{name}=={metadata.version(name)}" for name in names]


def _executor_venv(names: tuple[str, ...]) -> str:
    """A Python with the project's exact versions of `names` and nothing else (built once)."""
    requirements = _requirements(names)
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
def executor_python() -> str:
    """A Python with the project's exact pyspark/numpy/pyarrow/pandas and nothing else."""
    return _executor_venv(EXECUTOR_REQUIREMENTS)


@pytest.fixture(scope="session")
def object_executor_python() -> str:
    """The same plus obstore (an object-store index's client), and still no msgindex."""
    return _executor_venv(EXECUTOR_REQUIREMENTS + OBJECT_STORE_REQUIREMENTS)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStandaloneCluster]:
    cluster = LocalStandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), worker_hosts=("127.0.0.1", "127.0.0.2"),
                                     memory_per_worker=WORKER_MEMORY)
    try:
        yield cluster.start(START_TIMEOUT_S)
    finally:
        cluster.stop()
