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
committed and reports them as such. A batch holding records that Spark's Kafka source cannot
read at all (a timestamp that overflows) is indexed around them, and they are quarantined
(unreadable_records.py).

``BatchWriter`` is the foreachBatch function proper: picklable, no threads or locks (a Spark
Connect server runs it in a process of its own: there, given ``claim``, it also holds the index
for the job, see ownership.py). ``IndexSink`` wraps it for a local driver: graceful stop, lag,
progress lines.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from msgindex.errors import BrokerError, InvalidOptionError, MsgIndexError
from msgindex.spark.pipeline.attempt_counts import AttemptMarkers, CommittedCounts
from msgindex.spark.pipeline.commits import COMMIT_DDL, TaskCommit, commit_of_row, with_committed
from msgindex.spark.pipeline.completed_batches import CompletedBatches
from msgindex.spark.pipeline.field_values import describe_counts, merged_counts
from msgindex.spark.pipeline.kafka_records import record_columns
from msgindex.spark.pipeline.kafka_source import KafkaSource
from msgindex.spark.pipeline.metadata_events import parse_metadata_events
from msgindex.spark.pipeline.ownership import IndexClaim, JobIdentity
from msgindex.spark.pipeline.partition_brokers import PartitionBrokerMap
from msgindex.spark.pipeline.progress import append_batch_log, say
from msgindex.spark.pipeline.shard_owner import KEEP_FOREVER_MS, disk_full
from msgindex.spark.pipeline.spark_checkpoint import batch_end_offsets, batch_start_offsets
from msgindex.spark.pipeline.task_writer import (
    INPUT_KINDS,
    INPUT_METADATA,
    INPUT_RECORDS,
    SLICE,
    SinkConfig,
    task_function,
)
from msgindex.spark.pipeline.timestamp_rule import overflowing_record
from msgindex.spark.pipeline.unreadable_records import salvage_batch

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from msgindex.storage.source_ranges import SourceRanges

__all__ = ["BatchStats", "BatchWriter", "GracefulStop", "IndexSink", "KafkaSource", "SinkConfig", "INPUT_RECORDS",
           "INPUT_METADATA"]

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
    deleted_segments: int = 0  # retention run by the shards' lock holders during the batch
    deleted_index_files: int = 0
    deleted_bytes: int = 0
    requests: int = 0  # object stores: requests the batch's appends sent
    field_counts: dict[str, list[int]] = field(default_factory=dict)  # field_values.field_pairs' counts

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
        """The batch's counts from its tasks' commits (collected Spark rows or TaskCommits)."""
        stats = cls(batch_id, seconds=seconds)
        for commit in map(commit_of_row, rows):
            stats.appended += commit.appended
            stats.already_committed += commit.already_committed
            stats.keys_indexed += commit.keys_indexed
            stats.unkeyed += commit.unkeyed
            stats.quarantined += commit.quarantined
            stats.quarantined_before += commit.quarantined_before
            stats.write_seconds += commit.write_ms / 1000
            stats.deleted_segments += commit.deleted_segments
            stats.deleted_index_files += commit.deleted_index_files
            stats.deleted_bytes += commit.deleted_bytes
            stats.requests += commit.requests
            if commit.field_counts:
                stats.field_counts = json.loads(merged_counts(json.dumps(stats.field_counts), commit.field_counts))
            if commit.broker is not None and commit.broker not in stats.brokers:
                stats.brokers.append(commit.broker)
            stats.late_attempts += commit.attempt > 0
        stats.brokers.sort()
        return stats

    _JSON_NAMES = {"brokers": "shards"}

    def to_json(self) -> dict:
        """The batch log's entry (progress.py); ``from_json`` reads it back."""
        entry = {self._JSON_NAMES.get(f.name, f.name): getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.name != "lag"}
        entry.update(records=self.records, seconds=round(self.seconds, 3), write_seconds=round(self.write_seconds, 3))
        return entry

    @classmethod
    def from_json(cls, entry: dict) -> BatchStats:
        """A batch log entry as BatchStats (fields it lacks keep their defaults)."""
        names = {cls._JSON_NAMES.get(f.name, f.name): f.name for f in dataclasses.fields(cls)}
        return cls(**{names[key]: value for key, value in entry.items() if key in names and value is not None})

    def line(self) -> str:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        lag = "?" if self.lag is None else f"{self.lag:,}"
        new = f"{self.appended:,} new" + (f", {self.already_committed:,} already committed" if self.already_committed else "")
        before = f" ({self.quarantined_before:,} already)" if self.quarantined_before else ""
        quarantined = f"{self.malformed:,} quarantined{before}"
        retention = ""
        if self.deleted_segments or self.deleted_index_files:
            retention = (f" | retention deleted {self.deleted_segments:,} segments, {self.deleted_index_files:,} index "
                         f"files ({self.deleted_bytes:,} bytes)")
        requests = f" | {self.requests:,} requests" if self.requests else ""
        return (
            f"batch {self.batch_id}: {self.records:,} records ({new}) in {self.seconds:.2f} s ({rate:,.0f} rec/s) | "
            f"{self.keys_indexed:,} keys indexed | {len(self.brokers)} shards | "
            f"{self.unkeyed:,} unkeyed{describe_counts(self.field_counts)} | {quarantined}{retention}{requests} | "
            f"lag {lag}"
        )


class BatchWriter:
    """The ``foreachBatch`` function: plans the batch, runs its tasks, returns its BatchStats.
    Picklable and free of threads and locks (see the module docstring).

    `source`: the job's Kafka source (records input needs it: new partitions' leaders; a batch
    with records Spark cannot read is re-read from it); `checkpoint`: the query's Spark
    checkpoint (that batch's offset ranges); `job_id`: tags the batch log's entries; `claim`: hold
    the index for this job from the first batch on, in the process that runs the batches (Spark
    Connect, where the client may not see the index)."""

    def __init__(self, config: SinkConfig, *, source: KafkaSource | None = None, parallelism: int | None = None,
                 checkpoint: str | None = None, job_id: str | None = None, claim: JobIdentity | None = None) -> None:
        if config.input_kind not in INPUT_KINDS:
            raise InvalidOptionError(f"input kind {config.input_kind!r} is not one of {', '.join(INPUT_KINDS)}")
        if config.input_kind == INPUT_RECORDS and source is None:
            raise InvalidOptionError("input 'records' needs the Kafka source to find partition leaders")
        if source is not None and (source.subscribe is None) == (source.subscribe_pattern is None):
            raise InvalidOptionError("the Kafka source needs exactly one of subscribe / subscribe_pattern")
        if parallelism is not None and parallelism < 1:
            raise InvalidOptionError(f"parallelism must be >= 1, got {parallelism}")
        self.config = config
        self.source = source
        self.parallelism = parallelism
        self.checkpoint = checkpoint
        self.job_id = job_id
        self.claim = claim
        self._partition_brokers: PartitionBrokerMap | None = None  # read where the batches run
        self._completed = CompletedBatches()  # of the process that runs the batches
        self._last_ends: tuple[int, dict[tuple[str, int], int]] | None = None  # (batch id, its end offsets)
        self._claimed: IndexClaim | None = None
        # the batch's columns (kafka_records.record_columns) and the partition map they were built for
        self._projection: tuple[dict[tuple[str, int], str], list[Column]] | None = None

    def __getstate__(self) -> dict:
        # what the batches' process opens for itself: never pickled
        return {**self.__dict__, "_partition_brokers": None, "_claimed": None, "_projection": None,
                "_completed": CompletedBatches(), "_last_ends": None}

    @property
    def partition_brokers(self) -> PartitionBrokerMap:
        if self._partition_brokers is None:
            self._partition_brokers = PartitionBrokerMap(self.config.root, self.config.options)
        return self._partition_brokers

    def __call__(self, df: DataFrame, batch_id: int) -> BatchStats:
        started = time.perf_counter()
        batch_id = int(batch_id)
        try:
            self._hold_index()
            settled = self._settled(batch_id)
            try:
                commits = self._run(self.plan(df, batch_id), batch_id, settled)
            except Exception as error:
                unreadable = overflowing_record(error)
                if unreadable is None or self.source is None or self.checkpoint is None:
                    raise
                commits = salvage_batch(
                    df.sparkSession, batch_id, unreadable, source=self.source, checkpoint=self.checkpoint,
                    quarantine_dir=self.config.quarantine_dir, input_kind=self.config.input_kind,
                    lock_timeout_s=self.config.lock_timeout_s,
                    run=lambda frame: self._run(self.plan(frame, batch_id), batch_id, settled))
            stats = BatchStats.from_commits(batch_id, commits, time.perf_counter() - started)
            append_batch_log(self.config.root, {"job_id": self.job_id, **stats.to_json()}, self.config.options)
        except OSError as error:  # driver-side files: the batch log, the partition -> broker map
            full = disk_full(error, f"the index {self.config.root}", self.config.root)
            if full is not None:
                raise full from None
            raise
        return stats

    def _run(self, frame: DataFrame, batch_id: int, settled: dict[str, SourceRanges]) -> list[TaskCommit]:
        """Run the batch's tasks; their commits with what all attempts of each task committed
        (attempt_counts.py: Spark keeps one attempt's result)."""
        markers = AttemptMarkers(self.config.root, f"{batch_id:020d}-{uuid.uuid4().hex[:16]}", self.config.options)
        rows = frame.mapInArrow(task_function(self.config, batch_id, markers, settled), COMMIT_DDL).collect()
        committed = markers.committed()
        commits = []
        for commit in map(commit_of_row, rows):
            if commit.broker is not None:
                counts = committed.get((commit.task, commit.broker), CommittedCounts())
                commit = with_committed(commit, counts.appended, counts.keys_indexed)
            commits.append(commit)
        markers.clear()
        return commits

    def _settled(self, batch_id: int) -> dict[str, SourceRanges]:
        """Per shard, the offsets of the micro-batches this process completed before `batch_id`
        (completed_batches.py), from Spark's offset log; none without a checkpoint the driver reads."""
        if self.checkpoint is None:
            return {}
        starts = (self._end_offsets(batch_id - 1) if batch_id > 0
                  else batch_start_offsets(self.checkpoint, batch_id, storage_options=self.config.options))
        shard_of = None if self.config.input_kind == INPUT_METADATA else self.partition_brokers.as_dict()
        return self._completed.settled(starts, shard_of)

    def _hold_index(self) -> None:
        """With `claim`: hold the index (ownership.py) from the first batch until this process
        ends; a second job fails its first batch naming the first one."""
        if self.claim is not None and self._claimed is None:
            self._claimed = IndexClaim(self.config.root, self.claim, self.config.options).__enter__()

    def plan(self, df: DataFrame, batch_id: int | None = None) -> DataFrame:
        """The batch's rows as the columns the tasks take (shard and slice columns included),
        coalesced to at most `parallelism` tasks without a shuffle."""
        from pyspark.sql import functions as F

        prepared = self.prepare(df, batch_id).withColumn(SLICE, F.spark_partition_id().cast("long"))
        return prepared.coalesce(self.parallelism) if self.parallelism else prepared

    def prepare(self, df: DataFrame, batch_id: int | None = None) -> DataFrame:
        """The batch's Kafka rows as the columns `write_task` takes, with the shard column
        (`batch_id`: the micro-batch, whose partitions Spark's offset log names)."""
        if self.config.input_kind == INPUT_METADATA:
            return parse_metadata_events(df)
        self._record_new_partitions(batch_id)
        self._follow_new_topics()
        mapping = self.partition_brokers.as_dict()
        if self._projection is None or self._projection[0] != mapping:
            self._projection = (mapping, record_columns(broker_column(mapping), self.config.fields))
        return df.select(*self._projection[1])

    def shard_column(self, batch_id: int | None = None) -> Column:
        """Each Kafka row's shard (``broker_column``), new partitions' leaders recorded first."""
        self._record_new_partitions(batch_id)
        return broker_column(self.partition_brokers.as_dict())

    def _record_new_partitions(self, batch_id: int | None) -> None:
        """Record the leader of each partition without a shard yet, before any row of it is written."""
        if not self._partitions_recorded(batch_id):
            self.partition_brokers.extend({tp: str(leader) for tp, leader in self._new_partition_leaders().items()})

    def _follow_new_topics(self) -> None:
        """With the default age limit (the longest retention.ms of the indexed topics), topics a
        pattern subscription matches later lengthen it before their first batch is written:
        their records must not leave the index while Kafka still keeps them."""
        policy = self.config.retention
        if not policy.follows_topics or self.source is None:
            return
        from msgindex.kafka.admin import topic_retention_ms

        new = sorted({topic for topic, _ in self.partition_brokers.as_dict()} - set(policy.age_from_topics))
        if not new:
            return
        try:
            found, why = topic_retention_ms(self.source.bootstrap_servers, new), "the longest retention.ms of the indexed topics"
        except BrokerError as error:  # never delete what might still be kept: no age limit
            found, why = dict.fromkeys(new, KEEP_FOREVER_MS), f"the retention.ms of new topics could not be read: {error}"
        widened = policy.widened(found)
        self.config = dataclasses.replace(self.config, retention=widened)
        if widened.max_age_ms != policy.max_age_ms:
            say(f"retention: now {widened.age_text} ({why}, with {', '.join(new)})")

    def _partitions_recorded(self, batch_id: int | None) -> bool:
        """Whether every partition of micro-batch `batch_id` has its broker recorded already, as
        Spark's offset log for the batch names them (written before the batch runs; a file read,
        one GET in a bucket). Asking Kafka for the leaders instead took 0.25-0.4 s of every
        ~1 s micro-batch at a 1 s trigger (an admin client's connection and metadata round
        trips). False when the log cannot say (no checkpoint the driver can read: Kafka is asked)."""
        if batch_id is None or self.checkpoint is None:
            return False
        ends = self._end_offsets(batch_id)
        return bool(ends) and not self.partition_brokers.missing(list(ends))

    def _end_offsets(self, batch_id: int) -> dict[tuple[str, int], int]:
        """``batch_end_offsets`` of this job's checkpoint, the last ones read kept: a batch's are
        read again as the next batch's starts (``_settled``), one GET fewer a batch in a bucket.
        (Spark writes an offset-log entry once, before its batch runs.)"""
        if self._last_ends is None or self._last_ends[0] != batch_id:
            ends = batch_end_offsets(self.checkpoint, batch_id, storage_options=self.config.options)
            if not ends:
                return ends
            self._last_ends = (batch_id, ends)
        return self._last_ends[1]

    def _leaders(self) -> dict[tuple[str, int], int]:
        from msgindex.kafka.admin import partition_leaders

        if self.source.subscribe is not None:
            return partition_leaders(self.source.bootstrap_servers, self.source.subscribe)
        pattern = re.compile(self.source.subscribe_pattern)
        return {tp: leader for tp, leader in partition_leaders(self.source.bootstrap_servers).items()
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
    def __call__(self, df: DataFrame, batch_id: int) -> None:
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
        (Spark's offset log in a local checkpoint) against the offsets the job's consumers read to
        (read_committed: the last stable offset, before any open transaction)."""
        from msgindex.kafka.admin import latest_offsets, offsets_consumer

        source = self.writer.source
        if source is None or self.checkpoint is None:
            return None
        # a local or object-store checkpoint (never a Spark job here: nothing for hdfs://)
        ends = batch_end_offsets(self.checkpoint, batch_id, storage_options=self.config.options)
        if not ends:
            return None
        try:
            if self._offsets is None:
                self._offsets = offsets_consumer(source.bootstrap_servers, isolation_level=source.isolation_level)
            latest = latest_offsets(source.bootstrap_servers, sorted({topic for topic, _ in ends}),
                                    consumer=self._offsets)
        except Exception:  # lag is informational (a broker may be restarting): report "?" instead
            self._close_offsets()
            return None
        return sum(max(latest.get(tp, end) - end, 0) for tp, end in ends.items())


def broker_column(mapping: dict[tuple[str, int], str]) -> Column:
    """The shard of each Kafka row: its (topic, partition)'s recorded broker, from `mapping` as
    a map literal (null for a partition not in it)."""
    from pyspark.sql import functions as F

    if not mapping:
        return F.lit(None).cast("string")
    pairs = [F.lit(x) for (topic, partition), broker in sorted(mapping.items()) for x in (f"{topic}:{partition}", broker)]
    return F.try_element_at(F.create_map(*pairs), F.concat_ws(":", "topic", F.col("partition").cast("string")))
