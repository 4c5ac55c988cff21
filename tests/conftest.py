"""Session fixtures shared by every test folder: a real Kafka broker, fresh topics, one SparkSession.

All three are lazy: a test that asks for none of them starts neither Kafka nor Spark.

Where the broker comes from, first match wins:
1. ``KAFKA_BOOTSTRAP_SERVERS`` is set: that cluster is used as is (nothing is started or stopped);
2. a Docker engine answers: testcontainers' Kafka module (KRaft);
3. otherwise: msgindex's own local KRaft broker (``msgindex.kafka.broker.LocalBroker``) on free
   ports with its data in a temp dir, stopped at the end of the session.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.object_store import s3, stores  # noqa: F401  (fixtures: a real S3 API server, moto's; stores of both kinds)
from tests.small_disk import small_disk  # noqa: F401  (the fixture: a small tmpfs tests fill up)

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
TESTCONTAINERS_IMAGE = "confluentinc/cp-kafka:7.6.0"  # the image testcontainers' KRaft mode is built for


def _docker_engine_reachable() -> bool:
    if not (os.environ.get("DOCKER_HOST") or os.path.exists("/var/run/docker.sock")):
        return False
    try:
        import docker

        docker.from_env(timeout=5).ping()
    except Exception:  # any failure means "no usable engine": fall back to the local broker
        return False
    return True


def _testcontainers_kafka() -> Iterator[str]:
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:
        from testcontainers.kafka import KafkaContainer
    with KafkaContainer(TESTCONTAINERS_IMAGE).with_kraft() as container:
        yield container.get_bootstrap_server()


def _local_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from msgindex.kafka.broker import LocalBroker, free_port

    broker = LocalBroker(tmp_path_factory.mktemp("kafka"), port=free_port(), controller_port=free_port())
    try:
        yield broker.start(timeout=180)
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address ("host:port") of a real Kafka broker for the whole test session."""
    if os.environ.get(BOOTSTRAP_ENV):
        yield os.environ[BOOTSTRAP_ENV]
    elif _docker_engine_reachable():
        yield from _testcontainers_kafka()
    else:
        yield from _local_kafka(tmp_path_factory)


@pytest.fixture(scope="session")
def kafka_topic(kafka_bootstrap: str) -> Callable[..., str]:
    """Factory: ``kafka_topic(partitions=3, prefix="t")`` creates a topic with a unique name on
    the session broker, waits until every partition has a leader, and returns the name."""
    from msgindex.kafka.admin import create_topics

    def make(partitions: int = 3, prefix: str = "t", configs: dict[str, str] | None = None) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        # Kept forever: tests produce records with CreateTimes of 2023, which Kafka's default
        # time retention (7 days, checked every 5 minutes, active segment included) deletes the
        # next time its check runs -- a read a moment later then finds the topic empty.
        create_topics(kafka_bootstrap, {name: partitions}, configs={"retention.ms": "-1", **(configs or {})})
        return name

    return make


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the test session (msgindex.spark.runtime.session.build_spark_session)."""
    from msgindex.spark.runtime.session import build_spark_session

    session = build_spark_session(app_name="msgindex-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def rocketmq_dataset(tmp_path_factory: pytest.TempPathFactory):
    """A real RocketMQ 5.3.3 NameServer + Broker (Maven Central jars) on 127.0.0.1 for the whole
    test session, with ``tests.rocketmq.dataset.build_specs()`` sent through it and the ground
    truth of where every message landed (a ``BrokerDataset``); stopped at the session's end."""
    from tests.rocketmq.harness import environment_ready

    missing = environment_ready()
    if missing:
        pytest.skip(f"a RocketMQ broker {missing}")
    from tests.rocketmq.dataset import produce_dataset

    yield from produce_dataset(tmp_path_factory.mktemp("rocketmq"))
