"""Issue 14's benchmark: the messages of many keys at once (a DataFrame of keys), three ways, in one
SparkSession and one run, on the same data:

* msgindex:  ``msgindex.spark.lookup_keys(keys, store)``: the keys collected and shipped to the
             tasks (no shuffle below its ``max_collected_keys``), each looking its slice up in
             the store with the many-key lookup; and again with ``columns=`` naming the columns
             the aggregate reads (Spark prunes the Parquet scan to them, not a Python function's);
* kafka:     what a user does today: Spark's ``kafka`` source, a full batch scan of the topic,
             joined with the keys (``CAST(key AS STRING)``, Spark's own join strategy);
* parquet:   the same join against a Parquet copy of the metadata (key, topic, partition, offset,
             timestamp; zstd; what the storage issue compares the log with).

The data are ``bench_spark_lookup.py``'s (same generator, Java producer, store writer): message i
is in partition i % partitions at offset i // partitions with key ``user-<key_of(i)>``. The asked
keys are a random sample of the key space. Every method computes the same aggregate in Spark:
row count and the sum of ``xxhash64(key, partition, offset)`` over the (asked key, message) pairs;
all must be equal, so the comparison is on equal answers. Timed: that aggregate, after an
untimed warm-up of each method; msgindex (both) and parquet: median of ``--repeat`` runs, kafka: best of
``--kafka-repeat`` (a full scan takes tens of seconds).

    .venv/bin/python bench/bench_bulk_lookup.py                                  # 10M messages, 100k keys
    .venv/bin/python bench/bench_bulk_lookup.py --messages 1000000 --lookup-keys 10000   # quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bench_spark_lookup import add_data_arguments, bench_data, key_of, timestamp_of

PARQUET_FILES = 8
PARQUET_ROWS = 1_000_000  # per write call


def build_parquet(root: Path, topic: str, partitions: int, messages: int, cardinality: int) -> float:
    """The metadata as zstd Parquet files, from the same formulas as the topic and the store."""
    started = time.perf_counter()
    root.mkdir(parents=True)
    per_file = -(-messages // PARQUET_FILES)
    for number, file_start in enumerate(range(0, messages, per_file)):
        file_end = min(file_start + per_file, messages)
        with pq.ParquetWriter(root / f"part-{number:03d}.parquet", pa.schema([
            ("key", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
            ("offset", pa.int64()), ("timestamp", pa.timestamp("ms", tz="UTC")),
        ]), compression="zstd") as writer:
            for start in range(file_start, file_end, PARQUET_ROWS):
                ids = np.arange(start, min(start + PARQUET_ROWS, file_end), dtype=np.int64)
                writer.write_table(pa.table({
                    "key": pa.array([f"user-{k}" for k in key_of(ids, cardinality).tolist()], pa.string()),
                    "topic": pa.array([topic] * len(ids), pa.string()),
                    "partition": pa.array((ids % partitions).astype(np.int32)),
                    "offset": pa.array(ids // partitions),
                    "timestamp": pa.array(timestamp_of(ids, messages), pa.timestamp("ms", tz="UTC")),
                }))
    return time.perf_counter() - started


def answer(df) -> tuple[int, int]:
    """(rows, sum of xxhash64(key, partition, offset)) of a (key, partition, offset) DataFrame."""
    from pyspark.sql import functions as F

    row = df.agg(F.count(F.lit(1)).alias("n"),
                 F.sum(F.xxhash64("key", "partition", "offset").cast("decimal(38,0)")).alias("h")).collect()[0]
    return row.n, row.h or 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(parser, lookup_keys=100_000)
    parser.add_argument("--num-partitions", type=int, default=None,
                        help="lookup_keys tasks (default: Spark's adaptive choice)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of msgindex and parquet (median)")
    parser.add_argument("--kafka-repeat", type=int, default=2, help="runs of the Kafka scan (best)")
    args = parser.parse_args(argv)
    cardinality = args.cardinality or max(args.messages // 10, 1)
    with bench_data(args, cardinality, "bulk") as data:
        bootstrap, topic, store_root, workdir = data.bootstrap, data.topic, data.store, data.workdir
        print(f"asked keys={args.lookup_keys:,}", flush=True)
        parquet_root = workdir / f"parquet-{topic}"
        parquet_s = build_parquet(parquet_root, topic, args.partitions, args.messages, cardinality)
        print(f"write Parquet copy (pyarrow, zstd):   {parquet_s:8.1f} s", flush=True)

        from msgindex.spark import enable_pushdown, lookup_keys
        from msgindex.spark.runtime.session import build_spark_session

        spark = build_spark_session(app_name="bench-bulk-lookup")
        enable_pushdown(spark)
        rng = np.random.default_rng(2)
        asked = rng.choice(cardinality, size=min(args.lookup_keys, cardinality), replace=False)
        keys = spark.createDataFrame(pa.table({"key": pa.array([f"user-{k}" for k in asked.tolist()])}))
        keys = keys.cache()
        keys.count()

        def msgindex_df():
            return lookup_keys(keys, str(store_root), num_partitions=args.num_partitions) \
                .selectExpr("lookup_key AS key", "partition", "offset")

        def msgindex_columns_df():  # the columns the query reads named, as Spark prunes the Parquet scan's
            return lookup_keys(keys, str(store_root), num_partitions=args.num_partitions,
                               columns=["partition", "offset"]).selectExpr("lookup_key AS key", "partition", "offset")

        def kafka_df():
            return (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                    .option("subscribe", topic).option("startingOffsets", "earliest")
                    .option("endingOffsets", "latest").load()
                    .selectExpr("CAST(key AS STRING) AS key", "partition", "offset").join(keys, "key"))

        def parquet_df():
            return spark.read.parquet(str(parquet_root)).select("key", "partition", "offset").join(keys, "key")

        methods = {"msgindex": msgindex_df, "columns": msgindex_columns_df, "parquet": parquet_df, "kafka": kafka_df}
        runs: dict[str, list[tuple[float, tuple[int, int]]]] = {}
        for name, make in methods.items():
            answer(make())  # untimed warm-up (the Kafka one reads the whole topic once: page cache)
            repeat = args.kafka_repeat if name == "kafka" else args.repeat
            runs[name] = []
            for _ in range(repeat):
                started = time.perf_counter()
                result = answer(make())
                runs[name].append((time.perf_counter() - started, result))
            print(f"{name:<9} {[round(t, 2) for t, _ in runs[name]]} s", flush=True)
        answers = {name: {result for _, result in method_runs} for name, method_runs in runs.items()}
        if len({frozenset(a) for a in answers.values()}) != 1 or len(answers["msgindex"]) != 1:
            raise SystemExit(f"the methods disagree (rows, hash): {answers}; not the same answer, so no comparison")
        rows = next(iter(answers["msgindex"]))[0]
        seconds = {name: (min if name == "kafka" else statistics.median)(t for t, _ in method_runs)
                   for name, method_runs in runs.items()}
        print(f"\n{len(asked):,} keys, {rows:,} (key, message) rows, same answer from all four")
        print(f"{'method':<40}{'seconds':>9}{'msgindex is':>14}{'with columns=':>15}")
        labels = {"msgindex": "msgindex lookup_keys", "columns": "msgindex lookup_keys, columns=",
                  "kafka": "join with a full kafka scan", "parquet": "join with a Parquet copy"}
        for name in ("msgindex", "columns", "kafka", "parquet"):
            ratios = "" if name in ("msgindex", "columns") else \
                f"{seconds[name] / seconds['msgindex']:>13.1f}x{seconds[name] / seconds['columns']:>14.1f}x"
            print(f"{labels[name]:<40}{seconds[name]:>9.2f}{ratios}")
        print(f"(msgindex, both, and parquet: median of {args.repeat}; kafka: best of {args.kafka_repeat}; "
              f"after an untimed warm-up of each; same SparkSession, {spark.sparkContext.master}; "
              f"ratio = other method's seconds / msgindex's)")
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
