"""A topic deleted and created again under its name starts its offsets at 0 again: the index,
exactly once by offsets, would take the new topic's records for the old one's (found by an
attack run: after Spark refused the old checkpoint, a new one indexed none of the new records
and reported them as already committed; payloads fetched by offset were the new records'). The
job records each topic's Kafka id and refuses a topic whose id changed (topic_identity.py)."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from kafka import KafkaAdminClient
from kafka.errors import TopicAlreadyExistsError

from msgindex.kafka.admin import create_topics
from msgindex.kafka.loadgen import Message, produce
from tests.cli.conftest import MSGINDEX
from tests.pipeline.support import job_args

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def recreate(bootstrap: str, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])
    finally:
        admin.close()
    deadline = time.monotonic() + 60
    while True:  # the deletion completes in the background
        try:
            create_topics(bootstrap, {topic: 1}, configs={"retention.ms": "-1"})
            return
        except TopicAlreadyExistsError:
            assert time.monotonic() < deadline, f"{topic} still exists a minute after its deletion"
            time.sleep(0.5)
        except Exception as error:  # kafka-python wraps it in some versions
            if "TopicAlreadyExists" not in repr(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_topic_created_again_is_refused_naming_it(kafka_bootstrap, kafka_topic, tmp_path):
    topic = kafka_topic(partitions=1, prefix="again")
    produce(kafka_bootstrap, [Message(topic, f"old-{i}".encode(), b"old") for i in range(5)])
    index = tmp_path / "index"
    args = job_args(kafka_bootstrap, [topic], index, "--available-now")
    first = subprocess.run([MSGINDEX, "index", *args], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert [p.name.rsplit("-", 1)[0] for p in (index / "topic-ids").iterdir()] == [topic]

    recreate(kafka_bootstrap, topic)
    produce(kafka_bootstrap, [Message(topic, f"new-{i}".encode(), b"new") for i in range(3)])
    shutil.rmtree(index / "_checkpoint")  # what a user does once Spark refuses the old checkpoint
    again = subprocess.run([MSGINDEX, "index", *args], capture_output=True, text=True, timeout=300)
    lines = [line for line in again.stderr.strip().splitlines() if not line.startswith("Picked up")]
    assert again.returncode == 2 and len(lines) == 1, again.stderr[-2000:]
    assert lines[0].startswith(f"msgindex index: topic '{topic}' was deleted and created again since this index was "
                               f"built from it (Kafka's topic id was ")
    assert "Index it into a new --path" in lines[0]


def test_recorded_topic_ids(tmp_path):
    """What the job's start does with each topic's id: recorded once; refused when changed and
    the index holds offsets of the topic; replaced when it holds none (a first run that failed
    before indexing anything); names differing in case kept apart (found by a review)."""
    from msgindex.errors import SourceMismatchError
    from msgindex.spark.pipeline.topic_identity import check_topic_identity, record_name

    root = str(tmp_path)
    check_topic_identity(root, None, {"orders": "id-1", "Orders": "id-9"}, held=[])
    assert record_name("orders") != record_name("Orders")
    check_topic_identity(root, None, {"orders": "id-1"}, held=["orders"])  # unchanged
    check_topic_identity(root, None, {"orders": "id-2"}, held=["Orders"])  # never indexed: the new id stands
    with pytest.raises(SourceMismatchError, match=r"topic 'orders' was deleted and created again .* was id-2, it is "
                                                  r"id-3 now"):
        check_topic_identity(root, None, {"orders": "id-3"}, held=["orders"])
    check_topic_identity(root, None, {"Orders": "id-9"}, held=["Orders"])
