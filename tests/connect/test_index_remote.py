"""`msgindex index --remote sc://HOST:PORT`: the indexing job runs on a Spark Connect server (the
session fixture's), the CLI process prints its progress, and the index holds every record of the
topic exactly once (ground truth from kafka-python); a second run with a new Spark checkpoint
finds everything committed and adds nothing; SIGTERM to the client stops the query on the server,
and a restart from the same checkpoint completes the index exactly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from msgindex.kafka.admin import OutgoingRecord, create_topics, produce
from tests.pipeline.support import assert_index_equals, ground_truth, job_args

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

MSGINDEX = str(Path(sys.executable).with_name("msgindex"))
RECORDS = 6_000


def _index(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([MSGINDEX, "index", *args], capture_output=True, text=True, timeout=600)


def _progress(stdout: str) -> list[str]:
    return [line.split("] ", 1)[1] for line in stdout.splitlines() if line.startswith("[msgindex ")]


def test_the_job_runs_on_a_connect_server_with_progress_on_the_client(kafka_bootstrap, connect_server, tmp_path):
    topic = f"remote-{uuid.uuid4().hex[:10]}"
    create_topics(kafka_bootstrap, {topic: 2})
    produce(kafka_bootstrap, topic, [OutgoingRecord(f"k{n % 1000}", b"v", keys=(f"order-{n}",), uniq_key=f"u{n}")
                                     for n in range(RECORDS)])
    index = (tmp_path / "index").resolve()  # the server's path (here the same machine)
    args = job_args(kafka_bootstrap, [topic], index, "--remote", connect_server, "--available-now",
                    "--max-offsets-per-trigger", "2500")

    first = _index(args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    lines = _progress(first.stdout)
    batches = [line for line in lines if line.startswith("batch ")]
    assert len(batches) >= 2, lines  # one line per micro-batch, read back through Spark on the client
    assert any(line.startswith("retention: ") for line in lines)
    assert lines[-1].startswith(f"done: {len(batches)} batches, {RECORDS:,} records ({RECORDS:,} new)"), lines[-1]
    assert f"Spark Connect {connect_server}" in first.stdout
    assert_index_equals(index, ground_truth(kafka_bootstrap, [topic]), topics=[topic])

    again = _index([*args, "--checkpoint", str(tmp_path / "new-checkpoint")])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert _progress(again.stdout)[-1].startswith("done: ") and f"{RECORDS:,} records (0 new, {RECORDS:,} already committed)" \
        in _progress(again.stdout)[-1], again.stdout[-2000:]
    assert_index_equals(index, ground_truth(kafka_bootstrap, [topic]), topics=[topic])


def test_sigterm_stops_the_query_on_the_server_and_a_restart_is_exact(kafka_bootstrap, connect_server, tmp_path):
    topic = f"remote-stop-{uuid.uuid4().hex[:10]}"
    create_topics(kafka_bootstrap, {topic: 2})
    produce(kafka_bootstrap, topic, [OutgoingRecord(f"k{n % 700}", b"v", keys=(f"order-{n}",)) for n in range(RECORDS)])
    index = (tmp_path / "index").resolve()
    args = job_args(kafka_bootstrap, [topic], index, "--remote", connect_server, "--max-offsets-per-trigger", "500",
                    "--trigger-interval", "1 second")
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        job = subprocess.Popen([MSGINDEX, "index", *args], stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 300
            while not any(line.startswith("batch ") for line in _progress(log.read_text())):
                assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            job.send_signal(signal.SIGTERM)  # as a supervisor stops it: mid-stream, maybe mid-batch
            assert job.wait(120) == 0, log.read_text()[-3000:]
        finally:
            if job.poll() is None:
                job.kill()
    lines = _progress(log.read_text())
    assert "SIGTERM: stopping after the current batch" in lines and lines[-1].startswith("stopped: "), lines[-5:]
    indexed = int(lines[-1].split(" records", 1)[0].rsplit(" ", 1)[1].replace(",", ""))
    assert 0 < indexed < RECORDS, lines[-1]  # stopped partway: the restart has work left

    # The query no longer runs on the server: a run from the same Spark checkpoint may start
    # (a live query would hold the index and the checkpoint) and completes the index exactly.
    rest = _index([*args[: args.index("--trigger-interval")], "--available-now"])
    assert rest.returncode == 0, rest.stdout[-3000:] + rest.stderr[-3000:]
    assert _progress(rest.stdout)[-1].startswith("done: "), rest.stdout[-2000:]
    assert_index_equals(index, ground_truth(kafka_bootstrap, [topic]), topics=[topic])
