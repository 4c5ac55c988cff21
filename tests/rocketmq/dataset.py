"""The messages the RocketMQ tests send through a real broker, and the ground truth of where
they landed.

Made to be hard for a key index: Java hash collisions within a topic (``Aa``/``BB``) and across
topics (``AaT#k`` and ``BBT#k`` hash alike), keys with more than 64 messages (RocketMQ's cap),
several keys per message, repeated keys, keys with tabs, U+3000 and non-ASCII characters,
leading/trailing/double spaces in KEYS, messages without keys, user properties named like the
system ones (``XKEYS``, ``MY_UNIQ_KEY``), bodies compressed with each of RocketMQ's codecs, single
and batch sends, and pauses so that store times span several seconds (windows can cut inside one).

The ground truth is computed from what was sent (topic, KEYS, body, properties) joined, by the
message id the producer assigned (UNIQ_KEY), with where the broker stored each message as its
consume queues report it (a pull consumer): queue, queue offset, commit-log offset, store time.
It never goes through msgindex's commit-log reader.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.rocketmq.harness import LocalRocketMQ

ORDERS, PAYMENTS, AAT, BBT = "orders", "payments", "AaT", "BBT"
TOPICS = (ORDERS, PAYMENTS, AAT, BBT)
HOT_KEY, HOT_BATCH_KEY = "hot-1", "hot-2"
UNICODE_KEYS = ("ключ-1", "emoji-\U0001F389", "tab\tkey", "ideo\u3000space", "a#b")
DECOY_KEY = "decoy-key"  # only ever in the user property XKEYS: no lookup may find it
COMPRESSED_BODY_BYTES = 6000  # > the producer's 4 KiB compression threshold
STORE_NAME = "broker-a-store"  # the store directory: what brokerName defaults to
BROKER_NAME = "broker-a"


def _body(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def build_specs(seed: int = 12) -> list[dict]:
    """The messages to send, in order (RocketMqClient ``produce`` specs)."""
    rng = random.Random(seed)
    specs: list[dict] = []

    def add(topic: str, keys: str | None, *, body: str | None = None, batch: int | None = None,
            sleep_ms: int = 0, properties: dict | None = None, compress: str | None = None, tags: str = "t") -> None:
        specs.append({"topic": topic, "keys": keys, "tags": tags, "batch": batch, "sleepMs": sleep_ms,
                      "properties": properties, "compress": compress,
                      "bodyB64": _body(body if body is not None else f"body-{len(specs)}")})

    for i in range(150):  # one key, 150 messages: more than RocketMQ's 64
        add(ORDERS, f"{HOT_KEY} o-{i}", sleep_ms=400 if i % 50 == 49 else 0)
    for b in range(9):  # batch sends: 90 messages under one key
        for i in range(10):
            add(ORDERS, f"{HOT_BATCH_KEY} shared-{(b * 10 + i) % 7}", batch=1000 + b)
    for _ in range(40):  # collisions: Aa/BB in one topic, and AaT#k / BBT#k across topics
        for topic in (AAT, BBT):
            add(topic, rng.choice(["Aa", "BB", "AaBB", "BBAa", "k"]) + " " + rng.choice(["k", "x", ""]))
        add(ORDERS, rng.choice(["Aa", "BB"]))
    for i in range(60):  # unicode, tabs, U+3000, repeated tokens, stray spaces
        keys = rng.choice([
            UNICODE_KEYS[i % len(UNICODE_KEYS)],
            f" {UNICODE_KEYS[i % len(UNICODE_KEYS)]}  dup dup ",
            "dup dup dup",
        ])
        add(ORDERS if i % 2 else PAYMENTS, keys, sleep_ms=300 if i == 30 else 0)
    for i in range(80):  # no keys at all: only the UNIQ_KEY the producer adds
        add(PAYMENTS if i % 2 else ORDERS, None)
    for codec in ["LZ4", "ZSTD", "ZLIB"] * 4:
        text = "".join(rng.choice("abcdefgh ") for _ in range(COMPRESSED_BODY_BYTES))
        add(ORDERS, f"big-{codec} big", body=text, compress=codec)
    for i in range(20):  # user properties named like the system ones
        add(PAYMENTS, f"props-{i % 4}", properties={"XKEYS": DECOY_KEY, "MY_UNIQ_KEY": "fake", "color": "red"})
    batch_id = 5000
    for i in range(1800):  # the bulk: many keys, batch sends to two topics
        if i % 32 == 0:
            batch_id += 1
        topic = ORDERS if (batch_id % 2) else PAYMENTS
        add(topic, f"user-{rng.randrange(300)} order-{i}", batch=batch_id,
            sleep_ms=500 if i % 600 == 0 else 0)
    for i in range(40):  # a tail of hot-key messages after the bulk, in other seconds
        add(ORDERS, f"{HOT_KEY} tail-{i}", sleep_ms=150 if i % 10 == 0 else 0)
    return specs


@dataclass(frozen=True)
class TruthMessage:
    """One sent message and where the broker stored it."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_timestamp: int
    size: int
    keys_value: str | None
    uniq_key: str
    body: bytes
    user_properties: dict
    tags: str

    @property
    def tokens(self) -> list[str]:
        """KEYS split on U+0020, empty tokens dropped (written out here, independently of msgindex)."""
        return [t for t in (self.keys_value or "").split(" ") if t]

    @property
    def keys(self) -> set[str]:
        return set(self.tokens) | {self.uniq_key}


@dataclass
class BrokerDataset:
    """The running broker, its store root and the ground truth of everything sent."""

    broker: LocalRocketMQ
    work: Path
    messages: tuple[TruthMessage, ...]

    @property
    def store_root(self) -> Path:
        return self.broker.store_root

    def select(self, topic: str | None = None, key: str | None = None, begin: int | None = None,
               end: int | None = None, partitions=None) -> set[int]:
        """Commit-log offsets of the messages matching, computed naively."""
        return {
            m.commit_log_offset for m in self.messages
            if (topic is None or m.topic == topic) and (key is None or key in m.keys)
            and (begin is None or m.store_timestamp >= begin) and (end is None or m.store_timestamp <= end)
            and (partitions is None or m.queue_id in partitions)
        }

    def by_offset(self) -> dict[int, TruthMessage]:
        return {m.commit_log_offset: m for m in self.messages}

    def topic_keys(self) -> set[tuple[str, str]]:
        """Every (topic, KEYS token) sent."""
        return {(m.topic, k) for m in self.messages for k in m.tokens}


def produce_dataset(work: Path) -> Iterator[BrokerDataset]:
    """Start a broker, send ``build_specs()``, join with what a pull consumer reads; the broker
    keeps running until the generator is closed."""
    broker = LocalRocketMQ(work / "broker", store_name=STORE_NAME, broker_name=BROKER_NAME, topics=TOPICS)
    broker.start()
    try:
        specs = build_specs()
        sent = broker.produce(specs, work)
        pulled = {row["commitLogOffset"]: row for row in broker.pull(list(TOPICS), work)}
        messages = []
        for spec, result in zip(specs, sent, strict=True):
            # joined on the commit-log offset the broker reported to the producer (the last 16 hex
            # digits of offsetMsgId), not on msgId: a batch's messages are stored with the batch's
            # own UNIQ_KEY pair after theirs, and Java's decoder (like the index) keeps the last
            stored = pulled[int(result["offsetMsgId"][-16:], 16)]
            assert stored["topic"] == spec["topic"] and stored["queueOffset"] == result["queueOffset"]
            messages.append(TruthMessage(
                topic=spec["topic"], queue_id=stored["queueId"], queue_offset=stored["queueOffset"],
                commit_log_offset=stored["commitLogOffset"], store_timestamp=stored["storeTimestamp"],
                size=stored["storeSize"], keys_value=spec["keys"], uniq_key=stored["properties"]["UNIQ_KEY"],
                body=base64.b64decode(spec["bodyB64"]), user_properties=spec["properties"] or {},
                tags=spec["tags"],
            ))
        assert len(pulled) == len(messages), "the broker holds messages that were not sent"
        yield BrokerDataset(broker, work, tuple(messages))
    finally:
        broker.stop()
