"""`msgindex index`: the continuous indexing pipeline (Kafka -> Spark -> per-broker shards).

    msgindex index --bootstrap-servers 127.0.0.1:9092 --subscribe orders,payments --path ./index-data --available-now
    msgindex index --master spark://host:7077 --conf spark.executor.memory=2g ... --path /shared/index
    msgindex index --remote sc://spark-host:15002 ... --path /shared/index       (Spark Connect)
    spark-submit --master spark://host:7077 --jars "$(msgindex kafka jars)" streaming_jobs/index_job.py ...

Flags follow the Spark Kafka source's vocabulary; this module turns them into
``msgindex.spark.pipeline.job.IndexJobOptions`` (every check argparse cannot make, with an error naming
the flag) and runs ``msgindex.spark.pipeline.job.index_kafka``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from msgindex.cli import checked_seconds
from msgindex.cli.retention import parse_size_bytes
from msgindex.cli.store_args import add_storage_options, storage_options
from msgindex.errors import InvalidOptionError
from msgindex.spark.pipeline.backfill import NO_FIELDS_TO_BACKFILL
from msgindex.spark.pipeline.field_values import declared_fields
from msgindex.spark.pipeline.job import DEFAULT_QUERY_NAME, KAFKA_OPTION_PREFIX, KEEP_FOREVER_MS, IndexJobOptions
from msgindex.spark.runtime.session import hadoop_url
from msgindex.storage.hash_index.rocketmq_sizing import DEFAULT_INDEX_NUM, STORE_HASH_SLOT_NUM
from msgindex.storage.location import StoreLocation, parse_location
from msgindex.times import parse_duration_ms

STARTING_OFFSETS_WORDS = ("earliest", "latest")
SIZING_FLAGS = {"hash_slots": "hash_slot_num", "index_num": "index_num", "segment_bytes": "segment_bytes",
                "index_interval_bytes": "index_interval_bytes"}
_TRIGGER_INTERVAL = re.compile(r"^\d+(\.\d+)?\s*(ms|millisecond|milliseconds|s|second|seconds|min|minute|minutes)$")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `index` subcommand."""
    parser = subparsers.add_parser(
        "index", help="index Kafka topics continuously (or --available-now)",
        description="Index Kafka messages by key: Spark Structured Streaming reads the topics and "
                    "appends each micro-batch to per-broker msgindex shards, exactly once.",
    )
    add_arguments(parser)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    return run(options_from_args(args))


def run(options: IndexJobOptions) -> int:
    """Run the job (locally, or on a Spark Connect server with --remote); exit code 0 once caught
    up (--available-now) or stopped by a signal."""
    if options.remote is not None:
        from msgindex.spark.pipeline.connect_job import index_remotely

        index_remotely(options)
    else:
        from msgindex.spark.pipeline.job import index_kafka

        index_kafka(options)
    return 0


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
    source.add_argument("--min-partitions", type=int, metavar="N",
                        help="Spark's minPartitions: split big partitions' offset ranges over at least N tasks")
    source.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Kafka consumer setting passed as kafka.KEY (e.g. security.protocol=SSL); repeatable")
    source.add_argument("--fail-on-data-loss", choices=("true", "false"), default="true",
                        help="Spark's failOnDataLoss: stop when offsets vanished (retention) (default true)")
    sink = parser.add_argument_group("index")
    sink.add_argument("--path", required=True,
                      help="index root (created when missing): a local directory shared by the driver and every "
                           "executor, or s3://bucket/prefix, gs://..., az://... (no shared disk needed)")
    add_storage_options(sink)
    sink.add_argument("--checkpoint", help="Spark checkpoint directory (default: <path>/_checkpoint; on an object "
                                           "store through Hadoop's connector, s3a:// for s3://)")
    sink.add_argument("--input", choices=("records", "metadata"), default="records",
                      help="records: index the topics' own records (key + KEYS/UNIQ_KEY headers); metadata: "
                           "the records are JSON message-metadata events (default records)")
    sink.add_argument("--quarantine", metavar="DIR",
                      help="where malformed metadata events, and records whose timestamp msgindex cannot store, "
                           "are set aside (default: <path>/_quarantine)")
    sink.add_argument("--hash-slots", type=int, metavar="N",
                      help=f"hash slots per index file (new store; default {STORE_HASH_SLOT_NUM:,})")
    sink.add_argument("--index-num", type=int, metavar="N",
                      help=f"entries per index file (new store; default {DEFAULT_INDEX_NUM:,})")
    sink.add_argument("--segment-bytes", type=int, metavar="N", help="metadata-log segment size (new store; default 1 GiB)")
    sink.add_argument("--index-interval-bytes", type=int, metavar="N",
                      help="log bytes between sparse index entries (new store; default 4096)")
    sink.add_argument("--index-field", action="append", default=[], metavar="NAME=EXPR",
                      help="also index each record under NAME's values: any Spark SQL expression over the Kafka "
                           "columns (key, value, headers, topic, ...), e.g. order=get_json_object(CAST(value AS "
                           "STRING), '$.order.id'); a string gives one value, an array each element (repeatable)")
    sink.add_argument("--index-header", action="append", default=[], metavar="[NAME=]HEADER",
                      help="also index each record under every value of header HEADER, as field NAME (default: the "
                           "header's name) (repeatable)")
    sink.add_argument("--backfill-fields", action="store_true",
                      help="before indexing new records, index the declared fields over the records the index "
                           "already holds and a field does not cover yet (re-read from Kafka, as far as it still "
                           "retains them; exactly once). A local shard is rewritten under its lock (it needs free "
                           "space about its size); the earliest offsets are read with the Python Kafka client, so "
                           "not with SASL/SSL --kafka-option settings")
    sink.add_argument("--lock-timeout", type=float, default=120.0, metavar="SECONDS",
                      help="how long a task waits for a shard lock held by another attempt (default 120)")
    kept = parser.add_argument_group("retention (applied by the shards' writers between appends)")
    kept.add_argument("--retention-ms", metavar="AGE",
                      help="delete log segments whose newest record is older than this: milliseconds or 7d, 12h, "
                           "30m, 45s; -1 keeps everything (default: the longest retention.ms of the indexed topics)")
    kept.add_argument("--retention-bytes", metavar="SIZE",
                      help="shrink each shard to at most this size, oldest segments first: bytes or 50GiB, 500MB "
                           "(default: no size limit)")
    kept.add_argument("--retention-interval", type=float, default=60.0, metavar="SECONDS",
                      help="check retention at most this often per shard (default 60)")
    run = parser.add_argument_group("trigger")
    when = run.add_mutually_exclusive_group()
    when.add_argument("--trigger-interval", metavar="INTERVAL",
                      help="micro-batch interval, e.g. '10 seconds' (default: as fast as possible)")
    when.add_argument("--available-now", action="store_true", help="index what is in Kafka now, then stop")
    run.add_argument("--master", help="Spark master URL (default: what spark-submit or spark-defaults.conf "
                                      "says, else local[2])")
    run.add_argument("--remote", metavar="sc://HOST:PORT",
                     help="run the job on this Spark Connect server (msgindex installed there, the index mounted at "
                          "--path on it); this process prints its progress")
    run.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", dest="spark_conf",
                     help="a Spark setting, as spark-submit's --conf (e.g. spark.executor.memory=2g); repeatable")
    run.add_argument("--query-name", default=DEFAULT_QUERY_NAME, help=f"streaming query name (default {DEFAULT_QUERY_NAME})")
    run.add_argument("--quiet-spark", action="store_true", help="do not print Spark's own progress lines")


def options_from_args(args: argparse.Namespace) -> IndexJobOptions:
    """Check flags that argparse cannot (values, combinations) -> InvalidOptionError naming them."""
    storage = storage_options(args) or {}
    location = parse_location(args.path, storage)
    path = str(Path(location.local_path).expanduser().resolve()) if location.is_local else location.url
    subscribe = None
    if args.subscribe is not None:
        subscribe = [t.strip() for t in args.subscribe.split(",") if t.strip()]
        if not subscribe:
            raise InvalidOptionError(f"--subscribe {args.subscribe!r} names no topic")
    if args.subscribe_pattern is not None:
        try:
            re.compile(args.subscribe_pattern)
        except re.error as bad:
            raise InvalidOptionError(
                f"--subscribe-pattern {args.subscribe_pattern!r} is not a regular expression: {bad}") from None
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
    if args.min_partitions is not None and args.min_partitions <= 0:
        raise InvalidOptionError(f"--min-partitions must be > 0, got {args.min_partitions}")
    spark_conf = {}
    for item in args.spark_conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().startswith("spark."):
            raise InvalidOptionError(f"--conf {item!r} is not spark.KEY=VALUE")
        spark_conf[key.strip()] = value
    if args.trigger_interval is not None and not _TRIGGER_INTERVAL.match(args.trigger_interval.strip()):
        raise InvalidOptionError(f"--trigger-interval {args.trigger_interval!r}: use e.g. '500 ms', '10 seconds', '1 minute'")
    checked_seconds("--lock-timeout", args.lock_timeout)
    retention_ms = None
    if args.retention_ms is not None:
        retention_ms = KEEP_FOREVER_MS if args.retention_ms.strip() == str(KEEP_FOREVER_MS) \
            else parse_duration_ms("--retention-ms", args.retention_ms)
    retention_bytes = None if args.retention_bytes is None else parse_size_bytes("--retention-bytes", args.retention_bytes)
    checked_seconds("--retention-interval", args.retention_interval)
    if args.remote is not None:
        if not args.remote.startswith("sc://"):
            raise InvalidOptionError(f"--remote {args.remote!r}: a Spark Connect URL is sc://HOST:PORT")
        if args.master is not None or spark_conf:
            raise InvalidOptionError("--remote runs the job on a Spark Connect server, whose master and settings are "
                                     "the server's: drop --master and --conf")
        if location.is_local and not Path(args.path).expanduser().is_absolute():
            raise InvalidOptionError(f"--path {args.path!r}: with --remote give the index's absolute path on the server")
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
    fields = declared_fields(args.index_field, args.index_header)
    if fields and args.input != "records":
        raise InvalidOptionError("--index-field/--index-header: fields are indexed with --input records only (so far)")
    if args.backfill_fields and not fields:
        raise InvalidOptionError(NO_FIELDS_TO_BACKFILL)
    if fields and args.remote is not None:
        raise InvalidOptionError("--index-field/--index-header: fields are not indexed by --remote jobs yet")
    return IndexJobOptions(
        bootstrap_servers=args.bootstrap_servers, path=path,
        checkpoint=_checkpoint(args.checkpoint, location, path),
        input_kind=args.input, quarantine=_beside(args.quarantine, path, "_quarantine", storage),
        subscribe=subscribe, subscribe_pattern=args.subscribe_pattern, starting_offsets=offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger, kafka_options=kafka_options,
        fail_on_data_loss=args.fail_on_data_loss, sizing=sizing, lock_timeout_s=args.lock_timeout,
        trigger_interval=args.trigger_interval, available_now=args.available_now, master=args.master,
        query_name=args.query_name, spark_progress=not args.quiet_spark, min_partitions=args.min_partitions,
        spark_conf=spark_conf, retention_ms=retention_ms, retention_bytes=retention_bytes,
        retention_interval_s=args.retention_interval, remote=args.remote, storage_options=storage, fields=fields,
        backfill_fields=args.backfill_fields,
    )


def _checkpoint(given: str | None, location: StoreLocation, path: str) -> str:
    """The Spark checkpoint: as given (a local path expanded), else ``<path>/_checkpoint``; on an
    object store through Hadoop's connector for it (``s3a://`` for ``s3://``)."""
    if given:
        return hadoop_url(given) if "://" in given else str(Path(given).expanduser().resolve())
    if location.is_local:
        return str(Path(path) / "_checkpoint")
    return f"{hadoop_url(location.url)}/_checkpoint"


def _beside(given: str | None, path: str, name: str, storage: dict[str, str]) -> str:
    """A directory the job keeps: as given, else ``<path>/<name>`` (a URL stays a URL)."""
    if given:
        location = parse_location(given, storage if "://" in given else None)
        return str(Path(location.local_path).expanduser().resolve()) if location.is_local else location.url
    return f"{path.rstrip('/')}/{name}"


def build_parser() -> argparse.ArgumentParser:
    """The standalone script's parser."""
    parser = argparse.ArgumentParser(prog="index_job.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: the same job, flags and one-line errors as `msgindex index`."""
    from msgindex.cli import main as cli_main

    return cli_main(["index", *(sys.argv[1:] if argv is None else argv)])
