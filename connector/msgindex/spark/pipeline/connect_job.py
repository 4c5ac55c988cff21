"""``msgindex index --remote sc://HOST:PORT``: the indexing job on a Spark Connect server.

Over Spark Connect the server is the driver and the client may be on another host, one that sees
neither the index nor (often) Kafka. So everything that touches them runs on the server's side:

1. a one-task Spark job (``_prepare``) checks the Kafka source, settles retention, creates or
   opens the index (sizing flags), upgrades legacy shards and checks that no other job holds the
   index; its errors are msgindex's own one-line errors, carried back in Spark's;
2. the query is the local job's query: Spark's Kafka source, ``foreachBatch(BatchWriter)``; the
   BatchWriter is pickled to the server and holds the index (ownership.py) in the process that
   runs the batches, from the first batch until that process ends with the query;
3. this process prints the same lines as a local run: Spark's progress from
   ``query.recentProgress`` (and the lag from the Kafka source's metrics in it), and msgindex's
   counts per batch from ``<index>/_batches.jsonl``, read through Spark itself (the entries of
   this job only, by its job id), then the same final summary;
4. SIGINT/SIGTERM stop the query (``query.stop()``; the server keeps running). A batch stopped
   halfway is safe: the shards commit by Kafka offsets and roll back torn tails.

Spark Connect has no SparkContext on the client: no code shipping (msgindex must be installed
for the server's Python), no coalescing to the cluster's cores unless ``spark.default.parallelism``
is set on the server (a batch then runs one task per Kafka input partition).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from typing import TYPE_CHECKING

from msgindex.errors import MsgIndexError
from msgindex.spark.pipeline.job import (
    IndexJobOptions,
    _StopOnSignal,
    check_and_plan,
    check_source_identity,
    configure_trigger,
    open_index,
    sink_config,
    summary,
    upgrade_legacy_shards,
)
from msgindex.spark.pipeline.progress import BATCH_LOG_FILE, progress_line, say
from msgindex.spark.pipeline.shard_owner import RetentionPolicy

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

POLL_S = 0.5
_PREPARED = "prepared string"
_LOG_ENTRY = "entry string"


def _prepare(options: IndexJobOptions):
    """The server-side checks and set-up, as a mapInArrow function (one task): yields one row
    with JSON of what it found."""

    def task(batches):
        import pyarrow as pa

        from msgindex.spark.pipeline.ownership import require_free

        for _ in batches:
            pass
        start = check_and_plan(options)
        root = options.path
        with open_index(options) as store:
            require_free(root, options.storage_options or None)
            check_source_identity(options, start, store)
            upgraded = upgrade_legacy_shards(store, options.input_kind)
        found = {"root": str(root), "quarantine": str(options.quarantine), "upgraded": upgraded,
                 "retention": dataclasses.asdict(start.retention),
                 "retention_line": start.retention_line}
        yield pa.RecordBatch.from_pydict({"prepared": [json.dumps(found)]})

    return task


def connect_session(url: str) -> SparkSession:
    """A Spark Connect session on `url` (switches this process to Connect mode, as pyspark does)."""
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(url).getOrCreate()


def index_remotely(options: IndexJobOptions, stop: threading.Event | None = None) -> list:
    """Run the indexing job on the Spark Connect server `options.remote` and print its progress
    here; returns the per-batch statistics (sink.BatchStats) like ``index_kafka``."""
    from msgindex.spark.pipeline.ownership import JobIdentity
    from msgindex.spark.pipeline.sink import BatchStats, BatchWriter

    spark = connect_session(options.remote)
    prepared = json.loads(spark.range(1, numPartitions=1).mapInArrow(_prepare(options), _PREPARED).collect()[0][0])
    root = prepared["root"]
    for broker in prepared["upgraded"]:
        say(f"shard {broker}: upgraded from batch ids to the Kafka offsets its log holds")
    say(prepared["retention_line"])
    options = _with_resolved_paths(options, root, prepared["quarantine"])
    job_id = uuid.uuid4().hex
    retention = RetentionPolicy(**{**prepared["retention"], "age_from_topics": tuple(prepared["retention"]["age_from_topics"])})
    writer = BatchWriter(sink_config(options, options.path, retention),
                         source=options.kafka_source(), parallelism=_server_parallelism(spark),
                         checkpoint=options.checkpoint, job_id=job_id,
                         claim=JobIdentity.current(options.query_name, options.checkpoint))
    stream_writer = configure_trigger(options.kafka_source().stream(spark).writeStream.foreachBatch(writer)
                                      .option("checkpointLocation", options.checkpoint)
                                      .queryName(options.query_name), options)
    history: list[BatchStats] = []
    progress = _RemoteProgress(spark, root, job_id, options.spark_progress, options.storage_options or None)
    started = time.perf_counter()
    stopped = False
    with _StopOnSignal(stop) as stop_request:
        query = stream_writer.start()
        say(f"indexing {options.subscribe or options.subscribe_pattern} from {options.bootstrap_servers} into "
            f"{options.path} (input {options.input_kind}, checkpoint {options.checkpoint}, Spark Connect "
            f"{options.remote})")
        try:
            while query.isActive:
                if stop_request.requested.is_set():
                    stopped = True
                    query.stop()
                    break
                history += progress.report(query)
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            stopped = True
            query.stop()
        history += progress.report(query, final=True)
        failure = None if stopped else query.exception()
    if failure is not None:
        raise failure
    say(summary(history, stopped, time.perf_counter() - started, options))
    return history


def _with_resolved_paths(options: IndexJobOptions, root: str, quarantine: str) -> IndexJobOptions:
    """The options with --path and --quarantine as the server resolved them."""
    return dataclasses.replace(options, path=root, quarantine=quarantine)


def _server_parallelism(spark: SparkSession) -> int | None:
    """``spark.default.parallelism`` when the server sets it (no SparkContext over Connect)."""
    try:
        value = spark.conf.get("spark.default.parallelism", None)
    except Exception:  # not readable through this server: run one task per input partition
        return None
    return int(value) if value and str(value).isdigit() and int(value) > 0 else None


class _RemoteProgress:
    """Prints the remote query's progress: Spark's line per trigger and msgindex's per batch."""

    def __init__(self, spark: SparkSession, root: str, job_id: str, spark_lines: bool,
                 storage_options: dict[str, str] | None = None) -> None:
        self.spark = spark
        self.root = root
        self.storage_options = storage_options
        self.job_id = job_id
        self.spark_lines = spark_lines
        self.seen_progress = -1  # the last Spark batch id whose progress was handled
        self.shown = -1  # the last msgindex batch id printed
        self.lags: dict[int, int] = {}

    def report(self, query, final: bool = False) -> list:
        """Print what is new; the BatchStats printed now."""
        fresh = [p for p in query.recentProgress if p.batchId > self.seen_progress]
        for progress in fresh:
            self.seen_progress = max(self.seen_progress, progress.batchId)
            lag = _lag(progress)
            if lag is not None:
                self.lags[progress.batchId] = lag
            if self.spark_lines and progress.numInputRows:
                say(progress_line(progress))
        if not fresh and not final:
            return []
        return self._batches()

    def _batches(self) -> list:
        from msgindex.spark.pipeline.sink import BatchStats

        try:
            rows = (self.spark.range(1, numPartitions=1)
                    .mapInArrow(_read_batch_log(self.root, self.job_id, self.shown, self.storage_options),
                                _LOG_ENTRY).collect())
        except Exception as error:
            raise MsgIndexError(f"{self.root}/{BATCH_LOG_FILE}: cannot read the job's batch log through Spark "
                                f"Connect: {str(error).strip().splitlines()[0]}") from None
        printed = []
        for entry in sorted((json.loads(row[0]) for row in rows), key=lambda e: e["batch_id"]):
            stats = BatchStats.from_json(entry)
            stats.lag = self.lags.get(stats.batch_id)
            say(stats.line())
            self.shown = max(self.shown, stats.batch_id)
            printed.append(stats)
        return printed


def _read_batch_log(root: str, job_id: str, after: int, storage_options: dict[str, str] | None = None):
    """A one-task mapInArrow function: the entries of job `job_id` after batch `after` in the
    index's batch log, as JSON text. Read by a task, not with ``spark.read.json``: Spark's file
    listing skips names that start with ``_`` (its own metadata files), and the client may not see
    the index at all."""

    def task(batches):
        import pyarrow as pa

        from msgindex.spark.pipeline.progress import read_batch_log

        for _ in batches:
            pass
        entries = [entry for entry in read_batch_log(root, storage_options)
                   if entry.get("job_id") == job_id and entry.get("batch_id", -1) > after]
        yield pa.RecordBatch.from_pydict({"entry": pa.array([json.dumps(e) for e in entries], pa.string())})

    return task


def _lag(progress) -> int | None:
    """Messages behind the latest offsets after a trigger: the Kafka source's average per
    partition times the partitions it read (Spark's own metrics, also over Connect)."""
    try:
        source = progress.sources[0]
        metrics = source.metrics or {}
        average = metrics.get("avgOffsetsBehindLatest")
        ends = source.endOffset
        ends = json.loads(ends) if isinstance(ends, str) else ends
        partitions = sum(len(parts) for parts in (ends or {}).values())
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    if average is None or not partitions:
        return None
    return round(float(average) * partitions)
