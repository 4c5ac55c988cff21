"""``msgindex doctor`` run as users run it, in the environment their shell gives: it names what is
wrong (the workers' Python, Kafka, the index) and what to do, and says ok when all is."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from tests.cli.conftest import MSGINDEX
from tests.packaging.conftest import PROJECT_VENV_BIN, user_environment


def doctor(*argv: str, activated: bool = True) -> subprocess.CompletedProcess:
    env = user_environment(PROJECT_VENV_BIN if activated else None)
    return subprocess.run([MSGINDEX, "doctor", *argv], capture_output=True, text=True, timeout=600, env=env)


def test_a_venv_python_run_without_activation_is_named_with_the_fix(tmp_path):
    """What a Jupyter kernel started elsewhere looks like: Spark's workers would run python3 from PATH."""
    done = doctor("--no-spark", activated=False)
    assert done.returncode == 2, done.stdout
    lines = done.stdout.splitlines()
    failed = next(i for i, line in enumerate(lines) if line.startswith("  FAIL  workers' Python: python3 from PATH"))
    assert "cannot import msgindex" in lines[failed] and "DATA_SOURCE_NOT_FOUND" in lines[failed]
    assert f"set PYSPARK_PYTHON={PROJECT_VENV_BIN / 'python'}" in lines[failed + 1]
    assert lines[-1] == "1 check(s) failed"


def test_unreachable_kafka_and_a_path_that_is_no_index_are_named_within_seconds(tmp_path):
    started = time.monotonic()
    done = doctor(str(tmp_path / "nowhere"), "--bootstrap-servers", "127.0.0.1:1", "--no-spark")
    assert time.monotonic() - started < 60
    assert done.returncode == 2
    assert "  FAIL  Kafka: no Kafka broker answers at 127.0.0.1:1" in done.stdout
    assert f"  FAIL  index: {tmp_path / 'nowhere'}: no such msgindex store (the path does not exist)" in done.stdout
    assert "  ok    workers' Python: python3 from PATH" in done.stdout  # activated: the venv's own


@pytest.mark.kafka
@pytest.mark.spark
def test_all_ok_with_kafka_an_index_and_a_plain_spark_session(incident_index):
    done = doctor(str(incident_index.path), "--bootstrap-servers", incident_index.bootstrap)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = done.stdout
    assert re.search(rf"  ok    index: {re.escape(str(incident_index.path))}: \d+ shard\(s\), "
                     rf"{len(incident_index.messages):,} messages, topics ", out)
    assert f"  ok    Kafka: {incident_index.bootstrap} answers" in out and "all 2 topics of the index exist" in out
    assert "workers: " in out and "msgindex 0.1.0" in out
    assert 'format("msgindex"): reads the index (5 of the first 5 rows)' in out
    assert out.splitlines()[-1] == "all checks ok"
