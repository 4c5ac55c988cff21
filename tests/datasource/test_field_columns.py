"""Each field a store indexes is a column of ``spark.read.format("msgindex")`` (a string for a field
of one value, an array and its ``any_<name>`` lookup column for an array field), rendered from the
records' stored field terms in scans and lookups alike; ``where`` on it is the index lookup, with
the other filters, and intersects with key filters. Ground truth: the records the store was built
from (``build_field_store``)."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StringType

from msgindex.spark.read.datasource import PUSHDOWN_CONF
from msgindex.storage.message import ROW_SCHEMA
from tests.datasource.conftest import FIELD_BASE_MS, FIELDS_FROM, build_field_store

pytestmark = pytest.mark.spark

IDS = ("broker", "topic", "partition", "offset")


def _where(broker, record) -> tuple:
    return (broker, record.topic, record.partition, record.offset)


def _values(record) -> tuple[str | None, list[str] | None]:
    """(order, trace) as a row shows them: null where the record carries no value."""
    order = [value for name, value in record.fields if name == "order"]
    trace = [value for name, value in record.fields if name == "trace"]
    return (order[0] if order else None), (trace or None)


def _carrying(written, name, values, **only) -> set[tuple]:
    return {_where(b, r) for b, r in written if any((name, v) in r.fields for v in values)
            and all(getattr(r, attribute) in allowed for attribute, allowed in only.items())}


def _shown(df) -> dict[tuple, tuple]:
    return {tuple(row[:4]): (row.order, row.trace) for row in df.select(*IDS, "order", "trace").collect()}


def _ids(df) -> set[tuple]:
    return {tuple(row) for row in df.select(*IDS).collect()}


def _load(spark, path, options: dict[str, str] | None = None, **named):
    """A read of `path` with `options`, and `named` ones (``field_order``: option ``field.order``)."""
    reader = spark.read.format("msgindex").options(**(options or {}))
    for name, value in named.items():
        reader = reader.option(name.replace("_", "."), value)
    return reader.load(str(path))


def test_a_store_with_fields_has_a_column_per_field(spark, field_store, truth):
    path, _ = field_store
    schema = _load(spark, path).schema
    rows = [field.name for field in ROW_SCHEMA]
    assert schema.fieldNames() == [*rows, "order", "trace", "any_key", "any_trace"]
    assert schema["order"].dataType == StringType() and schema["order"].nullable
    assert schema["trace"].dataType == ArrayType(StringType(), False) and schema["trace"].nullable
    assert schema["any_trace"].dataType == StringType()
    assert _load(spark, truth.path).schema.fieldNames() == [*rows, "any_key"]  # no fields: as before
    plain = spark.newSession()  # the source Spark finds itself: the fields, no lookup columns
    plain.conf.set(PUSHDOWN_CONF, "false")
    assert _load(plain, path).schema.fieldNames() == [*rows, "order", "trace"]
    assert _load(plain, path, field_order="o-1").where("order = 'o-1'").count() == len(
        _carrying(field_store[1], "order", ["o-1"]))


def test_scans_and_lookups_show_each_records_values(spark, field_store):
    path, written = field_store
    expected = {_where(b, r): _values(r) for b, r in written}
    early = {_where(b, r) for b, r in written if r.offset < FIELDS_FROM.get(b, 0)}
    assert early and all(expected[at] == (None, None) for at in early)  # indexed before the fields
    assert _shown(_load(spark, path)) == expected
    by_key = _shown(_load(spark, path, key="o-1"))
    assert by_key == {at: expected[at] for b, r in written if "o-1" in r.keys for at in [_where(b, r)]}
    by_field = _shown(_load(spark, path, field_trace="t-2"))
    assert by_field == {at: expected[at] for at in _carrying(written, "trace", ["t-2"])}


def test_where_on_a_field_column_is_an_index_lookup(spark, field_store, capsys):
    path, written = field_store
    df = _load(spark, path).where(F.col("order") == "o-1")
    df.explain("formatted")
    assert "EqualTo(order,o-1)" in capsys.readouterr().out
    assert df.rdd.getNumPartitions() == 1  # the index (a scan reads a piece per shard at least)
    assert _ids(df) == _carrying(written, "order", ["o-1"]) != set()
    begin = FIELD_BASE_MS + 120
    narrowed = (_load(spark, path).where(F.col("order").isin("o-2", "o-3", "nope")).where("topic = 'refunds'")
                .where(F.col("timestamp") >= F.timestamp_millis(F.lit(begin))))
    assert narrowed.rdd.getNumPartitions() == 1
    assert _ids(narrowed) == {at for at in _carrying(written, "order", ["o-2", "o-3"], topic={"refunds"})
                              if at[3] >= begin - FIELD_BASE_MS} != set()
    # an array field: its any_ column, showing the first asked value each row carries
    traces = _load(spark, path).where(F.col("any_trace").isin("t-4", "t-3")).select(*IDS, "trace", "any_trace")
    assert traces.rdd.getNumPartitions() == 1
    rows = traces.collect()
    assert {tuple(r[:4]) for r in rows} == _carrying(written, "trace", ["t-3", "t-4"]) != set()
    assert len(rows) == len({tuple(r[:4]) for r in rows})
    assert all(r.any_trace == ("t-3" if "t-3" in r.trace else "t-4") for r in rows)
    # \x6f spells o, but no row shows "o-1" so: the pushed filters match what Spark's own would
    spelled = _load(spark, path).where(F.col("order").isin("\\x6f-1", "o-2"))
    assert _ids(spelled) == _carrying(written, "order", ["o-2"]) != set()
    assert _load(spark, path).where(F.col("any_trace") == "\\x74-3").count() == 0


def test_a_filter_the_index_cannot_answer_is_spark_s(spark, field_store):
    path, written = field_store
    df = _load(spark, path).where(F.col("order").like("o-1%"))
    assert df.rdd.getNumPartitions() > 1  # a scan, filtered by Spark
    assert _ids(df) == _carrying(written, "order", ["o-1", *(f"o-1{d}" for d in range(10))])
    assert _load(spark, path).where(F.array_contains("trace", "t-5")).count() == len(
        _carrying(written, "trace", ["t-5"]))


def test_field_and_key_filters_intersect(spark, field_store):
    path, written = field_store
    with_key = {_where(b, r) for b, r in written if "o-1" in r.keys}
    primary = {_where(b, r) for b, r in written if r.key == "o-1"}
    orders = _carrying(written, "order", ["o-1", "o-4"])
    both = _load(spark, path).where(F.col("order").isin("o-1", "o-4") & (F.col("any_key") == "o-1"))
    assert both.rdd.getNumPartitions() == 1
    rows = both.select(*IDS, "any_key").collect()
    assert {tuple(r[:4]) for r in rows} == orders & with_key != set() and {r.any_key for r in rows} == {"o-1"}
    assert _ids(_load(spark, path).where("order = 'o-4' AND key = 'o-1'")) == _carrying(
        written, "order", ["o-4"]) & primary != set()
    two_fields = _load(spark, path).where("order IN ('o-1', 'o-2') AND any_trace = 't-1'")
    assert _ids(two_fields) == _carrying(written, "order", ["o-1", "o-2"]) & _carrying(written, "trace", ["t-1"])
    assert _load(spark, path).where("order = 'o-1' AND order = 'o-2'").count() == 0
    # a field option (messages carrying any of them) and a filter on another field
    option = _load(spark, path, field_order="o-6").where("any_trace = 't-2'")
    assert _ids(option) == _carrying(written, "order", ["o-6"]) & _carrying(written, "trace", ["t-2"]) != set()


def test_field_columns_of_an_object_store(spark, s3):
    url = s3.url()
    written = build_field_store(url, s3.options)
    storage = {f"storage.{name}": value for name, value in s3.options.items()}
    assert _shown(_load(spark, url, storage)) == {_where(b, r): _values(r) for b, r in written}
    found = _load(spark, url, storage).where(F.col("order").isin("o-5", "o-9") & (F.col("any_trace") == "t-0"))
    assert found.rdd.getNumPartitions() == 1
    assert _ids(found) == _carrying(written, "order", ["o-5", "o-9"]) & _carrying(written, "trace", ["t-0"]) != set()
