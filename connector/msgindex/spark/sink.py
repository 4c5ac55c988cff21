"""The pipeline's Spark sink: ``foreachBatch(df, batch_id)`` -> one owner per shard appends its group.

Per micro-batch, on the driver (no per-row Python there):
  1. records input: assign partitions seen for the first time to their current leader and record
     it (partition-brokers.json) BEFORE any write, so replays shard identically; metadata input:
     parse the events in the JVM (metadata_events.py), malformed ones get a reason;
  2. ``groupBy("broker").applyInArrow(write_group)``: on an executor each group meets its shard's
     owner (shard_owner.py), which appends it as `batch_id` and commits (or skips a batch the shard
     already has); malformed events form their own group and are quarantined once per batch id;
  3. the one-row-per-group commit messages come back to the driver: progress and totals.

Exactly once: a shard commits batch ids atomically and skips ids it already has, the batch id
reaches the executors in the function's closure, a batch's rows always go to the same shard,
and two attempts of one group are serialised by the shard lock (the later one skips).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pyarrow as pa

from msgindex.errors import InvalidOptionError, MsgIndexError
from msgindex.spark.kafka_records import project_records, records_to_append
from msgindex.spark.metadata_events import parse_metadata_events
from msgindex.spark.ownership import claim_index, spark_query_id
from msgindex.spark.partition_brokers import PartitionBrokerMap
from msgindex.spark.quarantine import REASON, write_quarantine
from msgindex.spark.shard_owner import shard_owner
from msgindex.storage.message import APPEND_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

INPUT_RECORDS = "records"
INPUT_METADATA = "metadata"
INPUT_KINDS = (INPUT_RECORDS, INPUT_METADATA)
MALFORMED_TAG = "malformed"
DEFAULT_LOCK_TIMEOUT_S = 120.0
LEADER_WAIT_S = 30.0  # how long a batch waits for a new partition to get a leader
NO_LEADER = -1

# What each group's task reports back to the driver (one row per group).
COMMIT_SCHEMA = (
    "broker string, batch_id bigint, records bigint, keys_indexed bigint, unkeyed bigint, "
    "quarantined bigint, skipped boolean, write_ms double"
)
_COMMIT_ARROW = pa.schema([
    ("broker", pa.string()), ("batch_id", pa.int64()), ("records", pa.int64()), ("keys_indexed", pa.int64()),
    ("unkeyed", pa.int64()), ("quarantined", pa.int64()), ("skipped", pa.bool_()), ("write_ms", pa.float64()),
])


class GracefulStop(MsgIndexError):
    """Raised by a micro-batch that starts after a stop was requested (it writes nothing; the
    query stops and the batch is replayed on the next run)."""


@dataclass(frozen=True)
class SinkConfig:
    """Everything an executor needs to write a batch (pickled into the group function)."""

    root: str
    input_kind: str
    quarantine_dir: str
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S


def _commit_row(broker, batch_id, *, records=0, keys_indexed=0, unkeyed=0, quarantined=0, skipped=False,
                write_ms=0.0) -> pa.Table:
    return pa.table({
        "broker": [broker], "batch_id": [batch_id], "records": [records], "keys_indexed": [keys_indexed],
        "unkeyed": [unkeyed], "quarantined": [quarantined], "skipped": [skipped], "write_ms": [write_ms],
    }, schema=_COMMIT_ARROW)


def write_group(config: SinkConfig, batch_id: int, key: tuple, table: pa.Table) -> pa.Table:
    """Executor side: write one broker's group of batch `batch_id` (or quarantine it)."""
    broker = key[0].as_py()
    started = time.perf_counter()
    if config.input_kind == INPUT_METADATA:
        if broker is None:
            return _quarantine_group(config, batch_id, MALFORMED_TAG, table, table.column(REASON).to_pylist())
        from msgindex.storage.shard import validate_broker_name

        try:
            validate_broker_name(broker)
        except InvalidOptionError as bad:
            tag = "broker-" + hashlib.sha1(broker.encode("utf-8", "surrogatepass")).hexdigest()[:12]
            return _quarantine_group(config, batch_id, tag, table, [f"brokerName: {bad}"] * table.num_rows)
        records, unkeyed = table.select(APPEND_SCHEMA.names), 0
    else:
        if broker is None:
            raise MsgIndexError(
                f"batch {batch_id}: {table.num_rows} records of partitions with no recorded broker "
                f"(e.g. {table.column('topic')[0].as_py()}-{table.column('partition')[0].as_py()}); the partition had no "
                f"leader when the batch started. The batch is retried on restart."
            )
        records, unkeyed = records_to_append(table)
    result = shard_owner(config.root, broker, config.lock_timeout_s).append(batch_id, records)
    return _commit_row(broker, batch_id, records=result.records if not result.skipped else 0,
                       keys_indexed=result.keys_indexed, unkeyed=unkeyed if not result.skipped else 0,
                       skipped=result.skipped, write_ms=(time.perf_counter() - started) * 1000)


def group_writer(config: SinkConfig, batch_id: int):
    """The applyInArrow function for one batch: the batch id travels to executors in its closure.
    (Deliberately without annotations: pyspark 4.2 infers the UDF kind from type hints and fails
    on postponed ones.)"""

    def write(key, table):
        return write_group(config, batch_id, key, table)

    return write


def _quarantine_group(config: SinkConfig, batch_id: int, tag: str, table: pa.Table, reasons: list[str]) -> pa.Table:
    written = write_quarantine(config.quarantine_dir, batch_id, tag, table, reasons)
    return _commit_row(None, batch_id, quarantined=table.num_rows if written else 0, skipped=not written)


@dataclass
class BatchStats:
    """What one micro-batch did, summed over its groups."""

    batch_id: int
    records: int = 0
    keys_indexed: int = 0
    unkeyed: int = 0
    quarantined: int = 0
    shards_touched: int = 0
    shards_skipped: int = 0
    seconds: float = 0.0
    write_seconds: float = 0.0  # summed over groups: time inside the shard owners (executors)
    lag: int | None = None
    brokers: list[str] = field(default_factory=list)

    @classmethod
    def from_commits(cls, batch_id: int, rows: list, seconds: float) -> BatchStats:
        stats = cls(batch_id, seconds=seconds)
        for row in rows:
            stats.records += row["records"]
            stats.keys_indexed += row["keys_indexed"]
            stats.unkeyed += row["unkeyed"]
            stats.quarantined += row["quarantined"]
            stats.write_seconds += row["write_ms"] / 1000
            if row["broker"] is not None:
                stats.brokers.append(row["broker"])
                if row["skipped"]:
                    stats.shards_skipped += 1
                else:
                    stats.shards_touched += 1
        return stats

    def line(self) -> str:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        lag = "?" if self.lag is None else f"{self.lag:,}"
        return (
            f"batch {self.batch_id}: {self.records:,} records in {self.seconds:.2f} s ({rate:,.0f} rec/s) | "
            f"{self.keys_indexed:,} keys indexed | {self.shards_touched} shards touched"
            f"{f', {self.shards_skipped} already had it' if self.shards_skipped else ''} | "
            f"{self.unkeyed:,} unkeyed | {self.quarantined:,} quarantined | lag {lag}"
        )


class IndexSink:
    """The ``foreachBatch`` callable of the indexing query (driver side)."""

    def __init__(self, config: SinkConfig, *, bootstrap_servers: str | None = None, subscribe: list[str] | None = None,
                 subscribe_pattern: str | None = None, checkpoint: str | None = None,
                 on_batch: Callable[[BatchStats], None] | None = None) -> None:
        if config.input_kind not in INPUT_KINDS:
            raise InvalidOptionError(f"input kind {config.input_kind!r} is not one of {', '.join(INPUT_KINDS)}")
        if config.input_kind == INPUT_RECORDS and bootstrap_servers is None:
            raise InvalidOptionError("input 'records' needs the Kafka bootstrap servers to find partition leaders")
        if config.input_kind == INPUT_RECORDS and (subscribe is None) == (subscribe_pattern is None):
            raise InvalidOptionError("input 'records' needs exactly one of subscribe / subscribe_pattern")
        self.config = config
        self.bootstrap_servers = bootstrap_servers
        self.subscribe = subscribe
        self.subscribe_pattern = subscribe_pattern
        self.checkpoint = checkpoint
        self.on_batch = on_batch
        self.partition_brokers = PartitionBrokerMap(config.root)
        self.history: list[BatchStats] = []
        self._claimed = False
        self._stopping = threading.Event()
        self._busy = threading.Lock()  # held while a batch writes; a stop waits for it
        self._reporter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="msgindex-progress")

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
            started = time.perf_counter()
            self._claim_index()
            prepared = self.prepare(df)
            writer = group_writer(self.config, int(batch_id))
            rows = prepared.groupBy("broker").applyInArrow(writer, COMMIT_SCHEMA).collect()
            stats = BatchStats.from_commits(int(batch_id), rows, time.perf_counter() - started)
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

    def prepare(self, df: "DataFrame") -> "DataFrame":
        """The batch's Kafka rows as the columns `write_group` takes, with the shard column."""
        if self.config.input_kind == INPUT_METADATA:
            return parse_metadata_events(df)
        return project_records(df, self._broker_column())

    def _claim_index(self) -> None:
        if self._claimed or self.checkpoint is None:
            return
        query_id = spark_query_id(self.checkpoint)
        if query_id is not None:
            claim_index(self.config.root, query_id, self.checkpoint)
            self._claimed = True

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

    def _lag(self, batch_id: int) -> int | None:
        """Messages behind the latest Kafka offsets after this batch: the batch's end offsets
        (Spark's offset log in a local checkpoint) against the brokers' log-end offsets."""
        from msgindex.kafka.admin import latest_offsets

        if self.bootstrap_servers is None or self.checkpoint is None:
            return None
        ends = spark_batch_end_offsets(self.checkpoint, batch_id)
        if not ends:
            return None
        try:
            latest = latest_offsets(self.bootstrap_servers, sorted({topic for topic, _ in ends}))
        except Exception:  # lag is informational (a broker may be restarting): report "?" instead
            return None
        return sum(max(latest.get(tp, end) - end, 0) for tp, end in ends.items())


def spark_batch_end_offsets(checkpoint: str | Path, batch_id: int) -> dict[tuple[str, int], int]:
    """The Kafka end offsets of micro-batch `batch_id` from Spark's offset log
    (``<checkpoint>/offsets/<id>``: a version line, the batch metadata, then one JSON line per
    source). Empty when the checkpoint is not a local directory or the file is missing."""
    path = Path(checkpoint) / "offsets" / str(batch_id)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
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
