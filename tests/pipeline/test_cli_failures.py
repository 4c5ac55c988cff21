"""The indexing job's failures through the real CLI (`msgindex index` in a subprocess): one line on
stderr naming what is wrong, exit 2, and no wait of minutes.

* the Kafka source, checked before Spark starts (kafka.admin.check_source): a topic that does
  not exist, an address where nothing listens, one that accepts connections but never answers,
  a host that does not resolve;
* the index: held by another job; a shard lock held past --lock-timeout (raised inside a Spark
  task); a shard checkpoint that is corrupt or missing.

A full disk is in test_disk_full_pipeline.py.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from msgindex.kafka.admin import OutgoingRecord, create_topics, partition_leaders, produce
from msgindex.kafka.broker import free_port
from msgindex.spark.pipeline.ownership import IndexClaim, JobIdentity
from msgindex.storage.settings import StoreSettings
from msgindex.storage.store import open_store
from tests.pipeline.support import job_args, run_job_in_process

pytestmark = pytest.mark.kafka

MSGINDEX = str(Path(sys.executable).with_name("msgindex"))  # the console script of this environment
SMALL_SETTINGS = StoreSettings(hash_slot_num=4099, index_num=20000, segment_bytes=256 * 1024)  # support.SMALL_STORE
SOURCE_CHECK_BUDGET_S = 25.0  # check_source waits at most ~15 s; the rest is the CLI's start-up


def run_cli(args: list[str], timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([MSGINDEX, "index", *args], capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - started


# What the JVM itself prints on stderr when Spark starts it (Spark's launcher adds the module),
# before any logging is set up: not msgindex's to silence.
JVM_NOTICE = "WARNING: Using incubator modules: jdk.incubator.vector"


def assert_one_line(done: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 2 and one line on stderr (besides the JVM's own start-up notice), holding `fragments`."""
    lines = [line for line in done.stderr.strip().splitlines() if line != JVM_NOTICE]
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("msgindex index: "), done.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _topic(bootstrap: str, records: int = 0) -> str:
    name = f"cli-{uuid.uuid4().hex[:12]}"
    create_topics(bootstrap, {name: 1})
    if records:
        produce(bootstrap, name, [OutgoingRecord(f"k{n}", b"v") for n in range(records)])
    return name


def test_a_topic_that_does_not_exist_is_named(kafka_bootstrap, tmp_path):
    existing = _topic(kafka_bootstrap)
    done, seconds = run_cli(job_args(kafka_bootstrap, [existing + "x"], tmp_path / "ix", "--available-now"))
    assert_one_line(done, f"topic '{existing}x' (did you mean '{existing}'?) does not exist on {kafka_bootstrap}")
    assert seconds < SOURCE_CHECK_BUDGET_S


def test_an_address_where_nothing_listens_is_named(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    done, seconds = run_cli(job_args(address, ["t"], tmp_path / "ix", "--available-now"))
    assert_one_line(done, f"no Kafka broker answers at {address}: {address}: ")
    assert seconds < SOURCE_CHECK_BUDGET_S


def test_an_address_that_never_answers_is_named(tmp_path):
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        done, seconds = run_cli(job_args(address, ["t"], tmp_path / "ix", "--available-now"))
    assert_one_line(done, f"Kafka at {address} accepted a connection but did not answer as a Kafka broker")
    assert seconds < SOURCE_CHECK_BUDGET_S


def test_an_unresolvable_host_is_named(tmp_path):
    done, seconds = run_cli(job_args("no-such-host.invalid:9092", ["t"], tmp_path / "ix", "--available-now"))
    assert_one_line(done, "no Kafka broker answers at no-such-host.invalid:9092", "host 'no-such-host.invalid' does not resolve")
    assert seconds < SOURCE_CHECK_BUDGET_S


def test_a_second_job_on_the_same_index_is_refused(kafka_bootstrap, tmp_path):
    topic = _topic(kafka_bootstrap)
    index = tmp_path / "ix"
    open_store(index, create=True, settings=SMALL_SETTINGS).close()  # the first job's store
    # the claim a running job holds for its whole life (pipeline.index_kafka), held here by this process
    with IndexClaim(index.resolve(), JobIdentity.current("first-job", str(index / "_checkpoint"))):
        done, seconds = run_cli(job_args(kafka_bootstrap, [topic], index, "--available-now"))
    assert_one_line(done, f"--path {index} is being indexed by another job right now", "first-job")
    assert seconds < SOURCE_CHECK_BUDGET_S


@pytest.mark.spark
def test_a_shard_locked_past_the_lock_timeout_is_one_line(kafka_bootstrap, spark, tmp_path):
    topic = _topic(kafka_bootstrap, records=20)
    index = tmp_path / "ix"
    args = job_args(kafka_bootstrap, [topic], index, "--available-now", "--quiet-spark")
    run_job_in_process(args)  # creates the index and the shard
    produce(kafka_bootstrap, topic, [OutgoingRecord(f"more{n}", b"v") for n in range(20)])
    broker = str(partition_leaders(kafka_bootstrap, [topic])[(topic, 0)])

    with open_store(index) as store, store.writer(broker):  # someone else writes the shard
        done, _ = run_cli([*args, "--lock-timeout", "2"])
    assert_one_line(done, f"{index}/broker={broker}/lock: shard '{broker}' lock still held after waiting 2 s",
                    "a stuck task of this job, or another job writing the same index?")


@pytest.mark.spark
@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_damaged_shard_checkpoint_is_one_line(kafka_bootstrap, spark, tmp_path, damage):
    topic = _topic(kafka_bootstrap, records=20)
    index = tmp_path / "ix"
    args = job_args(kafka_bootstrap, [topic], index, "--available-now", "--quiet-spark")
    run_job_in_process(args)
    produce(kafka_bootstrap, topic, [OutgoingRecord(f"more{n}", b"v") for n in range(20)])
    broker = str(partition_leaders(kafka_bootstrap, [topic])[(topic, 0)])
    checkpoint = index / f"broker={broker}" / "checkpoint"
    if damage == "corrupt":
        checkpoint.write_bytes(b"\x00garbage" * 10)
    else:
        checkpoint.unlink()

    done, _ = run_cli(args)
    line = assert_one_line(done, str(checkpoint))
    assert f"run `msgindex repair {index} --broker {broker}`" in line  # what to do, in both cases
    assert ("not valid" if damage == "corrupt" else "missing") in line
