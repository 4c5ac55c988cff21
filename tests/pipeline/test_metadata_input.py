"""Input shape ``metadata``: RocketMQ-style message-metadata events on a Kafka topic are indexed
into the shards they name; malformed events are quarantined with the raw record and the reason,
exactly once by their Kafka offsets, and never stop the stream."""

from __future__ import annotations

import base64
import json

import pytest

from msgindex.kafka.loadgen import Message, metadata_events, produce
from msgindex.spark.pipeline.quarantine import read_quarantine
from msgindex.storage.message import MAX_TIMESTAMP_MS, timestamp_problem
from tests.pipeline.support import Truth, assert_index_equals, forget_commit, job_args, run_job_in_process

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

EVENTS = 6_000
BROKERS = ("broker-a", "broker-b", "broker-c")
SOURCE_TOPICS = ("TopicTest", "TradeTopic")
GOOD = {"brokerName": "broker-a", "topic": "TopicTest", "queueId": 0, "queueOffset": 10_000_000, "storeTimestamp": 1}
MALFORMED = [  # (value, reason the pipeline must give)
    (b"not json at all", "not a JSON object of the event schema (malformed JSON or a field of the wrong type)"),
    (b"[1, 2]", "not a JSON object of the event schema (malformed JSON or a field of the wrong type)"),
    (json.dumps({**GOOD, "queueId": "three"}).encode(),
     "not a JSON object of the event schema (malformed JSON or a field of the wrong type)"),
    (b"\xff\xfe{}", "value is not UTF-8 text"),
    (None, "value is null"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "topic"}).encode(), "missing topic"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "brokerName"}).encode(), "missing brokerName"),
    (json.dumps({**GOOD, "brokerName": ""}).encode(), "missing brokerName"),
    (json.dumps({**GOOD, "brokerName": "../evil"}).encode(), "brokerName cannot name a shard directory (no '/', NUL, '.', '..')"),
    (json.dumps({**GOOD, "queueId": -1}).encode(), "queueId out of range [0, 2147483647]"),
    (json.dumps({**GOOD, "queueId": 2**31}).encode(), "queueId out of range [0, 2147483647]"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "queueOffset"}).encode(), "missing queueOffset"),
    (json.dumps({**GOOD, "storeTimestamp": -5}).encode(), "storeTimestamp is negative"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "storeTimestamp"}).encode(), "missing storeTimestamp"),
    (json.dumps({**GOOD, "msgSize": -1}).encode(), "msgSize out of range [0, 2147483647]"),
    # the one timestamp rule (B4): valid by the JSON schema, outside the years 0001..9999
    (json.dumps({**GOOD, "storeTimestamp": 2**63 - 1}).encode(), f"storeTimestamp: {timestamp_problem(2**63 - 1)}"),
    (json.dumps({**GOOD, "storeTimestamp": MAX_TIMESTAMP_MS + 1}).encode(),
     f"storeTimestamp: {timestamp_problem(MAX_TIMESTAMP_MS + 1)}"),
    # text fields of another JSON type (B5): Spark's from_json would read them as their JSON text
    (json.dumps({**GOOD, "keys": 123}).encode(), "keys is not a string or a list of strings (JSON BIGINT)"),
    (json.dumps({**GOOD, "keys": ["ok", 5]}).encode(), "keys is not a string or a list of strings (JSON ARRAY<VARIANT>)"),
    (json.dumps({**GOOD, "keys": {"k": "v"}}).encode(), "keys is not a string or a list of strings (JSON OBJECT<k: STRING>)"),
    (json.dumps({**GOOD, "uniqKey": 7}).encode(), "uniqKey is not a string (JSON BIGINT)"),
    (json.dumps({**GOOD, "brokerName": True}).encode(), "brokerName is not a string (JSON BOOLEAN)"),
    (json.dumps({**GOOD, "topic": ["TopicTest"]}).encode(), "topic is not a string (JSON ARRAY<STRING>)"),
]


def _truth_of(events: list[dict]) -> Truth:
    truth = Truth()
    for event in events:
        tokens = event["keys"].split(" ") if isinstance(event.get("keys"), str) else list(event.get("keys") or ())
        keys = frozenset(k for k in [*tokens, event.get("uniqKey")] if k)
        truth.messages[(event["brokerName"], event["topic"], event["queueId"], event["queueOffset"])] = keys
        for key in keys:
            truth.by_key[(event["topic"], key)].add((event["brokerName"], event["queueId"], event["queueOffset"]))
    return truth


def test_metadata_events_indexed_and_malformed_quarantined(kafka_bootstrap, kafka_topic, spark, tmp_path):
    topic = kafka_topic(partitions=2, prefix="dispatch")
    good = [json.loads(m.value) for m in metadata_events(topic, EVENTS, brokers=BROKERS, source_topics=SOURCE_TOPICS, seed=5)]
    good[0]["keys"] = ["list-form-a", "list-form-b"]  # keys may also be a JSON list
    good[1].pop("commitLogOffset"), good[1].pop("msgSize"), good[1].pop("uniqKey")  # optional fields
    good[3]["keys"], good[4]["keys"] = "12345 [x]", ["67890"]  # strings that look like other JSON, a list
    good[5]["storeTimestamp"] = MAX_TIMESTAMP_MS  # the rule's last millisecond is a valid timestamp
    messages = [Message(topic, None, json.dumps(e).encode()) for e in good]
    for n, (value, _) in enumerate(MALFORMED):  # spread through the stream, so several batches meet them
        messages.insert(n * (len(messages) // len(MALFORMED)), Message(topic, b"k" if value is None else None, value))
    placement = {}
    produce(kafka_bootstrap, messages, partition_of=lambda n, m: placement.setdefault(n, n % 2))

    index = tmp_path / "index"
    args = job_args(kafka_bootstrap, [topic], index, "--input", "metadata", "--available-now",
                    "--max-offsets-per-trigger", "2500", "--quiet-spark")
    history = run_job_in_process(args)
    assert len(history) >= 2
    assert sum(s.records for s in history) == len(good)
    assert sum(s.quarantined for s in history) == sum(s.malformed for s in history) == len(MALFORMED)

    import msgindex

    with msgindex.open(index) as store:
        assert store.brokers() == sorted(BROKERS)
        rows = store.lookup(good[2]["uniqKey"], topic=good[2]["topic"]).to_pylist()
        assert [(r["broker"], r["partition"], r["offset"], r["commit_log_offset"], r["size"],
                 int(r["timestamp"].timestamp() * 1000)) for r in rows] == [
            (good[2]["brokerName"], good[2]["queueId"], good[2]["queueOffset"], good[2]["commitLogOffset"],
             good[2]["msgSize"], good[2]["storeTimestamp"])]
        bare = store.lookup(good[1]["keys"].split(" ")[0], topic=good[1]["topic"]).to_pylist()
        assert any(r["commit_log_offset"] is None and r["size"] is None for r in bare)
    assert_index_equals(index, _truth_of(good), topics=list(SOURCE_TOPICS),
                        always_single={"list-form-a", "list-form-b", "12345", "[x]", "67890"}, with_broker=True)

    quarantined = read_quarantine(index / "_quarantine").to_pylist()
    expected = sorted((base64.b64encode(v).decode() if v is not None else "", reason) for v, reason in MALFORMED)
    assert sorted((q["value_base64"] or "", q["reason"]) for q in quarantined) == expected
    assert all(q["topic"] == topic and q["offset"] >= 0 for q in quarantined)
    not_json = base64.b64encode(b"not json at all").decode()
    assert {q["value"] for q in quarantined if q["value_base64"] == not_json} == {"not json at all"}

    # Replaying the last batch writes neither its events nor its quarantine file again.
    last = history[-1].batch_id
    forget_commit(index, last)
    replay = run_job_in_process(args)
    assert [s.batch_id for s in replay] == [last] and replay[0].appended == 0 and replay[0].quarantined == 0
    assert replay[0].records == history[-1].records and replay[0].quarantined_before == history[-1].malformed
    assert len(read_quarantine(index / "_quarantine")) == len(MALFORMED)
    assert_index_equals(index, _truth_of(good), topics=list(SOURCE_TOPICS), with_broker=True)

    # A NEW Spark checkpoint starts again from earliest: every event and every malformed one is
    # found committed (by its Kafka offset), nothing is written or quarantined twice.
    fresh = run_job_in_process([*args, "--checkpoint", str(tmp_path / "new-checkpoint")])
    assert sum(s.records for s in fresh) == len(good) and sum(s.appended for s in fresh) == 0
    assert sum(s.quarantined_before for s in fresh) == len(MALFORMED) and sum(s.quarantined for s in fresh) == 0
    assert len(read_quarantine(index / "_quarantine")) == len(MALFORMED)
    assert_index_equals(index, _truth_of(good), topics=list(SOURCE_TOPICS), with_broker=True)
