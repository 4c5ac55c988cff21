"""msgindex demo: the whole product in a few minutes on one machine.

Starts a local Kafka broker (unless --bootstrap-servers is given), creates topics, produces the
last hour of a shop's traffic (order events and payments keyed by order id, customers in KEYS
headers, payment ids in UNIQ_KEY headers, and an incident: the payment provider stalls for five
minutes 25 minutes ago; plus a stream of RocketMQ-style metadata events), indexes it with the
real pipeline until caught up (available-now), then looks keys up and prints rows and timings.

Everything goes under --path (default <msgindex home>/demo, replaced each run): the indexes
records/ and metadata/, and the broker's data in kafka/. The broker is stopped at the end unless
--keep-broker; msgindex kafka start --data-dir <path>/kafka starts it again (for payloads).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

RECORD_TOPICS = {"demo-orders": 3, "demo-payments": 2}  # (order events, payments) of loadgen.incident_records
METADATA_TOPIC = ("demo-rmq-dispatch", 2)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `demo` subcommand."""
    parser = subparsers.add_parser(
        "demo", help="run the whole pipeline on a local broker and look keys up (a few minutes)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(handler=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's flags."""
    parser.add_argument("--bootstrap-servers", help="use this Kafka cluster instead of starting a local broker")
    parser.add_argument("--records", type=int, default=100_000, help="keyed records to produce (default 100,000)")
    parser.add_argument("--events", type=int, default=20_000, help="metadata events to produce (default 20,000)")
    parser.add_argument("--path", help="where the demo's indexes and broker data go (default: <msgindex home>/demo, "
                                       "replaced each run)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=50_000, help="records per micro-batch (default 50,000)")
    parser.add_argument("--keep-broker", action="store_true",
                        help="leave the local broker running at the end (to fetch payloads); msgindex kafka stop "
                             "--data-dir <path>/kafka stops it")


def _say(text: str) -> None:
    print(text, flush=True)


def _start_broker(data: Path):
    from msgindex.kafka.broker import LocalBroker, free_port

    broker = LocalBroker(data, port=free_port(), controller_port=free_port())
    started = time.perf_counter()
    bootstrap = broker.start(timeout=300)
    _say(f"local Kafka broker ready at {bootstrap} in {time.perf_counter() - started:.1f} s (data {data})")
    return broker, bootstrap


def _produce(bootstrap: str, records: int, events: int) -> None:
    from msgindex.kafka.admin import create_topics
    from msgindex.kafka.loadgen import incident_records, metadata_events, produce

    create_topics(bootstrap, {**RECORD_TOPICS, METADATA_TOPIC[0]: METADATA_TOPIC[1]}, exist_ok=True)
    started = time.perf_counter()
    sent = produce(bootstrap, incident_records(*RECORD_TOPICS, records))
    produce(bootstrap, metadata_events(METADATA_TOPIC[0], events))
    _say(f"produced {sent:,} keyed records (the last hour of a shop: order events and payments, a payment stall "
         f"25 minutes ago) to {', '.join(RECORD_TOPICS)} and {events:,} metadata events to {METADATA_TOPIC[0]} "
         f"in {time.perf_counter() - started:.1f} s")


# A payload field indexed beside the keys: every declined payment of the incident, by value
STATUS_FIELD = "status=get_json_object(CAST(value AS STRING), '$.status')"


def _index(bootstrap: str, topics: list[str], path: Path, input_kind: str, per_trigger: int,
           fields: tuple[str, ...] = ()) -> None:
    from msgindex.cli import index
    from msgindex.spark.pipeline.job import index_kafka

    args = ["--bootstrap-servers", bootstrap, "--subscribe", ",".join(topics), "--path", str(path),
            "--input", input_kind, "--available-now", "--max-offsets-per-trigger", str(per_trigger), "--quiet-spark",
            *(flag for field in fields for flag in ("--index-field", field))]
    index_kafka(index.options_from_args(index.build_parser().parse_args(args)))


def _show(store, title: str, key, **window) -> None:
    from msgindex.times import format_ms

    started = time.perf_counter()
    table = store.lookup(key, **window)
    elapsed = (time.perf_counter() - started) * 1000
    _say(f"\nlookup of {title}: {table.num_rows:,} messages in {elapsed:.1f} ms")
    stamps = table.column("timestamp").cast("int64").to_pylist()
    for row, micros in zip(table.slice(0, 5).to_pylist(), stamps):
        _say(f"  {format_ms(micros // 1000)}  {row['topic']}-{row['partition']}@{row['offset']}  broker={row['broker']}"
             f"  keys={','.join(row['keys'])}" + (f"  commitLogOffset={row['commit_log_offset']} size={row['size']}"
                                                   if row["commit_log_offset"] is not None else ""))
    if table.num_rows > 5:
        _say(f"  ... {table.num_rows - 5:,} more")


def _lookups(records_index: Path, metadata_index: Path) -> None:
    import msgindex
    from msgindex.times import format_window, to_epoch_ms

    with msgindex.open(records_index) as store:
        _show(store, "the hottest key 'order-00000' in demo-orders", "order-00000", topic="demo-orders")
        _show(store, "'order-00321' in any topic (the order the incident hit)", "order-00321")
        _show(store, "a KEYS-header key 'customer-00042'", "customer-00042")
        now = to_epoch_ms("end", "now")
        begin, end = to_epoch_ms("begin", "-30m", now_ms=now), to_epoch_ms("end", "-15m", now_ms=now)
        _show(store, f"'order-00001' in demo-payments from 30 to 15 minutes ago ({format_window(begin, end)})",
              "order-00001", topic="demo-payments", begin_ms=begin, end_ms=end)
        _show(store, f"payments whose payload says status 'declined', the same window (the field {STATUS_FIELD!r})",
              None, fields={"status": ["declined"]}, begin_ms=begin, end_ms=end)
    with msgindex.open(metadata_index) as store:
        _show(store, "'order-00007' in RocketMQ topic TopicTest (metadata events)", "order-00007", topic="TopicTest")


def run(args: argparse.Namespace) -> int:
    """The demo end to end; returns 0."""
    from msgindex.jvm import msgindex_home

    started = time.perf_counter()
    root = (Path(args.path) if args.path else msgindex_home() / "demo").resolve()
    shutil.rmtree(root, ignore_errors=True)
    broker = None
    bootstrap = args.bootstrap_servers
    if not bootstrap:
        broker, bootstrap = _start_broker(root / "kafka")
    try:
        _produce(bootstrap, args.records, args.events)
        indexing = time.perf_counter()
        _index(bootstrap, list(RECORD_TOPICS), root / "records", "records", args.max_offsets_per_trigger,
               fields=(STATUS_FIELD,))
        _index(bootstrap, [METADATA_TOPIC[0]], root / "metadata", "metadata", args.max_offsets_per_trigger)
        _say(f"\nindexed {args.records + args.events:,} messages in {time.perf_counter() - indexing:.1f} s "
             f"(Spark start-up included) into {root}")
        _lookups(root / "records", root / "metadata")
    finally:
        if broker is not None and not args.keep_broker:
            broker.stop()
            _say("\nlocal Kafka broker stopped")
    _say(_next_steps(root, bootstrap if broker is None or args.keep_broker else None))
    _say(f"demo finished in {time.perf_counter() - started:.0f} s")
    return 0


def _next_steps(root: Path, bootstrap: str | None) -> str:
    index = root / "records"
    values = f"--values --bootstrap-servers {bootstrap}" if bootstrap else "--values --bootstrap-servers 127.0.0.1:9092"
    restart = "" if bootstrap else f"\n  (payloads need the demo's broker: msgindex kafka start --data-dir {root / 'kafka'})"
    return (f"\nwhat happened to order 321 in the last hour?\n"
            f"  msgindex lookup {index} --key order-00321 --since 1h\n"
            f"  msgindex lookup {index} --key order-00321 --since 1h {values}{restart}\n"
            f"  msgindex serve {index}{' --bootstrap-servers ' + bootstrap if bootstrap else ''}   "
            f"(a search page in the browser)\n"
            f"  examples/explore.ipynb   (the incident, plotted: open it in Jupyter, or "
            f"jupyter nbconvert --to html --execute examples/explore.ipynb)\n"
            f"  spark.read.format('msgindex').load('{index}').where(\"any_key = 'order-00321'\")   "
            f"(after msgindex.spark.enable_pushdown(spark))\n"
            f"  msgindex lookup {index} --field status=declined --since 1h   (by a payload field)")
