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

Then the same again with the index on an object store (``--path s3://bench/index``: moto's S3
server in its own process on loopback, Spark's checkpoint in the bucket through ``s3a://`` as the
job defaults to; skipped with --no-object-store), goal p99 <= 5 s, printing the requests the
appends sent per micro-batch (from the job's batch lines).
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
from moto_s3 import add_object_store_flag

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


def committed_keys(store, read_up_to: dict, sent: dict) -> list[str]:
    """Keys of `sent` among the records each shard committed since the last call (the scan's
    pieces end where the shard's committed log ends, on either kind of store)."""
    new_keys = []
    for shard in store.brokers():
        with store.reader(shard) as reader:
            done = read_up_to.get(shard, 0)
            pieces = reader.scan_ranges()
            for start, end in pieces:
                if end > done:
                    new_keys += [key for batch in reader.scan_range(max(start, done), end)
                                 for key in batch.column("key").to_pylist() if key in sent]
            read_up_to[shard] = max([done, *(end for _, end in pieces)])
    return new_keys


def freshness_run(args, bootstrap: str, work: Path, root: str, storage_options: dict | None) -> dict:
    """One run of the job (its own process) at `root` with a steady producer; what it measured."""
    import msgindex
    from msgindex.errors import MsgIndexError
    from msgindex.kafka.admin import create_topics
    from msgindex.kafka.loadgen import Message, produce

    topic = f"fresh-{int(time.time())}"
    create_topics(bootstrap, {topic: TOPIC_PARTITIONS})
    log_path = work / f"job-{topic}.log"
    job_log = open(log_path, "w")
    job = subprocess.Popen([str(Path(sys.executable).parent / "msgindex"), "index", "--bootstrap-servers", bootstrap,
                            "--subscribe", topic, "--path", root, "--trigger-interval", args.trigger_interval,
                            "--quiet-spark"], stdout=job_log, stderr=subprocess.STDOUT)
    stop = threading.Event()
    store = None
    try:
        produce(bootstrap, [Message(topic, f"warm-{n}".encode(), b"x") for n in range(100)])
        started = time.monotonic()
        while True:
            try:
                if msgindex.open(root, storage_options=storage_options).lookup("warm-99", topic=topic).num_rows:
                    break
            except MsgIndexError:
                pass  # not created yet
            if job.poll() is not None or time.monotonic() - started > args.startup_timeout:
                raise SystemExit(f"the indexing job did not index the warm-up:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)

        sent: dict[str, float] = {}
        found: dict[str, float] = {}
        producer = threading.Thread(target=produce_steadily, args=(bootstrap, topic, args.rate, args.seconds, sent, stop))
        producer.start()
        store = msgindex.open(root, storage_options=storage_options)
        read_up_to: dict[str, int] = {}
        pending: set[str] = set()  # committed (the scan saw them), not yet found by a lookup
        deadline = None
        while True:
            pending.update(committed_keys(store, read_up_to, sent))
            if pending:
                # a store object's lookups may answer from a version up to max_staleness_s old
                # (1 s): keys its scan already saw are asked again until a lookup finds them
                table = store.lookup(sorted(pending), topic=topic)
                now = time.time()
                for key in table.column("key").to_pylist():
                    found.setdefault(key, now)
                    pending.discard(key)
            if not producer.is_alive():
                deadline = deadline or time.monotonic() + DRAIN_S
                if len(found) == len(sent) or time.monotonic() > deadline:
                    break
            time.sleep(args.poll_ms / 1000)
    finally:
        stop.set()
        job.send_signal(signal.SIGTERM)
        job.wait(120)
        job_log.close()
        if store is not None:
            store.close()
    batches = [line for line in log_path.read_text().splitlines() if "] batch " in line]
    return {"sent": sent, "found": found, "latencies": np.array([found[key] - sent[key] for key in found]),
            "batch_seconds": [float(line.split(" in ")[1].split(" s ")[0]) for line in batches],
            "batch_requests": [int(line.split(" requests")[0].rsplit("| ", 1)[1].replace(",", ""))
                               for line in batches if " requests |" in line]}


def report(name: str, args, run: dict) -> float | None:
    sent, found, latencies = run["sent"], run["found"], run["latencies"]
    print(f"\n{name}: {len(sent):,} messages sent in {args.seconds:.0f} s ({len(sent) / args.seconds:,.0f}/s, target "
          f"{args.rate:,}/s), trigger interval {args.trigger_interval}, lookups every {args.poll_ms:.0f} ms")
    print(f"found {len(found):,}, never found {len(sent) - len(found):,}")
    p99 = None
    if len(latencies):
        p50, p90, p99 = np.percentile(latencies, [50, 90, 99])
        print(f"send -> first lookup that finds it: p50 {p50:.2f} s, p90 {p90:.2f} s, p99 {p99:.2f} s, "
              f"max {latencies.max():.2f} s")
    seconds = run["batch_seconds"]
    if seconds:
        print(f"the job's micro-batches: {len(seconds)}, median {np.median(seconds):.2f} s, "
              f"p90 {np.percentile(seconds, 90):.2f} s, max {max(seconds):.2f} s each")
    requests = run["batch_requests"]
    if requests:
        print(f"requests the appends sent per micro-batch: median {np.median(requests):.0f}, "
              f"p90 {np.percentile(requests, 90):.0f}, max {max(requests)} (over {len(requests)} batches; "
              f"Spark's s3a checkpoint and the job's batch log not counted)")
    return p99


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_freshness.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--rate", type=int, default=5000, help="messages per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the producer sends (per run)")
    parser.add_argument("--trigger-interval", default="1 second")
    parser.add_argument("--poll-ms", type=float, default=100.0, help="pause between lookup rounds")
    parser.add_argument("--startup-timeout", type=float, default=600.0,
                        help="seconds the job may take to index the warm-up messages (a loaded machine starts Spark slowly)")
    add_object_store_flag(parser, "the run into an S3 bucket")
    args = parser.parse_args(argv)

    from msgindex.kafka.broker import LocalBroker, free_port

    work = Path(tempfile.mkdtemp(prefix="bench-freshness-"))
    broker = servers = None
    bootstrap = args.bootstrap_servers
    try:
        if not bootstrap:
            broker = LocalBroker(work / "kafka", port=free_port(), controller_port=free_port())
            bootstrap = broker.start(timeout=300)
        runs = {"local store": freshness_run(args, bootstrap, work, str(work / "index"), None)}
        if args.object_store:
            from moto_s3 import Servers

            servers = Servers()
            servers.create_bucket("bench")
            servers.export_env()  # the job (and its Spark checkpoint through s3a) reads AWS_*
            runs["object store (s3://, checkpoint s3a://, moto on loopback)"] = freshness_run(
                args, bootstrap, work, "s3://bench/index", servers.options())
        p99s = {name: report(name, args, run) for name, run in runs.items()}
        print("\ngoals: p99 <= 3 s (local store), p99 <= 5 s (object store): "
              + "; ".join(f"{name} {'-' if p99 is None else f'{p99:.2f} s'}" for name, p99 in p99s.items()))
    finally:
        if servers is not None:
            servers.stop()
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
