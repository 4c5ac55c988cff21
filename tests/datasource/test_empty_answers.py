"""An answer of no rows, on every path a read takes: options, ``where`` pushdown, ``lookup_keys``
and ``msgindex lookup``, over a msgindex store, a real RocketMQ broker's store root and a bare
directory of index files (``empty_answers.py`` says which reads; Connect runs the same ones in
tests/connect). Each case's near miss is read too, so that no case is empty for a trivial reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.datasource import empty_answers
from tests.datasource.conftest import INDEX_DIR_ENTRIES, INDEX_DIR_SLOTS

pytestmark = pytest.mark.spark
MSGINDEX = str(Path(sys.executable).with_name("msgindex"))


def assert_all_empty(spark, cases: list[empty_answers.EmptyRead]) -> None:
    got = {case.name: empty_answers.count_rows(spark, case.to_json()) for case in cases}
    assert got == dict.fromkeys(got, 0)


def assert_cli_empty(cases: list[empty_answers.EmptyRead]) -> None:
    for case in cases:
        if not case.cli:
            continue
        done = subprocess.run([MSGINDEX, "lookup", case.path, *case.cli, "--format", "json"],
                              capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), case.name


def near_miss(spark, path: str, options: dict[str, str]) -> int:
    reader = spark.read.format("msgindex")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(path).count()


def test_store(spark, truth):
    cases = empty_answers.store_cases(str(truth.path), truth.rows)
    assert_all_empty(spark, cases)
    assert_cli_empty(cases)
    window = next(case for case in cases if case.name == "store_window_after_options").options
    stamp = int(window["begin"]) - 1
    assert near_miss(spark, str(truth.path), {**window, "begin": str(stamp), "end": str(stamp)}) == 1
    collision = next(case for case in cases if case.name == "store_collision_options").options
    assert near_miss(spark, str(truth.path), {"key": collision["key"]}) == 0  # in no topic
    for other_topic in ("orders", "payments", "audit"):
        # the colliding key hashes like the lone key of another topic, which is found there
        if other_topic != collision["topic"] and near_miss(
                spark, str(truth.path), {"key": window["key"], "topic": other_topic}):
            break
    else:
        raise AssertionError("the lone key is in no topic")


def test_store_lookup_keys(spark, truth):
    from msgindex.spark import lookup_keys

    cases = empty_answers.store_cases(str(truth.path), truth.rows)
    window = next(case for case in cases if case.name == "store_window_after_options").options
    collision = next(case for case in cases if case.name == "store_collision_options").options
    keys = spark.createDataFrame([("no-such-key",), (collision["key"],)], "k string")
    assert lookup_keys(keys, str(truth.path), key_col="k").count() == 0
    assert lookup_keys(keys, str(truth.path), key_col="k", topic=collision["topic"]).count() == 0
    lone = spark.createDataFrame([(window["key"],)], "k string")
    assert lookup_keys(lone, str(truth.path), key_col="k", begin=window["begin"], end=window["end"]).count() == 0
    assert lookup_keys(lone, str(truth.path), key_col="k").count() >= 1
    nothing = spark.createDataFrame([], "k string")
    assert lookup_keys(nothing, str(truth.path), key_col="k").count() == 0


def test_rocketmq_store_root(spark, rocketmq_dataset):
    from tests.rocketmq.harness import HASH_SLOT_NUM, INDEX_NUM

    cases = empty_answers.rocketmq_root_cases(rocketmq_dataset, HASH_SLOT_NUM, INDEX_NUM)
    assert_all_empty(spark, cases)
    assert_cli_empty(cases)
    path = str(rocketmq_dataset.store_root)
    window = next(case for case in cases if case.name == "rocketmq_window_after_options").options
    stamp = int(window["begin"]) - 1
    assert near_miss(spark, path, {**window, "begin": str(stamp), "end": str(stamp)}) == 1
    collision = next(case for case in cases if case.name == "rocketmq_collision_options").options
    # the lone key, in its own topic, is found: the colliding key hits its index entries
    assert near_miss(spark, path, {**window, "begin": "0", "end": str(1 << 60)}) >= 1
    assert empty_answers.index_hash(empty_answers.index_key(collision["topic"], collision["key"])) == \
        empty_answers.index_hash(empty_answers.index_key(window["topic"], window["key"]))


def test_bare_index_directory(spark, rocketmq_dir):
    folder, puts = rocketmq_dir
    cases = empty_answers.index_directory_cases(str(folder), INDEX_DIR_SLOTS, INDEX_DIR_ENTRIES, puts[0][4])
    assert_all_empty(spark, cases)
    base = cases[0].options
    assert near_miss(spark, str(folder), {**base, "key": "Aa"}) > 0


def test_cases_are_plain_json(truth):
    """What tests/connect sends to its client process."""
    for case in empty_answers.store_cases(str(truth.path), truth.rows):
        assert json.loads(json.dumps(case.to_json())) == case.to_json()
