"""``spark.read.format("msgindex").option("field.<name>", value)``: messages carrying a field value
(storage/fields.py), found by the verified index lookup, with the other options and filters."""

from __future__ import annotations

import pytest

from tests.datasource.conftest import FIELD_BASE_MS as BASE_MS

pytestmark = pytest.mark.spark


def _truth(written, name, value, topic=None, begin=None):
    return {(b, r.topic, r.partition, r.offset) for b, r in written if (name, value) in r.fields
            and (topic is None or r.topic == topic) and (begin is None or r.timestamp_ms >= begin)}


def _ids(df) -> set[tuple]:
    return {tuple(row) for row in df.select("broker", "topic", "partition", "offset").collect()}


def test_a_field_option_finds_what_carries_the_value(spark, field_store):
    path, written = field_store
    read = spark.read.format("msgindex").option("field.order", "o-1").load(str(path))
    assert _ids(read) == _truth(written, "order", "o-1") != set()
    # key o-1 is a key, not the field: the key option finds other messages
    by_key = spark.read.format("msgindex").option("key", "o-1").load(str(path))
    assert _ids(by_key) == {(b, r.topic, r.partition, r.offset) for b, r in written if "o-1" in r.keys}
    # with filters Spark pushes down (or re-checks): exact either way
    narrowed = read.where("topic = 'refunds'").where(f"timestamp >= timestamp_millis({BASE_MS + 150})")
    assert _ids(narrowed) == _truth(written, "order", "o-1", topic="refunds", begin=BASE_MS + 150)
    # two field options: messages carrying either; field names match case-insensitively
    both = spark.read.format("msgindex").option("field.TRACE", "t-3").option("field.order", "o-2").load(str(path))
    assert _ids(both) == _truth(written, "trace", "t-3") | _truth(written, "order", "o-2")
    # the keys column shows keys only
    assert all(not any("t-" in k for k in row.keys) for row in both.select("keys").collect())


def test_a_field_option_with_keys_is_refused(spark, field_store):
    path, _ = field_store
    with pytest.raises(Exception, match="not with option 'key'/'keys'"):
        spark.read.format("msgindex").option("field.order", "o-1").option("key", "k1").load(str(path)).collect()


def test_lookup_keys_of_a_field(spark, field_store):
    from msgindex.spark.read.bulk_lookup import lookup_keys

    path, written = field_store
    asked = ["o-1", "o-7", "t-3", "nothing", "o-1", None]
    values = spark.createDataFrame([(v,) for v in asked], "v string")
    rows = lookup_keys(values, str(path), key_col="v", field="order", topic="orders", num_partitions=2).collect()
    got = sorted((r.lookup_key, r.broker, r.topic, r.partition, r.offset) for r in rows)
    assert got == sorted((v, b, r.topic, r.partition, r.offset) for v in ("o-1", "o-7", "t-3", "nothing")
                         for b, r in written if ("order", v) in r.fields and r.topic == "orders")
    assert got and not any(r.lookup_key == "t-3" for r in rows)  # a trace value is not an order
    traces = lookup_keys(values, str(path), key_col="v", field="TRACE").collect()
    assert sorted((r.lookup_key, r.broker, r.offset) for r in traces) == sorted(
        ("t-3", b, r.offset) for b, r in written if ("trace", "t-3") in r.fields)
    pruned = lookup_keys(values, str(path), key_col="v", field="TRACE", columns=["broker", "offset"]).collect()
    assert sorted(tuple(r) for r in pruned) == sorted((r.lookup_key, r.broker, r.offset) for r in traces)


def test_a_field_the_index_does_not_have_is_an_error_not_an_empty_answer(spark, field_store):
    """A misspelt field names itself and the fields there are, where a key lookup would name an
    unknown broker: at load() for the option, in the task for lookup_keys (whose driver may not
    see the store: Spark Connect)."""
    from msgindex.spark.read.bulk_lookup import lookup_keys

    path, _ = field_store
    with pytest.raises(Exception, match=r"option 'field.ordr': the index has no such field "
                                                 r"\(did you mean order\? it has: .*order"):
        spark.read.format("msgindex").option("field.ordr", "o-1").load(str(path))
    values = spark.createDataFrame([("o-1",)], "v string")
    with pytest.raises(Exception, match=r"lookup_keys: field = 'ordr': the index has no such field"):
        lookup_keys(values, str(path), key_col="v", field="ordr").collect()
