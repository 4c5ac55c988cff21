"""``format("msgindex")`` in SparkSessions that users open themselves (``SparkSession.builder``,
never msgindex's builder; no register call; no msgindex environment variable), in a Python of
their own, for both install kinds: the README's editable install (the project's venv) and a wheel
installed into a fresh venv.

How Spark picks the Python of its workers decides it all: an activated venv works; the venv's
Python run by full path without activation leaves Spark's workers on another ``python3``, where
Spark cannot find the source, and msgindex's own entry points then say what to set."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.datasource.conftest import assert_fetched, kafka_backed_store, rows_of_json
from tests.packaging.conftest import PROJECT_VENV_BIN, user_environment

pytestmark = pytest.mark.spark
SCRIPT = Path(__file__).resolve().parent / "plain_session.py"
KEY = "Aa"
SESSION_TIMEOUT_S = 600


def run_plain_session(python: Path, env: dict[str, str], store: Path | str, cwd: Path, fetch: dict | None = None) -> dict:
    extra = [json.dumps(fetch)] if fetch is not None else []
    done = subprocess.run([str(python), str(SCRIPT), str(store), KEY, *extra], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=SESSION_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_reads_right(results: dict, truth, installed_under: Path) -> None:
    assert not [name for name in results if name.endswith("_error")], results
    assert results["where_msgindex_from"].startswith(str(installed_under))
    assert {tuple(r) for r in results["option"]} == truth.select(keys={KEY})
    assert {tuple(r) for r in results["where"]} == truth.select(primary={KEY})
    assert {tuple(r[1:]) for r in results["bulk"]} == truth.select(keys={KEY})
    assert f"EqualTo(key,{KEY})" in results["pushed"]["plan"]
    assert {tuple(r) for r in results["pushed"]["ids"]} == truth.select(primary={KEY})


def test_editable_install_in_an_activated_venv(packaging_store, tmp_path):
    results = run_plain_session(PROJECT_VENV_BIN / "python", user_environment(PROJECT_VENV_BIN),
                                packaging_store.path, tmp_path)
    # the editable install is a plain path entry naming the source root
    assert_reads_right(results, packaging_store, Path(__file__).resolve().parents[2] / "connector")


@pytest.mark.kafka
def test_editable_install_reads_an_object_store_index(packaging_object_store, s3, kafka_bootstrap, kafka_topic, tmp_path):
    """The same reads of an s3:// index, the store's endpoint and credentials in the AWS_*
    variables of the user's shell: Spark's workers read the objects themselves; and fetchValues
    of an s3:// index of records in Kafka."""
    fetch_url = s3.url("fetch")
    sent = kafka_backed_store(kafka_bootstrap, kafka_topic(partitions=2), fetch_url, storage_options=s3.options)
    env = {**user_environment(PROJECT_VENV_BIN), **s3.env}
    results = run_plain_session(PROJECT_VENV_BIN / "python", env, packaging_object_store.path, tmp_path,
                                fetch={"store": fetch_url, "key": "cust-1", "bootstrap": kafka_bootstrap})
    assert_reads_right(results, packaging_object_store, Path(__file__).resolve().parents[2] / "connector")
    assert_fetched(rows_of_json(results["fetched"]), sent, "cust-1")
    assert list(tmp_path.iterdir()) == [] or all(p.name.startswith("spark-") for p in tmp_path.iterdir())


def test_editable_install_run_by_full_path_without_activation(packaging_store, tmp_path):
    """Spark then starts its workers with ``python3`` from PATH, which has no msgindex."""
    env = user_environment(None)
    results = run_plain_session(PROJECT_VENV_BIN / "python", env, packaging_store.path, tmp_path)
    assert "DATA_SOURCE_NOT_FOUND" in results["option_error"]  # Spark's own error, before any msgindex code
    for step in ("bulk_error", "pushed_error"):  # msgindex's entry points say what to do
        assert results[step].startswith("WorkerPythonError: Spark starts its Python workers with 'python3'")
        assert f"set PYSPARK_PYTHON={PROJECT_VENV_BIN / 'python'}" in results[step]
    # ... and doing what it says is enough
    env["PYSPARK_PYTHON"] = str(PROJECT_VENV_BIN / "python")
    fixed = run_plain_session(PROJECT_VENV_BIN / "python", env, packaging_store.path, tmp_path)
    assert_reads_right(fixed, packaging_store, Path(__file__).resolve().parents[2] / "connector")


@pytest.mark.slow
def test_wheel_in_a_fresh_venv(wheel_and_venv, packaging_store, tmp_path):
    wheel, venv = wheel_and_venv
    names = zipfile.ZipFile(wheel).namelist()
    assert "pyspark_msgindex/__init__.py" in names and "msgindex/spark/read/datasource.py" in names
    assert not [n for n in names if n.startswith(("connector/", "tests/", "streaming_jobs/"))]
    if shutil.which("cc") or shutil.which("gcc"):  # setup.py's optional compiled modules, built with the wheel
        for module in ("msgindex/storage/hash_index/_index_walk", "msgindex/storage/log/_blocks",
                       "msgindex/storage/_result_rows"):
            assert [n for n in names if n.startswith(module) and n.endswith(".so")], (module, names)
    results = run_plain_session(venv / "bin" / "python", user_environment(venv / "bin"),
                                packaging_store.path, tmp_path)
    assert_reads_right(results, packaging_store, venv)
