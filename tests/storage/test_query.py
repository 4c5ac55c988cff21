"""The Query value: validated once, and the same answers as the keyword arguments it stands for
(on both kinds of store)."""

from __future__ import annotations

import random

import pytest

from msgindex import Query
from msgindex.errors import InvalidArgumentError, InvalidOptionError
from tests.storage.shard_model import TINY, TOPICS, ShardModel, make_batch, model_lookup, model_scan, table_rows

BASE = 1_700_000_000_000


def test_of_normalizes_and_validates():
    query = Query.of([b"k1", "k2", "k2"], topic="orders", brokers="a", partitions=[2, 0, 2])
    assert query.keys == ("k1", "k2") and query.topics == {"orders"}
    assert query.brokers == {"a"} and query.partitions == {0, 2}
    assert Query.of(None).keys is None  # a scan
    with pytest.raises(InvalidArgumentError, match="topic or topics"):
        Query.of("k", topic="a", topics=["b"])
    with pytest.raises(InvalidOptionError, match="partition must be an int"):
        Query.of("k", partitions=[True])
    with pytest.raises(InvalidOptionError, match="topic name must be a str"):
        Query.of("k", topics=[1])
    with pytest.raises(InvalidOptionError, match="begin_ms"):
        Query(keys=("k",), begin_ms=1.5)
    with pytest.raises(InvalidOptionError, match="max_results"):
        Query.of("k", max_results=-1)


@pytest.fixture
def three_shards(stores):
    rng = random.Random(3)
    models = {b: ShardModel(b) for b in ("a", "b", "c")}
    with stores.create("s", settings=TINY) as store:
        offset = 0
        for _ in range(3):
            for broker, model in models.items():
                batch = make_batch(rng, offset, 20)
                offset += 20
                with store.writer(broker) as writer:
                    writer.append(batch)
                model.append(batch)
    return stores.open(stores.root("s")), list(models.values())


def test_a_query_answers_like_its_arguments(three_shards):
    store, models = three_shards
    with store:
        arguments = dict(begin_ms=BASE + 1000, end_ms=BASE + 15000, partitions=[0, 1], max_results=7)
        query = Query.of(["Aa", "BB"], brokers=["a", "c"], **arguments)
        assert table_rows(store.lookup(query)) == table_rows(store.lookup(["Aa", "BB"], brokers=["a", "c"], **arguments))
        assert table_rows(store.lookup(query)) == model_lookup([models[0], models[2]], ["Aa", "BB"], **arguments)
        with pytest.raises(InvalidArgumentError, match="also given: topic"):
            store.lookup(query, topic="orders")
        scan = Query.of(None, begin_ms=BASE + 5000, topics=[TOPICS[0]], brokers=["b"])
        assert table_rows(store.scan(scan)) == model_scan([models[1]], begin_ms=BASE + 5000, topics=[TOPICS[0]])


def test_several_topics_in_one_lookup_are_the_union_of_each(three_shards):
    store, models = three_shards
    with store:
        two = TOPICS[:2]
        together = table_rows(store.lookup(Query.of(["Aa", "BB", "k1"], topics=two)))
        each = sorted(row for topic in two for row in model_lookup(models, ["Aa", "BB", "k1"], topic=topic))
        assert together and sorted(together) == each


@pytest.mark.parametrize("fields, message", [
    ({"order": b"o-1"}, "field 'order': the values to look up must be a str or a list of str, got bytes"),
    ({"order": None}, "got NoneType"),
    ({"order": 5}, "got int: 5"),
    ("order=o-1", r"fields must be a mapping of a field name to its values \(such as"),
])
def test_field_arguments_that_are_not_values_are_one_line(fields, message):
    with pytest.raises(InvalidOptionError, match=message):
        Query.of(fields=fields)
