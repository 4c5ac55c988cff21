"""Reading an index through Spark Connect: ``format("msgindex")`` found by the server on its own,
options and ``where`` (without and with ``enable_pushdown``) exact, bad input named; bulk lookups;
the same on an object-store index (its client options given with the reads), and fetchValues."""

from __future__ import annotations

import pytest

from tests.connect.client import IDS
from tests.datasource.conftest import EDGE_KEY, WINDOW, assert_fetched, kafka_backed_store, rows_of_json

pytestmark = pytest.mark.spark


def as_set(rows) -> set[tuple]:
    return {tuple(row) for row in rows}


def test_read_through_connect(connect_client, connect_truth, field_store):
    got = connect_client("read", store=str(connect_truth.path), window=list(WINDOW), edge_key=EDGE_KEY,
                         field_store=str(field_store[0]))
    assert_read(got, connect_truth)
    assert "option 'path' = " in got["bad_path"] and "does not exist" in got["bad_path"]
    assert_fields(got["fields"], field_store[1])


def assert_fields(got: dict, written) -> None:
    """The `fields` scenario's answers (tests/datasource/test_field_columns.py) against the records."""
    assert got["columns"][-4:] == ["order", "trace", "any_key", "any_trace"]
    assert "In(order" in got["plan"] and "EqualTo(any_trace,t-1)" in got["plan"]
    expected = sorted([b, r.topic, r.partition, r.offset, order, [v for n, v in r.fields if n == "trace"], "t-1"]
                      for b, r in written for order in [dict(r.fields).get("order")]
                      if order in ("o-1", "o-2") and ("trace", "t-1") in r.fields and r.topic == "orders")
    assert expected and got["rows"] == expected


def assert_read(got: dict, truth) -> None:
    """The `read` scenario's answers against the truth."""
    assert as_set(got["key"]) == truth.select(keys={"Aa"})
    assert as_set(got["keys_topics"]) == truth.select(keys={"AaAa", "BBBB", "ключ-ünï"}, topics={"audit", "payments"})
    assert as_set(got["edge_window"]) == truth.select(keys={EDGE_KEY}, begin=WINDOW[0], end=WINDOW[1])
    # the auto-registered source: Spark evaluates where over a full read, right answers
    assert as_set(got["where_unpushed"]) == truth.select(primary={"BBBB"}, partitions={2})
    assert "EqualTo(key,BBBB)" not in got["where_unpushed_plan"]
    # after enable_pushdown(spark), one line on the client: the index answers where filters
    assert "EqualTo(key,Aa)" in got["where_pushed_plan"] and "In(topic" in got["where_pushed_plan"]
    assert as_set(got["where_pushed"]) == truth.select(primary={"Aa"}, topics={"orders", "audit"})
    assert as_set(got["where_window"]) == truth.select(begin=WINDOW[0], end=WINDOW[1])
    assert "unknown option 'colour' = 'red'" in got["bad_option"]


BULK_KEYS = ["Aa", "BB", "with,comma", "absent", None, "Aa"]


def assert_bulk(got: dict, truth) -> None:
    """The `bulk` scenario's answers (for BULK_KEYS) against the truth."""
    expected = {(key, broker, r.topic, r.partition, r.offset)
                for broker, r in truth.rows for key in {"Aa", "BB", "with,comma"} & set(r.keys)}
    assert as_set(got["rows"]) == expected and len(got["rows"]) == len(expected)
    assert got["counts"] == {k: sum(1 for e in expected if e[0] == k) for k in ("Aa", "BB", "with,comma")}
    assert got["pruned"] == got["rows"] and got["pruned_columns"] == ["lookup_key", *IDS]
    assert "key column 'order_id' is bigint" in got["bad_type"]


def test_empty_answers_through_connect(connect_client, connect_truth, rocketmq_dataset, rocketmq_dir):
    """The reads of tests/datasource/test_empty_answers.py, through Connect: no rows, no error."""
    from tests.datasource import empty_answers
    from tests.datasource.conftest import INDEX_DIR_ENTRIES, INDEX_DIR_SLOTS
    from tests.rocketmq.harness import HASH_SLOT_NUM, INDEX_NUM

    folder, puts = rocketmq_dir
    cases = (empty_answers.store_cases(str(connect_truth.path), connect_truth.rows)
             + empty_answers.rocketmq_root_cases(rocketmq_dataset, HASH_SLOT_NUM, INDEX_NUM)
             + empty_answers.index_directory_cases(str(folder), INDEX_DIR_SLOTS, INDEX_DIR_ENTRIES, puts[0][4]))
    collision = next(case for case in cases if case.name == "store_collision_options").options["key"]
    got = connect_client("empty_answers", cases=[case.to_json() for case in cases],
                         lookup_keys_store=str(connect_truth.path), keys=["no-such-key", collision])
    assert got == dict.fromkeys(got, 0)


def test_bulk_lookup_through_connect(connect_client, connect_truth):
    assert_bulk(connect_client("bulk", store=str(connect_truth.path), keys=BULK_KEYS), connect_truth)


def test_object_store_index_through_connect(connect_client, connect_object_truth, s3):
    """The same reads of an s3:// index: the Connect server has no AWS_* variables of its own, so
    the client gives the store's endpoint and credentials as storage.<name> options (and
    lookup_keys' storage_options); the server's Python workers read the objects themselves."""
    url = str(connect_object_truth.path)
    got = connect_client("read", store=url, window=list(WINDOW), edge_key=EDGE_KEY, storage=s3.options)
    assert_read(got, connect_object_truth)
    assert f"{url}-missing" in got["bad_path"] and "no such msgindex store" in got["bad_path"], got["bad_path"]
    assert_bulk(connect_client("bulk", store=url, keys=BULK_KEYS, storage=s3.options), connect_object_truth)


@pytest.mark.kafka
def test_fetch_values_of_an_object_store_index_through_connect(connect_client, kafka_bootstrap, kafka_topic, s3):
    topic = kafka_topic(partitions=2)
    url = s3.url("fetch")
    sent = kafka_backed_store(kafka_bootstrap, topic, url, storage_options=s3.options)
    rows = connect_client("fetch", store=url, key="cust-1", bootstrap=kafka_bootstrap, storage=s3.options)
    assert_fetched(rows_of_json(rows), sent, "cust-1")
