"""The one timestamp rule (years 0001..9999, storage.message) in the pipeline: a record outside it
is set aside in the quarantine with the reason, exactly once by its Kafka offset, and never
breaks the others -- also a record with CreateTime 2^63-1, which Spark's own Kafka source cannot
even read (it used to stop the job on every restart)."""

from __future__ import annotations

import json
import uuid

import pytest

from msgindex.kafka.admin import OutgoingRecord, create_topics, produce
from msgindex.spark.pipeline.quarantine import read_quarantine
from msgindex.storage.message import MAX_TIMESTAMP_MS, timestamp_problem
from tests.pipeline.support import assert_index_equals, forget_commit, ground_truth, job_args, run_job_in_process

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

# Kafka 4 refuses CreateTimes more than an hour ahead unless the topic allows them
# any CreateTime accepted, and kept (time retention would delete 2023 records within minutes)
ANY_TIMESTAMP = {"message.timestamp.after.max.ms": str(2**63 - 1), "retention.ms": "-1"}
NOW_MS = 1_700_000_000_000
OVERFLOW_MS = 2**63 - 1  # Spark's Kafka source fails on it (microseconds overflow)
FAR_MS = 300_000_000_000_000  # year ~11476: Spark reads it, msgindex's rule refuses it
RECORDS = 3_000
# (partition, position among the partition's records, timestamp): runs, both partitions, both kinds
BAD = [(0, 100, OVERFLOW_MS), (0, 101, OVERFLOW_MS), (0, 1_200, OVERFLOW_MS), (1, 700, OVERFLOW_MS),
       (0, 50, FAR_MS), (1, 1_400, FAR_MS)]


def _topic(bootstrap: str, prefix: str, partitions: int) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    create_topics(bootstrap, {name: partitions}, configs=ANY_TIMESTAMP)
    return name


def test_records_outside_the_rule_are_set_aside_exactly_once(kafka_bootstrap, spark, tmp_path):
    topic = _topic(kafka_bootstrap, "ts", 2)
    per_partition = {0: [], 1: []}
    for n in range(RECORDS):
        per_partition[n % 2].append(OutgoingRecord(f"k{n % 300}".encode(), b"v", partition=n % 2, timestamp_ms=NOW_MS + n))
    per_partition[1][900] = OutgoingRecord(b"edge", b"v", partition=1, timestamp_ms=MAX_TIMESTAMP_MS)  # inside the rule
    for partition, position, timestamp in BAD:  # bad records share their keys with good ones
        per_partition[partition][position] = OutgoingRecord(b"k7", b"bad-%d" % position, partition=partition,
                                                            timestamp_ms=timestamp, keys=("shared",))
    for records in per_partition.values():
        produce(kafka_bootstrap, topic, records)

    index = tmp_path / "index"
    args = job_args(kafka_bootstrap, [topic], index, "--available-now", "--max-offsets-per-trigger", "1000", "--quiet-spark")
    history = run_job_in_process(args)
    good = ground_truth(kafka_bootstrap, [topic], keep=lambda record: timestamp_problem(record.timestamp) is None)
    assert len(good.messages) == RECORDS - len(BAD)
    # a batch that meets an unreadable record runs twice: what its first run committed before
    # failing counts as "already committed"/"already quarantined" the second time
    assert sum(s.records for s in history) == RECORDS - len(BAD)
    assert sum(s.malformed for s in history) == len(BAD)
    assert_index_equals(index, good, topics=[topic], always_single={"k7", "edge", "shared"})

    quarantined = read_quarantine(index / "_quarantine").to_pylist()
    assert sorted((q["partition"], q["offset"], q["timestamp_ms"], q["reason"], q["value"]) for q in quarantined) == sorted(
        (partition, position, timestamp, timestamp_problem(timestamp), f"bad-{position}")
        for partition, position, timestamp in BAD)
    assert all(q["topic"] == topic for q in quarantined)

    # a replay of the last batch, and a new Spark checkpoint from earliest: nothing new, nothing twice
    forget_commit(index, history[-1].batch_id)
    replay = run_job_in_process(args)
    assert [s.appended for s in replay] == [0] and replay[0].quarantined == 0
    fresh = run_job_in_process([*args, "--checkpoint", str(tmp_path / "new-checkpoint")])
    assert sum(s.appended for s in fresh) == 0 and sum(s.records for s in fresh) == RECORDS - len(BAD)
    assert sum(s.quarantined for s in fresh) == 0 and sum(s.quarantined_before for s in fresh) == len(BAD)
    assert len(read_quarantine(index / "_quarantine")) == len(BAD)
    assert_index_equals(index, good, topics=[topic])


def test_a_metadata_event_spark_cannot_read_is_set_aside(kafka_bootstrap, spark, tmp_path):
    topic = _topic(kafka_bootstrap, "ts-meta", 1)
    events = [{"brokerName": "b", "topic": "T", "queueId": 0, "queueOffset": n, "storeTimestamp": NOW_MS + n,
               "keys": f"order-{n}"} for n in range(20)]
    records = [OutgoingRecord(None, json.dumps(event), timestamp_ms=NOW_MS) for event in events]
    records[5] = OutgoingRecord(None, json.dumps(events[5]), timestamp_ms=OVERFLOW_MS)  # the Kafka record's own CreateTime
    produce(kafka_bootstrap, topic, records)

    index = tmp_path / "index"
    history = run_job_in_process(job_args(kafka_bootstrap, [topic], index, "--input", "metadata", "--available-now",
                                          "--quiet-spark"))
    assert sum(s.records for s in history) == 19 and sum(s.quarantined for s in history) == 1
    (entry,) = read_quarantine(index / "_quarantine").to_pylist()
    assert (entry["offset"], entry["value"]) == (5, json.dumps(events[5]))
    assert entry["reason"] == "the Kafka record's " + timestamp_problem(OVERFLOW_MS)
    import msgindex

    with msgindex.open(index) as store:
        found = store.lookup([f"order-{n}" for n in range(20)], topic="T")
        assert sorted(found.column("offset").to_pylist()) == [n for n in range(20) if n != 5]
