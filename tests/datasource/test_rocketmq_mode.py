"""``mode=rocketmq``: a directory of RocketMQ IndexFiles (made with msgindex's byte-identical
IndexFile) read as raw entries; key lookups return every same-hash entry, marked unverified."""

from __future__ import annotations

import random

import pytest

from msgindex.storage.index_file import IndexFile, index_file_name
from msgindex.storage.java_hash import index_hash
from msgindex.storage.message import index_key

pytestmark = pytest.mark.spark
SLOTS, ENTRIES = 32, 60
T0 = 1_763_700_000_000


@pytest.fixture(scope="module")
def rocketmq_dir(tmp_path_factory):
    """Two full-ish files as a broker would roll them; returns (dir, puts) where puts are
    (file name, entry number, full key, phy offset, store timestamp)."""
    folder = tmp_path_factory.mktemp("rocketmq") / "index"
    folder.mkdir()
    rng = random.Random(7)
    keys = ["orders#Aa", "orders#BB", "payments#Aa"] + [f"orders#k{i}" for i in range(30)]
    puts, phy, ts = [], 0, T0
    index, name = None, None
    for _ in range(100):
        if index is None or index.is_full:
            end_phy, end_ts = (index.end_phy_offset, index.end_timestamp) if index else (0, 0)
            if index:
                index.close()
            name = index_file_name(ts, utc=True)
            index = IndexFile.create(folder / name, SLOTS, ENTRIES, end_phy, end_ts)
        key = rng.choice(keys)
        phy += rng.randrange(100, 500)
        ts += rng.randrange(0, 4000)
        entry = index.index_count
        assert index.put_key(key, phy, ts)
        puts.append((name, entry, key, phy, ts))
    index.close()
    (folder / "not-an-index.txt").write_text("ignored")
    return folder, puts


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
