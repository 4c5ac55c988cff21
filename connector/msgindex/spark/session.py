"""THE SparkSession builder: every job, test and notebook of msgindex gets its session here.

It puts Spark's Kafka connector (not shipped in the pyspark wheel) on ``spark.jars`` as local
files staged once with Maven, so no Ivy download happens at run time, and it fixes the settings
msgindex relies on (UTC session time zone, Arrow, Python data source filter pushdown, the
project's own interpreter on the executors).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from msgindex.errors import MsgIndexError
from msgindex.jvm import msgindex_home, stage_jars
from msgindex.storage.durable import write_atomically

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCALA_SUFFIX = "_2.13"
SQL_KAFKA = f"org.apache.spark:spark-sql-kafka-0-10{SCALA_SUFFIX}"  # group:artifact
TOKEN_PROVIDER = f"org.apache.spark:spark-token-provider-kafka-0-10{SCALA_SUFFIX}"
# Some Maven Central mirrors carry spark-sql-kafka at a release but not its token provider
# (seen: 4.2.0). The token provider's classes are small and stable across 4.x, so the newest
# 4.x release that such mirrors do carry stands in; the choice is remembered per pyspark version.
TOKEN_PROVIDER_FALLBACK = "4.0.0"

DRIVER_MEMORY_ENV = "MSGINDEX_SPARK_DRIVER_MEMORY"
DEFAULT_DRIVER_MEMORY = "1g"  # 2 cores / 24 GiB shared: local[2] runs everything in this JVM
SHUFFLE_PARTITIONS = 4

# artifact-version.jar, where the version starts with digits.digits (artifacts may hold digits:
# spark-sql-kafka-0-10_2.13-4.2.0.jar, zstd-jni-1.5.7-7.jar)
_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+)-\d+\.\d+[\w.\-]*\.jar$")


def _artifact_of(jar: Path) -> str:
    match = _VERSIONED_JAR.match(jar.name)
    return match.group("artifact") if match else jar.stem


def _pyspark_jars_dir() -> Path:
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


def kafka_connector_jars() -> list[Path]:
    """Local jar files of Spark's Kafka source/sink for the installed pyspark, staged with Maven on
    first use: ``spark-sql-kafka-0-10_2.13`` at exactly ``pyspark.__version__``, its token
    provider, kafka-clients and commons-pool2, minus every artifact pyspark's own ``jars/``
    folder already ships (Scala, Hadoop, slf4j, compression codecs...), which would conflict.

    For ``spark-submit --jars`` users: ``",".join(map(str, kafka_connector_jars()))``."""
    import pyspark

    shipped = {_artifact_of(jar) for jar in _pyspark_jars_dir().glob("*.jar")}
    return [jar for jar in _stage_for(pyspark.__version__) if _artifact_of(jar) not in shipped]


def _log_config() -> Path:
    """A log4j2 config that keeps Spark's driver quiet (WARN) from the first line it logs."""
    path = msgindex_home() / "conf" / "log4j2-spark.properties"
    text = (
        "rootLogger.level = warn\n"
        "rootLogger.appenderRef.stderr.ref = console\n"
        "appender.console.type = Console\n"
        "appender.console.name = console\n"
        "appender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex\n"
        # these two warn on every local session and mean nothing here
        "logger.nativeio.name = org.apache.hadoop.util.NativeCodeLoader\n"
        "logger.nativeio.level = error\n"
        "logger.kafkaconfig.name = org.apache.kafka.clients\n"
        "logger.kafkaconfig.level = error\n"
    )
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text.encode("utf-8"))
    return path


def session_conf(app_name: str = "msgindex", master: str = "local[2]",
                 extra_conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The configuration `build_spark_session` applies: extra_conf wins over the defaults, except
    that extra ``spark.jars`` are added to the connector's."""
    conf = {
        "spark.app.name": app_name,
        "spark.master": master,
        "spark.jars": ",".join(str(jar) for jar in kafka_connector_jars()),
        "spark.driver.memory": os.environ.get(DRIVER_MEMORY_ENV, DEFAULT_DRIVER_MEMORY),
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_log_config().as_uri()}",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.python.filterPushdown.enabled": "true",
        # executors must import this project's packages, i.e. run this interpreter
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    extra = {key: str(value) for key, value in (extra_conf or {}).items()}
    if extra.get("spark.jars"):  # the caller's jars join the connector's instead of replacing them
        extra["spark.jars"] = f"{conf['spark.jars']},{extra['spark.jars']}"
    conf.update(extra)
    return conf


def build_spark_session(app_name: str = "msgindex", master: str = "local[2]",
                        extra_conf: Mapping[str, str] | None = None) -> "SparkSession":
    """The SparkSession msgindex runs in, with Spark's Kafka connector on the classpath.

    When a session already runs in this process it is returned as is (jars and JVM options only
    take effect on the first session), with the SQL settings above re-applied."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # everything stays on loopback
    builder = SparkSession.builder
    for key, value in session_conf(app_name, master, extra_conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark

