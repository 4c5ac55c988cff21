"""Helpers of the pipeline tests: ground truth straight from Kafka, the index compared with it,
and the indexing job run in-process or as a killable subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

REPO = Path(__file__).resolve().parents[2]
INDEX_JOB = REPO / "streaming_jobs" / "index_job.py"
SMALL_STORE = ["--hash-slots", "4099", "--index-num", "20000", "--segment-bytes", str(256 * 1024)]


@dataclass
class Truth:
    """What the index must answer, derived from the records as Kafka returns them."""

    messages: dict[tuple[str, int, int], frozenset[str]] = field(default_factory=dict)  # (t, p, o) -> keys
    by_key: dict[tuple[str, str], set[tuple[int, int]]] = field(default_factory=lambda: defaultdict(set))
    raw_keys: dict[str, bytes] = field(default_factory=dict)  # keys that were not UTF-8 -> their bytes
    unkeyed: int = 0  # records whose own key is null or empty


def _text(raw: bytes, truth: Truth) -> str:
    """Key bytes as the spec says msgindex indexes them (UTF-8, undecodable bytes escaped)."""
    text = raw.decode("utf-8", "surrogateescape")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        truth.raw_keys[text] = raw
    return text


def spec_keys(key: bytes | None, headers, truth: Truth) -> frozenset[str]:
    """The keys issue 4 defines for a record, written independently of the pipeline's code."""
    keys = set()
    if key:
        keys.add(_text(key, truth))
    for name, value in headers or ():
        if value is None:
            continue
        if name == "KEYS":
            keys.update(token for token in _text(value, truth).split(" ") if token)
        elif name == "UNIQ_KEY" and value:
            keys.add(_text(value, truth))
    return frozenset(keys)


def consume_all(bootstrap: str, topics: list[str], isolation_level: str = "read_uncommitted"):
    """Every record of `topics` from the beginning to the current end offsets (kafka-python; with
    ``read_committed``, those of committed transactions and outside any)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, max_poll_records=5000,
                             fetch_max_bytes=64 * 1024 * 1024, consumer_timeout_ms=60_000,
                             isolation_level=isolation_level)
    try:
        partitions = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        pending = {tp for tp in partitions if ends[tp] > 0}
        deadline = time.monotonic() + 300
        while pending:
            for records in consumer.poll(timeout_ms=2000).values():
                yield from records
            # (a partition may end in records read_committed skips: its position still moves on)
            pending = {tp for tp in pending if consumer.position(tp) < ends[tp]}
            assert time.monotonic() < deadline, f"reading {sorted(pending)} did not reach their end offsets"
    finally:
        consumer.close()


def ground_truth(bootstrap: str, topics: list[str], keep=None, isolation_level: str = "read_uncommitted") -> Truth:
    """The index's expected content for the records of `topics`, read straight from Kafka
    (only those `keep(record)` accepts, when given)."""
    truth = Truth()
    for record in consume_all(bootstrap, topics, isolation_level):
        if keep is not None and not keep(record):
            continue
        keys = spec_keys(record.key, record.headers, truth)
        truth.unkeyed += not record.key
        truth.messages[(record.topic, record.partition, record.offset)] = keys
        for key in keys:
            truth.by_key[(record.topic, key)].add((record.partition, record.offset))
    return truth


SAMPLED_SINGLE_LOOKUPS = 60


def assert_index_equals(index_path: Path | str, truth: Truth, *, topics: list[str], always_single: set[str] = frozenset(),
                        with_broker: bool = False, storage_options: dict[str, str] | None = None) -> None:
    """Every key's lookup equals the truth (nothing missing, nothing extra), and the index holds
    every message exactly once with exactly its keys.

    Keys are looked up per topic in one multi-key call (a message answers key k iff k is among
    its keys, which are checked message by message); `always_single` keys and a random sample are
    also looked up one by one, including non-UTF-8 keys by their raw bytes. `with_broker`: a
    message is identified by (broker, topic, partition, offset), as RocketMQ queues are per broker
    (truth positions then start with the broker, and by_key values are (broker, partition, offset))."""
    import random

    import msgindex
    from msgindex.storage.message import arrow_text

    with msgindex.open(index_path, storage_options=storage_options) as store:
        logged = [row for batch in store.scan(topics=topics) for row in batch.to_pylist()]
        positions = [((row["broker"],) if with_broker else ()) + (row["topic"], row["partition"], row["offset"])
                     for row in logged]
        assert len(positions) == len(set(positions)), "a message was logged twice"
        assert set(positions) == set(truth.messages), (
            f"missing {len(set(truth.messages) - set(positions))}, extra {len(set(positions) - set(truth.messages))}")
        for row, position in zip(logged, positions):
            assert sorted(row["keys"]) == sorted(arrow_text(k) for k in truth.messages[position]), position

        for topic in topics:
            keys = sorted(key for (t, key) in truth.by_key if t == topic)
            table = store.lookup([truth.raw_keys.get(k, k) for k in keys], topic=topic)
            assert set(table.column("topic").to_pylist()) <= {topic}, "a lookup returned another topic's message"
            found = list(zip(*([table.column("broker").to_pylist()] if with_broker else []),
                             table.column("partition").to_pylist(), table.column("offset").to_pylist()))
            assert len(found) == len(set(found)), f"{topic}: a message returned twice"
            expected = set().union(*(truth.by_key[(topic, k)] for k in keys)) if keys else set()
            assert set(found) == expected, f"{topic}: missing {len(expected - set(found))}, extra {len(set(found) - expected)}"

        rng = random.Random(0)
        every = sorted(truth.by_key)
        sample = set(rng.sample(every, min(SAMPLED_SINGLE_LOOKUPS, len(every))))
        sample |= {(t, k) for (t, k) in every if k in always_single or k in truth.raw_keys}
        wrong = []
        for topic, key in sorted(sample):
            expected = {(topic, *position) for position in truth.by_key[(topic, key)]}
            table = store.lookup(truth.raw_keys.get(key, key), topic=topic)
            got = list(zip(table.column("topic").to_pylist(), *([table.column("broker").to_pylist()] if with_broker else []),
                           table.column("partition").to_pylist(), table.column("offset").to_pylist()))
            if set(got) != expected or len(got) != len(expected):
                wrong.append((topic, key[:40], len(expected), len(got)))
        assert not wrong, f"{len(wrong)} keys answered wrong, e.g. {wrong[:5]}"


def forget_commit(index: Path, batch_id: int) -> None:
    """Make Spark re-run `batch_id` on the next start, as after a crash between the shards'
    commits and Spark's: delete its entry (and checksum file) from the checkpoint's commit log."""
    commits = index / "_checkpoint" / "commits"
    (commits / str(batch_id)).unlink()
    (commits / f".{batch_id}.crc").unlink(missing_ok=True)


def job_args(bootstrap: str, topics: list[str], path: Path, *extra: str) -> list[str]:
    return ["--bootstrap-servers", bootstrap, "--subscribe", ",".join(topics), "--path", str(path), *SMALL_STORE, *extra]


def run_job_in_process(args: list[str]):
    """Run the job with the test session's SparkSession; returns its per-batch statistics."""
    from msgindex.cli import index as index_cli
    from msgindex.spark.pipeline.job import index_kafka

    return index_kafka(index_cli.options_from_args(index_cli.build_parser().parse_args(args)))


class JobProcess:
    """The indexing job as a subprocess in its own process group (so SIGKILL takes the driver,
    its JVM and its Python workers down together, like a machine crash)."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.handle = open(log, "w")
        self.process = subprocess.Popen([sys.executable, str(INDEX_JOB), *args], stdout=self.handle,
                                        stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def batches_logged(self) -> int:
        return sum(1 for line in self.text().splitlines() if "] batch " in line)

    def wait_for(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(f"job exited ({self.process.returncode}) before {what}:\n{self.text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.text()[-3000:]}")
            time.sleep(0.2)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self.handle.close()

    def terminate(self) -> None:
        """SIGTERM to the driver alone (as a supervisor would): it stops after the current batch."""
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job did not finish in {timeout} s:\n{self.text()[-3000:]}") from None
        self.handle.close()
        return code
