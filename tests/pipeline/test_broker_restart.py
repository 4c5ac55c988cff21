"""The Kafka broker restarts while the indexing query runs (a broker this test owns, on its own
free ports); the query survives it or is restarted from its checkpoint, then stops gracefully on
request, and the index equals the ground truth exactly."""

from __future__ import annotations

import threading
import time

import pytest

from msgindex.kafka.admin import create_topics
from msgindex.kafka.broker import LocalBroker, free_port
from msgindex.kafka.loadgen import keyed_records, produce
from tests.pipeline.support import assert_index_equals, ground_truth, job_args, run_job_in_process

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

PHASE_RECORDS = 4_000
CATCH_UP_TIMEOUT_S = 240


@pytest.fixture
def own_broker(tmp_path):
    broker = LocalBroker(tmp_path / "kafka", port=free_port(), controller_port=free_port())
    broker.start(timeout=180)
    yield broker
    broker.stop()


def _committed_batches(index) -> int:
    commits = index / "_checkpoint" / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else 0


def _indexed(index) -> int:
    import msgindex

    try:
        with msgindex.open(index) as store:
            return sum(store.reader(b).record_count for b in store.brokers())
    except Exception:  # not created yet
        return 0


def test_broker_restart_mid_stream(own_broker, spark, tmp_path):
    bootstrap = own_broker.bootstrap
    topic = "restart-topic"
    create_topics(bootstrap, {topic: 3})
    produce(bootstrap, keyed_records([topic], PHASE_RECORDS, key_pool=500, seed=1))
    index = tmp_path / "index"
    args = job_args(bootstrap, [topic], index, "--trigger-interval", "1 second", "--max-offsets-per-trigger", "1000",
                    "--quiet-spark")
    stop, outcome = threading.Event(), {}

    def job() -> None:
        try:
            outcome["history"] = run_job_in_process_with_stop(args, stop)
        except Exception as error:  # the query may die while the broker is away: restarted below
            outcome["error"] = error

    runner = threading.Thread(target=job, daemon=True)
    runner.start()
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    while _committed_batches(index) < 1 and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _committed_batches(index) >= 1, outcome.get("error")

    own_broker.stop()
    time.sleep(3)
    own_broker.start(timeout=180)  # same ports, same data
    produce(bootstrap, keyed_records([topic], PHASE_RECORDS, key_pool=500, seed=2))
    expected = 2 * PHASE_RECORDS
    while _indexed(index) < expected and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(1)
    stop.set()
    runner.join(120)
    assert not runner.is_alive(), "the job did not stop gracefully"
    survived = "error" not in outcome and _indexed(index) == expected
    what = "survived the broker restart" if survived else "was restarted after: " + repr(outcome.get("error"))[:300]
    print(f"the running query {what}")
    if not survived:
        run_job_in_process(job_args(bootstrap, [topic], index, "--available-now", "--quiet-spark"))
    assert_index_equals(index, ground_truth(bootstrap, [topic]), topics=[topic])


def run_job_in_process_with_stop(args, stop):
    from msgindex.cli import index as index_job
    from msgindex.spark.pipeline.job import index_kafka

    options = index_job.options_from_args(index_job.build_parser().parse_args(args))
    return index_kafka(options, stop=stop)
