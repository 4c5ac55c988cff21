"""Run by ``tests/packaging`` with a Python of its own, the way a user runs their own job: a plain
``SparkSession.builder`` (never msgindex's builder), no register call, no msgindex environment
variable. Reads the index given as argument and prints one JSON object: each step's result, or
the error it raised. With FETCH (JSON: store, key, bootstrap) also a fetchValues read of that
index's key from Kafka.

    python plain_session.py STORE KEY [FETCH]
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

IDS = ("broker", "topic", "partition", "offset")


def step(results: dict, name: str, action) -> None:
    try:
        results[name] = action()
    except Exception as error:  # reported, not raised: the test decides what was expected
        results[name + "_error"] = f"{type(error).__name__}: {error}"[:3000]


def ids(df) -> list[list]:
    return sorted(list(row) for row in df.select(*IDS).collect())


def plan(df) -> str:
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        df.explain("formatted")
    return captured.getvalue()


def value_rows(rows) -> list[list]:
    """fetchValues rows as JSON: (partition, offset, value hex, [[header key, value hex]])."""
    return [[row.partition, row.offset, None if row.value is None else bytes(row.value).hex(),
             None if row.headers is None else [[h.key, bytes(h.value).hex()] for h in row.headers]] for row in rows]


def main(store: str, key: str, fetch: dict | None = None) -> int:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    results: dict = {}
    step(results, "where_msgindex_from", lambda: __import__("msgindex").__file__)
    step(results, "option", lambda: ids(spark.read.format("msgindex").option("key", key).load(store)))
    step(results, "where", lambda: ids(spark.read.format("msgindex").load(store).where(f"key = '{key}'")))

    def bulk():
        from msgindex.spark import lookup_keys

        return sorted(list(r) for r in lookup_keys(spark.createDataFrame([(key,)], "key string"), store)
                      .select("lookup_key", *IDS).collect())

    step(results, "bulk", bulk)

    def pushed():
        from msgindex.spark import enable_pushdown

        enable_pushdown(spark)
        df = spark.read.format("msgindex").load(store).where(f"key = '{key}'")
        return {"plan": plan(df), "ids": ids(df)}

    step(results, "pushed", pushed)

    def fetched():
        rows = (spark.read.format("msgindex").option("key", fetch["key"]).option("fetchValues", "true")
                .option("kafka.bootstrap.servers", fetch["bootstrap"]).load(fetch["store"]).collect())
        return value_rows(rows)

    if fetch is not None:
        step(results, "fetched", fetched)
    spark.stop()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]) if len(sys.argv) > 3 else None))
