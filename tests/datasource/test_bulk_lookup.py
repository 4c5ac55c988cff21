"""``msgindex.spark.lookup_keys``: the messages of every key of a DataFrame, against the
ground-truth store (hash collisions, keys in several topics, commas, non-ASCII), on both of its
paths (keys collected and shipped to the tasks; above ``max_collected_keys``, hash-partitioned),
on a local and an object-store store, with bad input answered clearly."""

from __future__ import annotations

import contextlib
import io
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.pandas.types import from_arrow_schema

from msgindex.errors import InvalidOptionError
from msgindex.spark import lookup_keys
from msgindex.spark.read.bulk_lookup import RESULT_SCHEMA
from tests.datasource.conftest import BROKERS, COLLIDING, EDGE_KEY, KEY_POOL, SPECIAL, WINDOW, build_store

pytestmark = pytest.mark.spark
ASKED = (*COLLIDING, *SPECIAL, "user-3", "user-17", EDGE_KEY, "absent", "absent-2")
# the two ways lookup_keys runs: keys collected to the driver (the default for few keys), and
# hash-partitioned by a shuffle (above max_collected_keys; 0 forces it)
PATHS = {"collected": {}, "shuffled": {"max_collected_keys": 0}}


def expected(truth, keys, topics=None, begin=None, end=None, brokers=None) -> set[tuple]:
    """(asked key, broker, topic, partition, offset) of every message indexed under each key."""
    return {
        (key, broker, r.topic, r.partition, r.offset)
        for broker, r in truth.rows
        for key in set(keys) & set(r.keys)
        if (topics is None or r.topic in topics) and (brokers is None or broker in brokers)
        and (begin is None or r.timestamp_ms >= begin) and (end is None or r.timestamp_ms <= end)
    }


def found(df) -> set[tuple]:
    return {tuple(r) for r in df.select("lookup_key", "broker", "topic", "partition", "offset").collect()}


def keys_frame(spark, keys, column="key", type_="string"):
    return spark.createDataFrame([(k,) for k in keys], f"`{column}` {type_}")


def plan_of(df) -> str:
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        df.explain()
    return captured.getvalue()


@pytest.mark.parametrize("path", PATHS)
def test_every_key_exact_with_nulls_and_duplicates(spark, truth, path):
    keys = keys_frame(spark, [*ASKED, None, "Aa", None, "ключ-ünï"])  # nulls skipped, dups once
    df = lookup_keys(keys, str(truth.path), num_partitions=3, **PATHS[path])
    assert df.schema == from_arrow_schema(RESULT_SCHEMA)
    assert df.rdd.getNumPartitions() == 3  # the keys are spread over tasks
    rows = found(df)
    assert rows == expected(truth, ASKED)
    assert len(rows) == df.count()  # nothing twice
    assert {key for key, *_ in rows} == set(ASKED) - {"absent", "absent-2"}


def test_full_rows_match_the_data_source(spark, truth):
    keys = keys_frame(spark, ["user-7", "with,comma"], column="order id")  # a name with a blank
    # a message indexed under both keys is found under each: once per message here
    bulk = lookup_keys(keys, str(truth.path), key_col="order id").drop("lookup_key").distinct()
    read = spark.read.format("msgindex").option("keys", '["user-7", "with,comma"]').load(str(truth.path)) \
        .drop("any_key")
    assert sorted(bulk.collect()) == sorted(read.collect())


@pytest.mark.parametrize("path", PATHS)
def test_topic_window_and_brokers(spark, truth, path):
    keys = keys_frame(spark, ASKED)
    begin = datetime.fromtimestamp(WINDOW[0] / 1000, UTC)
    df = lookup_keys(keys, str(truth.path), topic="orders", begin=begin, end=WINDOW[1],
                     brokers=["broker-a", "broker-c"], **PATHS[path])
    assert found(df) == expected(truth, ASKED, topics={"orders"}, begin=WINDOW[0], end=WINDOW[1],
                                 brokers={"broker-a", "broker-c"})
    edge = lookup_keys(keys_frame(spark, [EDGE_KEY]), str(truth.path),
                       begin=begin.isoformat(), end=str(WINDOW[1]), **PATHS[path])
    assert sorted(r.timestamp.timestamp() * 1000 for r in edge.collect()) == list(WINDOW)


@pytest.mark.parametrize("path", PATHS)
def test_binary_keys_are_kafka_key_bytes(spark, truth, path):
    keys = spark.createDataFrame([(k.encode("utf-8"),) for k in ("Aa", "ключ-ünï", "absent")], "key binary")
    assert found(lookup_keys(keys, str(truth.path), **PATHS[path])) == expected(truth, {"Aa", "ключ-ünï"})


@pytest.mark.parametrize("path", PATHS)
def test_string_keys_are_keys_as_rows_show_them(spark, tmp_path, path):
    """A string column holds keys as rows show them, as ``where key = ...`` takes them: the byte
    0xff is asked as ``\\xff``, the 4-character text as ``\\x5cxff``, and ``lookup_key`` is the
    asked string, so joining back to the asked rows loses none; ``\\x41``, which no row shows,
    finds nothing (the row with key ``A`` shows ``A``)."""
    import msgindex
    from msgindex.storage.message import MessageRecord, arrow_text, decode_key_bytes

    raw_keys = [b"\xff", b"\\xff", b"caf\xc3", b"C:\\x00", b"A"]
    keys = [decode_key_bytes(raw) for raw in raw_keys]
    store_path = tmp_path / "shown"
    with msgindex.open(str(store_path), create=True) as store, store.writer("b") as writer:
        writer.append([MessageRecord("t", 0, n, 1_700_000_000_000 + n, key, (key,)) for n, key in enumerate(keys)])
    asked = [arrow_text(key) for key in keys] + ["\\x41"]
    assert asked[:2] == ["\\xff", "\\x5cxff"]
    frame = keys_frame(spark, asked)
    result = lookup_keys(frame, store_path, **PATHS[path])  # a pathlib.Path, as msgindex.open takes
    assert {(r.lookup_key, r.offset, r.key) for r in result.collect()} == {
        (shown, n, shown) for n, shown in enumerate(asked[:-1])}
    assert frame.join(result, frame.key == result.lookup_key).count() == len(raw_keys)


def test_every_key_of_every_shard_with_spark_choosing_the_tasks(spark, truth):
    asked = [*KEY_POOL, EDGE_KEY, "absent", *KEY_POOL[:7]]  # every key of the store, some twice
    rows = found(lookup_keys(keys_frame(spark, asked), str(truth.path)))
    assert rows == expected(truth, asked)
    assert {broker for _, broker, *_ in rows} == set(BROKERS)


def test_keys_above_the_cap_are_shuffled_below_it_collected(spark, truth):
    """At most max_collected_keys non-null rows (duplicates count: they are not collected
    distinct) go to the driver, no shuffle; one more and the keys are hash-partitioned."""
    keys = keys_frame(spark, ["Aa", None, "BB", "Aa"])
    collected = lookup_keys(keys, str(truth.path), max_collected_keys=3)
    shuffled = lookup_keys(keys, str(truth.path), max_collected_keys=2)
    assert "Exchange" not in plan_of(collected) and "Range" in plan_of(collected)
    assert "Exchange hashpartitioning" in plan_of(shuffled)
    assert found(collected) == found(shuffled) == expected(truth, {"Aa", "BB"})
    with pytest.raises(InvalidOptionError, match="max_collected_keys = -1 is not an integer >= 0"):
        lookup_keys(keys, str(truth.path), max_collected_keys=-1)


@pytest.mark.parametrize("path", PATHS)
def test_only_the_columns_asked_for(spark, truth, path):
    """`columns` returns lookup_key and just those columns, the same rows as the whole result's
    projection (a row per (asked key, message): keys carried twice included); bad names are errors."""
    asked = [*ASKED, "Aa"]
    whole = lookup_keys(keys_frame(spark, asked), str(truth.path), **PATHS[path])
    pruned = lookup_keys(keys_frame(spark, asked), str(truth.path), columns=["partition", "offset", "broker"],
                         **PATHS[path])
    assert pruned.columns == ["lookup_key", "partition", "offset", "broker"]
    assert sorted(pruned.collect()) == sorted(whole.select(*pruned.columns).collect())
    assert lookup_keys(keys_frame(spark, asked), str(truth.path), columns=["lookup_key", "key"]).columns == \
        ["lookup_key", "key"]
    assert lookup_keys(keys_frame(spark, asked), str(truth.path), columns=[]).count() == whole.count()
    for bad, message in ((["offset", "nope"], "columns: 'nope' is not a column of the result"),
                         (["offset", "offset"], "names a column twice"), (7, "columns = 7 is not a list")):
        with pytest.raises(InvalidOptionError, match=message):
            lookup_keys(keys_frame(spark, asked), str(truth.path), columns=bad)


def test_small_keys_are_collected_without_a_limit(spark, truth, tmp_path, monkeypatch):
    """Spark runs a limit before an Arrow collect as a shuffle stage: keys its own estimate calls
    small (a small Parquet file) are collected without one. Keys of unknown size (an RDD of Python
    rows) or of a huge estimate (a billion rows) keep the limit, so they never reach the driver
    whole, and go to the shuffle path above the cap."""
    pq.write_table(pa.table({"key": ["Aa", "BB", None]}), tmp_path / "keys.parquet")
    small = spark.read.parquet(str(tmp_path / "keys.parquet"))
    limits = []
    limit = type(small).limit  # the session's DataFrame class (classic)
    monkeypatch.setattr(type(small), "limit", lambda frame, n: limits.append(n) or limit(frame, n))
    assert found(lookup_keys(small, str(truth.path))) == expected(truth, {"Aa", "BB"})
    assert limits == []
    lookup_keys(keys_frame(spark, ["Aa", "BB"]), str(truth.path))
    assert limits == [1_000_001]
    huge = lookup_keys(spark.range(1_000_000_000).selectExpr("cast(id AS string) AS key"), str(truth.path),
                       max_collected_keys=5)
    assert limits == [1_000_001, 6] and "Exchange hashpartitioning" in plan_of(huge)


@pytest.mark.parametrize("path", PATHS)
def test_object_store_store(spark, truth, s3, path):
    url = s3.url()
    build_store(url, list(truth.rows), storage_options=s3.options)
    keys = keys_frame(spark, [*ASKED, "Aa", None])
    df = lookup_keys(keys, url, storage_options=s3.options, **PATHS[path])
    assert found(df) == expected(truth, ASKED) and df.count() == len(expected(truth, ASKED))
    window = lookup_keys(keys, url, storage_options=s3.options, topic="payments", begin=WINDOW[0], end=WINDOW[1],
                         **PATHS[path])
    assert found(window) == expected(truth, ASKED, topics={"payments"}, begin=WINDOW[0], end=WINDOW[1])


def test_from_sql_through_a_temp_view(spark, truth):
    keys_frame(spark, ["BB", "user-3"], column="order_id").createOrReplaceTempView("incident_ids")
    lookup_keys(spark.table("incident_ids"), str(truth.path), key_col="order_id") \
        .createOrReplaceTempView("incident_messages")
    rows = spark.sql("SELECT lookup_key, count(*) AS n FROM incident_messages GROUP BY lookup_key").collect()
    want = expected(truth, {"BB", "user-3"})
    assert {r.lookup_key: r.n for r in rows} == {k: sum(1 for e in want if e[0] == k) for k in ("BB", "user-3")}


@pytest.mark.parametrize("path", PATHS)
def test_no_keys_no_rows(spark, truth, path):
    assert lookup_keys(keys_frame(spark, [None, None]), str(truth.path), **PATHS[path]).count() == 0
    assert lookup_keys(keys_frame(spark, []), str(truth.path), **PATHS[path]).count() == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(key_col="order_id"), "key_col = 'order_id' is not a column of the keys DataFrame (its columns: key)"),
    (dict(topic="a,b"), "topic = 'a,b' is not one topic name"),
    (dict(begin="yesterday"), "lookup_keys: 'begin' = 'yesterday' is not a time"),
    (dict(begin=5, end=4), "begin = 5 is after end = 4"),
    (dict(end=datetime(2026, 1, 1, 0, 0, 0, 1)), "has sub-millisecond digits"),
    (dict(brokers=[]), "brokers = [] is not a list of shard names"),
    (dict(num_partitions=0), "num_partitions = 0 is not a positive integer"),
])
def test_bad_arguments_name_argument_and_value(spark, truth, kwargs, message):
    with pytest.raises(InvalidOptionError) as failure:
        lookup_keys(keys_frame(spark, ["Aa"]), str(truth.path), **kwargs)
    assert message in str(failure.value)


def test_times_as_people_type_them(spark, truth):
    """Without a zone: the session's (UTC here); relative: from now; what lookup_keys takes."""
    every = lookup_keys(keys_frame(spark, ["Aa"]), str(truth.path)).count()
    assert every > 0
    naive = datetime.fromtimestamp(WINDOW[0] / 1000, UTC).replace(tzinfo=None)
    assert lookup_keys(keys_frame(spark, ["Aa"]), str(truth.path), begin=naive).count() == \
        lookup_keys(keys_frame(spark, ["Aa"]), str(truth.path), begin=WINDOW[0]).count() < every
    assert lookup_keys(keys_frame(spark, ["Aa"]), str(truth.path), end="now").count() == every
    assert lookup_keys(keys_frame(spark, ["Aa"]), str(truth.path), begin="-1h").count() == 0


def test_non_string_key_column_names_the_column(spark, truth):
    numbers = spark.createDataFrame([(1,), (2,)], "order_id bigint")
    with pytest.raises(InvalidOptionError, match=r"key column 'order_id' is bigint; keys must be string or binary"):
        lookup_keys(numbers, str(truth.path), key_col="order_id")


@pytest.mark.parametrize("path", PATHS)
def test_bad_path_and_broker_fail_the_job_naming_them(spark, truth, tmp_path, path):
    with pytest.raises(Exception) as failure:
        lookup_keys(keys_frame(spark, ["Aa"]), str(tmp_path / "nowhere"), **PATHS[path]).collect()
    assert "lookup_keys: path" in str(failure.value) and "nowhere" in str(failure.value)
    with pytest.raises(Exception) as failure:
        lookup_keys(keys_frame(spark, ["Aa"]), str(truth.path), brokers="broker-x", **PATHS[path]).collect()
    assert f"no shard named 'broker-x' in {truth.path} (shards: {', '.join(BROKERS)})" in str(failure.value)


def test_task_slices_cover_every_key_once(truth):
    """The collected path's task function, as Spark calls it: the tasks' id ranges together
    answer every asked key exactly once, whichever ids a task gets."""
    from msgindex.spark.read.bulk_lookup import BulkLookup, CollectedKeysLookup

    asked = pa.array(list(dict.fromkeys(ASKED)))
    task = CollectedKeysLookup(BulkLookup(path=str(truth.path)), asked, slices=5)
    rows = []
    for ids in ([0, 3], [1], [2, 4]):  # three tasks, uneven ranges
        for batch in task(iter([pa.record_batch([pa.array(ids, pa.int64())], names=["id"])])):
            rows += zip(*(batch.column(name).to_pylist() for name in ("lookup_key", "broker", "topic", "partition", "offset")))
    assert len(rows) == len(set(rows)) and set(rows) == expected(truth, ASKED)
    assert list(task(iter([]))) == []
