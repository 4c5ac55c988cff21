"""Realistic load for the indexing pipeline: keyed Kafka records and RocketMQ-style metadata events.

    python streaming_jobs/loadgen.py --bootstrap-servers 127.0.0.1:9092 --topics orders,payments \\
        --records 100000 [--metadata-topic rmq-dispatch --events 20000]
    python -m msgindex.kafka.loadgen ...      (the same)

Keys follow a Zipf distribution over a pool (a few hot keys, a long tail), about 10% of records
carry a ``KEYS`` header (space-separated extra keys) and 5% a ``UNIQ_KEY`` header; metadata
events name brokers ``broker-a``/``broker-b``/... and use the schema of
msgindex.spark.pipeline.metadata_events. Everything is seeded: the same flags produce the same messages.
With ``json_fields`` the payloads are JSON carrying an order id and line items (``--index-field``
material) and every record a ``trace-id`` header (``--index-header``): see ``json_payload``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kafka import KafkaProducer

DEFAULT_KEY_POOL = 50_000
ZIPF_EXPONENT = 1.2
KEYS_HEADER_SHARE = 0.10
UNIQ_KEY_SHARE = 0.05
VALUE_BYTES = 200  # payloads exist (the pipeline must not read them), their content does not matter
TRACE_HEADER = "trace-id"  # json_fields: every record's trace id
# json_fields: the JSON paths an indexing job's fields read (bench_pipeline.py declares them)
ORDER_ID_PATH, ITEMS_SCHEMA = "$.order.id", "struct<items:array<struct<sku:string>>>"
MISSING_ORDER_SHARE = 0.02  # json_fields: payloads without an order (a field's records "without")


@dataclass(frozen=True)
class Message:
    """One record to produce."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None  # the record's CreateTime (None: when it is sent)


def zipf_key_ids(count: int, pool: int, seed: int) -> np.ndarray:
    """`count` key ids in [0, pool), Zipf-distributed (id 0 hottest)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, pool + 1) ** ZIPF_EXPONENT
    return rng.choice(pool, size=count, p=weights / weights.sum())


def json_payload(rng: random.Random, n: int, seed: int) -> tuple[bytes, tuple[str, bytes]]:
    """A JSON payload of about VALUE_BYTES: ``{"order": {"id": "o-..."}, "items": [{"sku": ...}, 1-3
    of them], ...}`` (MISSING_ORDER_SHARE without the order), and its ``trace-id`` header."""
    items = [{"sku": f"sku-{rng.randrange(20_000):05d}", "qty": rng.randint(1, 4)} for _ in range(rng.randint(1, 3))]
    event = {"order": {"id": f"o-{seed:02x}{n:08x}", "state": "created"}} if rng.random() >= MISSING_ORDER_SHARE else {}
    event.update(items=items, customer=f"customer-{rng.randrange(50_000):05d}", amount=rng.randrange(100, 99_999) / 100)
    text = json.dumps(event, separators=(",", ":"))
    text = text[:-1] + f',"note":"{"x" * max(0, VALUE_BYTES - len(text) - 10)}"}}'
    return text.encode(), (TRACE_HEADER, f"{seed:04x}{n:012x}".encode())


def keyed_records(topics: list[str], count: int, *, key_pool: int = DEFAULT_KEY_POOL, seed: int = 7,
                  json_fields: bool = False) -> Iterator[Message]:
    """Records spread over `topics`: Zipf keys like ``order-00042``, some KEYS / UNIQ_KEY headers;
    with `json_fields`, JSON payloads and a trace-id header on each (json_payload)."""
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
        value = payload
        if json_fields:
            value, trace = json_payload(rng, n, seed)
            headers.append(trace)
        yield Message(topic, f"order-{int(key_id):05d}".encode(), value, tuple(headers))


MINUTE_MS = 60_000
ORDER_EVENTS = ("created", "confirmed", "packed", "shipped")  # then "tracking-update"s
INCIDENT_BEFORE_END_MS = (25 * MINUTE_MS, 20 * MINUTE_MS)  # payments stall from 25 to 20 minutes before the end
INCIDENT_BURST_MS = 20_000  # ... and what was held back arrives within 20 s after
STORY_ORDER = 321  # order-00321: one order's scripted hour, the demo's investigation
# (minutes before the end, topic: 0 orders / 1 payments, what happened); the payment attempt of
# minute 24 is held by the stall and declined in the burst, the retry goes through
STORY = ((42, 0, {"event": "created"}), (41, 0, {"event": "confirmed"}),
         (24, 1, {"status": "declined", "reason": "issuer timeout"}), (19, 1, {"status": "captured"}),
         (18, 0, {"event": "packed"}), (9, 0, {"event": "shipped"}))


def incident_records(orders_topic: str, payments_topic: str, count: int, *, end_ms: int | None = None,
                     span_ms: int = 60 * MINUTE_MS, key_pool: int = DEFAULT_KEY_POOL, seed: int = 7) -> Iterator[Message]:
    """An hour of a shop's traffic ending at `end_ms` (default now), with an incident in it: the
    demo's workload, made to be investigated.

    Records alternate between `orders_topic` (order events: created, confirmed, packed, shipped,
    then tracking updates) and `payments_topic` (payments: captured, a few declined), keyed by
    order id (``order-00042``, Zipf-distributed: a few busy orders, a long tail), with JSON
    values. Every order event carries its customer in a ``KEYS`` header (``customer-01234``, one
    per order), every payment its payment id in ``UNIQ_KEY`` (``pay-...``), so that a lookup of
    either finds them. CreateTimes spread evenly over `span_ms`, except for the incident: from 25
    to 20 minutes before the end the payment provider stalls, no payment is written, and the
    held-back payments arrive in a burst right after, half of them declined ("issuer timeout").
    One order, ``order-00321`` (``STORY``), has a scripted hour that runs into it."""
    rng = random.Random(seed)
    ids = zipf_key_ids(count, key_pool, seed)
    end = end_ms if end_ms is not None else int(time.time() * 1000)
    start = end - span_ms
    stall_begin, stall_end = end - INCIDENT_BEFORE_END_MS[0], end - INCIDENT_BEFORE_END_MS[1]
    story = sorted((end - minutes * MINUTE_MS, topic, what) for minutes, topic, what in STORY
                   if minutes * MINUTE_MS <= span_ms)
    seen: dict[int, int] = {}

    def message(n: int, key_id: int, stamp: int, topic: int, what: dict | None = None) -> Message:
        order = f"order-{key_id:05d}"
        amount = round(5 + key_id * 37 % 400 + key_id % 100 / 100, 2)
        if topic == 0:
            step = seen.get(key_id, 0)
            seen[key_id] = step + 1
            event = {"order": order, "event": ORDER_EVENTS[step] if step < len(ORDER_EVENTS) else "tracking-update",
                     "customer": f"customer-{key_id * 7919 % max(1, key_pool // 10):05d}", "items": 1 + key_id % 5,
                     "total": amount, **(what or {})}
            return Message(orders_topic, order.encode(), json.dumps(event).encode(),
                           (("KEYS", event["customer"].encode()),), timestamp_ms=stamp)
        payment = f"pay-{seed:02x}{n:08x}"
        event = {"order": order, "payment": payment, "status": "captured", "amount": amount}
        if what is not None:
            event.update(what)
        elif stall_begin <= stamp < stall_end:  # held back by the stall, sent in the burst after it
            stamp = stall_end + (stamp - stall_begin) * INCIDENT_BURST_MS // (stall_end - stall_begin)
            if rng.random() < 0.5:
                event.update(status="declined", reason="issuer timeout")
        elif rng.random() < 0.03:
            event.update(status="declined", reason="insufficient funds")
        if stall_begin <= stamp < stall_end:
            stamp = stall_end + (stamp - stall_begin) * INCIDENT_BURST_MS // (stall_end - stall_begin)
        return Message(payments_topic, order.encode(), json.dumps(event).encode(),
                       (("UNIQ_KEY", payment.encode()),), timestamp_ms=stamp)

    for n, key_id in enumerate(ids):
        stamp = start + n * span_ms // max(count, 1)
        while story and story[0][0] <= stamp:
            at, topic, what = story.pop(0)
            yield message(count + len(STORY) - len(story), STORY_ORDER, at, topic, what)
        yield message(n, key_pool if key_id == STORY_ORDER else int(key_id), stamp, n % 2)
    for extra, (at, topic, what) in enumerate(story, start=count + len(STORY) - len(story) + 1):
        yield message(extra, STORY_ORDER, at, topic, what)


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


def producer(bootstrap_servers: str) -> KafkaProducer:
    """A kafka-python producer tuned for bulk loading (big batches; leader acks suffice here)."""
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap_servers, acks=1, linger_ms=20, batch_size=512 * 1024,
                         max_request_size=4 * 1024 * 1024,
                         enable_idempotence=False, retries=5)


def produce(bootstrap_servers: str, messages: Iterable[Message], *,
            partition_of: Callable[[int, Message], int] | None = None) -> int:
    """Send every message (keyless ones round-robin, or `partition_of(n, message)`) and flush."""
    sent = 0
    with_producer = producer(bootstrap_servers)
    try:
        for message in messages:
            partition = partition_of(sent, message) if partition_of else None
            with_producer.send(message.topic, key=message.key, value=message.value,
                               headers=list(message.headers) or None, partition=partition,
                               timestamp_ms=message.timestamp_ms)
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
