"""THE SparkSession builder: every job, test and notebook of msgindex gets its session here.

It puts Spark's Kafka connector (not shipped in the pyspark wheel) on ``spark.jars`` as local
files staged once with Maven, so no Ivy download happens at run time, and it fixes the settings
msgindex relies on (UTC session time zone, Arrow, Python data source filter pushdown). Cluster
settings are the user's, as a Spark user expects: ``spark.master`` only when nothing else
(spark-submit, ``--master``, spark-defaults.conf) set one, loopback binding and this interpreter
for the workers only for ``local`` masters, and never over the user's PYSPARK_PYTHON /
``spark.pyspark.python`` (see ``session_conf``).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

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


def _spark_defaults() -> dict[str, str]:
    """spark-defaults.conf where spark-submit looks for it: $SPARK_CONF_DIR, else $SPARK_HOME/conf
    (pyspark's package directory is SPARK_HOME for a pip install)."""
    if os.environ.get("SPARK_CONF_DIR"):
        directory = Path(os.environ["SPARK_CONF_DIR"])
    elif os.environ.get("SPARK_HOME"):
        directory = Path(os.environ["SPARK_HOME"]) / "conf"
    else:
        directory = _pyspark_jars_dir().parent / "conf"
    return _properties_file(directory / "spark-defaults.conf")


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
                 user_conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The configuration `build_spark_session` applies, in this order of precedence:

    1. `extra_conf` and `master` (the caller's explicit settings: ``--conf``, ``--master``);
    2. `user_conf` (default: ``user_spark_conf()``: spark-submit, spark-defaults.conf, ...), never
       overridden by msgindex's defaults -- those keys are simply not set here;
    3. msgindex's defaults: ``spark.master`` local[2], loopback driver binding for local masters
       only, this interpreter for the Python workers of local masters only, quiet logs, no UI;
    and always: UTC session time zone, Arrow, Python data source filter pushdown (msgindex
    relies on them), and the Kafka connector's jars joined to any others (``spark.jars``)."""
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
    conf = {key: value for key, value in defaults.items() if key not in user and key not in explicit}
    conf.update(REQUIRED_CONF)
    conf.update(explicit)
    jars = [str(jar) for jar in kafka_connector_jars()]
    for given in (user.get("spark.jars"), explicit.get("spark.jars")):
        jars += [jar for jar in (given or "").split(",") if jar and jar not in jars]
    conf["spark.jars"] = ",".join(jars)
    return conf


def build_spark_session(app_name: str = "msgindex", master: str | None = None,
                        extra_conf: Mapping[str, str] | None = None) -> SparkSession:
    """The SparkSession msgindex runs in, with Spark's Kafka connector on the classpath; see
    `session_conf` for which settings it makes and which it leaves to the user.

    When a session already runs in this process it is returned as is (jars and JVM options only
    take effect on the first session), with the SQL settings re-applied."""
    from pyspark.sql import SparkSession

    conf = session_conf(app_name, master, extra_conf)
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
    from msgindex.spark.read.datasource import enable_pushdown

    enable_pushdown(spark)  # `where` on key/topic/broker/partition/timestamp answered by the index
    return spark
