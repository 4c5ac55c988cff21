"""Issue 5's benchmark: key lookups through Spark, msgindex vs Spark's batch ``kafka`` read.

The same N messages (keys ``user-<k>``, one key per message, 10 messages per key by default) go
into a real Kafka topic and into a msgindex store built directly with the store writer from the
same formulas: message i is in partition i % partitions at offset i // partitions, because one
producer writes each partition in order (a small Java producer, ``bench/java/BenchProducer.java``:
kafka-python manages ~10k msg/s on this machine, the Java client ~75k); the end offsets are
checked. Then, in one SparkSession and one run, after an untimed warm-up of each path:

* one key:    ``spark.read.format("msgindex").load(store).where(key = K)`` (after
              ``enable_pushdown``) vs ``spark.read.format("kafka")...load().where(key = K)`` (what
              a user does today)
* 1000 keys:  ``where key IN (...)`` on both.

Unless ``--no-object-store``, the same store is also written into an S3 bucket (moto's server in
its own process on loopback, ``AWS_*`` set for Spark's Python workers) and the same msgindex
queries run on ``load("s3://bench/store")`` in the same rounds ("s3" rows; goal: one key <= 1.5x
the floor).

Both sides must return the same (partition, offset) set, so the comparison is on equal answers.
Prints absolute seconds and the ratios (baseline / msgindex), and Spark's own floor in the same
session: a trivial JVM job (``spark.range(1).collect()``), a trivial Python one (``mapInArrow``
over one row) and **a Python data source that reads one row**, what any Python data source read
costs at least; each msgindex query (``where`` and the same lookup through the ``key``/``keys``
options) is printed as a multiple of that floor. Goals: 1 key <= 1.25x, 1000 keys <= 2x.
``--conf KEY=VALUE`` (repeatable) adds Spark settings to the session, to measure their effect;
``--no-kafka`` skips the Kafka scans (floor ratios only: quick).

    .venv/bin/python bench/bench_spark_lookup.py --messages 10000000
    .venv/bin/python bench/bench_spark_lookup.py --messages 200000 --bootstrap 127.0.0.1:9092
    .venv/bin/python bench/bench_spark_lookup.py --messages 1000000 --conf spark.python.unix.domain.socket.enabled=true
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from moto_s3 import add_object_store_flag
from pyspark.sql.datasource import DataSource, DataSourceReader

SPAN_MS = 3_600_000  # messages are spread over the last hour (older ones: Kafka's retention deletes them)
BASE_MS = int(time.time() * 1000) - SPAN_MS
SHARD = "broker-0"  # one local broker: one shard
APPEND_ROWS = 250_000


def key_of(i: np.ndarray | int, cardinality: int) -> np.ndarray | int:
    """The key number of message i: a fixed permutation, so a key's messages are spread out."""
    return (np.asarray(i, dtype=np.int64) * 7_919 + 13) % cardinality


def timestamp_of(i: np.ndarray, messages: int) -> np.ndarray:
    return BASE_MS + (np.asarray(i, dtype=np.int64) * SPAN_MS) // max(messages, 1)


# --- Kafka ---------------------------------------------------------------------------------------
def produce(bootstrap: str, topic: str, partitions: int, messages: int, cardinality: int,
            value_bytes: int) -> float:
    """Produce with a small Java producer (bench/java/BenchProducer.java, compiled against the
    staged Kafka jars): a Python client manages ~10k msg/s here, far too slow for 10M. Returns
    seconds, after checking every partition's end offset matches the generator."""
    import subprocess

    from msgindex.jvm import compile_java, java_command
    from msgindex.kafka.broker import broker_jars

    jars = broker_jars()
    classes = compile_java("bench-producer", Path(__file__).resolve().parent / "java", jars)
    argv = java_command([classes, *jars], "BenchProducer", bootstrap, topic, str(partitions), str(messages),
                        str(cardinality), str(value_bytes), str(BASE_MS), str(SPAN_MS), heap="512m")
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    from msgindex.kafka.admin import latest_offsets

    ends = latest_offsets(bootstrap, [topic])
    expected = {p: len(range(p, messages, partitions)) for p in range(partitions)}
    got = {partition: offset for (_, partition), offset in ends.items()}
    if got != expected:
        raise SystemExit(f"end offsets {got} differ from the generator's {expected}: not the same data")
    return elapsed


# --- msgindex store ------------------------------------------------------------------------------
def build_store(root: Path | str, topic: str, partitions: int, messages: int, cardinality: int, value_bytes: int,
                storage_options: dict | None = None) -> float:
    from msgindex.storage.message import APPEND_SCHEMA
    from msgindex.storage.store import open_store

    started = time.perf_counter()
    with open_store(root, create=True, storage_options=storage_options) as store, store.writer(SHARD) as writer:
        for start in range(0, messages, APPEND_ROWS):
            ids = np.arange(start, min(start + APPEND_ROWS, messages), dtype=np.int64)
            keys = pa.array([f"user-{k}" for k in key_of(ids, cardinality).tolist()], pa.string())
            n = len(ids)
            table = pa.Table.from_arrays([
                pa.array([topic] * n, pa.string()),
                pa.array((ids % partitions).astype(np.int32)),
                pa.array(ids // partitions),
                pa.array(timestamp_of(ids, messages)),
                keys,
                pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), keys,
                                         type=APPEND_SCHEMA.field("keys").type),
                pa.array(np.full(n, -1, np.int64)),
                pa.array(np.full(n, value_bytes, np.int32)),
            ], schema=APPEND_SCHEMA)
            writer.append(table)
    return time.perf_counter() - started


def add_data_arguments(parser: argparse.ArgumentParser, lookup_keys: int) -> None:
    """The flags of the data set (``bench_data``) and of how many keys are asked for."""
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--cardinality", type=int, default=0, help="distinct keys (default: messages / 10)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--lookup-keys", type=int, default=lookup_keys)
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting a local broker")
    parser.add_argument("--workdir", help="where the store and broker data go (default: a temp dir)")


@dataclass(frozen=True)
class BenchData:
    """The benchmark's messages, in Kafka (unless skipped) and in a msgindex store."""

    bootstrap: str | None
    topic: str
    store: Path
    workdir: Path


@contextlib.contextmanager
def bench_data(args: argparse.Namespace, cardinality: int, prefix: str, kafka: bool = True) -> Iterator[BenchData]:
    """Produce the messages (a local broker unless ``args.bootstrap``) and build the store from
    the same formulas; the broker is stopped and a temp workdir removed afterwards."""
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix=f"msgindex-{prefix}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    broker = None
    try:
        bootstrap = args.bootstrap
        print(f"messages={args.messages:,} keys={cardinality:,} partitions={args.partitions} "
              f"value={args.value_bytes}B topic={topic}", flush=True)
        if kafka:
            if bootstrap is None:
                from msgindex.kafka.broker import LocalBroker, free_port

                broker = LocalBroker(workdir / "kafka", port=free_port(), controller_port=free_port(), heap="1g")
                bootstrap = broker.start(timeout=180)
            from msgindex.kafka.admin import create_topics

            create_topics(bootstrap, {topic: args.partitions})
            produce_s = produce(bootstrap, topic, args.partitions, args.messages, cardinality, args.value_bytes)
            print(f"produce to Kafka (Java producer):                {produce_s:8.1f} s "
                  f"({args.messages / produce_s:,.0f} msg/s)", flush=True)
        store_root = workdir / "store"
        # a store left in a reused --workdir holds an earlier run's topic under the same keys
        shutil.rmtree(store_root, ignore_errors=True)
        build_s = build_store(store_root, topic, args.partitions, args.messages, cardinality, args.value_bytes)
        print(f"build msgindex store (store writer):             {build_s:8.1f} s "
              f"({args.messages / build_s:,.0f} msg/s)", flush=True)
        yield BenchData(bootstrap, topic, store_root, workdir)
    finally:
        if broker is not None:
            broker.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


# --- the measurement -----------------------------------------------------------------------------
def timed(action) -> tuple[float, object]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def msgindex_ids(spark, root: Path, condition) -> set:
    df = spark.read.format("msgindex").load(str(root)).where(condition)  # fresh load per query
    return {(r.partition, r.offset) for r in df.select("partition", "offset").collect()}


def msgindex_option_ids(spark, root: Path, keys: list[str]) -> set:
    reader = spark.read.format("msgindex")
    reader = reader.option("key", keys[0]) if len(keys) == 1 else reader.option("keys", json.dumps(keys))
    return {(r.partition, r.offset) for r in reader.load(str(root)).select("partition", "offset").collect()}


def kafka_ids(spark, bootstrap: str, topic: str, condition, ending: str = "latest") -> set:
    df = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", topic).option("startingOffsets", "earliest")
          .option("endingOffsets", ending).load()
          .selectExpr("CAST(key AS STRING) AS key", "partition", "offset").where(condition))
    return {(r.partition, r.offset) for r in df.select("partition", "offset").collect()}


def _pass_through(batches):
    yield from batches


class OneRowSource(DataSource):
    """The cheapest Python data source: one partition, one row (Spark's floor for format(...))."""

    @classmethod
    def name(cls) -> str:
        return "bench_one_row"

    def schema(self) -> str:
        return "id long"

    def reader(self, schema) -> OneRowReader:
        return OneRowReader()


class OneRowReader(DataSourceReader):
    def read(self, partition):
        yield (1,)


FLOOR = "Python data source, 1 row"


def spark_floor(spark) -> dict[str, object]:
    """The cheapest queries Spark runs: the fixed cost under every lookup."""
    spark.dataSource.register(OneRowSource)
    return {
        "spark.range(1).collect()": lambda: spark.range(1).collect(),
        "mapInArrow over 1 row": lambda: spark.range(1).mapInArrow(_pass_through, "id long").collect(),
        FLOOR: lambda: spark.read.format(OneRowSource.name()).load().collect(),
    }


def parse_conf(items: list[str]) -> dict[str, str]:
    conf = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--conf {item!r}: expected KEY=VALUE")
        conf[name.strip()] = value.strip()
    return conf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(parser, lookup_keys=1000)
    parser.add_argument("--repeat", type=int, default=7, help="alternating rounds of the floor and each msgindex query (median)")
    parser.add_argument("--kafka-repeat", type=int, default=2, help="runs of each Kafka scan (best)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra Spark setting for the session (repeatable)")
    parser.add_argument("--no-kafka", action="store_true", help="skip the Kafka scans (floor ratios only)")
    add_object_store_flag(parser, "the queries on the same store in an S3 bucket")
    args = parser.parse_args(argv)
    cardinality = args.cardinality or max(args.messages // 10, 1)
    servers = None
    with bench_data(args, cardinality, "bench", kafka=not args.no_kafka) as data, contextlib.ExitStack() as cleanup:
        bootstrap, topic, store_root = data.bootstrap, data.topic, data.store
        s3_root = "s3://bench/store"
        if args.object_store:
            from moto_s3 import Servers

            servers = Servers()
            cleanup.callback(servers.stop)
            servers.create_bucket("bench")
            servers.export_env()  # before the session starts: its Python workers read AWS_*
            build_s = build_store(s3_root, topic, args.partitions, args.messages, cardinality, args.value_bytes,
                                  servers.options())
            print(f"build msgindex store in the bucket:              {build_s:8.1f} s "
                  f"({args.messages / build_s:,.0f} msg/s)", flush=True)
        from msgindex.spark import enable_pushdown
        from msgindex.spark.runtime.session import build_spark_session

        extra_conf = parse_conf(args.conf)
        spark = build_spark_session(app_name="bench-spark-lookup", extra_conf=extra_conf)
        enable_pushdown(spark)
        rng = np.random.default_rng(1)
        one = f"user-{int(rng.integers(cardinality))}"
        many = [f"user-{k}" for k in rng.choice(cardinality, size=min(args.lookup_keys, cardinality), replace=False)]
        one_cond = f"key = '{one}'"
        many_cond = "key IN (" + ",".join(f"'{k}'" for k in many) + ")"
        floor = spark_floor(spark)
        queries = {
            "1 key, where": lambda: msgindex_ids(spark, store_root, one_cond),
            "1 key, option": lambda: msgindex_option_ids(spark, store_root, [one]),
            f"{len(many)} keys, where": lambda: msgindex_ids(spark, store_root, many_cond),
            f"{len(many)} keys, option": lambda: msgindex_option_ids(spark, store_root, many),
        }
        if args.object_store:
            queries.update({
                "1 key, where, s3": lambda: msgindex_ids(spark, s3_root, one_cond),
                "1 key, option, s3": lambda: msgindex_option_ids(spark, s3_root, [one]),
                f"{len(many)} keys, where, s3": lambda: msgindex_ids(spark, s3_root, many_cond),
                f"{len(many)} keys, option, s3": lambda: msgindex_option_ids(spark, s3_root, many),
            })
        # untimed warm-up of every query (JVM code, Python workers); then rounds that alternate
        # the floor and the queries, so that the machine's load falls on both alike
        for action in [*floor.values(), *queries.values()]:
            action()
        runs: dict[str, list[tuple[float, object]]] = {name: [] for name in [*floor, *queries]}
        for _ in range(args.repeat):
            for name, action in [*floor.items(), *queries.items()]:
                runs[name].append(timed(action))
        answers = {name: {frozenset(r) for _, r in runs[name]} for name in queries}
        one_answer, many_answer = runs["1 key, where"][0][1], runs[f"{len(many)} keys, where"][0][1]
        for name, got in answers.items():
            if got != {frozenset(one_answer if name.startswith("1 key") else many_answer)}:
                raise SystemExit(f"{name}: answers differ between runs or from the where query")
        median = {name: statistics.median(t for t, _ in series) for name, series in runs.items()}
        floor_s = median[FLOOR]
        kafka = {}
        if not args.no_kafka:
            first_records = json.dumps({topic: {str(p): 1 for p in range(args.partitions)}})
            kafka_ids(spark, bootstrap, topic, many_cond, ending=first_records)  # warm-up
            # best of --kafka-repeat: the first scan may read from disk, later ones from the page cache
            for label, condition, mine in (("1 key", one_cond, one_answer),
                                           (f"{len(many)} keys", many_cond, many_answer)):
                scans = [timed(lambda: kafka_ids(spark, bootstrap, topic, condition)) for _ in range(args.kafka_repeat)]
                best_s, theirs = min(scans, key=lambda run: run[0])
                if mine != theirs:
                    raise SystemExit(
                        f"{label}: msgindex found {len(mine)} messages, the Kafka scan {len(theirs)} "
                        f"(only msgindex: {sorted(mine - theirs)[:5]}, only Kafka: {sorted(theirs - mine)[:5]}); "
                        f"not the same answer, so no comparison")
                kafka[label] = (best_s, [t for t, _ in scans])
        goals = {"1 key": 1.25, f"{len(many)} keys": 2.0, "1 key s3": 1.5}
        print(f"\n{'query':<26}{'rows':>8}{'seconds':>9}{'x floor':>9}{'goal':>7}"
              f"{'kafka scan s':>14}{'kafka/msgindex':>16}")
        for name in queries:
            label = name.split(",")[0]
            rows = len(runs[name][0][1])
            goal = goals.get(label + (" s3" if name.endswith(", s3") else ""))
            line = (f"{name:<26}{rows:>8}{median[name]:>9.3f}{median[name] / floor_s:>8.2f}x"
                    f"{('<=' + str(goal)) if goal else '':>7}")
            if label in kafka:
                line += f"{kafka[label][0]:>14.2f}{kafka[label][0] / median[name]:>15.0f}x"
            print(line)
        for name in floor:
            print(f"{'floor':<26}{'':>8}{median[name]:>9.3f}{median[name] / floor_s:>8.2f}x   Spark's {name}")
        kafka_all = [t for _, times in kafka.values() for t in times]
        print(f"(msgindex and floor: median of {args.repeat} alternating rounds after an untimed warm-up; "
              f"'x floor' = seconds / the {FLOOR!r} floor"
              + (f"; Kafka scan: best of {args.kafka_repeat} [{', '.join(f'{t:.1f}' for t in kafka_all)} s]"
                 if kafka else "")
              + f"; same SparkSession, {spark.sparkContext.master}"
              f"{', extra conf ' + str(extra_conf) if extra_conf else ''})")
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
