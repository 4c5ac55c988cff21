"""msgindex doctor: check that this machine and session can use msgindex, and say what to fix.

examples:
  msgindex doctor
  msgindex doctor ./index --bootstrap-servers 127.0.0.1:9092
  msgindex doctor /data/index --master spark://host:7077
  msgindex doctor /data/index --remote sc://spark-host:15002

It checks, one line each (ok, or FAIL with what to do):
  this Python      the interpreter running msgindex, its msgindex and pyspark
  java             Spark and the local Kafka broker need Java 17 or newer
  workers' Python  the Python Spark starts for its workers (PYSPARK_PYTHON, else python3 on
                   PATH) imports msgindex: without it Spark answers format("msgindex") with
                   DATA_SOURCE_NOT_FOUND before any msgindex code runs
  jars             Spark's Kafka connector, staged from Maven Central (msgindex index needs it)
  Kafka            answers at --bootstrap-servers, and has the topics the index holds (payloads
                   are fetched from there)
  index            PATH opens and reads: shards, messages, topics, time range
  Spark            a session as you would start it (SparkSession.builder, or --master / --remote)
                   runs a task on its workers, whose Python imports msgindex, and reads PATH (or
                   an empty index) with format("msgindex"); --no-spark skips it

Exit code 0 when everything checked is ok, 2 when something is not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msgindex.cli.store_args import add_storage_options, open_store_of, storage_options
from msgindex.spark.read.options import STORAGE_OPTION_PREFIX
from msgindex.storage.location import is_object_store_url

CHECK_TIMEOUT_S = 15.0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``doctor`` subcommand."""
    parser = subparsers.add_parser(
        "doctor", help="check Python, Spark's workers, jars, Kafka and an index; say what to fix",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", metavar="PATH", nargs="?",
                        help="an index to check (optional): a local directory or an s3://, gs://, az:// URL")
    add_storage_options(parser)
    parser.add_argument("--bootstrap-servers", metavar="HOST:PORT", help="a Kafka cluster to check (optional)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--master", metavar="URL", help="Spark master of the session to check (default: Spark's own)")
    where.add_argument("--remote", metavar="sc://HOST:PORT", help="check a Spark Connect server's session instead")
    parser.add_argument("--no-spark", action="store_true", help="skip starting a Spark session (faster)")
    parser.set_defaults(handler=run)


@dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, whether it is fine, what was found, and (when
    it is not fine) what to do."""

    name: str
    ok: bool
    found: str
    fix: str = ""

    def lines(self) -> list[str]:
        head = f"  {'ok  ' if self.ok else 'FAIL'}  {self.name}: {self.found}"
        return [head] + ([f"        fix: {self.fix}"] if self.fix and not self.ok else [])


def run(args: argparse.Namespace) -> int:
    """Print one line per check; exit code 0 when all are ok, else 2."""
    print("msgindex doctor", flush=True)
    steps: list[tuple[str, Callable[[], Check | list[Check] | None]]] = [
        ("this Python", _this_python), ("java", _java), ("workers' Python", _workers_python), ("jars", _jars),
        ("Kafka", lambda: _kafka(args.bootstrap_servers, args) if args.bootstrap_servers else None),
        ("index", lambda: _index(args) if args.path else None),
        ("Spark", lambda: None if args.no_spark else _spark(args, args.master, args.remote)),
    ]
    failed = 0
    for name, step in steps:
        try:
            result = step()
        except Exception as error:  # a check that breaks is itself a finding, and the others still run
            result = Check(name, False, _first_line(error))
        for check in [result] if isinstance(result, Check) else (result or []):
            failed += not check.ok
            print("\n".join(check.lines()), flush=True)
    print(f"{'all checks ok' if not failed else f'{failed} check(s) failed'}")
    return 2 if failed else 0


def _this_python() -> Check:
    import pyspark

    import msgindex

    return Check("this Python", True, f"{sys.executable} {sys.version.split()[0]}, msgindex {msgindex.__version__} "
                 f"({os.path.dirname(msgindex.__file__)}), pyspark {pyspark.__version__}")


def _java() -> Check:
    java = shutil.which("java")
    if java is None:
        return Check("java", False, "not found on PATH",
                     "install Java 17 or newer (Debian: apt-get install openjdk-17-jre-headless)")
    done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    version = (done.stderr or done.stdout).strip().splitlines()[0] if (done.stderr or done.stdout).strip() else "?"
    return Check("java", done.returncode == 0, f"{version} ({java})")


def _workers_python() -> Check:
    """The interpreter a plain SparkSession would start its workers with, asked directly."""
    from msgindex.spark.runtime.worker_python import interpreter_problem

    named = os.environ.get("PYSPARK_PYTHON")
    python = named or "python3"
    where = f"PYSPARK_PYTHON={named}" if named else f"python3 from PATH ({shutil.which('python3') or 'none'})"
    problem = interpreter_problem(python, os.environ.get("PYTHONPATH", ""))
    if not problem:
        return Check("workers' Python", True, f"{where} imports msgindex")
    return Check("workers' Python", False, f"{where} {problem}: a SparkSession started from this shell answers "
                 f"format(\"msgindex\") with DATA_SOURCE_NOT_FOUND",
                 f"activate the environment msgindex is installed in, or set PYSPARK_PYTHON={sys.executable} "
                 f"before the SparkSession starts (in a notebook: os.environ['PYSPARK_PYTHON'] = sys.executable; "
                 f"msgindex's own session builder does it)")


def _jars() -> Check:
    from msgindex.spark.runtime.session import kafka_connector_jars

    jars = kafka_connector_jars()
    return Check("jars", True, f"Spark's Kafka connector and spark-avro: {len(jars)} jars in "
                 f"{', '.join(sorted({str(jar.parent) for jar in jars})) or '-'}")


def _kafka(bootstrap: str, args: argparse.Namespace) -> list[Check]:
    from msgindex.kafka.admin import check_source

    topics = check_source(bootstrap, timeout=CHECK_TIMEOUT_S, pattern=".*")
    checks = [Check("Kafka", True, f"{bootstrap} answers ({len(topics)} topics)")]
    if args.path:
        from msgindex.cli.lookup import index_topics

        with open_store_of(args) as store:
            held = index_topics(store)
        missing = sorted(set(held) - set(topics))
        checks.append(Check("index topics in Kafka", not missing,
                            f"all {len(held)} topics of the index exist" if not missing else
                            f"Kafka at {bootstrap} has no topic {', '.join(missing)} (the index holds messages of them)",
                            "payloads (--values, fetchValues, the page) come from the cluster the index was built "
                            "from: give its --bootstrap-servers"))
    return checks


def _index(args: argparse.Namespace) -> Check:
    from msgindex.storage.maintenance.inspect import inspect_path, inspect_store, problems_of
    from msgindex.times import format_window

    path = args.path
    if is_object_store_url(path):
        report = inspect_path(path, verify=False, storage_options=storage_options(args))
    else:  # (a store, not any file inspect knows: "no such msgindex store" names what is missing)
        report = inspect_store(Path(path).absolute(), verify=False)
    shards = report["shards"]
    # a local shard lists segments, an object-store shard its newest version's chunks: both carry
    # "topics" lists and "time_range"s somewhere below the shard
    topics = sorted({topic for held in _values_under(shards, "topics") for topic in held})
    ranges = [found for found in _values_under(shards, "time_range") if found]
    window = format_window(min(r["min_ms"] for r in ranges), max(r["max_ms"] for r in ranges)) if ranges else "empty"
    problems = problems_of(report)
    found = (f"{path}: {len(shards)} shard(s), {report['records']:,} messages, topics {', '.join(topics) or 'none'}; "
             f"{window}")
    if problems:
        return Check("index", False, f"{found}; {problems[0]}", f"msgindex inspect {path} lists every problem")
    return Check("index", True, found)


def _values_under(report: Any, key: str) -> list[Any]:
    """Every value stored under `key` anywhere in a JSON-like report."""
    if isinstance(report, dict):
        return [value for name, child in report.items()
                for value in ([child] if name == key else _values_under(child, key))]
    if isinstance(report, list):
        return [value for child in report for value in _values_under(child, key)]
    return []


def _spark(args: argparse.Namespace, master: str | None, remote: str | None) -> list[Check]:
    from pyspark.sql import SparkSession

    from msgindex.spark.runtime.worker_python import probe_workers

    builder = SparkSession.builder.appName("msgindex-doctor")
    if remote:
        builder = builder.remote(remote)
    else:  # a session as the user's, without its progress bars in this report
        builder = builder.config("spark.ui.showConsoleProgress", "false")
        if master:
            builder = builder.master(master)
    spark = builder.getOrCreate()
    if not remote:
        spark.sparkContext.setLogLevel("ERROR")
    try:
        name = remote or spark.sparkContext.master
        checks = []
        workers = probe_workers(spark)
        missing = [w for w in workers if w.msgindex is None]
        shown = "; ".join(f"{w.python} on {w.host}: " + (f"msgindex {w.msgindex}" if w.msgindex else w.detail)
                          for w in workers)
        checks.append(Check(f"Spark ({name}) workers", not missing, shown,
                            "install msgindex for that Python, or point PYSPARK_PYTHON (spark.pyspark.python on a "
                            "cluster) at a Python that has it"))
        path = args.path
        with tempfile.TemporaryDirectory(prefix="msgindex-doctor-") as empty:
            target = path if path is None or is_object_store_url(path) else os.path.abspath(path)
            if target is None:
                from msgindex.storage.store import open_store

                open_store(os.path.join(empty, "index"), create=True).close()
                target = os.path.join(empty, "index")
            try:
                reader = spark.read.format("msgindex")
                for name_, value in (storage_options(args) or {}).items():
                    reader = reader.option(STORAGE_OPTION_PREFIX + name_, value)
                rows = reader.load(target).limit(5).collect()
                checks.append(Check(f"Spark ({name}) format(\"msgindex\")", True,
                                    f"reads {'the index' if path else 'an empty index'} ({len(rows)} of the first 5 rows)"))
            except Exception as error:
                line = _first_line(error)
                checks.append(Check(f"Spark ({name}) format(\"msgindex\")", False, line,
                                    "see the workers' Python above" if "DATA_SOURCE_NOT_FOUND" in line else ""))
        return checks
    finally:
        if not remote:
            spark.stop()


def _first_line(error: BaseException) -> str:
    from msgindex.cli.failure import explain

    return explain(error).line
