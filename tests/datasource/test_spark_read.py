"""``spark.read.format("msgindex")`` against the ground-truth store: exact results, the index
visibly used (partition counts, pushed filters in the plan), pushdown on and off, bad options.

Each query loads a fresh DataFrame: Spark 4.2 caches a planned read on the loaded relation
(see the datasource module docstring)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import from_arrow_schema

from msgindex.spark.read.datasource import ANY_KEY_FIELD, KEYS_PER_LOOKUP_TASK, PUSHDOWN_CONF
from msgindex.storage.message import ROW_SCHEMA
from msgindex.storage.store import open_store
from tests.datasource.conftest import BROKERS, EDGE_KEY, WINDOW

pytestmark = pytest.mark.spark
IDS = ("broker", "topic", "partition", "offset")


def ids(df) -> set[tuple]:
    return {tuple(row) for row in df.select(*IDS).collect()}


def load(spark, truth, **options):
    reader = spark.read.format("msgindex")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(truth.path))


def total_scan_pieces(truth, begin=None, end=None) -> int:
    with open_store(truth.path) as store:
        return sum(len(store.reader(b).scan_ranges(begin, end)) for b in store.brokers())


@pytest.fixture
def auto_source_session(spark):
    """A session of its own, where ``format("msgindex")`` is the source Spark finds by itself
    (``pyspark_msgindex``): no registration, pushdown setting off unless a test turns it on."""
    fresh = spark.newSession()
    fresh.conf.set(PUSHDOWN_CONF, "false")
    return fresh


def test_auto_registered(spark, truth):
    """No register() call: Spark finds ``pyspark_msgindex.DefaultSource`` on the Python path of
    its workers. A new session does not inherit the API registration the other tests use."""
    fresh = spark.newSession()
    df = fresh.read.format("msgindex").option("key", "Aa").load(str(truth.path))
    assert ids(df) == truth.select(keys={"Aa"})


def test_schema_and_full_read(spark, truth):
    df = spark.read.format("msgindex").load(str(truth.path))
    # the pushdown source's rows end with any_key: the key a lookup found them under (none here)
    assert df.schema == from_arrow_schema(pa.schema([*ROW_SCHEMA, ANY_KEY_FIELD]))
    assert df.rdd.getNumPartitions() == total_scan_pieces(truth) > len(BROKERS)
    rows = df.collect()
    assert len(rows) == len(truth.rows) and {row.any_key for row in rows} == {None}
    expected = {(b, r.topic, r.partition, r.offset): (b, r) for b, r in truth.rows}
    for row in rows:
        broker, record = expected[(row.broker, row.topic, row.partition, row.offset)]
        assert (row.key, tuple(row.keys)) == (record.key, record.keys)
        assert row.timestamp.replace(tzinfo=UTC).timestamp() * 1000 == record.timestamp_ms
        assert (row.commit_log_offset, row.size) == (record.commit_log_offset, record.size)


@pytest.mark.parametrize("options, expected", [
    ({"key": "Aa"}, dict(keys={"Aa"})),  # "BB" collides with it: must not show up
    ({"key": "with,comma", "topic": "orders"}, dict(keys={"with,comma"}, topics={"orders"})),
    ({"keys": json.dumps(["AaAa", "BBBB", "ключ-ünï"]), "topic": "audit,payments"},
     dict(keys={"AaAa", "BBBB", "ключ-ünï"}, topics={"audit", "payments"})),
    ({"key": "user-7", "brokers": "broker-a,broker-c", "partitions": "0,2"},
     dict(keys={"user-7"}, brokers={"broker-a", "broker-c"}, partitions={0, 2})),
    ({"key": EDGE_KEY, "begin": str(WINDOW[0]), "end": str(WINDOW[1])},
     dict(keys={EDGE_KEY}, begin=WINDOW[0], end=WINDOW[1])),
])
def test_option_lookups_exact(spark, truth, options, expected):
    df = load(spark, truth, **options)
    assert df.rdd.getNumPartitions() == 1  # a few keys: one task looks up every shard
    assert ids(df) == truth.select(**expected)


def test_many_keys_split_over_tasks(spark, truth):
    absent = [f"absent-{i}" for i in range(2 * KEYS_PER_LOOKUP_TASK)]
    wanted = ["Aa", *absent, "user-3", "BB"]  # found keys in the first and the last slice
    df = load(spark, truth, keys=json.dumps(wanted))
    assert df.rdd.getNumPartitions() == 3
    assert ids(df) == truth.select(keys=set(wanted))
    where = load(spark, truth).where(f"key IN ({', '.join(repr(k) for k in wanted)})")
    assert where.rdd.getNumPartitions() == 3
    assert ids(where) == truth.select(primary=set(wanted))
    capped = load(spark, truth, keys=json.dumps(wanted), maxNum="3")  # a global cap: one task
    assert capped.rdd.getNumPartitions() == 1 and len(ids(capped)) == 3


def test_edge_window_iso_times(spark, truth):
    begin = datetime.fromtimestamp(WINDOW[0] / 1000, UTC).isoformat(timespec="milliseconds")
    end = datetime.fromtimestamp(WINDOW[1] / 1000, UTC).astimezone().isoformat(timespec="milliseconds")
    df = load(spark, truth, key=EDGE_KEY, begin=begin, end=end)
    got = sorted(r.timestamp.replace(tzinfo=UTC) for r in df.collect())
    assert [int(t.timestamp() * 1000) for t in got] == [WINDOW[0], WINDOW[1]]  # not -1 / +1


def test_max_num_is_global(spark, truth):
    df = load(spark, truth, key="Aa", maxNum="5")
    assert df.rdd.getNumPartitions() == 1
    rows = ids(df)
    assert len(rows) == 5 and rows <= truth.select(keys={"Aa"})


def test_where_key_pushdown_uses_index(spark, truth, capsys):
    df = load(spark, truth).where("key = 'Aa' AND topic IN ('orders', 'audit')")
    df.explain("formatted")
    plan = capsys.readouterr().out
    assert "EqualTo(key,Aa)" in plan and "In(topic" in plan
    assert df.rdd.getNumPartitions() == 1  # a lookup, not a scan (one piece per log range)
    assert total_scan_pieces(truth) > 1
    # `key` is the primary key: a message only *indexed* under Aa does not match
    assert ids(df) == truth.select(primary={"Aa"}, topics={"orders", "audit"})


def test_where_combinations(spark, truth):
    df = load(spark, truth).where(
        "key IN ('BB', 'emoji-\U0001F389', 'nope') AND broker <> 'broker-b' AND partition = 1 "
        "AND offset >= 3"  # offset is not pushed: Spark re-checks it
    )
    expected = {row for row in truth.select(primary={"BB", "emoji-\U0001F389"}, partitions={1})
                if row[0] != "broker-b" and row[3] >= 3}
    assert ids(df) == expected


def test_where_time_window_exact_to_the_ms(spark, truth):
    begin = datetime.fromtimestamp(WINDOW[0] / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    end = datetime.fromtimestamp(WINDOW[1] / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    df = load(spark, truth).where(f"timestamp >= '{begin}' AND timestamp <= '{end}'")
    assert df.rdd.getNumPartitions() < total_scan_pieces(truth)  # the sparse time index cut the read
    assert ids(df) == truth.select(begin=WINDOW[0], end=WINDOW[1])
    # strict bounds with sub-millisecond literals: > x.0005 means >= x+1ms; < y.0005 means <= y
    df = load(spark, truth).where(
        f"key = '{EDGE_KEY}' AND timestamp > '{begin}5' AND timestamp < '{end}5'")
    assert {r.timestamp.replace(tzinfo=UTC).timestamp() * 1000 for r in df.collect()} == {WINDOW[1]}


def test_contradicting_filters_return_nothing(spark, truth):
    assert load(spark, truth).where("key = 'Aa' AND key = 'BB'").count() == 0
    assert load(spark, truth, key="Aa").where("topic = 'orders' AND topic = 'audit'").count() == 0


@pytest.mark.parametrize("setting", ["false", "true"])
def test_auto_source_options_use_the_index_where_is_right(auto_source_session, truth, setting):
    """The source Spark finds on its own reads right under either value of Spark's setting: the
    options use the index, ``where`` filters are evaluated by Spark over a full read."""
    auto_source_session.conf.set(PUSHDOWN_CONF, setting)
    df = load(auto_source_session, truth, key="Aa", topic="orders")
    assert df.rdd.getNumPartitions() == 1
    assert ids(df) == truth.select(keys={"Aa"}, topics={"orders"})
    df = load(auto_source_session, truth).where("key = 'BBBB' AND partition = 2")
    assert df.rdd.getNumPartitions() == total_scan_pieces(truth)
    assert ids(df) == truth.select(primary={"BBBB"}, partitions={2})


def test_enable_pushdown_then_setting_off_names_the_setting(auto_source_session, truth):
    from msgindex.spark import enable_pushdown

    enable_pushdown(auto_source_session)
    assert auto_source_session.conf.get(PUSHDOWN_CONF) == "true"
    assert load(auto_source_session, truth).where("key = 'Aa'").rdd.getNumPartitions() == 1
    auto_source_session.conf.set(PUSHDOWN_CONF, "false")
    with pytest.raises(Exception) as failure:
        load(auto_source_session, truth).where("key = 'Aa'").collect()
    assert "DATA_SOURCE_PUSHDOWN_DISABLED" in str(failure.value) and PUSHDOWN_CONF in str(failure.value)


@pytest.mark.parametrize("options, message", [
    ({"colour": "red"}, "unknown option 'colour' = 'red'"),
    ({"begin": "yesterday"}, "option 'begin' = 'yesterday'"),
    ({"end": "2026-11-21T05:00:00.0001"}, "option 'end' = '2026-11-21T05:00:00.0001' has sub-millisecond digits"),
    ({"keys": "a,b"}, "option 'keys' = 'a,b' is not a JSON array"),
    ({"maxNum": "-3", "key": "a"}, "option 'maxNum' = '-3'"),
    ({"maxNum": "\u0665", "key": "a"}, "option 'maxNum' = '\u0665' is not a positive integer"),  # Arabic-Indic 5
    ({"maxNum": str(2**63), "key": "a"}, f"option 'maxNum' = '{2**63}' is not a positive integer"),
    ({"partitions": "1,2147483648"}, "option 'partitions' = '1,2147483648' is not a comma-separated list"),
    ({"hashSlotNum": "500"}, "option 'hashSlotNum' = '500' sizes a RocketMQ index file: it needs option 'mode'"),
    ({"fetchValues": "true"}, "needs option 'kafka.bootstrap.servers'"),
    ({"kafka.bootstrap.servers": "127.0.0.1:9092"},
     "option 'kafka.bootstrap.servers' = '127.0.0.1:9092' is read only with option 'fetchValues' = 'true'"),
    ({"kafka.bootstrap.servers": "127.0.0.1:9092", "mode": "rocketmq", "fetchValues": "true"},
     "option 'kafka.bootstrap.servers' = '127.0.0.1:9092' is for a msgindex store: in mode 'rocketmq'"),
    ({"brokers": "broker-a,broker-x"}, "option 'brokers' = 'broker-a,broker-x': no shard named 'broker-x'"),
])
def test_bad_options_name_option_and_value(spark, truth, options, message):
    with pytest.raises(Exception) as failure:
        load(spark, truth, **options).collect()
    assert message in str(failure.value)


def test_bad_paths(spark, truth, tmp_path):
    with pytest.raises(Exception, match="option 'path' = .*does not exist"):
        spark.read.format("msgindex").load(str(tmp_path / "missing")).collect()
    (tmp_path / "plain").mkdir()
    with pytest.raises(Exception, match="option 'path' = .*not a msgindex store"):
        spark.read.format("msgindex").load(str(tmp_path / "plain")).collect()
    with pytest.raises(Exception, match="option 'path' is missing"):
        spark.read.format("msgindex").load().collect()


def test_each_query_on_an_object_store_sees_every_commit_made_before_it(spark, s3):
    """Spark's Python workers keep what they read of an object store between queries
    (storage/objects/cache.py): a record committed by another process after a query ran is
    found by the next query, through ``where`` and through the options; a scan too."""
    from msgindex.storage.message import MessageRecord

    url = s3.url()
    storage = {f"storage.{name}": value for name, value in s3.options.items()}

    def record(offset: int) -> MessageRecord:
        return MessageRecord("fresh", 0, offset, 1_700_000_000_000 + offset, "again", ["again"])

    def queries() -> list[set]:
        reader = spark.read.format("msgindex").options(**storage)
        return [{r.offset for r in reader.load(url).where("key = 'again'").select("offset").collect()},
                {r.offset for r in reader.option("key", "again").load(url).select("offset").collect()},
                {r.offset for r in reader.load(url).select("offset").collect()}]

    with open_store(url, create=True, storage_options=s3.options) as store:
        store.writer("b1").append([record(0)])
    assert queries() == [{0}] * 3
    with open_store(url, storage_options=s3.options) as store:  # another process than Spark's workers
        store.writer("b1").append([record(1)])
        store.writer("b2").append([record(2)])  # and a new shard
    assert queries() == [{0, 1, 2}] * 3
