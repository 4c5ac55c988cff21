"""Realistic load for the indexing pipeline: keyed Kafka records and RocketMQ-style metadata events.

    python streaming_jobs/loadgen.py --bootstrap-servers 127.0.0.1:9092 --topics orders,payments \\
        --records 100000 [--metadata-topic rmq-dispatch --events 20000]
    python -m msgindex.kafka.loadgen ...      (the same)

Keys follow a Zipf distribution over a pool (a few hot keys, a long tail), about 10% of records
carry a ``KEYS`` header (space-separated extra keys) and 5% a ``UNIQ_KEY`` header; metadata
events name brokers ``broker-a``/``broker-b``/... and use the schema of
msgindex.spark.pipeline.metadata_events. Everything is seeded: the same flags produce the same messages.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

DEFAULT_KEY_POOL = 50_000
ZIPF_EXPONENT = 1.2
KEYS_HEADER_SHARE = 0.10
UNIQ_KEY_SHARE = 0.05
VALUE_BYTES = 200  # payloads exist (the pipeline must not read them), their content does not matter


@dataclass(frozen=True)
class Message:
    """One record to produce."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


def zipf_key_ids(count: int, pool: int, seed: int) -> np.ndarray:
    """`count` key ids in [0, pool), Zipf-distributed (id 0 hottest)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, pool + 1) ** ZIPF_EXPONENT
    return rng.choice(pool, size=count, p=weights / weights.sum())


def keyed_records(topics: list[str], count: int, *, key_pool: int = DEFAULT_KEY_POOL, seed: int = 7) -> Iterator[Message]:
    """Records spread over `topics`: Zipf keys like ``order-00042``, some KEYS / UNIQ_KEY headers."""
    rng = random.Random(seed)
    ids = zipf_key_ids(count, key_pool, seed)
    payload = bytes(rng.getrandbits(8) for _ in range(VALUE_BYTES))
    for n, key_id in enumerate(ids):
        topic = topics[n % len(topics)]
        headers: list[tuple[str, bytes]] = []
        if rng.random() < KEYS_HEADER_SHARE:
            extra = " ".join(f"customer-{rng.randrange(key_pool // 10):05d}" for _ in range(rng.randint(1, 3)))
            headers.append(("KEYS", extra.encode()))
        if rng.random() < UNIQ_KEY_SHARE:
            headers.append(("UNIQ_KEY", f"{seed:04X}{n:016X}".encode()))
        yield Message(topic, f"order-{int(key_id):05d}".encode(), payload, tuple(headers))


def metadata_events(topic: str, count: int, *, brokers: tuple[str, ...] = ("broker-a", "broker-b"),
                    source_topics: tuple[str, ...] = ("TopicTest", "TradeTopic"), queues: int = 4,
                    key_pool: int = DEFAULT_KEY_POOL, start_ms: int | None = None, seed: int = 11) -> Iterator[Message]:
    """RocketMQ-style dispatch events (one per stored message) as JSON values on `topic`."""
    rng = random.Random(seed)
    ids = zipf_key_ids(count, key_pool, seed)
    now = start_ms if start_ms is not None else int(time.time() * 1000)
    queue_offsets: dict[tuple[str, str, int], int] = {}
    commit_log: dict[str, int] = {b: 0 for b in brokers}
    for n, key_id in enumerate(ids):
        broker = brokers[n % len(brokers)]
        source = source_topics[rng.randrange(len(source_topics))]
        queue = rng.randrange(queues)
        offset = queue_offsets.get((broker, source, queue), 0)
        queue_offsets[(broker, source, queue)] = offset + 1
        size = rng.randint(150, 4000)
        event = {
            "brokerName": broker, "topic": source, "queueId": queue, "queueOffset": offset,
            "keys": f"order-{int(key_id):05d}" + (f" customer-{rng.randrange(key_pool // 10):05d}" if rng.random() < 0.3 else ""),
            "uniqKey": f"7F000001{seed:04X}{n:012X}", "commitLogOffset": commit_log[broker], "msgSize": size,
            "storeTimestamp": now + n,
        }
        commit_log[broker] += size
        yield Message(topic, None, json.dumps(event).encode())


def producer(bootstrap_servers: str):
    """A kafka-python producer tuned for bulk loading (big batches; leader acks suffice here)."""
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap_servers, acks=1, linger_ms=20, batch_size=512 * 1024,
                         max_request_size=4 * 1024 * 1024,
                         enable_idempotence=False, retries=5)


def produce(bootstrap_servers: str, messages, *, partition_of=None) -> int:
    """Send every message (keyless ones round-robin, or `partition_of(n, message)`) and flush."""
    sent = 0
    with_producer = producer(bootstrap_servers)
    try:
        for message in messages:
            partition = partition_of(sent, message) if partition_of else None
            with_producer.send(message.topic, key=message.key, value=message.value,
                               headers=list(message.headers) or None, partition=partition)
            sent += 1
        with_producer.flush()
    finally:
        with_producer.close()
    return sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loadgen.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topics", default="orders,payments", help="comma-separated record topics (must exist)")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--metadata-topic", help="topic for metadata events (must exist)")
    parser.add_argument("--events", type=int, default=0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    sent = produce(args.bootstrap_servers, keyed_records(args.topics.split(","), args.records, seed=args.seed))
    if args.metadata_topic and args.events:
        sent += produce(args.bootstrap_servers, metadata_events(args.metadata_topic, args.events, seed=args.seed))
    print(f"produced {sent:,} records in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
