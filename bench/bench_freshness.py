"""Freshness: how long after a producer sends a message can a lookup find it?

    python bench/bench_freshness.py [--rate 5000] [--seconds 60] [--trigger-interval "1 second"]

The indexing job runs continuously (``--trigger-interval``, local[2]) while a producer sends a
steady ``--rate`` messages per second, each with a unique key, recording when it sent each one. A
reader polls the index the whole time (``Store.lookup`` of every key sent and not found yet, as a
user's tool would) and records, per message, when the first lookup that finds it returned.
Prints p50/p90/p99/max of (found - sent) over every message sent (goal: p99 <= 3 s), the rate
the producer really achieved, and how many messages were never found before the deadline.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

TOPIC_PARTITIONS = 3
DRAIN_S = 30.0  # after the producer stops, how long lookups may still find the last messages


def produce_steadily(bootstrap: str, topic: str, rate: int, seconds: float, sent: dict, stop: threading.Event) -> None:
    """Send `rate` messages a second (in 10 ms slices) with keys fresh-<n>; sent[key] = send time."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=2, acks=1)
    try:
        started = time.monotonic()
        n = 0
        while not stop.is_set():
            elapsed = time.monotonic() - started
            if elapsed >= seconds:
                break
            due = int(elapsed * rate)
            while n < due:
                key = f"fresh-{n}"
                sent[key] = time.time()
                producer.send(topic, key=key.encode(), value=b"x" * 100)
                n += 1
            producer.flush(timeout=10) if n % 1000 == 0 else None
            time.sleep(0.01)
        producer.flush(timeout=30)
    finally:
        producer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_freshness.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--rate", type=int, default=5000, help="messages per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the producer sends")
    parser.add_argument("--trigger-interval", default="1 second")
    parser.add_argument("--poll-ms", type=float, default=100.0, help="pause between lookup rounds")
    args = parser.parse_args(argv)

    import msgindex
    from msgindex.cli import index as index_cli
    from msgindex.kafka.admin import create_topics
    from msgindex.kafka.broker import LocalBroker, free_port
    from msgindex.spark.pipeline import index_kafka

    work = Path(tempfile.mkdtemp(prefix="bench-freshness-"))
    broker = None
    bootstrap = args.bootstrap_servers
    stop = threading.Event()
    try:
        if not bootstrap:
            broker = LocalBroker(work / "kafka", port=free_port(), controller_port=free_port())
            bootstrap = broker.start(timeout=300)
        topic = f"fresh-{int(time.time())}"
        create_topics(bootstrap, {topic: TOPIC_PARTITIONS})
        index = work / "index"
        options = index_cli.options_from_args(index_cli.build_parser().parse_args(
            ["--bootstrap-servers", bootstrap, "--subscribe", topic, "--path", str(index),
             "--trigger-interval", args.trigger_interval, "--quiet-spark"]))
        job = threading.Thread(target=index_kafka, args=(options, stop), name="indexing-job", daemon=True)
        job.start()
        started = time.monotonic()
        while not (index / "_checkpoint" / "offsets").is_dir():  # the query has planned its first trigger
            if not job.is_alive() or time.monotonic() - started > 300:
                raise SystemExit("the indexing job did not start")
            time.sleep(0.2)
        time.sleep(3)  # a few empty triggers: measure a running pipeline, not its start-up

        sent: dict[str, float] = {}
        found: dict[str, float] = {}
        producer = threading.Thread(target=produce_steadily, args=(bootstrap, topic, args.rate, args.seconds, sent, stop))
        producer.start()
        store = msgindex.open(index)
        deadline = None
        while True:
            pending = [key for key in list(sent) if key not in found]
            if pending and store.brokers():
                table = store.lookup(pending, topic=topic)
                now = time.time()
                for key in set(table.column("key").to_pylist()):
                    found.setdefault(key, now)
            if not producer.is_alive():
                deadline = deadline or time.monotonic() + DRAIN_S
                if len(found) == len(sent) or time.monotonic() > deadline:
                    break
            time.sleep(args.poll_ms / 1000)
        stop.set()
        job.join(120)
        latencies = np.array([found[key] - sent[key] for key in found])
        achieved = len(sent) / args.seconds
        print(f"\n{len(sent):,} messages sent in {args.seconds:.0f} s ({achieved:,.0f}/s, target {args.rate:,}/s), "
              f"trigger interval {args.trigger_interval}, lookups every {args.poll_ms:.0f} ms")
        print(f"found {len(found):,}, never found {len(sent) - len(found):,}")
        if len(latencies):
            p50, p90, p99 = np.percentile(latencies, [50, 90, 99])
            print(f"send -> first lookup that finds it: p50 {p50:.2f} s, p90 {p90:.2f} s, p99 {p99:.2f} s, "
                  f"max {latencies.max():.2f} s (goal p99 <= 3 s)")
        store.close()
    finally:
        stop.set()
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
