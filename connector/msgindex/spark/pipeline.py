"""The indexing job: Kafka -> Spark Structured Streaming -> per-broker msgindex shards, exactly once.

``index_kafka(options)`` runs the streaming query of ``msgindex index`` (the CLI parses the flags
into ``IndexJobOptions``) until it has caught up (``available_now``), is stopped (SIGINT/SIGTERM or
the caller's event) or fails, printing one progress line per micro-batch. The sink that does
the writing is ``msgindex.spark.sink``.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from msgindex.errors import InvalidOptionError

KAFKA_OPTION_PREFIX = "kafka."
DEFAULT_QUERY_NAME = "msgindex-index"


@dataclass
class IndexJobOptions:
    """Validated job settings."""

    bootstrap_servers: str
    path: Path
    checkpoint: str
    input_kind: str
    quarantine: Path
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


def upgrade_legacy_shards(store, input_kind: str) -> list[str]:
    """Shards written by msgindex before exactly-once-by-offsets (version-1 checkpoints: batch
    ids) cannot skip replayed records as they are. With --input records the log's own
    topic/partition/offset are the source offsets: they become the committed ranges (returns the
    shards upgraded). With --input metadata they are not (the source is the events' topic): the
    job refuses to start, saying what to do."""
    from msgindex.errors import LegacyCheckpointError
    from msgindex.storage.checkpoint import read_checkpoint
    from msgindex.storage.shard import checkpoint_path, shard_directory

    upgraded = []
    for broker in store.brokers():
        checkpoint = read_checkpoint(checkpoint_path(shard_directory(store.root, broker)))
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


def open_index(options: IndexJobOptions):
    """The store at --path (created with the sizing flags when new; an existing store keeps its
    settings, and sizing flags that contradict them are an error)."""
    from msgindex.storage.store import StoreSettings, open_store

    settings = StoreSettings(**options.sizing)
    store = open_store(options.path, create=True, settings=settings)
    conflicts = {k: (v, getattr(store.settings, k)) for k, v in options.sizing.items() if getattr(store.settings, k) != v}
    if conflicts:
        detail = ", ".join(f"{k}={v} (store has {have})" for k, (v, have) in conflicts.items())
        raise InvalidOptionError(f"--path {options.path} is an existing index with other sizing: {detail}; "
                                 f"drop those flags or index into a new --path")
    return store


def kafka_stream(spark, options: IndexJobOptions):
    """The streaming DataFrame of Spark's own Kafka source."""
    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", options.bootstrap_servers)
              .option("startingOffsets", options.starting_offsets)
              .option("failOnDataLoss", options.fail_on_data_loss)
              .option("includeHeaders", str(options.input_kind == "records").lower()))
    if options.subscribe is not None:
        reader = reader.option("subscribe", ",".join(options.subscribe))
    else:
        reader = reader.option("subscribePattern", options.subscribe_pattern)
    if options.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(options.max_offsets_per_trigger))
    if options.min_partitions is not None:
        reader = reader.option("minPartitions", str(options.min_partitions))
    for key, value in options.kafka_options.items():
        reader = reader.option(KAFKA_OPTION_PREFIX + key, value)
    return reader.load()


def say(line: str) -> None:
    print(f"[msgindex {time.strftime('%H:%M:%S')}] {line}", flush=True)


class _StopOnSignal:
    """SIGINT/SIGTERM -> stop after the batch in flight (a second signal: stop at once)."""

    def __init__(self, requested: threading.Event | None = None) -> None:
        self.requested = requested or threading.Event()
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "_StopOnSignal":
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


def run(options: IndexJobOptions) -> int:
    """The job's exit code: 0 once caught up (--available-now) or stopped by a signal."""
    index_kafka(options)
    return 0


def index_kafka(options: IndexJobOptions, stop: threading.Event | None = None) -> list:
    """Run the indexing query until caught up (--available-now), stopped (SIGINT/SIGTERM, or
    `stop` set by the caller), or failed; returns the per-batch statistics (sink.BatchStats).

    The driver holds the index (ownership.IndexClaim) for the query's life; executors get
    msgindex from the job and must see the index at the same path (shipping.py)."""
    from msgindex.spark.ownership import IndexClaim, JobIdentity
    from msgindex.spark.progress import SparkProgressListener
    from msgindex.spark.session import build_spark_session, is_local_master
    from msgindex.spark.shipping import check_executors_see_index, ship_code
    from msgindex.spark.sink import BatchWriter, IndexSink, SinkConfig

    store = open_index(options)
    root = options.path.resolve()
    with IndexClaim(root, JobIdentity.current(options.query_name, options.checkpoint)), store:
        for broker in upgrade_legacy_shards(store, options.input_kind):
            say(f"shard {broker}: upgraded from batch ids to the Kafka offsets its log holds")
        spark = build_spark_session(app_name=options.query_name, master=options.master, extra_conf=options.spark_conf)
        ship_code(spark)
        master = spark.sparkContext.master
        if not is_local_master(master):
            check_executors_see_index(spark, root)
        config = SinkConfig(root=str(root), input_kind=options.input_kind,
                            quarantine_dir=str(options.quarantine.resolve()), lock_timeout_s=options.lock_timeout_s)
        writer = BatchWriter(config, bootstrap_servers=options.bootstrap_servers, subscribe=options.subscribe,
                             subscribe_pattern=options.subscribe_pattern,
                             parallelism=spark.sparkContext.defaultParallelism)
        sink = IndexSink(writer, checkpoint=options.checkpoint, on_batch=lambda stats: say(stats.line()))
        listener = SparkProgressListener(say, options.query_name) if options.spark_progress else None
        if listener is not None:
            spark.streams.addListener(listener)
        stream_writer = (kafka_stream(spark, options).writeStream.foreachBatch(sink)
                         .option("checkpointLocation", options.checkpoint).queryName(options.query_name))
        if options.available_now:
            stream_writer = stream_writer.trigger(availableNow=True)
        elif options.trigger_interval:
            stream_writer = stream_writer.trigger(processingTime=options.trigger_interval)
        started = time.perf_counter()
        try:
            with _StopOnSignal(stop) as stop_request:
                query = stream_writer.start()
                say(f"indexing {options.subscribe or options.subscribe_pattern} from {options.bootstrap_servers} "
                    f"into {options.path} (input {options.input_kind}, checkpoint {options.checkpoint}, "
                    f"master {master})")
                _wait(query, sink, stop_request)
        finally:
            sink.close()
            if listener is not None:
                if sink.history:
                    listener.wait_for(sink.history[-1].batch_id)
                spark.streams.removeListener(listener)
        say(_summary(sink, time.perf_counter() - started, options))
    return sink.history


def _wait(query, sink, stop: _StopOnSignal) -> None:
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


def _summary(sink, seconds: float, options: IndexJobOptions) -> str:
    history = sink.history
    records = sum(s.records for s in history)
    appended = sum(s.appended for s in history)
    keys = sum(s.keys_indexed for s in history)
    malformed = sum(s.malformed for s in history)
    unkeyed = sum(s.unkeyed for s in history)
    how = "stopped" if sink.stopping else "done"
    new = f"{appended:,} new" + (f", {records - appended:,} already committed" if records != appended else "")
    extra = f", {malformed:,} quarantined (in {options.quarantine})" if options.input_kind == "metadata" else ""
    return (f"{how}: {len(history)} batches, {records:,} records ({new}), {keys:,} keys indexed, "
            f"{unkeyed:,} unkeyed{extra} in {seconds:.1f} s")
