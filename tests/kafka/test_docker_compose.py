"""docker-compose.yml: it parses, names the services the README promises, and its pieces fit
together (image version, listener the indexer uses, the S3 store and its bucket, the endpoint and
credentials the indexer gets, flags the `msgindex index` command really accepts, a Dockerfile that
installs what it needs). Running it needs a Docker engine; where one answers, ``docker compose
config`` checks the file as Compose reads it, and the test says why it skips otherwise."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from msgindex.kafka.broker import KAFKA_VERSION
from msgindex.storage.location import parse_location
from tests.conftest import _docker_engine_reachable

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _env(service: dict) -> dict:
    return {key: str(value) for key, value in service["environment"].items()}


def test_compose_names_the_promised_services(compose):
    assert {"kafka", "s3", "s3-bucket", "indexer"} <= set(compose["services"])


def _command(service: dict) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else list(command)


def _flags(service: dict) -> dict[str, str]:
    command = _command(service)
    return dict(zip(command[1::2], command[2::2]))


def test_the_s3_store_is_pinned_persistent_and_gets_its_bucket_before_the_indexer_starts(compose):
    services = compose["services"]
    store, bucket_job, indexer = services["s3"], services["s3-bucket"], services["indexer"]
    assert store["image"].startswith("minio/minio:RELEASE.") and ":latest" not in store["image"]
    assert store["command"][0] == "server" and any(v.endswith(":" + store["command"][1]) for v in store["volumes"])
    assert store["healthcheck"]["test"]
    assert "127.0.0.1:9000:9000" in store["ports"]
    assert bucket_job["depends_on"]["s3"]["condition"] == "service_healthy"
    assert bucket_job["image"] == store["image"] and bucket_job["restart"] == "no"
    assert _env(bucket_job) == _env(store)
    script = " ".join(_command(bucket_job))
    assert "mc alias set store http://s3:9000" in script and '"$$MINIO_ROOT_USER" "$$MINIO_ROOT_PASSWORD"' in script
    bucket = script.split("mc mb --ignore-existing store/")[1].split()[0]
    assert indexer["depends_on"]["s3-bucket"]["condition"] == "service_completed_successfully"
    # the index and Spark's checkpoint both live in that bucket, and nowhere on a volume
    flags = _flags(indexer)
    index, checkpoint = parse_location(flags["--path"]), flags["--checkpoint"]
    assert index.kind == "s3" and index.bucket == bucket and index.prefix
    assert checkpoint.startswith(f"s3a://{bucket}/") and checkpoint != f"s3a://{bucket}/{index.prefix}"
    assert "volumes" not in indexer


def test_the_indexer_reaches_the_store_with_the_aws_variables(compose):
    services = compose["services"]
    env, store = _env(services["indexer"]), _env(services["s3"])
    assert env["AWS_ENDPOINT_URL"] == "http://s3:9000" and env["AWS_ALLOW_HTTP"] == "true" and env["AWS_REGION"]
    assert env["AWS_ACCESS_KEY_ID"] == store["MINIO_ROOT_USER"]
    assert env["AWS_SECRET_ACCESS_KEY"] == store["MINIO_ROOT_PASSWORD"]
    from msgindex.spark.runtime.session import object_store_conf

    flags = _flags(services["indexer"])
    conf = object_store_conf([flags["--checkpoint"], flags["--path"]], user_conf={}, environ=env)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://s3:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"  # MinIO's bucket is no host name
    assert conf["spark.executorEnv.AWS_ENDPOINT_URL"] == "http://s3:9000"


def test_compose_config_as_docker_reads_it():
    if not (shutil.which("docker") and _docker_engine_reachable()):
        pytest.skip("no Docker engine answers here (no docker CLI or daemon): the file is checked statically only")
    done = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


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
    assert _command(indexer)[0] == "index"
    flags = _flags(indexer)
    advertised = _env(compose["services"]["kafka"])["KAFKA_ADVERTISED_LISTENERS"]
    assert f"PLAINTEXT://{flags['--bootstrap-servers']}" in advertised.split(",")
    assert flags["--subscribe-pattern"] == ".*"
    assert indexer["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_indexer_flags_are_accepted_by_the_real_index_command(compose):
    from msgindex.cli import build_parser

    command = compose["services"]["indexer"]["command"]
    parsed = build_parser().parse_args(list(command))
    assert parsed.command == "index"
    assert parsed.bootstrap_servers == "kafka:9092"
    assert parsed.path == "s3://msgindex/index" and parsed.checkpoint == "s3a://msgindex/checkpoint"


def test_dockerfile_builds_an_image_that_can_run_the_job(compose):
    assert compose["services"]["indexer"]["build"] == "."
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "\nFROM python:3.11" in dockerfile
    assert "openjdk-17-jre" in dockerfile and "maven" in dockerfile
    assert "pip install" in dockerfile and "kafka_connector_jars" in dockerfile
    assert "object_store_jars(['s3a://" in dockerfile  # the checkpoint's connector, staged at build time
    assert 'ENTRYPOINT ["msgindex"]' in dockerfile
    for copied in ("pyproject.toml", "connector", "streaming_jobs"):
        assert f" {copied}" in dockerfile and (ROOT / copied).exists()
