"""The indexing job: Kafka -> Spark Structured Streaming -> per-broker msgindex shards, exactly once.

``index_kafka(options)`` runs the streaming query of ``msgindex index`` (the CLI parses the flags
into ``IndexJobOptions``) until it has caught up (``available_now``), is stopped (SIGINT/SIGTERM or
the caller's event) or fails, printing one progress line per micro-batch. The sink that does
the writing is ``msgindex.spark.pipeline.sink``. With ``remote`` (a Spark Connect URL) the job runs on the
Connect server instead and this process only prints its progress (connect_job.py).

Before any Spark starts, the Kafka source is checked (a missing topic, an address that does not
answer or resolve: one line naming it, within ``SOURCE_CHECK_TIMEOUT_S``), and the retention the
shards apply between appends is settled: ``--retention-ms`` / ``--retention-bytes``, by default
the longest ``retention.ms`` of the indexed topics (a shard holds many topics: never delete what
one of them still keeps).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from msgindex.errors import InvalidOptionError
from msgindex.spark.pipeline.field_values import DeclaredField, lenient_expressions
from msgindex.spark.pipeline.kafka_source import KAFKA_OPTION_PREFIX, KafkaSource
from msgindex.spark.pipeline.progress import say
from msgindex.spark.pipeline.shard_owner import (
    DEFAULT_RETENTION_INTERVAL_S,
    KEEP_FOREVER_MS,
    RetentionPolicy,
    longest_retention,
)
from msgindex.storage.location import parse_location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

    from msgindex.spark.pipeline.task_writer import SinkConfig
    from msgindex.storage.fields import FieldDefinition
    from msgindex.storage.objects.store import ObjectStore
    from msgindex.storage.store import Store

DEFAULT_QUERY_NAME = "msgindex-index"
__all__ = ["KAFKA_OPTION_PREFIX", "IndexJobOptions", "index_kafka"]


@dataclass
class IndexJobOptions:
    """Validated job settings."""

    bootstrap_servers: str
    path: str  # a local directory (absolute) or an object-store URL (storage/location.py)
    checkpoint: str
    input_kind: str
    quarantine: str
    subscribe: list[str] | None = None
    subscribe_pattern: str | None = None
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    kafka_options: dict[str, str] = field(default_factory=dict)
    fail_on_data_loss: str = "true"
    sizing: dict[str, int] = field(default_factory=dict)
    lock_timeout_s: float = 120.0
    trigger_interval: str | None = None
    available_now: bool = False
    master: str | None = None
    query_name: str = DEFAULT_QUERY_NAME
    spark_progress: bool = True
    min_partitions: int | None = None  # Spark's minPartitions: split partitions' ranges over more tasks
    spark_conf: dict[str, str] = field(default_factory=dict)  # --conf K=V
    retention_ms: int | None = None  # None: the topics' longest retention.ms; KEEP_FOREVER_MS: no age limit
    retention_bytes: int | None = None  # per shard
    retention_interval_s: float = DEFAULT_RETENTION_INTERVAL_S
    remote: str | None = None  # sc://HOST:PORT: run on a Spark Connect server
    storage_options: dict[str, str] = field(default_factory=dict)  # --storage-option K=V (object stores)
    fields: tuple[DeclaredField, ...] = ()  # --index-field / --index-header (field_values.py)
    backfill_fields: bool = False  # --backfill-fields: index the fields over what the shards hold first (backfill.py)

    @property
    def on_object_store(self) -> bool:
        return not parse_location(self.path, self.storage_options or None).is_local

    def kafka_source(self) -> KafkaSource:
        """The Kafka source these options describe."""
        return KafkaSource(
            bootstrap_servers=self.bootstrap_servers,
            subscribe=tuple(self.subscribe) if self.subscribe is not None else None,
            subscribe_pattern=self.subscribe_pattern, include_headers=self.input_kind == "records",
            consumer_options=dict(self.kafka_options), fail_on_data_loss=self.fail_on_data_loss,
            starting_offsets=self.starting_offsets, max_offsets_per_trigger=self.max_offsets_per_trigger,
            min_partitions=self.min_partitions,
        )


def upgrade_legacy_shards(store: Store | ObjectStore, input_kind: str) -> list[str]:
    """Shards written by msgindex before exactly-once-by-offsets (version-1 checkpoints: batch
    ids) cannot skip replayed records as they are. With --input records the log's own
    topic/partition/offset are the source offsets: they become the committed ranges (returns the
    shards upgraded). With --input metadata they are not (the source is the events' topic): the
    job refuses to start, saying what to do."""
    from msgindex.errors import LegacyCheckpointError
    from msgindex.storage.shard import read_committed, shard_directory

    if not isinstance(store.root, Path):  # an object store: always exactly once by offsets
        return []
    upgraded = []
    for broker in store.brokers():
        checkpoint = read_committed(shard_directory(store.root, broker), broker)  # unreadable: says `msgindex repair`
        if checkpoint is None or checkpoint.source_ranges is not None:
            continue
        if input_kind != "records":
            raise LegacyCheckpointError(
                f"--path {store.root}: shard {broker!r} was written by an older msgindex (its checkpoint records "
                f"Spark batch ids, not the Kafka offsets of the metadata events); it cannot be continued with "
                f"--input metadata: index into a new --path"
            )
        with store.writer(broker) as writer:
            writer.adopt_log_offsets()
        upgraded.append(broker)
    return upgraded


def open_index(options: IndexJobOptions) -> Store | ObjectStore:
    """The store at --path (created with the sizing flags when new; an existing store keeps its
    settings, and sizing flags that contradict them are an error)."""
    from msgindex.storage.store import StoreSettings, open_store

    settings = StoreSettings(**options.sizing)
    store = open_store(options.path, create=True, settings=settings, storage_options=options.storage_options or None)
    conflicts = {k: (v, getattr(store.settings, k)) for k, v in options.sizing.items() if getattr(store.settings, k) != v}
    if conflicts:
        detail = ", ".join(f"{k}={v} (store has {have})" for k, (v, have) in conflicts.items())
        raise InvalidOptionError(f"--path {options.path} is an existing index with other sizing: {detail}; "
                                 f"drop those flags or index into a new --path")
    return store


def kafka_stream(spark: SparkSession, options: IndexJobOptions) -> DataFrame:
    """The streaming DataFrame of Spark's own Kafka source."""
    return options.kafka_source().stream(spark)


@dataclass(frozen=True)
class JobStart:
    """What the checks before the query found: the indexed Kafka topics (as far as they can be
    listed) and the retention the shards will apply, with a line saying why."""

    topics: tuple[str, ...]
    retention: RetentionPolicy
    retention_line: str


def check_and_plan(options: IndexJobOptions) -> JobStart:
    """Check the Kafka source (KafkaUnreachableError / TopicNotFoundError naming the address or
    topic, within about SOURCE_CHECK_TIMEOUT_S) and settle the retention policy."""
    from msgindex.kafka.admin import check_source

    topics = check_source(options.bootstrap_servers, topics=options.subscribe, pattern=options.subscribe_pattern,
                          consumer_options=options.kafka_options)
    retention, line = retention_policy(options, topics)
    return JobStart(tuple(topics), retention, line)


def held_topics(store: Store | ObjectStore) -> set[str]:
    """The topics any shard of `store` holds committed source offsets of."""
    held = set()
    for broker in store.brokers():
        with store.reader(broker) as reader:
            ranges = reader.committed_ranges  # (None: a version-1 shard, which names no source offsets)
            held.update(topic for topic, _ in (ranges.ranges if ranges is not None else ()))
    return held


def check_source_identity(options: IndexJobOptions, start: JobStart, store: Store | ObjectStore) -> None:
    """Refuse topics deleted and created again since the index was built from them
    (topic_identity.py), recording the ids of new ones; not where the Python client cannot ask
    Kafka (SASL/SSL settings the Java client alone takes)."""
    from msgindex.kafka.admin import needs_java_client, topic_ids
    from msgindex.spark.pipeline.topic_identity import check_topic_identity

    if start.topics and not needs_java_client(options.kafka_options):
        check_topic_identity(options.path, options.storage_options,
                             topic_ids(options.bootstrap_servers, start.topics), held_topics(store))


def retention_policy(options: IndexJobOptions, topics: list[str]) -> tuple[RetentionPolicy, str]:
    """The retention the shards apply, and a line saying what it is and where it comes from.
    Without --retention-ms the age limit is the LONGEST retention.ms among the indexed topics
    (-1 in any of them, or topics that cannot be read: no age limit)."""
    from msgindex.kafka.admin import needs_java_client, topic_retention_ms

    max_age, why = options.retention_ms, "--retention-ms"
    if max_age is None:
        if not topics or needs_java_client(options.kafka_options):
            max_age, why = KEEP_FOREVER_MS, "the topics' retention.ms cannot be read here: give --retention-ms"
        else:
            found = topic_retention_ms(options.bootstrap_servers, topics)
            topic, max_age = longest_retention(found)
            why = f"the longest retention.ms of the indexed topics: {topic}"
    policy = RetentionPolicy(max_age_ms=None if max_age == KEEP_FOREVER_MS else max_age,
                             max_bytes=options.retention_bytes, interval_s=options.retention_interval_s,
                             age_from_topics=tuple(sorted(topics)) if options.retention_ms is None else ())
    size = "" if policy.max_bytes is None else f", shards above {policy.max_bytes:,} bytes"
    return policy, (f"retention: {policy.age_text} ({why}){size}; checked after appends, at most every "
                    f"{policy.interval_s:g} s per shard")


JVM_END_WAIT_S = 15.0  # a JVM signalled with the driver runs its shutdown hooks, then exits


class _StopOnSignal:
    """SIGINT/SIGTERM -> stop after the batch in flight (a second signal: stop at once)."""

    def __init__(self, requested: threading.Event | None = None) -> None:
        self.requested = requested or threading.Event()
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested.is_set():
            raise KeyboardInterrupt
        say(f"{signal.Signals(signum).name}: stopping after the current batch")
        self.requested.set()

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def index_kafka(options: IndexJobOptions, stop: threading.Event | None = None) -> list:
    """Run the indexing query until caught up (--available-now), stopped (SIGINT/SIGTERM, or
    `stop` set by the caller), or failed; returns the per-batch statistics (sink.BatchStats).

    The driver holds the index (ownership.IndexClaim) for the query's life; executors get
    msgindex from the job and must see the index at the same path (shipping.py)."""
    if options.remote is not None:
        raise InvalidOptionError("a --remote job runs through msgindex.spark.pipeline.connect_job.index_remotely")
    import uuid

    from msgindex.spark.pipeline.ownership import IndexClaim, JobIdentity
    from msgindex.spark.pipeline.progress import SparkProgressListener
    from msgindex.spark.pipeline.sink import BatchWriter, IndexSink
    from msgindex.spark.pipeline.spark_checkpoint import clear_interrupted_first_batch
    from msgindex.spark.runtime.hadoop_paths import check_hadoop_path
    from msgindex.spark.runtime.session import build_spark_session, is_local_master
    from msgindex.spark.runtime.shipping import check_executors_see_index, ship_code

    start = check_and_plan(options)
    store = open_index(options)
    root = options.path
    identity = JobIdentity.current(options.query_name, options.checkpoint)
    with IndexClaim(root, identity, options.storage_options or None), store:
        check_source_identity(options, start, store)
        for broker in upgrade_legacy_shards(store, options.input_kind):
            say(f"shard {broker}: upgraded from batch ids to the Kafka offsets its log holds")
        say(start.retention_line)
        spark = build_spark_session(app_name=options.query_name, master=options.master, extra_conf=options.spark_conf,
                                    hadoop_urls=[options.checkpoint],
                                    store_urls=[options.path] if options.on_object_store else [],
                                    storage_options=options.storage_options or None)
        check_hadoop_path(spark, options.checkpoint)
        cleared = clear_interrupted_first_batch(options.checkpoint)
        if cleared:
            say(f"checkpoint {options.checkpoint}: removed Spark's unfinished first offset-log entry "
                f"({', '.join(cleared)}: a job stopped while writing it)")
        ship_code(spark)
        master = spark.sparkContext.master
        if not is_local_master(master):
            check_executors_see_index(spark, root, options.storage_options or None)
        config = sink_config(options, root, start.retention, declare_fields(spark, options, store))
        if options.backfill_fields:
            from msgindex.spark.pipeline.backfill import backfill_fields

            with lenient_expressions(spark, config.fields, options.spark_conf):
                backfill_fields(spark, options.kafka_source(), store, config, say=say)
        writer = BatchWriter(config, source=options.kafka_source(), parallelism=spark.sparkContext.defaultParallelism,
                             checkpoint=options.checkpoint, job_id=uuid.uuid4().hex)
        sink = IndexSink(writer, checkpoint=options.checkpoint, on_batch=lambda stats: say(stats.line()))
        listener = SparkProgressListener(say, options.query_name) if options.spark_progress else None
        if listener is not None:
            spark.streams.addListener(listener)
        stream_writer = configure_trigger(kafka_stream(spark, options).writeStream.foreachBatch(sink)
                                          .option("checkpointLocation", options.checkpoint)
                                          .queryName(options.query_name), options)
        started = time.perf_counter()
        jvm_gone = False
        stop = stop or threading.Event()
        quiet = _quiet_when_the_jvm_ends(spark, after=stop)
        try:
            with _StopOnSignal(stop) as stop_request, lenient_expressions(spark, config.fields, options.spark_conf):
                query = stream_writer.start()
                say(f"indexing {options.subscribe or options.subscribe_pattern} from {options.bootstrap_servers} "
                    f"into {options.path} (input {options.input_kind}, checkpoint {options.checkpoint}, "
                    f"master {master})")
                jvm_gone = _wait(query, sink, stop_request, spark)
        finally:
            sink.close()
            if not jvm_gone:  # (with the JVM gone, the process ends: PySpark's exit may lose it again)
                _remove_quiet_filter(quiet)
                if listener is not None:
                    if sink.history:
                        listener.wait_for(sink.history[-1].batch_id)
                    spark.streams.removeListener(listener)
        if jvm_gone:
            say("Spark's JVM ended on the same signal (sent to the whole process group, as systemd and `kill -- "
                "-PGID` do): a batch it was running is replayed on the next run, exactly once")
        say(summary(sink.history, sink.stopping, time.perf_counter() - started, options))
    return sink.history


def sink_config(options: IndexJobOptions, root: str, retention: RetentionPolicy,
                fields: tuple[FieldDefinition, ...] = ()) -> SinkConfig:
    """What the tasks need (sink.SinkConfig)."""
    from msgindex.spark.pipeline.sink import SinkConfig

    return SinkConfig(root=str(root), input_kind=options.input_kind, quarantine_dir=str(options.quarantine),
                      lock_timeout_s=options.lock_timeout_s, retention=retention,
                      storage_options=tuple(sorted(options.storage_options.items())), fields=tuple(fields))


def declare_fields(spark: SparkSession, options: IndexJobOptions, store: Store | ObjectStore) -> tuple[FieldDefinition, ...]:
    """The job's field definitions, each expression analysed by Spark against the Kafka source
    (field_values.analysed_definitions) and checked against what the index's shards already
    index under those names (a field keeps its definition): InvalidOptionError before the query
    starts otherwise."""
    if not options.fields:
        return ()
    from msgindex.spark.pipeline.field_values import analysed_definitions
    from msgindex.storage.fields import check_compatible, respelled

    definitions = analysed_definitions(kafka_stream(spark, options), options.fields)
    for broker in store.brokers():
        with store.reader(broker) as reader:
            existing = reader.field_coverage.definitions()
            definitions = respelled(definitions, existing)  # NAME and name are one field: the index's spelling
            check_compatible(existing, definitions, f"index {options.path} (shard {broker})")
    say("fields: " + ", ".join(f"{d.name} ({d.shape}) = {d.describe().split('=', 1)[1]}" for d in definitions))
    return definitions


def configure_trigger(stream_writer: DataStreamWriter, options: IndexJobOptions) -> DataStreamWriter:
    """The query's trigger: available-now, a processing-time interval, or as fast as possible."""
    if options.available_now:
        return stream_writer.trigger(availableNow=True)
    if options.trigger_interval:
        return stream_writer.trigger(processingTime=options.trigger_interval)
    return stream_writer


def _quiet_when_the_jvm_ends(spark, after: threading.Event) -> logging.Filter:
    """A JVM ended by a signal (``_wait``) makes PySpark print tracebacks: its accumulator server
    (a thread of the driver) when the JVM's end of its socket closes, and Py4J when the call in
    flight loses its connection ("Exception while sending command.", logged to the root logger
    and shown by logging's last-resort handler) or a closing one fails (its own loggers). That
    case alone is not printed: the accumulator server's always (a private attribute of PySpark's:
    nothing happens without it), Py4J's once a stop was asked for (`after` set); a lost connection
    without a signal is a failure, reported by ``_wait``'s caller. Returns the log filter, for
    ``_remove_quiet_filter`` to remove."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None and hasattr(server, "handle_error"):
        printed = server.handle_error

        def handle_error(request, client_address) -> None:
            if not isinstance(sys.exc_info()[1], (EOFError, ConnectionError)):
                printed(request, client_address)

        server.handle_error = handle_error
    quiet = _LostGatewayAfterStop(after)
    for name in _PY4J_LOGGERS:  # a logger's filters see only the records logged on it
        logging.getLogger(name).addFilter(quiet)
    return quiet


def _remove_quiet_filter(quiet: logging.Filter) -> None:
    for name in _PY4J_LOGGERS:
        logging.getLogger(name).removeFilter(quiet)


_PY4J_LOGGERS = ("", "py4j.java_gateway", "py4j.clientserver")  # "": the root logger


class _LostGatewayAfterStop(logging.Filter):
    """Drops a log record about a lost Py4J connection once `stopping` is set."""

    def __init__(self, stopping: threading.Event) -> None:
        super().__init__()
        self.stopping = stopping

    def filter(self, record: logging.LogRecord) -> bool:
        from py4j.protocol import Py4JNetworkError

        error = record.exc_info[1] if record.exc_info else None
        return not (self.stopping.is_set() and isinstance(error, (Py4JNetworkError, OSError)))


def _wait(query, sink, stop: _StopOnSignal, spark) -> bool:
    """Until the query ends, stopping it after its batch once a signal came; True when Spark's
    JVM ended with the signal (PySpark starts it ignoring SIGINT, not SIGTERM: a SIGTERM to the
    whole process group ends it too), which after a signal is a stop, not a failure."""
    from py4j.protocol import Py4JError, Py4JJavaError
    from pyspark.errors import StreamingQueryException

    try:
        while query.isActive:
            if stop.requested.is_set():
                sink.request_stop()
                query.stop()
                break
            query.awaitTermination(0.5)
        query.awaitTermination()
    except StreamingQueryException:
        if not sink.stopping:
            raise
    except (Py4JError, ConnectionError) as error:
        # a Java exception comes from a JVM that is still there: a failure, unless it is ending
        if not stop.requested.is_set() or (isinstance(error, Py4JJavaError) and not _jvm_ends(spark)):
            raise
        sink.request_stop()
        return True
    return False


def _jvm_ends(spark, within_s: float = JVM_END_WAIT_S) -> bool:
    """Whether the local JVM PySpark started exits within `within_s` (False when there is none
    to watch: a remote session)."""
    process = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    if process is None:
        return False
    try:
        process.wait(within_s)
    except Exception:  # still running (TimeoutExpired), or not a process object
        return False
    return True


def summary(history: list, stopped: bool, seconds: float, options: IndexJobOptions) -> str:
    """The job's last line: what all its batches did."""
    records = sum(s.records for s in history)
    appended = sum(s.appended for s in history)
    keys = sum(s.keys_indexed for s in history)
    malformed = sum(s.malformed for s in history)
    unkeyed = sum(s.unkeyed for s in history)
    segments = sum(s.deleted_segments for s in history)
    index_files = sum(s.deleted_index_files for s in history)
    how = "stopped" if stopped else "done"
    new = f"{appended:,} new" + (f", {records - appended:,} already committed" if records != appended else "")
    extra = f", {malformed:,} quarantined (in {options.quarantine})" if malformed or options.input_kind == "metadata" else ""
    if segments or index_files:
        extra += (f", retention deleted {segments:,} segments and {index_files:,} index files "
                  f"({sum(s.deleted_bytes for s in history):,} bytes)")
    return (f"{how}: {len(history)} batches, {records:,} records ({new}), {keys:,} keys indexed, "
            f"{unkeyed:,} unkeyed{extra} in {seconds:.1f} s")
