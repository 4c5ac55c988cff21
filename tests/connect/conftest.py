"""Spark Connect: one local Connect server per test session (pyspark's own jars, Spark's Kafka
connector, this interpreter for its Python workers), and clients in processes of their own.

Clients run in subprocesses because a Connect session switches its whole Python process to
Connect mode (pyspark sets SPARK_CONNECT_MODE_ENABLED), which would break the classic session
the other test folders share; it is also how users run them: a notebook or job on another host.

Reusable fixtures: ``connect_server`` (the ``sc://`` URL) and ``connect_client`` (runs a scenario
of ``tests/connect/client.py`` against it and returns what it printed as JSON).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.datasource.conftest import (
    Truth,
    build_store,
    field_store,  # noqa: F401  (the fixture: a store with fields)
    generate_records,
    rocketmq_dir,  # noqa: F401  (the fixture: a bare directory of index files)
)

REPO = Path(__file__).resolve().parents[2]
CLIENT_TIMEOUT_S = 600


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL (``sc://127.0.0.1:<port>``) of a Spark Connect server running for the whole session."""
    from msgindex.spark.runtime.connect_server import LocalConnectServer

    server = LocalConnectServer(tmp_path_factory.mktemp("connect-server"),
                                extra_conf={"spark.driver.memory": "768m"})
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def connect_client(connect_server: str) -> Callable[..., Any]:
    """``connect_client(scenario, **args)``: run ``client.<scenario>(spark, **args)`` in a new
    Python process with a Connect session on the server; returns its JSON result."""

    def run(scenario: str, **args: Any) -> Any:
        done = subprocess.run(
            [sys.executable, "-m", "tests.connect.client", scenario, connect_server, json.dumps(args)],
            cwd=REPO, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S,
        )
        if done.returncode != 0:
            raise AssertionError(f"Connect client {scenario!r} failed ({done.returncode}):\n"
                                 f"{done.stdout[-4000:]}\n{done.stderr[-8000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run


@pytest.fixture(scope="session")
def connect_truth(tmp_path_factory: pytest.TempPathFactory) -> Truth:
    """The data source tests' ground-truth store, for reads through Connect."""
    rows = generate_records()
    path = tmp_path_factory.mktemp("connect-store") / "store"
    build_store(path, rows)
    return Truth(path, tuple(rows))


@pytest.fixture(scope="session")
def connect_object_truth(connect_truth: Truth, s3) -> Truth:
    """The same records in an index on the session's S3 server (moto): ``path`` is its URL."""
    url = s3.url("store")
    build_store(url, list(connect_truth.rows), storage_options=s3.options)
    return Truth(url, connect_truth.rows)
