"""Spark's own checkpoint on an object store (``--checkpoint s3a://...``), the way users run it.

The connector jars are the ones ``msgindex kafka jars --object-store s3a`` prints (hadoop-aws at
pyspark's Hadoop version, the AWS SDK bundle its pom pins), the settings those of
``object_store_conf`` (the ``AWS_*`` variables), the S3 server moto's: a streaming query in a
plain ``SparkSession`` keeps its checkpoint in a bucket and restarts from it in msgindex's own
session (``build_spark_session(hadoop_urls=...)``, as the job runs); a missing bucket,
refused credentials and endpoints that do not resolve or answer are one line each; so is a
checkpoint the CLI's Spark cannot open.

What S3A needs from moto (found running these tests, Hadoop 3.5.0 / AWS SDK 2.35.4 / moto 5.2):
path-style requests (a virtual-host request to ``<bucket>.127.0.0.1`` cannot resolve), plain HTTP
(SSL off), any region. Everything S3A did for the checkpoint -- HEAD, LIST v2 with delimiter,
PUT (directory markers, files), GET with ranges, CopyObject + DELETE (its rename) -- moto
answered. moto checks no credentials unless told to, so the refused-credentials case runs on a
second moto server that checks them (``requests_before_auth``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

from msgindex.errors import ConnectorJarsError
from msgindex.jvm import msgindex_home
from msgindex.kafka.admin import OutgoingRecord, produce
from msgindex.spark.runtime.session import (
    CHECKPOINT_MANAGER,
    ENVIRONMENT_CREDENTIALS,
    FILE_SYSTEM_CHECKPOINTS,
    HADOOP_CONNECTORS,
    SIMPLE_CREDENTIALS,
    TEMPORARY_CREDENTIALS,
    _artifact_of,
    _pyspark_jars_dir,
    _shipped_artifacts,
    hadoop_url,
    hadoop_version,
    kafka_connector_jars,
    object_store_conf,
    object_store_jars,
    session_conf,
)
from tests.object_store import _free_port, start_s3_server

SCRIPT = Path(__file__).resolve().parent / "plain_s3a_session.py"
MSGINDEX = str(Path(sys.executable).with_name("msgindex"))
RUN_TIMEOUT_S = 1200
S3A = "spark.hadoop.fs.s3a."
ENV = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret",
       "AWS_SESSION_TOKEN": "token", "AWS_REGION": "eu-west-3", "AWS_ALLOW_HTTP": "true", "HOME": "/root"}


# --- settings and jars (no Spark) -------------------------------------------------------------

def test_aws_variables_become_s3a_settings_and_executor_environment():
    conf = object_store_conf(["s3a://b/checkpoint", "s3://b/index"], user_conf={}, environ=ENV)
    assert conf == {
        S3A + "endpoint": "http://127.0.0.1:9000", S3A + "path.style.access": "true",
        S3A + "connection.ssl.enabled": "false", S3A + "endpoint.region": "eu-west-3",
        S3A + "aws.credentials.provider": ENVIRONMENT_CREDENTIALS, CHECKPOINT_MANAGER: FILE_SYSTEM_CHECKPOINTS,
        **{f"spark.executorEnv.{name}": value for name, value in ENV.items() if name.startswith("AWS_")},
    }
    assert CHECKPOINT_MANAGER not in object_store_conf(["s3://b/index"], user_conf={}, environ=ENV)
    assert CHECKPOINT_MANAGER not in object_store_conf(["s3a://b/c"], user_conf={CHECKPOINT_MANAGER: "x.Mine"}, environ=ENV)
    assert not any("secret" in value or value == "token" for key, value in conf.items() if key.startswith(S3A))


def test_the_users_settings_win():
    user = {S3A + "endpoint": "https://minio.corp:9000", S3A + "access.key": "mine",
            "spark.executorEnv.AWS_REGION": "us-east-1", "spark.hadoop.fs.s3a.endpoint.region": "ap-south-1"}
    conf = object_store_conf(["s3a://b/c"], user_conf=user, environ=ENV)
    assert not set(conf) & set(user)
    # the endpoint's settings go with the endpoint: none of them when the user named one
    assert not {S3A + "path.style.access", S3A + "connection.ssl.enabled", S3A + "aws.credentials.provider"} & set(conf)
    assert conf["spark.executorEnv.AWS_SECRET_ACCESS_KEY"] == "secret"


def test_storage_options_reach_s3a_and_win_over_the_environment():
    """`--storage-option`s name the bucket's endpoint and keys for msgindex's client: an s3a://
    checkpoint in the same bucket must reach it with them, not with the environment's."""
    options = {"endpoint": "http://10.0.0.5:9000", "AWS_REGION": "us-east-2", "access_key_id": "opt-id",
               "aws_secret_access_key": "opt-secret", "allow_http": "true", "timeout": "30s"}
    conf = object_store_conf(["s3a://b/c", "s3://b/i"], user_conf={}, environ=ENV, storage_options=options)
    assert {key: conf[key] for key in conf if key.startswith(S3A)} == {
        S3A + "endpoint": "http://10.0.0.5:9000", S3A + "path.style.access": "true",
        S3A + "connection.ssl.enabled": "false", S3A + "endpoint.region": "us-east-2",
        S3A + "access.key": "opt-id", S3A + "secret.key": "opt-secret",
        S3A + "aws.credentials.provider": SIMPLE_CREDENTIALS}  # the environment's token is its keys'
    with_token = object_store_conf(["s3a://b/c"], user_conf={}, environ=ENV,
                                   storage_options={**options, "session_token": "opt-token"})
    assert with_token[S3A + "session.token"] == "opt-token"
    assert with_token[S3A + "aws.credentials.provider"] == TEMPORARY_CREDENTIALS
    # the executors' own client gets the options in its tasks; their environment is the driver's
    assert conf["spark.executorEnv.AWS_ACCESS_KEY_ID"] == "id"
    keyless = object_store_conf(["s3a://b/c"], user_conf={}, environ={},
                                storage_options={"access_key_id": "a", "secret_access_key": "s"})
    assert keyless == {S3A + "access.key": "a", S3A + "secret.key": "s",
                       S3A + "aws.credentials.provider": SIMPLE_CREDENTIALS, CHECKPOINT_MANAGER: FILE_SYSTEM_CHECKPOINTS}
    # S3A credentials the user configured win over the options' keys
    mine = object_store_conf(["s3a://b/c"], user_conf={S3A + "aws.credentials.provider": "x.Mine"}, environ={},
                             storage_options={"access_key_id": "a", "secret_access_key": "s"})
    assert mine == {CHECKPOINT_MANAGER: FILE_SYSTEM_CHECKPOINTS}


def test_which_urls_get_which_settings():
    https = {**ENV, "AWS_ENDPOINT_URL": "https://s3.eu-west-3.amazonaws.com", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true"}
    conf = object_store_conf(["s3a://b/c"], user_conf={}, environ=https)
    assert conf[S3A + "path.style.access"] == "false" and S3A + "connection.ssl.enabled" not in conf
    # msgindex's own client (s3://) needs only the variables on the executors; Hadoop is not involved
    index_only = object_store_conf(["s3://b/index", "/local/checkpoint"], user_conf={}, environ=ENV)
    assert set(index_only) == {f"spark.executorEnv.{name}" for name in ENV if name.startswith("AWS_")}
    assert object_store_conf(["gs://b/c", "/tmp/x", "file:///tmp/y"], user_conf={}, environ=ENV) == {}
    # no keys in the environment: S3A's own credential chain (instance roles, profiles) decides
    keyless = object_store_conf(["s3a://b/c"], user_conf={}, environ={"AWS_REGION": "eu-west-3"})
    assert keyless == {S3A + "endpoint.region": "eu-west-3", "spark.executorEnv.AWS_REGION": "eu-west-3",
                       CHECKPOINT_MANAGER: FILE_SYSTEM_CHECKPOINTS}
    assert hadoop_url("s3://b/index/_checkpoint") == "s3a://b/index/_checkpoint"
    assert hadoop_url("gs://b/c") == "gs://b/c" and hadoop_url("/s3://x") == "/s3://x"


def test_s3a_jars_are_hadoop_aws_at_pysparks_hadoop_version_and_the_sdk_bundle_it_pins():
    version = hadoop_version()
    assert (_pyspark_jars_dir() / f"hadoop-client-api-{version}.jar").is_file()
    jars = object_store_jars(["s3a://bucket/checkpoint"])
    names = sorted(jar.name for jar in jars)
    assert f"hadoop-aws-{version}.jar" in names
    # the bundle at the version Hadoop's build pins (hadoop-project's pom, from Maven's cache)
    project_pom = Path.home() / f".m2/repository/org/apache/hadoop/hadoop-project/{version}/hadoop-project-{version}.pom"
    pinned = project_pom.read_text().split("<aws-java-sdk-v2.version>")[1].split("<")[0]
    assert f"bundle-{pinned}.jar" in names
    assert not {_artifact_of(jar) for jar in jars} & _shipped_artifacts()  # nothing pyspark ships
    assert object_store_jars(["s3://b/index", "/tmp/checkpoint", "hdfs://nn/x"]) == []
    assert object_store_jars(["s3a://a/1", "s3a://b/2"]) == jars


def test_under_spark_submit_the_jars_are_those_of_spark_home(tmp_path, monkeypatch):
    """spark-submit's Python imports pyspark from $SPARK_HOME/python/lib/pyspark.zip, which has no
    jars/ beside it: the Hadoop release is read from $SPARK_HOME/jars (the Spark that runs), else
    `spark-submit ... index_job.py --checkpoint s3a://...` failed with 'found versions none'."""
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    for name in ("hadoop-client-api-9.8.7.jar", "hadoop-client-runtime-9.8.7.jar", "kafka-clients-1.2.3.jar"):
        (jars / name).touch()
    monkeypatch.setenv("SPARK_HOME", str(jars.parent))
    assert _pyspark_jars_dir() == jars and hadoop_version() == "9.8.7"
    assert "kafka-clients" in _shipped_artifacts()
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "no-such-spark"))  # not a Spark: pyspark's own
    assert (_pyspark_jars_dir() / f"hadoop-client-api-{hadoop_version()}.jar").is_file()


def test_gcs_and_abfs_connectors_stage_and_hold_their_filesystems():
    """Staged from Maven Central and holding the class Hadoop loads for the scheme; no test
    server for them here (no GCS or Azure emulator is installed), so nothing more is claimed."""
    for connector in HADOOP_CONNECTORS[1:]:
        jars = object_store_jars([f"{connector.schemes[-1]}://container/checkpoint"])
        classes = {name for jar in jars for name in zipfile.ZipFile(jar).namelist()}
        assert connector.filesystem_class.replace(".", "/") + ".class" in classes, connector.name


def test_the_connector_goes_on_the_driver_class_path_only():
    local = session_conf("x", "local[2]", user_conf={"spark.driver.extraClassPath": "/opt/mine.jar"},
                         hadoop_urls=["s3a://b/c"])
    entries = local["spark.driver.extraClassPath"].split(os.pathsep)
    assert entries[0] == "/opt/mine.jar" and any(Path(e).name.startswith("hadoop-aws-") for e in entries)
    assert "hadoop-aws" not in local["spark.jars"]  # Spark would copy 690 MB into its local dir
    cluster = session_conf("x", "spark://h:7077", user_conf={}, hadoop_urls=["s3a://b/c"], store_urls=["s3://b/i"])
    # only the driver opens the checkpoint: executors are not sent the 690 MB SDK bundle
    assert "hadoop-aws-" not in cluster["spark.jars"] and "spark-sql-kafka" in cluster["spark.jars"]
    assert any(Path(e).name.startswith("hadoop-aws-") for e in cluster["spark.driver.extraClassPath"].split(os.pathsep))
    plain = session_conf("x", "local[2]", user_conf={})
    assert "hadoop-aws" not in plain["spark.jars"] and "spark.driver.extraClassPath" not in plain


def _offline_maven(folder: Path) -> Path:
    """A PATH folder whose `mvn` is the real Maven, offline, with an empty local repository: it
    fails to resolve anything not staged yet, as Maven does on a machine without the network."""
    folder.mkdir()
    real = shutil.which("mvn")
    (folder / "mvn").write_text(f'#!/bin/sh\nexec "{real}" -o -Dmaven.repo.local="{folder}/repository" "$@"\n')
    (folder / "mvn").chmod(0o755)
    return folder


def _home_with_kafka_jars(home: Path) -> Path:
    """A msgindex home that has Spark's Kafka connector and spark-avro staged (copied) and nothing else."""
    kafka_connector_jars()  # staged in this checkout's home (a fresh one has none yet)
    for staged in [*(msgindex_home() / "jars").glob("spark-kafka-*"), *(msgindex_home() / "jars").glob("spark-avro-*")]:
        if staged.is_dir():
            shutil.copytree(staged, home / "jars" / staged.name, ignore=shutil.ignore_patterns(".lock"))
        else:
            (home / "jars").mkdir(parents=True, exist_ok=True)
            shutil.copy2(staged, home / "jars" / staged.name)
    return home


def test_connector_that_cannot_be_staged_is_one_line_naming_the_url(tmp_path, monkeypatch):
    object_store_jars(["s3a://b/c"])  # the Kafka jars and Maven's cache are there; the new home is empty
    monkeypatch.setenv("MSGINDEX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", f"{_offline_maven(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ConnectorJarsError) as failed:
        object_store_jars(["s3a://bucket/checkpoint"])
    line = str(failed.value)
    assert "\n" not in line
    assert line.startswith(f"s3a://bucket/checkpoint: Spark opens s3a:// paths with Hadoop's S3A connector "
                           f"(org.apache.hadoop:hadoop-aws:{hadoop_version()}), which could not be staged")
    # Maven's own first error: offline with an empty repository, it lacks even its dependency plugin
    assert "from Maven Central: No plugin found for prefix 'dependency'" in line


def test_staged_connector_jars_serve_offline_and_a_missing_spark_avro_is_one_line(tmp_path, monkeypatch):
    import pyspark

    names = [jar.name for jar in kafka_connector_jars()]
    home = _home_with_kafka_jars(tmp_path / "home")
    monkeypatch.setenv("MSGINDEX_HOME", str(home))
    monkeypatch.setenv("PATH", f"{_offline_maven(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}")
    assert [jar.name for jar in kafka_connector_jars()] == names  # the staged copies, Maven offline
    shutil.rmtree(home / "jars" / f"spark-avro-{pyspark.__version__}")
    with pytest.raises(ConnectorJarsError) as failed:
        kafka_connector_jars()
    line = str(failed.value)
    assert "\n" not in line
    assert line.startswith(f"Spark's Avro functions org.apache.spark:spark-avro_2.13:{pyspark.__version__} (from_avro "
                           f"in --index-field), the release matching the installed pyspark {pyspark.__version__}, "
                           f"could not be staged from Maven Central: No plugin found for prefix 'dependency'"), line


def test_kafka_jars_lists_the_object_store_connector_for_spark_submit():
    done = subprocess.run([MSGINDEX, "kafka", "jars", "--object-store", "s3a"], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    listed = done.stdout.strip().split(",")
    assert [jar for jar in listed if Path(jar).name.startswith("spark-sql-kafka")]
    assert set(map(str, object_store_jars(["s3a://b/c"]))) <= set(listed)
    assert all(Path(jar).is_file() for jar in listed)
    wrong = subprocess.run([MSGINDEX, "kafka", "jars", "--object-store", "hdfs"], capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S)
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1
    assert "--object-store 'hdfs'" in wrong.stderr


# --- Spark, for real ---------------------------------------------------------------------------

def _plain_session(s3, *args: str) -> dict:
    env = {**os.environ, **s3.env, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _offsets(run: dict) -> list[tuple[int, int]]:
    return sorted(tuple(record) for _, records in run["batches"] for record in records)


def _keys(s3, bucket: str) -> set[str]:
    import boto3

    client = boto3.client("s3", endpoint_url=s3.endpoint, aws_access_key_id=s3.env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=s3.env["AWS_SECRET_ACCESS_KEY"], region_name=s3.env["AWS_REGION"])
    return {item["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for item in page.get("Contents", [])}


@pytest.mark.slow
def test_a_streaming_checkpoint_on_s3a_restarts_where_it_stopped_and_bad_stores_are_one_line(
        s3, kafka_bootstrap, kafka_topic, tmp_path):
    topic = kafka_topic(partitions=2, prefix="s3a-checkpoint")
    first = produce(kafka_bootstrap, topic, [OutgoingRecord(key=f"a{i}", value="v") for i in range(40)])
    bucket = s3.bucket("checkpoint")
    checkpoint = f"s3a://{bucket}/jobs/orders"
    before = _plain_session(s3, "plain", kafka_bootstrap, topic, checkpoint)
    assert before["error"] is None and _offsets(before) == sorted(first)
    written = _keys(s3, bucket)
    last = max(batch for batch, _ in before["batches"])
    assert {"jobs/orders/metadata", f"jobs/orders/offsets/{last}", f"jobs/orders/commits/{last}"} <= written
    assert before["conf"][S3A + "endpoint"] == s3.endpoint and before["conf"][S3A + "path.style.access"] == "true"
    assert before["conf"][S3A + "connection.ssl.enabled"] == "false"
    assert before["conf"][S3A + "aws.credentials.provider"] == ENVIRONMENT_CREDENTIALS
    assert before["conf"]["spark.executorEnv.AWS_SECRET_ACCESS_KEY"] == s3.env["AWS_SECRET_ACCESS_KEY"]

    second = produce(kafka_bootstrap, topic, [OutgoingRecord(key=f"b{i}", value="v") for i in range(25)])
    checking, checked = start_s3_server(str(tmp_path / "moto-auth.log"), requests_before_auth=1)
    try:
        refusing = checked.bucket("refusing")  # the one request before it checks keys
        missing = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
        after = _plain_session(  # restarted in msgindex's own session, as `msgindex index` runs it
            s3, "msgindex", kafka_bootstrap, topic, checkpoint,
            f"missing=s3a://{missing}/cp",
            f"endpoint-{refusing}={checked.endpoint}", f"credentials=s3a://{refusing}/cp",
            "endpoint-unresolvable=http://no-such-host.invalid:9000", "unresolvable=s3a://unresolvable/cp",
            f"endpoint-closed=http://127.0.0.1:{_free_port()}", "slow-closed=s3a://closed/cp")
    finally:
        checking.terminate()
    # restarted from the checkpoint in the bucket: exactly the records sent since, in later batches
    assert after["error"] is None and _offsets(after) == sorted(second)
    assert min(batch for batch, _ in after["batches"]) > last
    # msgindex's session (local master): the connector on the driver's class path, not copied by spark.jars
    assert "hadoop-aws-" in after["conf"]["spark.driver.extraClassPath"] and "hadoop-aws" not in after["conf"]["spark.jars"]
    assert after["conf"][S3A + "endpoint"] == s3.endpoint

    bad = after["bad"]
    expected = {
        "missing": f"s3a://{missing}/cp: bucket {missing!r} does not exist at the S3 endpoint",
        "credentials": f"s3a://{refusing}/cp: the S3 endpoint refused the credentials, or their permissions on "
                       f"bucket {refusing!r} (403)",
        "unresolvable": "s3a://unresolvable/cp: the S3 endpoint's host 'no-such-host.invalid' does not resolve",
        "slow-closed": "s3a://closed/cp: nothing answers at 127.0.0.1:",
    }
    for name, start in expected.items():
        assert bad[name]["check"].startswith(f"ObjectStoreError: {start}"), (name, bad[name])
        assert "\n" not in bad[name]["check"]
        # one request, no retries: S3A's own retries on a closed port took 188 s (see hadoop_paths)
        assert bad[name]["check_s"] < 60, (name, bad[name])
        if "query" in bad[name]:  # a query started on it fails deep in Spark: the CLI's line says the same
            assert bad[name]["query"].startswith(start) and bad[name]["query_exit"] == 2, (name, bad[name])
            assert bad[name]["query_lines"] > 10
    assert not _keys(s3, bucket) - written - {key for key in _keys(s3, bucket) if key.startswith("jobs/orders/")}


@pytest.mark.slow
def test_index_cli_with_an_s3a_checkpoint_its_spark_cannot_open_is_one_line(s3, kafka_bootstrap, kafka_topic,
                                                                            tmp_path):
    topic = kafka_topic(partitions=1, prefix="s3a-cli")
    produce(kafka_bootstrap, topic, [OutgoingRecord(key=f"k{i}", value="v") for i in range(5)])
    bucket = s3.bucket("cli")
    home = _home_with_kafka_jars(tmp_path / "home")
    env = {**os.environ, **s3.env, "MSGINDEX_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "PATH": f"{_offline_maven(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([MSGINDEX, "index", "--bootstrap-servers", kafka_bootstrap, "--subscribe", topic,
                           "--path", str(tmp_path / "index"), "--checkpoint", f"s3a://{bucket}/checkpoint",
                           "--available-now", "--quiet-spark"],
                          env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("msgindex index: ")]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-4000:]
    # Spark without the connector (ClassNotFoundException) or msgindex unable to stage it: either way one line
    assert "Hadoop's S3A connector" in lines[0] and "s3a://" in lines[0], lines[0]
    assert not _keys(s3, bucket)  # nothing reached the bucket
