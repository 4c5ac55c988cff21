"""The indexing job: Kafka -> Spark Structured Streaming -> per-broker msgindex shards, exactly once.

    python streaming_jobs/index_job.py --bootstrap-servers 127.0.0.1:9092 --subscribe orders,payments \\
        --path ./index-data --available-now
    msgindex index ...                       (the same job as a subcommand)
    spark-submit --jars "$(python -c 'from msgindex.spark.session import kafka_connector_jars as j; \\
        print(",".join(map(str, j())))')" streaming_jobs/index_job.py ...

Flags follow the Spark Kafka source's vocabulary. The job is a thin CLI over msgindex.spark.sink.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from msgindex.errors import InvalidOptionError

KAFKA_OPTION_PREFIX = "kafka."
STARTING_OFFSETS_WORDS = ("earliest", "latest")
DEFAULT_QUERY_NAME = "msgindex-index"
SIZING_FLAGS = {"hash_slots": "hash_slot_num", "index_num": "index_num", "segment_bytes": "segment_bytes",
                "index_interval_bytes": "index_interval_bytes"}
_TRIGGER_INTERVAL = re.compile(r"^\d+(\.\d+)?\s*(ms|millisecond|milliseconds|s|second|seconds|min|minute|minutes)$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The job's flags (shared by `msgindex index` and the standalone script)."""
    source = parser.add_argument_group("Kafka source (Spark's kafka format)")
    source.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT[,...]",
                        help="Kafka bootstrap servers (kafka.bootstrap.servers)")
    topics = source.add_mutually_exclusive_group(required=True)
    topics.add_argument("--subscribe", metavar="TOPIC[,TOPIC...]", help="comma-separated topics to index")
    topics.add_argument("--subscribe-pattern", metavar="REGEX", help="index every topic whose whole name matches")
    source.add_argument("--starting-offsets", default="earliest",
                        help="earliest (default), latest, or Spark's JSON per-partition offsets; only used "
                             "when the checkpoint is new")
    source.add_argument("--max-offsets-per-trigger", type=int, metavar="N",
                        help="cap on Kafka records per micro-batch (all partitions together)")
    source.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Kafka consumer setting passed as kafka.KEY (e.g. security.protocol=SSL); repeatable")
    source.add_argument("--fail-on-data-loss", choices=("true", "false"), default="true",
                        help="Spark's failOnDataLoss: stop when offsets vanished (retention) (default true)")
    sink = parser.add_argument_group("index")
    sink.add_argument("--path", required=True, help="index root (created when missing)")
    sink.add_argument("--checkpoint", help="Spark checkpoint directory (default: <path>/_checkpoint)")
    sink.add_argument("--input", choices=("records", "metadata"), default="records",
                      help="records: index the topics' own records (key + KEYS/UNIQ_KEY headers); metadata: "
                           "the records are JSON message-metadata events (default records)")
    sink.add_argument("--quarantine", metavar="DIR",
                      help="where malformed metadata events go (default: <path>/_quarantine); --input metadata only")
    sink.add_argument("--hash-slots", type=int, metavar="N", help="hash slots per index file (new store; default 5,000,000)")
    sink.add_argument("--index-num", type=int, metavar="N", help="entries per index file (new store; default 20,000,000)")
    sink.add_argument("--segment-bytes", type=int, metavar="N", help="metadata-log segment size (new store; default 1 GiB)")
    sink.add_argument("--index-interval-bytes", type=int, metavar="N",
                      help="log bytes between sparse index entries (new store; default 4096)")
    sink.add_argument("--lock-timeout", type=float, default=120.0, metavar="SECONDS",
                      help="how long a task waits for a shard lock held by another attempt (default 120)")
    run = parser.add_argument_group("trigger")
    when = run.add_mutually_exclusive_group()
    when.add_argument("--trigger-interval", metavar="INTERVAL",
                      help="micro-batch interval, e.g. '10 seconds' (default: as fast as possible)")
    when.add_argument("--available-now", action="store_true", help="index what is in Kafka now, then stop")
    run.add_argument("--master", help="Spark master (default: the session builder's local[2]; ignored under spark-submit)")
    run.add_argument("--query-name", default=DEFAULT_QUERY_NAME, help=f"streaming query name (default {DEFAULT_QUERY_NAME})")
    run.add_argument("--quiet-spark", action="store_true", help="do not print Spark's own progress lines")


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


def options_from_args(args: argparse.Namespace) -> IndexJobOptions:
    """Check flags that argparse cannot (values, combinations) -> InvalidOptionError naming them."""
    path = Path(args.path).expanduser()
    subscribe = None
    if args.subscribe is not None:
        subscribe = [t.strip() for t in args.subscribe.split(",") if t.strip()]
        if not subscribe:
            raise InvalidOptionError(f"--subscribe {args.subscribe!r} names no topic")
    if args.subscribe_pattern is not None:
        try:
            re.compile(args.subscribe_pattern)
        except re.error as bad:
            raise InvalidOptionError(f"--subscribe-pattern {args.subscribe_pattern!r} is not a regular expression: {bad}") from None
    offsets = args.starting_offsets.strip()
    if offsets not in STARTING_OFFSETS_WORDS:
        try:
            if not isinstance(json.loads(offsets), dict):
                raise ValueError("not a JSON object")
        except ValueError as bad:
            raise InvalidOptionError(
                f"--starting-offsets {args.starting_offsets!r}: use earliest, latest or a JSON object "
                f"like '{{\"topic\":{{\"0\":23,\"1\":-2}}}}' ({bad})"
            ) from None
    if args.max_offsets_per_trigger is not None and args.max_offsets_per_trigger <= 0:
        raise InvalidOptionError(f"--max-offsets-per-trigger must be > 0, got {args.max_offsets_per_trigger}")
    if args.quarantine is not None and args.input != "metadata":
        raise InvalidOptionError("--quarantine only applies to --input metadata (Kafka records are never malformed)")
    if args.trigger_interval is not None and not _TRIGGER_INTERVAL.match(args.trigger_interval.strip()):
        raise InvalidOptionError(f"--trigger-interval {args.trigger_interval!r}: use e.g. '500 ms', '10 seconds', '1 minute'")
    if args.lock_timeout <= 0:
        raise InvalidOptionError(f"--lock-timeout must be > 0 seconds, got {args.lock_timeout}")
    kafka_options = {}
    for item in args.kafka_option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidOptionError(f"--kafka-option {item!r} is not KEY=VALUE")
        key = key.strip().removeprefix(KAFKA_OPTION_PREFIX)
        if key == "bootstrap.servers":
            raise InvalidOptionError("--kafka-option bootstrap.servers: use --bootstrap-servers")
        kafka_options[key] = value
    sizing = {setting: getattr(args, flag) for flag, setting in SIZING_FLAGS.items() if getattr(args, flag) is not None}
    return IndexJobOptions(
        bootstrap_servers=args.bootstrap_servers, path=path,
        checkpoint=str(Path(args.checkpoint).expanduser()) if args.checkpoint else str(path / "_checkpoint"),
        input_kind=args.input, quarantine=Path(args.quarantine).expanduser() if args.quarantine else path / "_quarantine",
        subscribe=subscribe, subscribe_pattern=args.subscribe_pattern, starting_offsets=offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger, kafka_options=kafka_options,
        fail_on_data_loss=args.fail_on_data_loss, sizing=sizing, lock_timeout_s=args.lock_timeout,
        trigger_interval=args.trigger_interval, available_now=args.available_now, master=args.master,
        query_name=args.query_name, spark_progress=not args.quiet_spark,
    )


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
    for key, value in options.kafka_options.items():
        reader = reader.option(KAFKA_OPTION_PREFIX + key, value)
    return reader.load()


def _say(line: str) -> None:
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
        _say(f"{signal.Signals(signum).name}: stopping after the current batch")
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
    `stop` set by the caller), or failed; returns the per-batch statistics (sink.BatchStats)."""
    from msgindex.spark.progress import SparkProgressListener
    from msgindex.spark.session import build_spark_session
    from msgindex.spark.sink import IndexSink, SinkConfig

    store = open_index(options)
    store.close()
    spark = build_spark_session(app_name=options.query_name, **({"master": options.master} if options.master else {}))
    config = SinkConfig(root=str(options.path.resolve()), input_kind=options.input_kind,
                        quarantine_dir=str(options.quarantine.resolve()), lock_timeout_s=options.lock_timeout_s)
    sink = IndexSink(config, bootstrap_servers=options.bootstrap_servers, subscribe=options.subscribe,
                     subscribe_pattern=options.subscribe_pattern, checkpoint=options.checkpoint,
                     on_batch=lambda stats: _say(stats.line()))
    listener = SparkProgressListener(_say, options.query_name) if options.spark_progress else None
    if listener is not None:
        spark.streams.addListener(listener)
    writer = (kafka_stream(spark, options).writeStream.foreachBatch(sink)
              .option("checkpointLocation", options.checkpoint).queryName(options.query_name))
    if options.available_now:
        writer = writer.trigger(availableNow=True)
    elif options.trigger_interval:
        writer = writer.trigger(processingTime=options.trigger_interval)
    started = time.perf_counter()
    try:
        with _StopOnSignal(stop) as stop_request:
            query = writer.start()
            _say(f"indexing {options.subscribe or options.subscribe_pattern} from {options.bootstrap_servers} "
                 f"into {options.path} (input {options.input_kind}, checkpoint {options.checkpoint})")
            _wait(query, sink, stop_request)
    finally:
        sink.flush()
        if listener is not None:
            if sink.history:
                listener.wait_for(sink.history[-1].batch_id)
            spark.streams.removeListener(listener)
    _say(_summary(sink, time.perf_counter() - started, options))
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
    records = sum(s.records for s in sink.history)
    keys = sum(s.keys_indexed for s in sink.history)
    quarantined = sum(s.quarantined for s in sink.history)
    unkeyed = sum(s.unkeyed for s in sink.history)
    how = "stopped" if sink.stopping else "done"
    extra = f", {quarantined:,} quarantined (in {options.quarantine})" if options.input_kind == "metadata" else ""
    return (f"{how}: {len(sink.history)} batches, {records:,} records, {keys:,} keys indexed, "
            f"{unkeyed:,} unkeyed{extra} in {seconds:.1f} s")


def build_parser() -> argparse.ArgumentParser:
    """The standalone script's parser."""
    parser = argparse.ArgumentParser(prog="index_job.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (the same job as `msgindex index`)."""
    from msgindex.errors import MsgIndexError

    args = build_parser().parse_args(argv)
    try:
        return run(options_from_args(args))
    except MsgIndexError as error:
        print(f"index_job: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
