"""Issue 5's benchmark: key lookups through Spark, msgindex vs Spark's batch ``kafka`` read.

The same N messages (keys ``user-<k>``, one key per message, 10 messages per key by default) go
into a real Kafka topic and into a msgindex store built directly with the store writer from the
same formulas: message i is in partition i % partitions at offset i // partitions, because one
producer writes each partition in order (a small Java producer, ``bench/java/BenchProducer.java``:
kafka-python manages ~10k msg/s on this machine, the Java client ~75k); the end offsets are
checked. Then, in one SparkSession and one run, after an untimed warm-up of each path:

* one key:    ``spark.read.format("msgindex").load(store).where(key = K)``
              vs ``spark.read.format("kafka")...load().where(key = K)`` (what a user does today)
* 1000 keys:  ``where key IN (...)`` on both.

Both sides must return the same (partition, offset) set, so the comparison is on equal answers.
Prints absolute seconds and the ratios (baseline / msgindex), and Spark's own floor in the same
session: a trivial JVM job (``spark.range(1).collect()``) and a trivial Python one
(``mapInArrow`` over one row), what any query, and any Python data source read, costs at least.
``--conf KEY=VALUE`` (repeatable) adds Spark settings to the session, to measure their effect.

    .venv/bin/python bench/bench_spark_lookup.py --messages 10000000
    .venv/bin/python bench/bench_spark_lookup.py --messages 200000 --bootstrap 127.0.0.1:9092
    .venv/bin/python bench/bench_spark_lookup.py --messages 1000000 --conf spark.python.unix.domain.socket.enabled=true
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa

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
def build_store(root: Path, topic: str, partitions: int, messages: int, cardinality: int, value_bytes: int) -> float:
    from msgindex.storage.message import APPEND_SCHEMA
    from msgindex.storage.store import open_store

    started = time.perf_counter()
    with open_store(root, create=True) as store, store.writer(SHARD) as writer:
        for batch_id, start in enumerate(range(0, messages, APPEND_ROWS)):
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


# --- the measurement -----------------------------------------------------------------------------
def timed(action) -> tuple[float, object]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def msgindex_ids(spark, root: Path, condition) -> set:
    df = spark.read.format("msgindex").load(str(root)).where(condition)  # fresh load per query
    return {(r.partition, r.offset) for r in df.select("partition", "offset").collect()}


def kafka_ids(spark, bootstrap: str, topic: str, condition, ending: str = "latest") -> set:
    df = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", topic).option("startingOffsets", "earliest")
          .option("endingOffsets", ending).load()
          .selectExpr("CAST(key AS STRING) AS key", "partition", "offset").where(condition))
    return {(r.partition, r.offset) for r in df.select("partition", "offset").collect()}


def _pass_through(batches):
    yield from batches


def spark_floor(spark) -> dict[str, object]:
    """The cheapest queries Spark runs: the fixed cost under every lookup."""
    return {
        "spark.range(1).collect()": lambda: spark.range(1).collect(),
        "mapInArrow over 1 row": lambda: spark.range(1).mapInArrow(_pass_through, "id long").collect(),
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
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--cardinality", type=int, default=0, help="distinct keys (default: messages / 10)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--lookup-keys", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each msgindex lookup (median)")
    parser.add_argument("--kafka-repeat", type=int, default=2, help="runs of each Kafka scan (best)")
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting a local broker")
    parser.add_argument("--workdir", help="where the store and broker data go (default: a temp dir)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra Spark setting for the session (repeatable)")
    args = parser.parse_args(argv)
    cardinality = args.cardinality or max(args.messages // 10, 1)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="msgindex-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    broker = None
    try:
        bootstrap = args.bootstrap
        if bootstrap is None:
            from msgindex.kafka.broker import LocalBroker, free_port

            broker = LocalBroker(workdir / "kafka", port=free_port(), controller_port=free_port(), heap="1g")
            bootstrap = broker.start(timeout=180)
        from msgindex.kafka.admin import create_topics

        create_topics(bootstrap, {topic: args.partitions})
        print(f"messages={args.messages:,} keys={cardinality:,} partitions={args.partitions} "
              f"value={args.value_bytes}B topic={topic}", flush=True)
        produce_s = produce(bootstrap, topic, args.partitions, args.messages, cardinality, args.value_bytes)
        print(f"produce to Kafka (Java producer):                {produce_s:8.1f} s "
              f"({args.messages / produce_s:,.0f} msg/s)", flush=True)
        store_root = workdir / "store"
        build_s = build_store(store_root, topic, args.partitions, args.messages, cardinality, args.value_bytes)
        print(f"build msgindex store (store writer):             {build_s:8.1f} s "
              f"({args.messages / build_s:,.0f} msg/s)", flush=True)

        from msgindex.spark.session import build_spark_session

        extra_conf = parse_conf(args.conf)
        spark = build_spark_session(app_name="bench-spark-lookup", extra_conf=extra_conf)
        from msgindex.spark.datasource import MsgIndexDataSource

        spark.dataSource.register(MsgIndexDataSource)  # also found without this once installed
        rng = np.random.default_rng(1)
        one = f"user-{int(rng.integers(cardinality))}"
        many = [f"user-{k}" for k in rng.choice(cardinality, size=min(args.lookup_keys, cardinality), replace=False)]
        one_cond = f"key = '{one}'"
        many_cond = "key IN (" + ",".join(f"'{k}'" for k in many) + ")"

        # untimed warm-up of both paths and both query shapes (JVM code, Python workers, Kafka
        # consumers); the Kafka warm-up reads one record per partition
        msgindex_ids(spark, store_root, one_cond)
        msgindex_ids(spark, store_root, many_cond)
        first_records = json.dumps({topic: {str(p): 1 for p in range(args.partitions)}})
        kafka_ids(spark, bootstrap, topic, many_cond, ending=first_records)
        floor = spark_floor(spark)
        for action in floor.values():
            action()
        floor_runs = {name: [timed(action)[0] for _ in range(args.repeat)] for name, action in floor.items()}
        one_runs = [timed(lambda: msgindex_ids(spark, store_root, one_cond)) for _ in range(args.repeat)]
        many_runs = [timed(lambda: msgindex_ids(spark, store_root, many_cond)) for _ in range(args.repeat)]
        # best of --kafka-repeat: the first scan may read from disk, later ones from the page cache
        kafka_one_runs = [timed(lambda: kafka_ids(spark, bootstrap, topic, one_cond)) for _ in range(args.kafka_repeat)]
        kafka_many_runs = [timed(lambda: kafka_ids(spark, bootstrap, topic, many_cond)) for _ in range(args.kafka_repeat)]
        kafka_one_s, kafka_one = min(kafka_one_runs, key=lambda run: run[0])
        kafka_many_s, kafka_many = min(kafka_many_runs, key=lambda run: run[0])
        for name, mine, theirs in (("1 key", one_runs[0][1], kafka_one), ("many keys", many_runs[0][1], kafka_many)):
            if mine != theirs:
                raise SystemExit(
                    f"{name}: msgindex found {len(mine)} messages, the Kafka scan {len(theirs)} "
                    f"(only msgindex: {sorted(mine - theirs)[:5]}, only Kafka: {sorted(theirs - mine)[:5]}); "
                    f"not the same answer, so no comparison")
        idx_one = statistics.median(t for t, _ in one_runs)
        idx_many = statistics.median(t for t, _ in many_runs)
        print(f"\n{'lookup':<12}{'rows':>8}{'msgindex s':>12}{'kafka scan s':>14}{'ratio':>10}")
        print(f"{'1 key':<12}{len(kafka_one):>8}{idx_one:>12.3f}{kafka_one_s:>14.2f}{kafka_one_s / idx_one:>9.0f}x")
        print(f"{f'{len(many)} keys':<12}{len(kafka_many):>8}{idx_many:>12.3f}{kafka_many_s:>14.2f}"
              f"{kafka_many_s / idx_many:>9.0f}x")
        for name, runs in floor_runs.items():
            print(f"{'floor':<12}{'':>8}{statistics.median(runs):>12.3f}   Spark's {name}")
        print(f"(msgindex and floor: median of {args.repeat} runs; Kafka scan: best of {args.kafka_repeat} "
              f"[{', '.join(f'{t:.1f}' for t, _ in kafka_one_runs + kafka_many_runs)} s]; after an untimed "
              f"warm-up of each; same SparkSession, {spark.sparkContext.master}"
              f"{', extra conf ' + str(extra_conf) if extra_conf else ''})")
        spark.stop()
    finally:
        if broker is not None:
            broker.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
