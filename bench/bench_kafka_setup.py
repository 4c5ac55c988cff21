"""Benchmark: what "real Kafka everywhere" costs on this machine (issue 3's figures).

(1) Jar staging (the local broker's kafka_2.13 + log4j2 binding, and Spark's Kafka connector):
    cold = empty Maven repository (``-Dmaven.repo.local`` to a temp dir) and a fresh MSGINDEX_HOME,
    i.e. a fresh machine; warm-m2 = fresh MSGINDEX_HOME but the user's ``~/.m2`` (what deleting
    ``.msgindex/`` costs); cached = everything staged already (every later run). Baseline: cached.
(2) Local KRaft broker: first start (storage format + start, to a successful admin call), restarts
    of the same data dir, stop (SIGTERM, clean shutdown). Baseline: a bare ``java -version``.
(3) SparkSession start in a fresh process: ``build_spark_session()`` (connector jars on spark.jars,
    first query ``spark.range(1).count()``) vs a plain ``SparkSession.builder.master("local[2]")``
    session running the same query; plus a batch read of N records from Kafka with Spark's `kafka`
    source.

Run:  .venv/bin/python bench/bench_kafka_setup.py            (add --skip-cold to keep ~/.m2 only)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGE_ALL = ("from msgindex.kafka.broker import broker_jars; "
             "from msgindex.spark.runtime.session import kafka_connector_jars; "
             "print(len(broker_jars()), len(kafka_connector_jars()))")

SPARK_TIMING = """
import json, sys, time
began = time.perf_counter()
if sys.argv[1] == "msgindex":
    from msgindex.spark.runtime.session import build_spark_session
    spark = build_spark_session(app_name="bench")
else:
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.master("local[2]").appName("bench").getOrCreate()
spark.range(1).count()
ready = time.perf_counter() - began
result = {"start_s": ready}
if sys.argv[1] == "msgindex" and len(sys.argv) > 2:
    began = time.perf_counter()
    rows = (spark.read.format("kafka").option("kafka.bootstrap.servers", sys.argv[2])
            .option("subscribe", sys.argv[3]).option("startingOffsets", "earliest")
            .option("endingOffsets", "latest").option("includeHeaders", "true").load()
            .selectExpr("key", "headers", "partition", "offset").collect())
    result.update(read_s=time.perf_counter() - began, rows=len(rows))
spark.stop()
print(json.dumps(result))
"""


def _timed(argv: list[str], env: dict | None = None) -> tuple[float, str]:
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return time.perf_counter() - began, done.stdout


def bench_staging(scratch: Path, skip_cold: bool) -> None:
    print("== jar staging (broker + Spark connector) ==")
    base = dict(os.environ)
    cached, _ = _timed([sys.executable, "-c", STAGE_ALL])
    cached, _ = _timed([sys.executable, "-c", STAGE_ALL])  # the first call may have staged
    rows = [("cached (every later run)", cached)]
    warm = dict(base, MSGINDEX_HOME=str(scratch / "home-warm"))
    rows.append(("fresh .msgindex, warm ~/.m2", _timed([sys.executable, "-c", STAGE_ALL], warm)[0]))
    if not skip_cold:
        cold = dict(base, MSGINDEX_HOME=str(scratch / "home-cold"),
                    MAVEN_OPTS=f"{base.get('MAVEN_OPTS', '')} -Dmaven.repo.local={scratch / 'm2'}".strip())
        rows.append(("cold: fresh .msgindex, empty Maven repo", _timed([sys.executable, "-c", STAGE_ALL], cold)[0]))
    for label, seconds in rows:
        print(f"  {label:<42} {seconds:8.2f} s   x{seconds / cached:7.1f} vs cached")


def bench_broker(scratch: Path, restarts: int, records: int) -> tuple[object, str]:
    from msgindex.kafka.admin import OutgoingRecord, create_topics, produce
    from msgindex.kafka.broker import LocalBroker, free_port

    print("== local KRaft broker (start = until a kafka-python admin call succeeds) ==")
    java, _ = _timed(["java", "-version"])
    broker = LocalBroker(scratch / "kafka", port=free_port(), controller_port=free_port())
    began = time.perf_counter()
    bootstrap = broker.start()
    first = time.perf_counter() - began
    starts, stops = [], []
    for _ in range(restarts):
        began = time.perf_counter()
        broker.stop()
        stops.append(time.perf_counter() - began)
        began = time.perf_counter()
        broker.start()
        starts.append(time.perf_counter() - began)
    print(f"  {'bare `java -version` (baseline)':<42} {java:8.2f} s")
    print(f"  {'first start (format + start)':<42} {first:8.2f} s   x{first / java:7.1f} vs java -version")
    print(f"  {f'restart, median of {restarts}':<42} {statistics.median(starts):8.2f} s   "
          f"x{statistics.median(starts) / java:7.1f} vs java -version  (min {min(starts):.2f}, max {max(starts):.2f})")
    print(f"  {f'stop (SIGTERM), median of {restarts}':<42} {statistics.median(stops):8.2f} s")
    topic = create_topics(bootstrap, {"bench-read": 3})[0]
    began = time.perf_counter()
    produce(bootstrap, topic, (OutgoingRecord(key=f"key-{i}", value=b"x" * 100, keys=(f"k{i}", "shared"),
                                              uniq_key=f"U{i}") for i in range(records)))
    print(f"  {f'produce {records} records (kafka-python)':<42} {time.perf_counter() - began:8.2f} s")
    return broker, topic


def bench_spark(bootstrap: str, topic: str, records: int) -> None:
    print("== SparkSession start in a fresh process (until spark.range(1).count() returns) ==")
    plain, out = _timed([sys.executable, "-c", SPARK_TIMING, "plain"])
    plain_start = json.loads(out.strip().splitlines()[-1])["start_s"]
    ours, out = _timed([sys.executable, "-c", SPARK_TIMING, "msgindex", bootstrap, topic])
    result = json.loads(out.strip().splitlines()[-1])
    assert result["rows"] == records, result
    print(f"  {'plain SparkSession (baseline)':<42} {plain_start:8.2f} s   (process total {plain:.2f} s)")
    print(f"  {'build_spark_session (connector jars)':<42} {result['start_s']:8.2f} s   "
          f"x{result['start_s'] / plain_start:7.2f} vs plain   (process total {ours:.2f} s)")
    print(f"  {f'spark kafka batch read of {records} rows':<42} {result['read_s']:8.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-cold", action="store_true", help="skip staging into an empty Maven repo")
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--records", type=int, default=10_000)
    args = parser.parse_args()
    one, five, fifteen = os.getloadavg()
    print(f"load average at start: {one:.1f} {five:.1f} {fifteen:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="msgindex-bench-kafka-") as scratch:
        bench_staging(Path(scratch), args.skip_cold)
        broker, topic = bench_broker(Path(scratch), args.restarts, args.records)
        try:
            bench_spark(broker.bootstrap, topic, args.records)
        finally:
            broker.stop()
    one, five, fifteen = os.getloadavg()
    print(f"load average at end: {one:.1f} {five:.1f} {fifteen:.1f}")


if __name__ == "__main__":
    main()
