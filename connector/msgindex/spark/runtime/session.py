"""THE SparkSession builder: every job, test and notebook of msgindex gets its session here.

It puts Spark's Kafka connector and its Avro functions (``from_avro`` in ``--index-field``;
neither is shipped in the pyspark wheel) on ``spark.jars`` as local files staged once with Maven,
so no Ivy download happens at run time, and it fixes the settings msgindex relies on (UTC session
time zone, Arrow, Python data source filter pushdown). For object-store URLs it adds Hadoop's
connector for the paths Spark opens itself (an ``s3a://`` checkpoint: hadoop-aws and the AWS SDK
bundle) and the ``AWS_*`` variables as Spark settings (``object_store_conf``). Cluster settings
are the user's, as a Spark user expects: ``spark.master`` only when nothing else (spark-submit,
``--master``, spark-defaults.conf) set one, loopback binding and this interpreter for the workers
only for ``local`` masters, and never over the user's PYSPARK_PYTHON / ``spark.pyspark.python``
(see ``session_conf``).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit
from xml.etree import ElementTree

from msgindex.errors import ConnectorJarsError, MsgIndexError
from msgindex.jvm import msgindex_home, stage_jars
from msgindex.storage.durable import write_atomically

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCALA_SUFFIX = "_2.13"
SQL_KAFKA = f"org.apache.spark:spark-sql-kafka-0-10{SCALA_SUFFIX}"  # group:artifact
TOKEN_PROVIDER = f"org.apache.spark:spark-token-provider-kafka-0-10{SCALA_SUFFIX}"
# from_avro/to_avro: Spark's SQL functions load their implementation from this jar at analysis
AVRO = f"org.apache.spark:spark-avro{SCALA_SUFFIX}"
# Some Maven Central mirrors carry spark-sql-kafka at a release but not its token provider
# (seen: 4.2.0). The token provider's classes are small and stable across 4.x, so the newest
# 4.x release that such mirrors do carry stands in; the choice is remembered per pyspark version.
TOKEN_PROVIDER_FALLBACK = "4.0.0"

DRIVER_MEMORY_ENV = "MSGINDEX_SPARK_DRIVER_MEMORY"
DEFAULT_DRIVER_MEMORY = "1g"  # 2 cores / 24 GiB shared: local[2] runs everything in this JVM
SHUFFLE_PARTITIONS = 4
DEFAULT_MASTER = "local[2]"  # when neither the caller nor the user's Spark configuration names one
# Settings msgindex's reads and writes rely on: always applied.
REQUIRED_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.python.filterPushdown.enabled": "true",
}

# artifact-version.jar, where the version starts with digits.digits (artifacts may hold digits:
# spark-sql-kafka-0-10_2.13-4.2.0.jar, zstd-jni-1.5.7-7.jar)
_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+)-\d+\.\d+[\w.\-]*\.jar$")


def _artifact_of(jar: Path) -> str:
    match = _VERSIONED_JAR.match(jar.name)
    return match.group("artifact") if match else jar.stem


def _pyspark_jars_dir() -> Path:
    """The jars of the Spark that runs this driver: ``$SPARK_HOME/jars`` when spark-submit started
    it (it sets SPARK_HOME, and its Python imports pyspark from ``python/lib/pyspark.zip``, beside
    which there is no ``jars/``), else those in pyspark's package directory (a pip install)."""
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "jars").is_dir():
        return Path(home) / "jars"
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def _fallback_marker(version: str) -> Path:
    return msgindex_home() / "jars" / f"spark-kafka-{version}.token-provider"


def _stage_connector(version: str, token_provider_version: str) -> list[Path]:
    return stage_jars(
        f"spark-kafka-{version}-tp{token_provider_version}",
        # the connector first: kafka-clients and commons-pool2 then come at the versions Spark's
        # own pom pins (Maven's tie between equally near dependencies goes to the first declared)
        [f"{SQL_KAFKA}:{version}", f"{TOKEN_PROVIDER}:{token_provider_version}"],
        exclusions=(TOKEN_PROVIDER,),
    )


def _stage_for(version: str) -> list[Path]:
    marker = _fallback_marker(version)
    if marker.is_file():
        return _stage_connector(version, marker.read_text().strip())
    try:
        return _stage_connector(version, version)
    except MsgIndexError as exact_failed:
        maven_says = str(exact_failed).split("\n", 1)[-1]
        if f"{SQL_KAFKA}:jar:{version}" in maven_says:
            raise MsgIndexError(
                f"Spark's Kafka connector {SQL_KAFKA}:{version}, the release matching the "
                f"installed pyspark {version}, could not be staged from Maven Central. Pin pyspark "
                f"to a release whose connector is published there (e.g. pyspark==4.2.0)."
                f"\n{maven_says}"
            ) from exact_failed
        if f"{TOKEN_PROVIDER}:jar:{version}" not in maven_says:
            raise
    jars = _stage_connector(version, TOKEN_PROVIDER_FALLBACK)
    marker.write_text(TOKEN_PROVIDER_FALLBACK)
    return jars


def _stage_avro(version: str) -> list[Path]:
    try:
        return stage_jars(f"spark-avro-{version}", [f"{AVRO}:{version}"])
    except MsgIndexError as failed:
        raise ConnectorJarsError(
            f"Spark's Avro functions {AVRO}:{version} (from_avro in --index-field), the release matching the "
            f"installed pyspark {version}, could not be staged from Maven Central: {_maven_reason(failed)}") from failed


def kafka_connector_jars() -> list[Path]:
    """Local jar files of Spark's Kafka source/sink and Avro functions for the installed pyspark,
    staged with Maven on first use: ``spark-sql-kafka-0-10_2.13`` at exactly
    ``pyspark.__version__``, its token provider, kafka-clients and commons-pool2, and
    ``spark-avro_2.13`` at the same version (``from_avro``/``to_avro`` in SQL expressions such as
    ``--index-field``), minus every artifact pyspark's own ``jars/`` folder already ships (Scala,
    Hadoop, Avro itself, slf4j, compression codecs...), which would conflict.

    For ``spark-submit --jars`` users: ``",".join(map(str, kafka_connector_jars()))``."""
    import pyspark

    shipped, jars = _shipped_artifacts(), []
    for jar in [*_stage_for(pyspark.__version__), *_stage_avro(pyspark.__version__)]:
        if _artifact_of(jar) not in shipped and _artifact_of(jar) not in {_artifact_of(kept) for kept in jars}:
            jars.append(jar)
    return jars


def _shipped_artifacts() -> set[str]:
    return {_artifact_of(jar) for jar in _pyspark_jars_dir().glob("*.jar")}


# --- object stores: Hadoop's connectors for the paths Spark opens itself (its checkpoint) ---------

_HADOOP_CLIENT_JAR = re.compile(r"^hadoop-client-(?:api|runtime)-(?P<version>\d+\.\d+[\w.\-]*)\.jar$")


@dataclass(frozen=True)
class HadoopConnector:
    """A Hadoop filesystem for object-store URLs that pyspark's ``jars/`` lacks, and the Maven
    artifact that brings it (with its runtime dependencies)."""

    name: str
    schemes: tuple[str, ...]
    filesystem_class: str  # what Hadoop loads for these schemes (its ClassNotFoundException names it)
    artifact: str  # "group:artifact" released with Hadoop (taken at pyspark's Hadoop version), or a full coordinate
    exclusions: tuple[str, ...] = ()

    def coordinate(self, hadoop: str) -> str:
        return self.artifact if self.artifact.count(":") >= 2 else f"{self.artifact}:{hadoop}"


HADOOP_CONNECTORS = (
    # hadoop-aws's pom pins the AWS SDK v2 `bundle` it was built with (shaded; ~690 MB for 3.5.0)
    HadoopConnector("Hadoop's S3A connector", ("s3a",), "org.apache.hadoop.fs.s3a.S3AFileSystem",
                    "org.apache.hadoop:hadoop-aws"),
    HadoopConnector("Hadoop's ABFS connector", ("abfs", "abfss"), "org.apache.hadoop.fs.azurebfs.AzureBlobFileSystem",
                    "org.apache.hadoop:hadoop-azure"),
    # Google releases its connector on its own schedule; 4.0.0 is built against Hadoop 3.4.2 and is
    # the newest 4.x whose shaded jar (its dependencies relocated inside) Maven Central serves.
    HadoopConnector("Google's Cloud Storage connector", ("gs",), "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
                    "com.google.cloud.bigdataoss:gcs-connector:4.0.0:shaded", exclusions=("*:*",)),
)
S3_SCHEMES = ("s3", "s3a")  # msgindex's own client takes both; Spark's Hadoop only s3a
# What msgindex's object-store client reads on the executors, handed over as spark.executorEnv.*
AWS_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ALLOW_HTTP", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST")
S3A = "spark.hadoop.fs.s3a."
# reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN in each JVM: no secret in Spark's conf
ENVIRONMENT_CREDENTIALS = "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"
_S3A_CREDENTIALS = ("access.key", "secret.key", "session.token", "aws.credentials.provider")


def url_scheme(url: str) -> str:
    """The scheme of `url`, lower case ('' for a plain path)."""
    text = str(url)
    if "://" not in text:
        return ""
    return urlsplit(text).scheme.lower()


def hadoop_url(url: str) -> str:
    """The URL by which Spark's Hadoop filesystems reach `url`: ``s3://`` (msgindex's and most
    tools' spelling) becomes ``s3a://`` (Hadoop's S3A connector; Hadoop has no ``s3://``
    filesystem outside EMR); anything else is returned as is."""
    text = str(url)
    return "s3a://" + text[len("s3://"):] if url_scheme(text) == "s3" else text


def hadoop_version() -> str:
    """The Hadoop release pyspark's own jars carry (``jars/hadoop-client-api-<version>.jar``):
    Hadoop's connectors must be of exactly this release."""
    versions = {match.group("version") for jar in _pyspark_jars_dir().glob("hadoop-client-*.jar")
                if (match := _HADOOP_CLIENT_JAR.match(jar.name))}
    if len(versions) != 1:
        raise ConnectorJarsError(f"{_pyspark_jars_dir()}: expected one hadoop-client-api-<version>.jar, found "
                                 f"versions {sorted(versions) or 'none'}: cannot tell which Hadoop connectors match")
    return versions.pop()


def hadoop_connector(url: str) -> HadoopConnector | None:
    """The connector Spark needs to open `url` through Hadoop, None when pyspark's jars suffice."""
    scheme = url_scheme(url)
    return next((c for c in HADOOP_CONNECTORS if scheme in c.schemes), None)


def _maven_reason(failure: MsgIndexError) -> str:
    """The line that says why staging failed: Maven's first error, else the error's first line
    (e.g. that mvn is not installed)."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(failure)).splitlines() if line.strip()]
    errors = [line.removeprefix("[ERROR]").strip() for line in lines if line.startswith("[ERROR]")]
    found = next((line for line in errors if line), lines[0] if lines else "unknown")
    return found.removesuffix("-> [Help 1]").strip()[:400]


def object_store_jars(urls: Iterable[str]) -> list[Path]:
    """Local jar files of the Hadoop connectors Spark needs to open `urls` itself (its
    checkpoint): for ``s3a://`` hadoop-aws at pyspark's Hadoop version and the AWS SDK bundle its
    pom pins, for ``abfs[s]://`` hadoop-azure, for ``gs://`` Google's shaded gcs-connector; none
    for other URLs. Staged with Maven on first use (as `kafka_connector_jars`), minus every
    artifact pyspark's own ``jars/`` already ships. ConnectorJarsError names the URL when a
    connector cannot be staged.

    For ``spark-submit --jars`` users: ``msgindex kafka jars --object-store s3a``."""
    shipped, jars, done = _shipped_artifacts(), [], set()
    for url in urls:
        connector = hadoop_connector(url)
        if connector is None or connector in done:
            continue
        done.add(connector)
        coordinate = connector.coordinate(hadoop_version())
        try:
            staged = stage_jars(coordinate.split(":", 1)[1].replace(":", "-"), [coordinate],
                                exclusions=connector.exclusions)
        except MsgIndexError as failed:
            raise ConnectorJarsError(
                f"{url}: Spark opens {url_scheme(url)}:// paths with {connector.name} ({coordinate}), which could "
                f"not be staged from Maven Central: {_maven_reason(failed)}") from failed
        jars += [jar for jar in staged if _artifact_of(jar) not in shipped and jar not in jars]
    return jars


def _is_true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")


# storage option (the object-store client's name, lower case, "aws_" prefix dropped) -> the AWS_*
# variable it stands for, so that an s3a:// checkpoint reaches the bucket the options name
_S3_OPTION_VARIABLES = {"endpoint": "AWS_ENDPOINT_URL", "endpoint_url": "AWS_ENDPOINT_URL", "region": "AWS_REGION",
                        "default_region": "AWS_REGION", "access_key_id": "AWS_ACCESS_KEY_ID",
                        "secret_access_key": "AWS_SECRET_ACCESS_KEY", "session_token": "AWS_SESSION_TOKEN",
                        "token": "AWS_SESSION_TOKEN", "virtual_hosted_style_request": "AWS_VIRTUAL_HOSTED_STYLE_REQUEST"}
SIMPLE_CREDENTIALS = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
TEMPORARY_CREDENTIALS = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"


def s3_option_variables(storage_options: Mapping[str, str] | None) -> dict[str, str]:
    """The ``AWS_*`` variables `storage_options` (``--storage-option``) stand for (S3 options only)."""
    found = {}
    for name, value in (storage_options or {}).items():
        key = name.strip().lower()
        variable = _S3_OPTION_VARIABLES.get(key.removeprefix("aws_")) or \
            (name.upper() if name.upper() in AWS_VARIABLES else None)
        if variable and str(value):
            found[variable] = str(value)
    return found


# Spark's default checkpoint file manager goes through Hadoop's FileContext, whose S3A binding
# probes every path it touches several times over (HEAD, directory HEAD, LIST) on create and on
# rename: 44 requests a micro-batch against an S3 server for the offsets and commit files of a
# foreachBatch query (Hadoop 3.5.0, counted through a logging proxy), ~0.5 s of each 1 s trigger
# on moto. Spark's FileSystem-based manager, the one it picks itself for file systems without a
# FileContext binding, sends 24 and is no less safe on S3: neither rename is atomic there (S3A's is
# copy + delete after an existence check), which is why the job keeps its own lease
# (``pipeline-owner.json``) and never lets two queries share a checkpoint.
CHECKPOINT_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_CHECKPOINTS = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def object_store_conf(urls: Sequence[str], user_conf: Mapping[str, str],
                      environ: Mapping[str, str] | None = None,
                      storage_options: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark settings for a job whose paths include the object-store `urls` (Spark's checkpoint,
    the index), from the ``AWS_*`` variables of `environ` (default: this process's), leaving out
    every key `user_conf` already sets (``--conf``, spark-defaults.conf, core-site.xml win):

    * any ``s3://`` or ``s3a://`` URL: ``spark.executorEnv.AWS_*`` (endpoint, keys, session token,
      region, allow-http), because msgindex's own object-store client on the executors reads
      them (Spark redacts the secret key and token in its UI; the key id is an identifier);
    * an ``s3a://`` URL (Spark's Hadoop opens it): ``AWS_ENDPOINT_URL`` -> ``fs.s3a.endpoint``
      with path-style access (as msgindex's client and S3-compatible servers do; not with
      ``AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true``) and, for an ``http://`` endpoint, SSL off;
      ``AWS_REGION``/``AWS_DEFAULT_REGION`` -> ``fs.s3a.endpoint.region``; with
      ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` set, the SDK's environment credentials
      provider (it also reads ``AWS_SESSION_TOKEN``), unless the user configured S3A credentials;
    * `storage_options` (the index's ``--storage-option``s) count as the variables they stand for
      (`s3_option_variables`) and win over them, for S3A only (msgindex's executors get the
      options themselves); keys given as options go to ``fs.s3a.access.key``/``secret.key``
      (``session.token``), which Spark redacts, since no JVM's environment has them;
    * an ``s3a://`` URL: Spark's FileSystem-based checkpoint file manager (``CHECKPOINT_MANAGER``).

    Each ``fs.s3a.*`` key as ``spark.hadoop.fs.s3a.*``. Nothing for other URLs."""
    env = os.environ if environ is None else environ
    given = s3_option_variables(storage_options)
    user = {key: str(value) for key, value in user_conf.items()}
    schemes = {url_scheme(url) for url in urls}
    conf: dict[str, str] = {}
    if schemes & set(S3_SCHEMES):
        conf.update({f"spark.executorEnv.{name}": env[name] for name in AWS_VARIABLES if env.get(name)})
    if "s3a" in schemes:
        conf[CHECKPOINT_MANAGER] = FILE_SYSTEM_CHECKPOINTS
        env = {**env, **given}
        endpoint = env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT")
        if endpoint and S3A + "endpoint" not in user:  # the endpoint's settings go together
            conf[S3A + "endpoint"] = endpoint
            conf[S3A + "path.style.access"] = str(not _is_true(env.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST"))).lower()
            if endpoint.strip().lower().startswith("http://"):
                conf[S3A + "connection.ssl.enabled"] = "false"
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if region:
            conf[S3A + "endpoint.region"] = region
        if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY") \
                and not any(S3A + key in user for key in _S3A_CREDENTIALS):
            if "AWS_ACCESS_KEY_ID" in given or "AWS_SECRET_ACCESS_KEY" in given:
                conf[S3A + "access.key"] = env["AWS_ACCESS_KEY_ID"]
                conf[S3A + "secret.key"] = env["AWS_SECRET_ACCESS_KEY"]
                token = given.get("AWS_SESSION_TOKEN")  # the environment's belongs to its own keys
                if token:
                    conf[S3A + "session.token"] = token
                conf[S3A + "aws.credentials.provider"] = TEMPORARY_CREDENTIALS if token else SIMPLE_CREDENTIALS
            else:
                conf[S3A + "aws.credentials.provider"] = ENVIRONMENT_CREDENTIALS
    return {key: value for key, value in conf.items() if key not in user}


def _hadoop_site_conf() -> dict[str, str]:
    """Settings in the core-site.xml Spark loads (``$HADOOP_CONF_DIR``, Spark's conf directory),
    spelled as ``spark.hadoop.*``: the user's, which msgindex never overrides."""
    conf: dict[str, str] = {}
    for directory in (os.environ.get("HADOOP_CONF_DIR"), str(_spark_conf_dir())):
        if not directory:
            continue
        try:
            root = ElementTree.parse(Path(directory) / "core-site.xml").getroot()
        except (OSError, ElementTree.ParseError):
            continue
        for item in root.iter("property"):
            name, value = item.findtext("name"), item.findtext("value")
            if name and value is not None:
                conf.setdefault(f"spark.hadoop.{name.strip()}", value.strip())
    return conf


def _log_config() -> Path:
    """A log4j2 config that keeps Spark's driver quiet (WARN) from the first line it logs, one
    line per event: a failed task's Java stack trace is in the error that reaches Python (the CLI
    writes it to its log file), so the console does not repeat it (dozens of lines per task)."""
    path = msgindex_home() / "conf" / "log4j2-spark.properties"
    text = (
        "rootLogger.level = warn\n"
        "rootLogger.appenderRef.stderr.ref = console\n"
        "appender.console.type = Console\n"
        "appender.console.name = console\n"
        "appender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n\n"
        "appender.console.layout.alwaysWriteExceptions = false\n"
        # these warn on every session or query and mean nothing here
        "logger.nativeio.name = org.apache.hadoop.util.NativeCodeLoader\n"
        "logger.nativeio.level = error\n"
        "logger.kafkaconfig.name = org.apache.kafka.clients\n"
        "logger.kafkaconfig.level = error\n"
        "logger.sources.name = org.apache.spark.sql.execution.datasources.DataSourceManager\n"
        "logger.sources.level = error\n"
        "logger.streamaqe.name = org.apache.spark.sql.execution.streaming.runtime.ResolveWriteToStream\n"
        "logger.streamaqe.level = error\n"
        # A failed task or query is logged three times on its way to the driver (the executor's
        # "Exception in task", "Lost task"/"aborting job", "Query ... terminated with error"),
        # the first two with the task's whole stack trace; the same error then reaches the caller
        # as an exception (the CLI prints its one line and logs the whole text to a file), so
        # the console says none of it.
        "logger.failedTasks.name = org.apache.spark.executor.Executor\n"
        "logger.failedTasks.level = off\n"
        "logger.lostTasks.name = org.apache.spark.scheduler.TaskSetManager\n"
        "logger.lostTasks.level = off\n"
        "logger.failedQuery.name = org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution\n"
        "logger.failedQuery.level = off\n"
    )
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text.encode("utf-8"))
    return path


def _properties_file(path: Path) -> dict[str, str]:
    """A Java properties file as Spark reads spark-defaults.conf (key, then '=', ':' or blanks, then value)."""
    conf = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return conf
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"^(\S+?)\s*[=:\s]\s*(.*)$", line)
        if match:
            conf[match.group(1)] = match.group(2).strip()
    return conf


def _spark_conf_dir() -> Path:
    """Where spark-submit looks for its configuration: $SPARK_CONF_DIR, else $SPARK_HOME/conf
    (pyspark's package directory is SPARK_HOME for a pip install)."""
    if os.environ.get("SPARK_CONF_DIR"):
        return Path(os.environ["SPARK_CONF_DIR"])
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"]) / "conf"
    return _pyspark_jars_dir().parent / "conf"


def _spark_defaults() -> dict[str, str]:
    """spark-defaults.conf where spark-submit looks for it (`_spark_conf_dir`)."""
    return _properties_file(_spark_conf_dir() / "spark-defaults.conf")


_SUBMIT_FLAGS = {"--master": "spark.master", "--jars": "spark.jars", "--driver-memory": "spark.driver.memory",
                 "--name": "spark.app.name", "--py-files": "spark.submit.pyFiles"}


def _submit_args(text: str) -> dict[str, str]:
    """The settings in PYSPARK_SUBMIT_ARGS (the spark-submit flags a plain `python` driver's JVM gets)."""
    conf: dict[str, str] = {}
    words = shlex.split(text)
    for n, word in enumerate(words):
        flag, _, inline = word.partition("=")
        value = inline if inline else (words[n + 1] if n + 1 < len(words) else "")
        if flag in _SUBMIT_FLAGS:
            conf[_SUBMIT_FLAGS[flag]] = value
        elif flag in ("--conf", "-c"):
            key, sep, setting = (inline if inline else value).partition("=")
            if sep:
                conf[key] = setting
    return conf


def _running_jvm_conf() -> dict[str, str]:
    """The spark.* settings of a JVM that already runs this Python driver (spark-submit starts
    the JVM first: its --master, --conf, --jars and spark-defaults.conf are system properties)."""
    from pyspark import SparkConf, SparkContext

    if SparkContext._gateway is None and not os.environ.get("PYSPARK_GATEWAY_PORT"):
        return {}
    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


def user_spark_conf() -> dict[str, str]:
    """Spark settings made outside msgindex, which msgindex's defaults never override:
    spark-defaults.conf, PYSPARK_SUBMIT_ARGS, the MASTER variable, and under spark-submit the
    running JVM's settings (its flags and spark-defaults.conf)."""
    conf = _spark_defaults()
    if os.environ.get("MASTER"):
        conf["spark.master"] = os.environ["MASTER"]
    conf.update(_submit_args(os.environ.get("PYSPARK_SUBMIT_ARGS", "")))
    conf.update(_running_jvm_conf())
    return conf


def is_local_master(master: str) -> bool:
    """``local``, ``local[N]``, ``local[*]``, ``local[N,F]``, ``local-cluster[...]``: one machine."""
    return master.startswith("local")


def session_conf(app_name: str = "msgindex", master: str | None = None,
                 extra_conf: Mapping[str, str] | None = None,
                 user_conf: Mapping[str, str] | None = None, *,
                 hadoop_urls: Sequence[str] = (), store_urls: Sequence[str] = (),
                 storage_options: Mapping[str, str] | None = None) -> dict[str, str]:
    """The configuration `build_spark_session` applies, in this order of precedence:

    1. `extra_conf` and `master` (the caller's explicit settings: ``--conf``, ``--master``);
    2. `user_conf` (default: ``user_spark_conf()``: spark-submit, spark-defaults.conf, ...), never
       overridden by msgindex's defaults -- those keys are simply not set here;
    3. msgindex's defaults: ``spark.master`` local[2], loopback driver binding for local masters
       only, this interpreter for the Python workers of local masters only, quiet logs, no UI,
       and for object stores the ``AWS_*`` variables as settings (`object_store_conf`, for
       `hadoop_urls` -- paths Spark opens itself through Hadoop: its checkpoint -- and
       `store_urls` -- paths msgindex's own client opens: the index; with the index's
       `storage_options`);
    and always: UTC session time zone, Arrow, Python data source filter pushdown (msgindex
    relies on them), and the Kafka connector's and Avro functions' jars joined to any others (``spark.jars``), with
    the Hadoop connectors `hadoop_urls` need (`object_store_jars`) on the driver's class path
    only, whatever the master: only the driver opens Spark's checkpoint (the job keeps no state
    in executors), and Spark copies ``spark.jars`` to every executor (and for local masters into
    its local directory): 690 MB for the AWS SDK bundle."""
    user = dict(user_spark_conf() if user_conf is None else user_conf)
    explicit = {key: str(value) for key, value in (extra_conf or {}).items()}
    if master is not None:
        explicit["spark.master"] = master
    chosen_master = explicit.get("spark.master") or user.get("spark.master") or DEFAULT_MASTER
    defaults = {
        "spark.app.name": app_name,
        "spark.master": DEFAULT_MASTER,
        "spark.driver.memory": os.environ.get(DRIVER_MEMORY_ENV, DEFAULT_DRIVER_MEMORY),
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_log_config().as_uri()}",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
    }
    if is_local_master(chosen_master):
        # everything in this process and its workers: stay on loopback, run this interpreter
        defaults.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
        if not os.environ.get("PYSPARK_PYTHON"):
            defaults.update({"spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable})
    defaults.update(object_store_conf([*hadoop_urls, *store_urls], {**_hadoop_site_conf(), **user, **explicit},
                                      storage_options=storage_options))
    conf = {key: value for key, value in defaults.items() if key not in user and key not in explicit}
    conf.update(REQUIRED_CONF)
    conf.update(explicit)
    jars = [str(jar) for jar in kafka_connector_jars()]
    connectors = [str(jar) for jar in object_store_jars(hadoop_urls)]
    if connectors:
        key = "spark.driver.extraClassPath"
        conf[key] = os.pathsep.join([*(entry for entry in (explicit.get(key) or user.get(key) or "").split(os.pathsep)
                                       if entry), *connectors])
    for given in (user.get("spark.jars"), explicit.get("spark.jars")):
        jars += [jar for jar in (given or "").split(",") if jar and jar not in jars]
    conf["spark.jars"] = ",".join(jars)
    return conf


def build_spark_session(app_name: str = "msgindex", master: str | None = None,
                        extra_conf: Mapping[str, str] | None = None, *,
                        hadoop_urls: Sequence[str] = (), store_urls: Sequence[str] = (),
                        storage_options: Mapping[str, str] | None = None) -> SparkSession:
    """The SparkSession msgindex runs in, with Spark's Kafka connector on the classpath and, for
    object-store `hadoop_urls` (Spark's checkpoint on ``s3a://``, ``gs://``, ``abfss://``), the
    Hadoop connector that opens them; see `session_conf` for which settings it makes and which it
    leaves to the user. `store_urls` are object-store paths msgindex's own client opens (the
    index): its executors get the same ``AWS_*`` variables; `storage_options` (the index's) reach
    Spark's S3A too.

    When a session already runs in this process it is returned as is (jars and JVM options only
    take effect on the first session), with the SQL settings re-applied."""
    from pyspark.sql import SparkSession

    conf = session_conf(app_name, master, extra_conf, hadoop_urls=hadoop_urls, store_urls=store_urls,
                        storage_options=storage_options)
    # A plain `python` driver's Python workers run PYSPARK_PYTHON (spark.pyspark.python is read
    # by spark-submit only): do what spark-submit does with it, never override the user's choice.
    if conf.get("spark.pyspark.python"):
        os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    if conf.get("spark.pyspark.driver.python") and not os.environ.get("PYSPARK_DRIVER_PYTHON"):
        os.environ["PYSPARK_DRIVER_PYTHON"] = conf["spark.pyspark.driver.python"]
    if is_local_master(conf.get("spark.master") or DEFAULT_MASTER):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # everything stays on loopback
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    from msgindex.spark.read.datasource import register_pushdown

    # `where` on key/topic/broker/partition/timestamp answered by the index (the workers' Python is
    # not probed here: the job ships msgindex to executors after this)
    register_pushdown(spark)
    return spark
