"""``where any_key = ...`` ("indexed under this key") answered by the index, and times as people
type them in the read options: without a zone in the session's zone, relative to now."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from msgindex.spark.read.datasource import KEYS_PER_LOOKUP_TASK, PUSHDOWN_CONF
from tests.datasource.conftest import EDGE_KEY, KEY_POOL, WINDOW
from tests.datasource.test_spark_read import ids, load, total_scan_pieces

pytestmark = pytest.mark.spark


def test_any_key_is_a_lookup_of_every_key_a_message_is_indexed_under(spark, truth, capsys):
    df = load(spark, truth).where("any_key = 'user-7'")
    df.explain("formatted")
    assert "EqualTo(any_key,user-7)" in capsys.readouterr().out
    assert df.rdd.getNumPartitions() == 1 < total_scan_pieces(truth)  # the index, not a scan
    rows = df.collect()
    assert {(r.broker, r.topic, r.partition, r.offset) for r in rows} == truth.select(keys={"user-7"})
    assert truth.select(keys={"user-7"}) != truth.select(primary={"user-7"})  # what `key =` would miss
    assert {r.any_key for r in rows} == {"user-7"}


def test_any_key_in_returns_each_message_once_under_the_key_that_found_it(spark, truth):
    wanted = {"Aa", "with,comma", "ключ-ünï"}
    rows = load(spark, truth).where("any_key IN ('Aa', 'with,comma', 'ключ-ünï', 'nope')").collect()
    found = [(r.broker, r.topic, r.partition, r.offset) for r in rows]
    assert len(found) == len(set(found)) and set(found) == truth.select(keys=wanted)
    assert all(r.any_key in wanted and r.any_key in r.keys for r in rows)
    # Spark's own check of the condition on the rows it got back agrees with the index
    again = load(spark, truth).where("any_key IN ('Aa', 'with,comma', 'ключ-ünï')").where("any_key <> 'zzz'")
    assert ids(again) == truth.select(keys=wanted)


def test_any_key_with_other_filters_and_options(spark, truth):
    df = load(spark, truth).where(
        f"any_key = 'user-3' AND topic = 'orders' AND partition IN (0, 2) AND "
        f"timestamp >= '{_utc_text(WINDOW[0] - 120_000)}' AND key <> 'user-3'")
    assert df.rdd.getNumPartitions() == 1
    keyed = truth.select(primary=set(KEY_POOL) - {"user-3"})  # `key <> x` is not true for a null key
    expected = truth.select(keys={"user-3"}, topics={"orders"}, partitions={0, 2}, begin=WINDOW[0] - 120_000) & keyed
    assert expected and ids(df) == expected
    # the key options and any_key intersect: indexed under a key that both ask for
    both = load(spark, truth, keys=json.dumps(["Aa", "BB"])).where("any_key IN ('BB', 'user-9')")
    assert ids(both) == truth.select(keys={"BB"})
    primary = load(spark, truth).where("any_key = 'user-5' AND key = 'Aa'")
    assert ids(primary) == truth.select(keys={"user-5"}) & truth.select(primary={"Aa"})


def test_a_spelling_no_row_shows_matches_nothing(spark, truth):
    """``\\x41`` spells ``A``, but no row shows a key so: ``any_key`` (like ``key``) finds no row
    for it, as Spark's own comparison of the shown values would not."""
    from pyspark.sql import functions as F

    for column in ("any_key", "key"):
        assert load(spark, truth).where(F.col(column) == "\\x41a").count() == 0
        rows = load(spark, truth).where(F.col(column).isin("\\x41a", "BB")).collect()
        assert rows and {r[column] for r in rows} == {"BB"}
    assert ids(load(spark, truth).where(F.col("any_key").isin("\\x41a", "BB"))) == truth.select(keys={"BB"})


def test_an_empty_key_is_found_by_spark_not_the_index(spark, tmp_path):
    """A record with an empty Kafka key is logged, shown with key '', and indexed under nothing
    (as the pipeline writes it): ``key = ''`` is Spark's to answer, over a scan, not a lookup
    that finds nothing."""
    import msgindex
    from msgindex.storage.message import MessageRecord

    path = tmp_path / "empty-key"
    with msgindex.open(str(path), create=True) as store, store.writer("b") as writer:
        writer.append([MessageRecord("t", 0, 0, 1_700_000_000_000, "", ()),
                       MessageRecord("t", 0, 1, 1_700_000_000_001, "A", ("A",))])
    read = spark.read.format("msgindex").load(str(path))
    assert [r.offset for r in read.where("key = ''").collect()] == [0]
    assert sorted(r.offset for r in read.where("key IN ('', 'A')").collect()) == [0, 1]
    assert [r.offset for r in spark.read.format("msgindex").load(str(path)).where("key = 'A'").collect()] == [1]


def test_max_num_caps_what_the_options_ask_and_where_filters_after(spark, truth):
    """With ``maxNum`` nothing is pushed: the cap takes the options' first rows, then ``where``
    keeps those of them it matches, whichever column it names (as without pushdown)."""
    capped = load(spark, truth, key="Aa", maxNum="2").collect()
    assert len(capped) == 2
    last = capped[1]
    for condition, keeps in ((f"topic = '{last.topic}'", lambda r: r.topic == last.topic),
                             (f"key = '{last.key}'", lambda r: r.key == last.key),
                             (f"partition = {last.partition}", lambda r: r.partition == last.partition),
                             ("key = 'BB'", lambda r: r.key == "BB")):
        got = load(spark, truth, key="Aa", maxNum="2").where(condition).collect()
        assert sorted(map(tuple, got)) == sorted(tuple(r) for r in capped if keeps(r)), condition


def test_a_message_found_by_keys_of_several_tasks_comes_back_once(spark, truth):
    both = [row for row in truth.rows if {"Aa", "user-3"} <= set(row[1].keys)]
    assert both, "the ground truth needs a message indexed under both keys"
    wanted = ["Aa", *(f"absent-{i}" for i in range(KEYS_PER_LOOKUP_TASK)), "user-3"]  # two tasks
    for df in (load(spark, truth, keys=json.dumps(wanted)),
               load(spark, truth).where(f"any_key IN ({', '.join(repr(k) for k in wanted)})")):
        assert df.rdd.getNumPartitions() == 2
        rows = [tuple(r) for r in df.select("broker", "topic", "partition", "offset").collect()]
        assert len(rows) == len(set(rows)) and set(rows) == truth.select(keys={"Aa", "user-3"})


def test_any_key_inside_or_is_left_to_spark_which_finds_nothing(spark, truth):
    """Documented (pushdown module): Spark pushes no OR, and scans have no any_key; IN is the way."""
    assert load(spark, truth).where("any_key = 'Aa' OR any_key = 'BB'").count() == 0
    assert ids(load(spark, truth).where("any_key IN ('Aa', 'BB')")) == truth.select(keys={"Aa", "BB"})


def test_without_enable_pushdown_any_key_is_an_error_naming_it(spark, truth):
    fresh = spark.newSession()  # the source Spark finds by itself: no any_key column, no scan for it
    fresh.conf.set(PUSHDOWN_CONF, "false")
    with pytest.raises(Exception, match="any_key"):
        load(fresh, truth).where("any_key = 'Aa'").collect()


def _utc_text(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _wall_text(ms: int, zone: str) -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Kolkata"])
def test_option_times_without_a_zone_are_in_the_session_zone(spark, truth, zone):
    """As Spark reads ``where timestamp >= '...'`` literals: exact to the ms in the session's zone."""
    session = spark.newSession()
    session.conf.set("spark.sql.session.timeZone", zone)
    begin, end = _wall_text(WINDOW[0], zone), _wall_text(WINDOW[1], zone)
    df = load(session, truth, key=EDGE_KEY, begin=begin, end=end)
    got = sorted(r.ts for r in df.selectExpr("unix_millis(timestamp) AS ts").collect())
    assert got == [WINDOW[0], WINDOW[1]]  # not begin-1 / end+1, and not hours off
    scan = load(session, truth, begin=begin, end=end)
    assert ids(scan) == truth.select(begin=WINDOW[0], end=WINDOW[1])
    where = load(session, truth).where(f"timestamp >= '{begin}' AND timestamp <= '{end}'")
    assert ids(where) == ids(scan)


def test_relative_option_times(spark, truth):
    everything = truth.select(keys={"Aa"})
    assert ids(load(spark, truth, key="Aa", end="now")) == everything
    assert ids(load(spark, truth, key="Aa", begin="-3650d")) == everything
    assert load(spark, truth, key="Aa", begin="-1h").count() == 0  # the store's messages are older
    assert load(spark, truth, begin="now").count() == 0
