"""Issue 4's main test: >= 100k real Kafka records indexed by the real pipeline (Spark's kafka
source, foreachBatch, applyInArrow, shard owners) equal the ground truth read back from Kafka,
key by key; a replayed batch changes nothing."""

from __future__ import annotations

import random
import uuid

import pytest

from msgindex.kafka.admin import create_topics
from msgindex.kafka.loadgen import Message, keyed_records, produce
from tests.pipeline.support import assert_index_equals, forget_commit, ground_truth, job_args, run_job_in_process

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

BULK_RECORDS = 100_000
PER_TRIGGER = 35_000
# Java String.hashCode collisions: "Aa" and "BB" hash alike, so do any equal-length mixes of them,
# and "<topic>#<key>" strings that differ only by such a block.
COLLIDING_KEYS = ["Aa", "BB", "AaAa", "BBBB", "AaBB", "BBAa"]
UNICODE_KEYS = ["ключ", "键-🔑", "é", "e\u0301", "𝄞 clef", "emoji🙂", "a b", "x#y", "tab\tkey", "k" * 3000]
NON_UTF8_KEYS = [b"\xff\xfe\xfd", b"bad\xc3(", b"\x80", b"ok-\xed\xa0\x80"]  # the last: an encoded surrogate
SPECIAL_KEYS = set(COLLIDING_KEYS + UNICODE_KEYS) | {"hdr-a", "hdr-b", "dup", "second-keys-header", "tok", "U-0"}


def _edge_records(topic: str, rng: random.Random) -> list[Message]:
    """Every awkward key shape, several times each (so they also repeat across batches)."""
    messages = []
    for round_ in range(5):
        for key in COLLIDING_KEYS + UNICODE_KEYS:
            messages.append(Message(topic, key.encode(), b"v"))
        for raw in NON_UTF8_KEYS:
            messages.append(Message(topic, raw, b"v"))
        messages.append(Message(topic, None, b"null key"))
        messages.append(Message(topic, b"", b"empty key"))
        messages.append(Message(topic, None, b"keys only", (("KEYS", b"  hdr-a  hdr-b hdr-a "),)))
        messages.append(Message(topic, b"Aa", b"v", (("KEYS", "BB Aa ключ".encode()), ("UNIQ_KEY", f"U-{round_}".encode()))))
        messages.append(Message(topic, b"dup", b"v", (("KEYS", b"dup"), ("KEYS", b"second-keys-header"), ("UNIQ_KEY", b"dup"))))
        messages.append(Message(topic, b"bin-hdr", b"v", (("KEYS", b"\xff tok"), ("UNIQ_KEY", b"\xfe"))))
        messages.append(Message(topic, b"empty-hdrs", b"v", (("KEYS", b""), ("UNIQ_KEY", b""), ("other", b"x"))))
    rng.shuffle(messages)
    return messages


def test_100k_records_index_equals_kafka_ground_truth(kafka_bootstrap, kafka_topic, spark, tmp_path):
    bulk_a, bulk_b = kafka_topic(partitions=3, prefix="orders"), kafka_topic(partitions=2, prefix="payments")
    shared = uuid.uuid4().hex[:8]
    colliding_topics = [f"AaTopic-{shared}", f"BBTopic-{shared}"]  # "AaTopic-x#BB" == "BBTopic-x#BB" (hash)
    create_topics(kafka_bootstrap, {name: 1 for name in colliding_topics})
    rng = random.Random(4)
    produce(kafka_bootstrap, keyed_records([bulk_a, bulk_b], BULK_RECORDS, key_pool=8_000, seed=4))
    for topic in (bulk_a, *colliding_topics):
        produce(kafka_bootstrap, _edge_records(topic, rng))
    topics = [bulk_a, bulk_b, *colliding_topics]
    truth = ground_truth(kafka_bootstrap, topics)
    assert len(truth.messages) >= BULK_RECORDS
    assert truth.raw_keys, "the workload must contain non-UTF-8 keys"

    index = tmp_path / "index"
    history = run_job_in_process(job_args(kafka_bootstrap, topics, index, "--available-now",
                                          "--max-offsets-per-trigger", str(PER_TRIGGER), "--quiet-spark"))
    assert len(history) >= 3, "the bulk must span several micro-batches"
    assert sum(stats.records for stats in history) == sum(stats.appended for stats in history) == len(truth.messages)
    assert sum(stats.unkeyed for stats in history) == truth.unkeyed > 0
    assert_index_equals(index, truth, topics=topics, always_single=SPECIAL_KEYS)

    # Replay the last batch: Spark re-runs it when its commit is missing; the shards hold its offsets,
    # and the batch reports its records as already committed (not as 0 records).
    last = history[-1].batch_id
    forget_commit(index, last)
    replay = run_job_in_process(job_args(kafka_bootstrap, topics, index, "--available-now", "--quiet-spark"))
    assert [stats.batch_id for stats in replay] == [last]
    assert (replay[0].records, replay[0].appended, replay[0].already_committed) == (history[-1].records, 0, history[-1].records)
    assert replay[0].brokers == history[-1].brokers
    assert_index_equals(index, truth, topics=topics, always_single=SPECIAL_KEYS)
