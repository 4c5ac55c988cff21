"""`msgindex demo`: the whole product in a few minutes on one machine.

Starts a local Kafka broker (unless --bootstrap-servers is given), creates topics, produces a
realistic workload (Zipf-distributed order keys over two topics with some KEYS / UNIQ_KEY
headers, plus a stream of RocketMQ-style metadata events), indexes it with the real pipeline
until caught up (available-now), then looks keys up and prints rows and timings.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

RECORD_TOPICS = {"demo-orders": 3, "demo-payments": 2}
METADATA_TOPIC = ("demo-rmq-dispatch", 2)


def register(subparsers) -> None:
    """Add the `demo` subcommand."""
    parser = subparsers.add_parser(
        "demo", help="run the whole pipeline on a local broker and look keys up (a few minutes)",
        description="Start a local Kafka broker (unless --bootstrap-servers), produce a realistic workload, "
                    "index it with the streaming pipeline until caught up, then run lookups and print timings.",
    )
    add_arguments(parser)
    parser.set_defaults(handler=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's flags."""
    parser.add_argument("--bootstrap-servers", help="use this Kafka cluster instead of starting a local broker")
    parser.add_argument("--records", type=int, default=100_000, help="keyed records to produce (default 100,000)")
    parser.add_argument("--events", type=int, default=20_000, help="metadata events to produce (default 20,000)")
    parser.add_argument("--path", help="where the demo's indexes go (default: <msgindex home>/demo, replaced each run)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=50_000, help="records per micro-batch (default 50,000)")


def _say(text: str) -> None:
    print(text, flush=True)


def _start_broker():
    from msgindex.jvm import msgindex_home
    from msgindex.kafka.broker import LocalBroker, free_port

    data = msgindex_home() / "demo-kafka"
    shutil.rmtree(data, ignore_errors=True)
    broker = LocalBroker(data, port=free_port(), controller_port=free_port())
    started = time.perf_counter()
    bootstrap = broker.start(timeout=300)
    _say(f"local Kafka broker ready at {bootstrap} in {time.perf_counter() - started:.1f} s (data {data})")
    return broker, bootstrap


def _produce(bootstrap: str, records: int, events: int) -> None:
    from msgindex.kafka.admin import create_topics
    from msgindex.kafka.loadgen import keyed_records, metadata_events, produce

    create_topics(bootstrap, {**RECORD_TOPICS, METADATA_TOPIC[0]: METADATA_TOPIC[1]}, exist_ok=True)
    started = time.perf_counter()
    produce(bootstrap, keyed_records(list(RECORD_TOPICS), records))
    produce(bootstrap, metadata_events(METADATA_TOPIC[0], events))
    _say(f"produced {records:,} keyed records to {', '.join(RECORD_TOPICS)} and {events:,} metadata events to "
         f"{METADATA_TOPIC[0]} in {time.perf_counter() - started:.1f} s")


def _index(bootstrap: str, topics: list[str], path: Path, input_kind: str, per_trigger: int) -> None:
    from msgindex.cli import index
    from msgindex.spark.pipeline.job import index_kafka

    args = ["--bootstrap-servers", bootstrap, "--subscribe", ",".join(topics), "--path", str(path),
            "--input", input_kind, "--available-now", "--max-offsets-per-trigger", str(per_trigger), "--quiet-spark"]
    index_kafka(index.options_from_args(index.build_parser().parse_args(args)))


def _show(store, title: str, key, **window) -> None:
    started = time.perf_counter()
    table = store.lookup(key, **window)
    elapsed = (time.perf_counter() - started) * 1000
    _say(f"\nlookup {title}: {table.num_rows:,} messages in {elapsed:.1f} ms")
    for row in table.slice(0, 5).to_pylist():
        _say(f"  {row['timestamp']:%H:%M:%S.%f}  broker={row['broker']}  {row['topic']}-{row['partition']}@{row['offset']}"
             f"  keys={row['keys']}" + (f"  commitLogOffset={row['commit_log_offset']} size={row['size']}"
                                         if row["commit_log_offset"] is not None else ""))
    if table.num_rows > 5:
        _say(f"  ... {table.num_rows - 5:,} more")


def _lookups(records_index: Path, metadata_index: Path) -> None:
    import msgindex

    with msgindex.open(records_index) as store:
        _show(store, "of the hottest key 'order-00000' in demo-orders", "order-00000", topic="demo-orders")
        _show(store, "of a tail key 'order-00321' in any topic", "order-00321")
        _show(store, "of a KEYS-header key 'customer-00042'", "customer-00042")
        first = store.lookup("order-00001", topic="demo-payments")
        if first.num_rows >= 2:
            stamps = sorted(first.column("timestamp").to_pylist())
            begin = int(stamps[0].timestamp() * 1000)
            end = int(stamps[len(stamps) // 2].timestamp() * 1000)
            _show(store, f"of 'order-00001' in demo-payments within [{begin}, {end}] ms", "order-00001",
                  topic="demo-payments", begin_ms=begin, end_ms=end)
    with msgindex.open(metadata_index) as store:
        _show(store, "of 'order-00007' in RocketMQ topic TopicTest (metadata events)", "order-00007", topic="TopicTest")


def run(args: argparse.Namespace) -> int:
    """The demo end to end; returns 0."""
    from msgindex.jvm import msgindex_home

    started = time.perf_counter()
    broker = None
    bootstrap = args.bootstrap_servers
    if not bootstrap:
        broker, bootstrap = _start_broker()
    try:
        root = Path(args.path) if args.path else msgindex_home() / "demo"
        shutil.rmtree(root, ignore_errors=True)
        _produce(bootstrap, args.records, args.events)
        indexing = time.perf_counter()
        _index(bootstrap, list(RECORD_TOPICS), root / "records", "records", args.max_offsets_per_trigger)
        _index(bootstrap, [METADATA_TOPIC[0]], root / "metadata", "metadata", args.max_offsets_per_trigger)
        _say(f"\nindexed {args.records + args.events:,} messages in {time.perf_counter() - indexing:.1f} s "
             f"(Spark start-up included) into {root}")
        _lookups(root / "records", root / "metadata")
        _say(f"\nexplore further:  msgindex lookup {root / 'records'} --key order-00000   |   "
             f"spark.read.format('msgindex').option('path', '{root / 'records'}')")
    finally:
        if broker is not None:
            broker.stop()
            _say("local Kafka broker stopped")
    _say(f"demo finished in {time.perf_counter() - started:.0f} s")
    return 0
