"""A job checks its Kafka source up front: a missing topic, a dead or unresolvable bootstrap
address, or a malformed bootstrap list is one line naming it, within seconds."""

from __future__ import annotations

import time

import pytest

from msgindex.errors import InvalidOptionError, KafkaUnreachableError, TopicNotFoundError
from msgindex.kafka.admin import check_source
from msgindex.kafka.broker import free_port

pytestmark = pytest.mark.kafka


def test_existing_topics_pass(kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=2, prefix="check")
    assert check_source(kafka_bootstrap, topics=[topic]) == [topic]
    assert check_source(kafka_bootstrap, pattern="check-.*") != []


def test_a_missing_topic_is_named_with_a_close_match(kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=1, prefix="orders")
    with pytest.raises(TopicNotFoundError, match=rf"topic '{topic}x' \(did you mean '{topic}'\?\) does not exist"):
        check_source(kafka_bootstrap, topics=[topic, topic + "x"])
    with pytest.raises(TopicNotFoundError, match="--subscribe-pattern 'nothing-.*' matches no topic"):
        check_source(kafka_bootstrap, pattern="nothing-.*")


def test_nothing_listening_is_named_fast():
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(KafkaUnreachableError, match=f"no Kafka broker answers at {address}: {address}: "):
        check_source(address, topics=["t"], timeout=5)
    assert time.monotonic() - started < 10


def test_an_unresolvable_host_is_named():
    with pytest.raises(KafkaUnreachableError, match="host 'no-such-host.invalid' does not resolve"):
        check_source("no-such-host.invalid:9092", topics=["t"], timeout=5)


@pytest.mark.parametrize("bad", ["localhost", "localhost:port", ":9092", "h:0", "h:70000"])
def test_a_malformed_bootstrap_list_names_the_entry(bad):
    with pytest.raises(InvalidOptionError, match="--bootstrap-servers .* is not HOST:PORT"):
        check_source(f"127.0.0.1:9092,{bad}")
