"""docker-compose.yml (no Docker engine here to run it): it parses, names the services the README
promises, and its pieces fit together (image version, listener the indexer uses, index volume,
flags the `msgindex index` command really accepts, a Dockerfile that installs what it needs)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from msgindex.kafka.broker import KAFKA_VERSION

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _env(service: dict) -> dict:
    return {key: str(value) for key, value in service["environment"].items()}


def test_compose_names_the_promised_services(compose):
    assert {"kafka", "indexer"} <= set(compose["services"])


def test_kafka_is_the_pinned_official_kraft_image(compose):
    kafka = compose["services"]["kafka"]
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"
    env = _env(kafka)
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    for key in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"):
        assert env[key] == "1"
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) == set(protocols)
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in listeners


def test_indexer_runs_the_index_job_against_the_kafka_service(compose):
    indexer = compose["services"]["indexer"]
    command = indexer["command"]
    command = shlex.split(command) if isinstance(command, str) else list(command)
    assert command[0] == "index"
    flags = dict(zip(command[1::2], command[2::2]))
    advertised = _env(compose["services"]["kafka"])["KAFKA_ADVERTISED_LISTENERS"]
    assert f"PLAINTEXT://{flags['--bootstrap-servers']}" in advertised.split(",")
    assert flags["--subscribe-pattern"] == ".*"
    assert indexer["depends_on"]["kafka"]["condition"] == "service_healthy"
    # the index and the Spark checkpoint land on the mounted volume
    mounts = [volume.rsplit(":", 1)[1] for volume in indexer["volumes"]]
    for flag in ("--path", "--checkpoint"):
        assert any(flags[flag].startswith(mount + "/") for mount in mounts), flag


def test_indexer_flags_are_accepted_by_the_real_index_command(compose):
    from msgindex.cli import build_parser

    command = compose["services"]["indexer"]["command"]
    parsed = build_parser().parse_args(list(command))
    assert parsed.command == "index"
    assert parsed.bootstrap_servers == "kafka:9092"
    assert parsed.path == "/data/index"


def test_dockerfile_builds_an_image_that_can_run_the_job(compose):
    assert compose["services"]["indexer"]["build"] == "."
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "\nFROM python:3.11" in dockerfile
    assert "openjdk-17-jre" in dockerfile and "maven" in dockerfile
    assert "pip install" in dockerfile and "kafka_connector_jars" in dockerfile
    assert 'ENTRYPOINT ["msgindex"]' in dockerfile
    for copied in ("pyproject.toml", "connector", "streaming_jobs"):
        assert f" {copied}" in dockerfile and (ROOT / copied).exists()
