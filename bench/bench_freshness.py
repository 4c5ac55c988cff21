"""Freshness: how long after a producer sends a message can a lookup find it?

    python bench/bench_freshness.py [--rate 5000] [--seconds 60] [--trigger-interval "1 second"]

The indexing job runs continuously as its own process (``msgindex index --trigger-interval``,
local[2]); once it has indexed a warm-up message, a producer sends a steady ``--rate`` messages
per second, each with a unique key, recording when it sent each one. A reader (this process, as
a user's tool would be) polls the index every ``--poll-ms``: it reads the records committed since
its last poll, looks their keys up with ``Store.lookup``, and records, per message, when the
first lookup that finds it returned. Prints p50/p90/p99/max of (found - sent) over every message
sent (goal: p99 <= 3 s), the rate the producer really achieved, and how many messages were
never found before the deadline.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
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
    from msgindex.kafka.admin import create_topics
    from msgindex.kafka.broker import LocalBroker, free_port
    from msgindex.kafka.loadgen import Message, produce

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
        job_log = open(work / "job.log", "w")
        job = subprocess.Popen([str(Path(sys.executable).parent / "msgindex"), "index", "--bootstrap-servers", bootstrap,
                                "--subscribe", topic, "--path", str(index), "--trigger-interval", args.trigger_interval,
                                "--quiet-spark"], stdout=job_log, stderr=subprocess.STDOUT)
        produce(bootstrap, [Message(topic, f"warm-{n}".encode(), b"x") for n in range(100)])
        started = time.monotonic()
        while not (index / "msgindex.json").exists() or not msgindex.open(index).lookup("warm-99", topic=topic).num_rows:
            if job.poll() is not None or time.monotonic() - started > 300:
                raise SystemExit(f"the indexing job did not index the warm-up:\n{(work / 'job.log').read_text()[-3000:]}")
            time.sleep(0.2)

        sent: dict[str, float] = {}
        found: dict[str, float] = {}
        producer = threading.Thread(target=produce_steadily, args=(bootstrap, topic, args.rate, args.seconds, sent, stop))
        producer.start()
        store = msgindex.open(index)
        read_up_to: dict[str, int] = {}
        deadline = None
        while True:
            for shard in store.brokers():
                with store.reader(shard) as reader:
                    end = reader.checkpoint.record_count
                    new_keys = [key for batch in reader.scan_range(read_up_to.get(shard, 0), end)
                                for key in batch.column("key").to_pylist() if key in sent]
                read_up_to[shard] = end
                if new_keys:
                    table = store.lookup(new_keys, topic=topic)
                    now = time.time()
                    for key in table.column("key").to_pylist():
                        found.setdefault(key, now)
            if not producer.is_alive():
                deadline = deadline or time.monotonic() + DRAIN_S
                if len(found) == len(sent) or time.monotonic() > deadline:
                    break
            time.sleep(args.poll_ms / 1000)
        job.send_signal(signal.SIGTERM)
        job.wait(120)
        job_log.close()
        batches = [line for line in (work / "job.log").read_text().splitlines() if "] batch " in line]
        latencies = np.array([found[key] - sent[key] for key in found])
        achieved = len(sent) / args.seconds
        print(f"\n{len(sent):,} messages sent in {args.seconds:.0f} s ({achieved:,.0f}/s, target {args.rate:,}/s), "
              f"trigger interval {args.trigger_interval}, lookups every {args.poll_ms:.0f} ms")
        print(f"found {len(found):,}, never found {len(sent) - len(found):,}")
        if len(latencies):
            p50, p90, p99 = np.percentile(latencies, [50, 90, 99])
            print(f"send -> first lookup that finds it: p50 {p50:.2f} s, p90 {p90:.2f} s, p99 {p99:.2f} s, "
                  f"max {latencies.max():.2f} s (goal p99 <= 3 s)")
        seconds = [float(line.split(" in ")[1].split(" s ")[0]) for line in batches]
        if seconds:
            print(f"the job's micro-batches: {len(seconds)}, median {np.median(seconds):.2f} s, "
                  f"p90 {np.percentile(seconds, 90):.2f} s, max {max(seconds):.2f} s each")
        store.close()
    finally:
        stop.set()
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
