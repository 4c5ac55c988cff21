"""``mode=rocketmq``: on a bare directory of RocketMQ IndexFiles (made with msgindex's
byte-identical IndexFile) the raw entries, key lookups returning every same-hash entry, marked
unverified; on a real RocketMQ 5.3.3 broker's store root (the session fixture
``rocketmq_dataset``) verified rows, compared with the ground truth of what was sent."""

from __future__ import annotations

import json

import pytest

from msgindex.spark.read.datasource import PUSHDOWN_CONF
from msgindex.storage.hash_index.java_hash import index_hash
from msgindex.storage.message import index_key
from tests.datasource.conftest import INDEX_DIR_ENTRIES as ENTRIES
from tests.datasource.conftest import INDEX_DIR_SLOTS as SLOTS
from tests.datasource.conftest import INDEX_DIR_T0 as T0

pytestmark = pytest.mark.spark


def load(spark, folder, **options):
    reader = spark.read.format("msgindex").option("mode", "rocketmq").option("hashSlotNum", SLOTS) \
        .option("indexNum", ENTRIES)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(folder))


def test_raw_entries(spark, rocketmq_dir):
    folder, puts = rocketmq_dir
    df = load(spark, folder)
    assert df.rdd.getNumPartitions() == len({p[0] for p in puts}) >= 2
    rows = df.collect()
    assert {(r.file, r.entry, r.key_hash, r.phy_offset) for r in rows} == \
        {(f, e, index_hash(k), p) for f, e, k, p, _ in puts}
    assert not any(r.verified for r in rows)


def test_key_lookup_by_hash_is_unverified(spark, rocketmq_dir):
    folder, puts = rocketmq_dir
    rows = load(spark, folder, key="Aa", topic="orders").collect()
    wanted = index_hash(index_key("orders", "Aa"))
    expected = {(f, e) for f, e, k, _, _ in puts if index_hash(k) == wanted}
    assert {(r.file, r.entry) for r in rows} == expected
    # "orders#BB" has the same hash: the index cannot tell, so its entries come back too
    assert any(k == "orders#BB" for f, e, k, _, _ in puts if (f, e) in expected)
    assert {r.lookup_key for r in rows} == {"orders#Aa"} and not any(r.verified for r in rows)


def test_time_window_on_second_granularity(spark, rocketmq_dir):
    folder, puts = rocketmq_dir
    begin, end = T0 + 60_000, T0 + 120_000
    def ms(row):
        return round(row.timestamp.timestamp() * 1000)

    everything = load(spark, folder).collect()
    expected = {(r.file, r.entry) for r in everything if begin <= ms(r) <= end}
    rows = load(spark, folder, begin=str(begin), end=str(end)).collect()
    assert expected and {(r.file, r.entry) for r in rows} == expected
    assert all(ms(r) % 1000 == ms(everything[0]) % 1000 for r in rows if r.file == everything[0].file)


def test_wrong_sizing_and_missing_topic(spark, rocketmq_dir):
    folder, _ = rocketmq_dir
    with pytest.raises(Exception, match="options 'hashSlotNum' = 5000000 and 'indexNum' = 20000000"):
        spark.read.format("msgindex").option("mode", "rocketmq").load(str(folder)).collect()
    with pytest.raises(Exception, match="needs option 'topic'"):
        load(spark, folder, key="Aa").collect()


# ------------------------------------------------------------------ a real broker's store root
def load_store(spark, dataset, **options):
    from tests.rocketmq.harness import HASH_SLOT_NUM, INDEX_NUM

    reader = spark.read.format("msgindex").option("mode", "rocketmq") \
        .option("hashSlotNum", HASH_SLOT_NUM).option("indexNum", INDEX_NUM)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(dataset.store_root))


def offsets(df) -> list[int]:
    return [row.commit_log_offset for row in df.select("commit_log_offset").collect()]


def test_verified_key_lookup(spark, rocketmq_dataset):
    from tests.rocketmq.dataset import HOT_KEY, ORDERS, STORE_NAME

    df = load_store(spark, rocketmq_dataset, key=HOT_KEY, topic=ORDERS)
    assert df.rdd.getNumPartitions() == 1
    rows = df.collect()
    assert {r.commit_log_offset for r in rows} == rocketmq_dataset.select(ORDERS, HOT_KEY)
    assert len(rows) > 64 and all(r.verified and r.broker == STORE_NAME for r in rows)
    named = load_store(spark, rocketmq_dataset, key=HOT_KEY, topic=ORDERS, brokerName="broker-a", maxNum="5")
    assert [r.broker for r in named.collect()] == ["broker-a"] * 5


def test_verified_where_pushdown(spark, rocketmq_dataset, capsys):
    from tests.rocketmq.dataset import AAT, BBT, HOT_BATCH_KEY, ORDERS

    truth = rocketmq_dataset
    stamps = sorted(m.store_timestamp for m in truth.messages)
    begin, end = stamps[100] + 1, stamps[-100] - 1
    df = load_store(spark, truth).where(
        f"key = '{HOT_BATCH_KEY}' AND topic = '{ORDERS}' AND partition IN (0, 1, 3) "
        f"AND timestamp >= timestamp_millis({begin}) AND timestamp <= timestamp_millis({end})")
    df.explain("formatted")
    plan = capsys.readouterr().out
    assert f"EqualTo(key,{HOT_BATCH_KEY})" in plan and "In(partition" in plan
    assert df.rdd.getNumPartitions() == 1  # a lookup, not a scan
    assert set(offsets(df)) == truth.select(ORDERS, HOT_BATCH_KEY, begin, end, partitions={0, 1, 3})
    # collisions across topics: AaT#k and BBT#k hash alike, each topic gets only its own
    both = load_store(spark, truth, key="k").where(f"topic IN ('{AAT}', '{BBT}')")
    assert set(offsets(both)) == truth.select(AAT, "k") | truth.select(BBT, "k")
    # a key filter without a topic cannot be hashed: a scan, still exact
    scanned = load_store(spark, truth).where(f"key = '{HOT_BATCH_KEY}'")
    assert scanned.rdd.getNumPartitions() > 1
    assert set(offsets(scanned)) == truth.select(ORDERS, HOT_BATCH_KEY)


def test_verified_time_scan_and_values(spark, rocketmq_dataset):
    from tests.rocketmq.dataset import ORDERS

    truth = rocketmq_dataset
    stamps = sorted(m.store_timestamp for m in truth.messages)
    begin, end = stamps[500] + 3, stamps[1500] - 3
    df = load_store(spark, truth, begin=str(begin), end=str(end))
    assert sorted(offsets(df)) == sorted(truth.select(begin=begin, end=end))
    big = [m for m in truth.messages if m.tokens and m.tokens[0].startswith("big-")][:3]
    rows = load_store(spark, truth, keys=json.dumps([m.tokens[0] for m in big]), topic=ORDERS,
                      fetchValues="true").collect()
    by_offset = truth.by_offset()
    assert len(rows) >= 3
    for row in rows:
        m = by_offset[row.commit_log_offset]
        assert row.value == m.body and row.properties["TAGS"] == m.tags


def test_verified_pushdown_off(spark, rocketmq_dataset):
    from tests.rocketmq.dataset import HOT_KEY, ORDERS

    # a session of its own reads with the source Spark finds itself (enable_pushdown registered
    # the pushdown source in the shared session only)
    fresh = spark.newSession()
    fresh.conf.set(PUSHDOWN_CONF, "false")
    df = load_store(fresh, rocketmq_dataset, key=HOT_KEY, topic=ORDERS).where("partition = 2")
    assert set(offsets(df)) == rocketmq_dataset.select(ORDERS, HOT_KEY, partitions={2})


def test_verified_bad_options(spark, rocketmq_dataset, rocketmq_dir):
    folder, _ = rocketmq_dir
    with pytest.raises(Exception, match="'fetchValues' in mode 'rocketmq' needs a broker's store root"):
        load(spark, folder, fetchValues="true")
    with pytest.raises(Exception, match="'brokerName'.*needs option 'mode' = 'rocketmq'"):
        spark.read.format("msgindex").option("brokerName", "b").load(str(folder))
    with pytest.raises(Exception, match="hashSlotNum' = 5000000"):
        spark.read.format("msgindex").option("mode", "rocketmq").load(str(rocketmq_dataset.store_root)).collect()
