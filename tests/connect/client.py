"""Spark Connect client scenarios, run by ``tests/connect/conftest.py`` in processes of their own:

    python -m tests.connect.client SCENARIO sc://HOST:PORT '{"arg": ...}'

Each scenario gets a Connect session and its arguments, and returns something JSON-able, which is
printed as the last line of output."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any

IDS = ("broker", "topic", "partition", "offset")


def _ids(df) -> list[list]:
    return sorted([list(row) for row in df.select(*IDS).collect()])


def _plan(df) -> str:
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        df.explain("formatted")
    return captured.getvalue()


def _error(action) -> str:
    try:
        action()
    except Exception as error:  # the client's error, whatever class Connect wraps it in
        return str(error)
    return ""


def read(spark, store: str, window: list[int], edge_key: str, storage: dict[str, str] | None = None,
         field_store: str | None = None) -> dict[str, Any]:
    """format("msgindex") through Connect: options, where without and with pushdown, bad input.
    `storage`: an object store's client options, given to every read as storage.<name>;
    `field_store`: a store with fields, read as ``fields`` reads it (in this client's session)."""
    from msgindex.spark import enable_pushdown

    def load(path: str = store, **options):
        reader = spark.read.format("msgindex")
        for name, value in {**{f"storage.{k}": v for k, v in (storage or {}).items()}, **options}.items():
            reader = reader.option(name, value)
        return reader.load(path)

    result = {
        "key": _ids(load(key="Aa")),
        "keys_topics": _ids(load(keys=json.dumps(["AaAa", "BBBB", "ключ-ünï"]), topic="audit,payments")),
        "edge_window": _ids(load(key=edge_key, begin=str(window[0]), end=str(window[1]))),
        "where_unpushed": _ids(load().where("key = 'BBBB' AND partition = 2")),
        "where_unpushed_plan": _plan(load().where("key = 'BBBB'")),
        "bad_option": _error(lambda: load(colour="red").collect()),
        "bad_path": _error(lambda: load(store + "-missing").collect()),
    }
    enable_pushdown(spark)
    pushed = load().where("key = 'Aa' AND topic IN ('orders', 'audit')")
    result["where_pushed_plan"] = _plan(pushed)
    result["where_pushed"] = _ids(pushed)
    window_df = load().where(f"timestamp >= timestamp_millis({window[0]}) "
                             f"AND timestamp <= timestamp_millis({window[1]})")
    result["where_window"] = _ids(window_df)
    if field_store is not None:
        result["fields"] = fields(spark, field_store)
    return result


def fields(spark, store: str) -> dict[str, Any]:
    """Field columns through Connect (tests/datasource/test_field_columns.py): the schema, and a
    where on a field's column and on an array field's any_ column, pushed down."""
    from pyspark.sql import functions as F

    from msgindex.spark import enable_pushdown

    enable_pushdown(spark)
    df = spark.read.format("msgindex").load(store)
    pushed = spark.read.format("msgindex").load(store).where(
        F.col("order").isin("o-1", "o-2") & (F.col("any_trace") == "t-1") & (F.col("topic") == "orders"))
    return {"columns": df.columns, "plan": _plan(pushed),
            "rows": sorted([list(r) for r in pushed.select(*IDS, "order", "trace", "any_trace").collect()])}


def bulk(spark, store: str, keys: list[str | None], storage: dict[str, str] | None = None) -> dict[str, Any]:
    """lookup_keys through Connect, and its SQL recipe (`storage`: an object store's client options)."""
    from msgindex.spark import lookup_keys

    frame = spark.createDataFrame([(k,) for k in keys], "order_id string")
    found = lookup_keys(frame, store, key_col="order_id", num_partitions=2, storage_options=storage)
    rows = sorted([list(r) for r in found.select("lookup_key", *IDS).collect()])
    found.createOrReplaceTempView("incident_messages")
    counted = spark.sql("SELECT lookup_key, count(*) AS n FROM incident_messages GROUP BY lookup_key").collect()
    numbers = spark.createDataFrame([(1,)], "order_id bigint")
    pruned = lookup_keys(frame, store, key_col="order_id", columns=IDS, storage_options=storage)
    return {
        "rows": rows,
        "pruned": sorted([list(r) for r in pruned.collect()]),
        "pruned_columns": pruned.columns,
        "counts": {r.lookup_key: r.n for r in counted},
        "bad_type": _error(lambda: lookup_keys(numbers, store, key_col="order_id")),
    }


def empty_answers(spark, cases: list[dict], lookup_keys_store: str, keys: list[str]) -> dict[str, Any]:
    """Reads that must find nothing (tests/datasource/empty_answers.py), with pushdown on: rows
    per case, or the error; and lookup_keys of keys that are in no message."""
    from msgindex.spark import enable_pushdown, lookup_keys
    from tests.datasource.empty_answers import count_rows

    enable_pushdown(spark)
    result: dict[str, Any] = {}
    for case in cases:
        try:
            result[case["name"]] = count_rows(spark, case)
        except Exception as error:  # reported, not raised: the test names every case that fails
            result[case["name"]] = f"{type(error).__name__}: {str(error)[:300]}"
    frame = spark.createDataFrame([(k,) for k in keys], "k string")
    result["lookup_keys"] = lookup_keys(frame, lookup_keys_store, key_col="k").count()
    return result


def fetch(spark, store: str, key: str, bootstrap: str, storage: dict[str, str] | None = None) -> list[list]:
    """fetchValues through Connect: (partition, offset, value hex, [[header key, value hex]])."""
    reader = spark.read.format("msgindex").option("key", key).option("fetchValues", "true") \
        .option("kafka.bootstrap.servers", bootstrap)
    for name, value in (storage or {}).items():
        reader = reader.option(f"storage.{name}", value)
    from tests.packaging.plain_session import value_rows

    return value_rows(reader.load(store).collect())


def main(argv: list[str]) -> int:
    scenario, url, args = argv[1], argv[2], json.loads(argv[3])
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        result = globals()[scenario](spark, **args)
    finally:
        spark.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
