"""Failures reach the user as one line, also when they happen deep inside Spark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from msgindex.cli.failure import explain, write_log
from msgindex.errors import ShardLockedError, StoreNotFoundError

pytestmark = pytest.mark.spark

MSGINDEX = str(Path(sys.executable).with_name("msgindex"))  # the console script of this environment
LOCKED = "/data/index/broker=a/lock: shard 'a' already has a writer (lock held)"


def _raise_locked(*_args):
    raise ShardLockedError(LOCKED)


def test_error_in_a_foreach_batch_function_is_one_line(spark):
    query = spark.readStream.format("rate").option("rowsPerSecond", 10).load().writeStream \
        .foreachBatch(_raise_locked).start()
    with pytest.raises(Exception) as caught:
        query.awaitTermination(120)
    assert len(str(caught.value).splitlines()) > 10  # what a user saw before
    failure = explain(caught.value)
    assert failure.line == LOCKED and failure.raised_by_msgindex


def test_error_in_a_task_is_one_line(spark):
    def task(batches):
        for batch in batches:
            raise StoreNotFoundError("/data/index: no such msgindex store (the path does not exist)")
            yield batch  # pragma: no cover

    with pytest.raises(Exception) as caught:
        spark.range(2).mapInArrow(task, "id long").collect()
    failure = explain(caught.value)
    assert failure.line == "/data/index: no such msgindex store (the path does not exist)"
    assert failure.raised_by_msgindex


def test_other_errors_name_their_type_and_log_everything(tmp_path):
    try:
        {}["missing"]
    except KeyError as error:
        failure, log = explain(error), write_log("lookup", error, tmp_path / "logs")
    assert failure == type(failure)("KeyError: 'missing'", False)
    assert "Traceback" in log.read_text() and log.parent == tmp_path / "logs"


def test_the_cli_prints_one_line_and_exits_2_for_msgindex_errors(tmp_path):
    done = subprocess.run([MSGINDEX, "lookup", str(tmp_path / "nope"), "--key", "k"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"msgindex lookup: {tmp_path / 'nope'}: no such msgindex store (the path does not exist)"
    ]
    verbose = subprocess.run([MSGINDEX, "lookup", str(tmp_path / "nope"), "--key", "k",
                              "--verbose"], capture_output=True, text=True, timeout=120)
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr
