"""The driver side of the pipeline: ``foreachBatch(df, batch_id)`` plans a micro-batch and reports it.

Per micro-batch, on the driver (no per-row Python here):
  1. records input: partitions seen for the first time are assigned to their current leader and
     recorded (partition-brokers.json) BEFORE any write, so a replay writes the same shards;
     metadata input: events are parsed in the JVM (metadata_events.py), malformed ones get a reason;
  2. every row gets its shard (``broker``) and the id of its Kafka input partition (``slice``,
     evaluated before the coalesce), then the batch is coalesced to at most the cluster's cores,
     NEVER shuffled, and ``mapInArrow`` runs ``task_writer.write_task`` on each task: the task
     splits its rows by shard and appends them (executor side, task_writer.py);
  3. the tasks' ``TaskCommit`` rows come back: one ``BatchStats`` per batch, printed by
     ``IndexSink`` and appended to ``<index>/_batches.jsonl`` (progress.py) for clients that do
     not see the driver's output (Spark Connect).

Exactly once by Kafka offsets (storage/source_ranges.py), so nothing here depends on batch ids:
a replayed batch, a retried or speculative task, or a new Spark checkpoint finds its rows
committed and reports them as such.

``BatchWriter`` is the foreachBatch function proper: picklable, no threads or locks (a Spark
Connect server runs it in a process of its own). ``IndexSink`` wraps it for a local driver:
graceful stop, lag, progress lines.
"""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable
from urllib.parse import urlparse

from msgindex.errors import InvalidOptionError, MsgIndexError
from msgindex.spark.commits import COMMIT_DDL, commit_of_row
from msgindex.spark.kafka_records import project_records
from msgindex.spark.metadata_events import parse_metadata_events
from msgindex.spark.partition_brokers import PartitionBrokerMap
from msgindex.spark.progress import append_batch_log
from msgindex.spark.task_writer import (
    INPUT_KINDS,
    INPUT_METADATA,
    INPUT_RECORDS,
    SLICE,
    SinkConfig,
    task_function,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["BatchStats", "BatchWriter", "GracefulStop", "IndexSink", "SinkConfig", "INPUT_RECORDS", "INPUT_METADATA"]

LEADER_WAIT_S = 30.0  # how long a batch waits for a new partition to get a leader
NO_LEADER = -1


class GracefulStop(MsgIndexError):
    """Raised by a micro-batch that starts after a stop was requested (it writes nothing; the
    query stops and the batch is replayed on the next run)."""


@dataclass
class BatchStats:
    """What one micro-batch committed, summed over its tasks, whoever committed it."""

    batch_id: int
    appended: int = 0  # records this batch's tasks wrote
    already_committed: int = 0  # records of this batch the shards held already (replays, retries, copies)
    keys_indexed: int = 0  # index entries of the appended records
    unkeyed: int = 0
    quarantined: int = 0  # malformed events set aside now
    quarantined_before: int = 0  # malformed events of this batch found in the quarantine already
    late_attempts: int = 0  # shard commits reported by a task's retry or speculative copy
    seconds: float = 0.0
    write_seconds: float = 0.0  # summed over tasks: time inside shard appends (executors)
    lag: int | None = None
    brokers: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        """Records of the batch now in the index (new or not)."""
        return self.appended + self.already_committed

    @property
    def malformed(self) -> int:
        """Malformed events of the batch now in the quarantine (new or not)."""
        return self.quarantined + self.quarantined_before

    @classmethod
    def from_commits(cls, batch_id: int, rows: list, seconds: float) -> BatchStats:
        stats = cls(batch_id, seconds=seconds)
        for commit in map(commit_of_row, rows):
            stats.appended += commit.appended
            stats.already_committed += commit.already_committed
            stats.keys_indexed += commit.keys_indexed
            stats.unkeyed += commit.unkeyed
            stats.quarantined += commit.quarantined
            stats.quarantined_before += commit.quarantined_before
            stats.write_seconds += commit.write_ms / 1000
            if commit.broker is not None and commit.broker not in stats.brokers:
                stats.brokers.append(commit.broker)
            stats.late_attempts += commit.attempt > 0
        stats.brokers.sort()
        return stats

    def to_json(self) -> dict:
        return {"batch_id": self.batch_id, "records": self.records, "appended": self.appended,
                "already_committed": self.already_committed, "keys_indexed": self.keys_indexed,
                "unkeyed": self.unkeyed, "quarantined": self.quarantined,
                "quarantined_before": self.quarantined_before, "shards": self.brokers,
                "late_attempts": self.late_attempts,
                "seconds": round(self.seconds, 3), "write_seconds": round(self.write_seconds, 3)}

    def line(self) -> str:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        lag = "?" if self.lag is None else f"{self.lag:,}"
        new = f"{self.appended:,} new" + (f", {self.already_committed:,} already committed" if self.already_committed else "")
        quarantined = f"{self.malformed:,} quarantined" + (f" ({self.quarantined_before:,} already)" if self.quarantined_before else "")
        return (
            f"batch {self.batch_id}: {self.records:,} records ({new}) in {self.seconds:.2f} s ({rate:,.0f} rec/s) | "
            f"{self.keys_indexed:,} keys indexed | {len(self.brokers)} shards | "
            f"{self.unkeyed:,} unkeyed | {quarantined} | lag {lag}"
        )


class BatchWriter:
    """The ``foreachBatch`` function: plans the batch, runs its tasks, returns its BatchStats.
    Picklable and free of threads and locks (see the module docstring)."""

    def __init__(self, config: SinkConfig, *, bootstrap_servers: str | None = None,
                 subscribe: list[str] | None = None, subscribe_pattern: str | None = None,
                 parallelism: int | None = None) -> None:
        if config.input_kind not in INPUT_KINDS:
            raise InvalidOptionError(f"input kind {config.input_kind!r} is not one of {', '.join(INPUT_KINDS)}")
        if config.input_kind == INPUT_RECORDS and bootstrap_servers is None:
            raise InvalidOptionError("input 'records' needs the Kafka bootstrap servers to find partition leaders")
        if config.input_kind == INPUT_RECORDS and (subscribe is None) == (subscribe_pattern is None):
            raise InvalidOptionError("input 'records' needs exactly one of subscribe / subscribe_pattern")
        if parallelism is not None and parallelism < 1:
            raise InvalidOptionError(f"parallelism must be >= 1, got {parallelism}")
        self.config = config
        self.bootstrap_servers = bootstrap_servers
        self.subscribe = subscribe
        self.subscribe_pattern = subscribe_pattern
        self.parallelism = parallelism
        self.partition_brokers = PartitionBrokerMap(config.root)

    def __call__(self, df: "DataFrame", batch_id: int) -> BatchStats:
        started = time.perf_counter()
        tasks = self.plan(df)
        rows = tasks.mapInArrow(task_function(self.config, int(batch_id)), COMMIT_DDL).collect()
        stats = BatchStats.from_commits(int(batch_id), rows, time.perf_counter() - started)
        append_batch_log(self.config.root, stats.to_json())
        return stats

    def plan(self, df: "DataFrame") -> "DataFrame":
        """The batch's rows as the columns the tasks take (shard and slice columns included),
        coalesced to at most `parallelism` tasks without a shuffle."""
        from pyspark.sql import functions as F

        prepared = self.prepare(df).withColumn(SLICE, F.spark_partition_id().cast("long"))
        return prepared.coalesce(self.parallelism) if self.parallelism else prepared

    def prepare(self, df: "DataFrame") -> "DataFrame":
        """The batch's Kafka rows as the columns `write_task` takes, with the shard column."""
        if self.config.input_kind == INPUT_METADATA:
            return parse_metadata_events(df)
        return project_records(df, self._broker_column())

    def _leaders(self) -> dict[tuple[str, int], int]:
        from msgindex.kafka.admin import partition_leaders

        if self.subscribe is not None:
            return partition_leaders(self.bootstrap_servers, self.subscribe)
        pattern = re.compile(self.subscribe_pattern)
        return {tp: leader for tp, leader in partition_leaders(self.bootstrap_servers).items()
                if pattern.fullmatch(tp[0])}

    def _new_partition_leaders(self) -> dict[tuple[str, int], int]:
        """Leaders of subscribed partitions not yet in the map, waiting (bounded) for partitions
        that have none at the moment (a leader election, a broker restarting)."""
        deadline = time.monotonic() + LEADER_WAIT_S
        while True:
            known = self.partition_brokers.as_dict()
            new = {tp: leader for tp, leader in self._leaders().items() if tp not in known}
            if all(leader != NO_LEADER for leader in new.values()) or time.monotonic() > deadline:
                return {tp: leader for tp, leader in new.items() if leader != NO_LEADER}
            time.sleep(0.5)

    def _broker_column(self) -> "Column":
        """partition -> broker as a map literal: new partitions get their leader, recorded first."""
        from pyspark.sql import functions as F

        self.partition_brokers.extend({tp: str(leader) for tp, leader in self._new_partition_leaders().items()})
        mapping = self.partition_brokers.as_dict()
        if not mapping:
            return F.lit(None).cast("string")
        pairs = [F.lit(x) for (topic, partition), broker in sorted(mapping.items()) for x in (f"{topic}:{partition}", broker)]
        return F.try_element_at(F.create_map(*pairs), F.concat_ws(":", "topic", F.col("partition").cast("string")))


class IndexSink:
    """The ``foreachBatch`` callable of a local driver: a BatchWriter plus graceful stop, lag
    and progress lines (its threads and locks never leave the driver)."""

    def __init__(self, writer: BatchWriter, *, checkpoint: str | None = None,
                 on_batch: Callable[[BatchStats], None] | None = None) -> None:
        self.writer = writer
        self.config = writer.config
        self.checkpoint = checkpoint
        self.on_batch = on_batch
        self.history: list[BatchStats] = []
        self._stopping = threading.Event()
        self._busy = threading.Lock()  # held while a batch writes; a stop waits for it
        self._reporter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="msgindex-progress")
        self._offsets = None  # a Kafka consumer for lag, used by the reporter thread only

    # --- stopping ------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """No new batch will write after this returns; waits for the batch in flight to finish."""
        self._stopping.set()
        with self._busy:
            pass

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # --- the batch -----------------------------------------------------------------------------
    def __call__(self, df: "DataFrame", batch_id: int) -> None:
        with self._busy:
            if self._stopping.is_set():
                raise GracefulStop(f"batch {batch_id} not started: the indexing job is stopping")
            stats = self.writer(df, batch_id)
            self.history.append(stats)
            # Lag needs a round trip to Kafka: reported off the batch's critical path, in order.
            self._reporter.submit(self._report, stats)

    def _report(self, stats: BatchStats) -> None:
        stats.lag = self._lag(stats.batch_id)
        if self.on_batch is not None:
            self.on_batch(stats)

    def flush(self) -> None:
        """Wait until every finished batch has been reported (call before the final summary)."""
        self._reporter.submit(lambda: None).result()

    def close(self) -> None:
        """Report what is pending and release the lag consumer."""
        self._reporter.submit(self._close_offsets).result()
        self._reporter.shutdown()

    def _close_offsets(self) -> None:
        if self._offsets is not None:
            self._offsets.close()
            self._offsets = None

    def _lag(self, batch_id: int) -> int | None:
        """Messages behind the latest Kafka offsets after this batch: the batch's end offsets
        (Spark's offset log in a local checkpoint) against the brokers' log-end offsets."""
        from msgindex.kafka.admin import latest_offsets, offsets_consumer

        if self.writer.bootstrap_servers is None or self.checkpoint is None:
            return None
        ends = spark_batch_end_offsets(self.checkpoint, batch_id)
        if not ends:
            return None
        try:
            if self._offsets is None:
                self._offsets = offsets_consumer(self.writer.bootstrap_servers)
            latest = latest_offsets(self.writer.bootstrap_servers, sorted({topic for topic, _ in ends}),
                                    consumer=self._offsets)
        except Exception:  # lag is informational (a broker may be restarting): report "?" instead
            self._close_offsets()
            return None
        return sum(max(latest.get(tp, end) - end, 0) for tp, end in ends.items())


def local_path(location: str | Path) -> Path | None:
    """A checkpoint location as a local path: a plain path or a ``file:`` URI (None otherwise)."""
    text = str(location)
    parsed = urlparse(text)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme and len(parsed.scheme) > 1:  # hdfs://, s3a://, ... (not a Windows drive)
        return None
    return Path(text)


def spark_batch_end_offsets(checkpoint: str | Path, batch_id: int) -> dict[tuple[str, int], int]:
    """The Kafka end offsets of micro-batch `batch_id` from Spark's offset log
    (``<checkpoint>/offsets/<id>``: a version line, the batch metadata, then one JSON line per
    source). Empty when the checkpoint is not on a local filesystem or the file is missing."""
    directory = local_path(checkpoint)
    if directory is None:
        return {}
    try:
        lines = (directory / "offsets" / str(batch_id)).read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    ends: dict[tuple[str, int], int] = {}
    for line in lines[2:]:
        try:
            source = json.loads(line)
        except ValueError:
            continue
        if isinstance(source, dict):
            for topic, partitions in source.items():
                if isinstance(partitions, dict):
                    ends.update({(topic, int(p)): int(o) for p, o in partitions.items()})
    return ends
