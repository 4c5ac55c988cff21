"""Verified lookups and scans on the store of a real RocketMQ 5.3.3 broker (the session fixture
``rocketmq_dataset``), compared with the ground truth of what was sent, and with the broker's own
``queryMessage`` answer for the same queries."""

from __future__ import annotations

import csv
import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

import msgindex
from msgindex.errors import InvalidArgumentError, InvalidOptionError
from msgindex.storage.hash_index.index_file import IndexFile
from tests.rocketmq.dataset import (
    AAT,
    BBT,
    BROKER_NAME,
    DECOY_KEY,
    HOT_BATCH_KEY,
    HOT_KEY,
    ORDERS,
    PAYMENTS,
    STORE_NAME,
    UNICODE_KEYS,
)
from tests.rocketmq.harness import HASH_SLOT_NUM, INDEX_NUM

BROKER_CAP = 64  # RocketMQ's maxMsgsNumBatch
FOREVER = (0, (1 << 62))


@pytest.fixture(scope="module")
def store(rocketmq_dataset):
    with msgindex.open_rocketmq(rocketmq_dataset.store_root, hash_slot_num=HASH_SLOT_NUM, index_num=INDEX_NUM) as opened:
        yield opened


def offsets(table) -> list[int]:
    return table["commit_log_offset"].to_pylist()


def test_the_store_rolled_files(rocketmq_dataset, store):
    assert len(store.commit_log.files) >= 3 and len(store.index_files()) >= 2
    assert store.broker_name == STORE_NAME  # default: the store directory's name


def test_every_key_finds_exactly_its_messages(rocketmq_dataset, store):
    truth = rocketmq_dataset
    by_offset = truth.by_offset()
    pairs = sorted(truth.topic_keys())
    rng = random.Random(1)
    pairs += [(m.topic, m.uniq_key) for m in rng.sample(truth.messages, 150)]
    for topic, key in pairs:
        table = store.lookup(key, topic=topic)
        expected = truth.select(topic=topic, key=key)
        got = offsets(table)
        assert len(got) == len(set(got)) and set(got) == expected, (topic, key)
        for row in table.to_pylist():
            m = by_offset[row["commit_log_offset"]]
            assert row["verified"] and row["broker"] == STORE_NAME
            assert (row["topic"], row["partition"], row["offset"], row["size"]) == (m.topic, m.queue_id, m.queue_offset, m.size)
            assert round(row["timestamp"].timestamp() * 1000) == m.store_timestamp
            assert set(row["keys"]) == m.keys and row["key"] == (m.tokens[0] if m.tokens else None)


def test_more_than_64_messages_and_odd_keys(rocketmq_dataset, store):
    truth = rocketmq_dataset
    for key in (HOT_KEY, HOT_BATCH_KEY):
        assert len(offsets(store.lookup(key, topic=ORDERS))) == len(truth.select(ORDERS, key)) > BROKER_CAP
    for key in UNICODE_KEYS + ("dup",):
        found = set(offsets(store.lookup(key, topic=[ORDERS, PAYMENTS])))
        assert found and found == truth.select(ORDERS, key) | truth.select(PAYMENTS, key)
    assert store.lookup(DECOY_KEY, topic=PAYMENTS).num_rows == 0  # only in the user property XKEYS
    assert store.lookup("ideo", topic=[ORDERS, PAYMENTS]).num_rows == 0  # U+3000 is part of a key


def test_hash_collisions_are_dropped(rocketmq_dataset, store):
    """``AaT#k`` and ``BBT#k`` (and ``orders#Aa`` / ``orders#BB``) share a hash: the broker's
    index walk returns both; the verified lookup only the real ones."""
    truth = rocketmq_dataset
    for topic, key in [(AAT, "k"), (BBT, "k"), (AAT, "Aa"), (BBT, "BB"), (ORDERS, "Aa"), (ORDERS, "BB")]:
        raw = {phy for index in store.index_files()
               for phy in index.select_phy_offsets(f"{topic}#{key}", 1 << 30, 0, (1 << 63) - 1)}
        expected = truth.select(topic, key)
        assert expected < raw, "the raw hash hits should include other keys' messages"
        assert set(offsets(store.lookup(key, topic=topic))) == expected


def test_windows_cut_inside_seconds(rocketmq_dataset, store):
    truth = rocketmq_dataset
    stamps = sorted({m.store_timestamp for m in truth.messages})
    rng = random.Random(2)
    windows = []
    for _ in range(40):
        a, b = sorted(rng.sample(stamps, 2))
        windows.append((a, b))
        windows.append((a + rng.randrange(1, 999), b - rng.randrange(1, 999)))
    mid_second = [s for s in stamps if s % 1000 not in (0, 999)][:5]
    windows += [(s, s) for s in mid_second] + [(s + 1, s + 1500) for s in mid_second]
    keys = [(ORDERS, HOT_KEY), (ORDERS, HOT_BATCH_KEY), (PAYMENTS, "dup"), (ORDERS, "user-7")]
    for begin, end in windows:
        if begin > end:
            continue
        for topic, key in keys:
            got = offsets(store.lookup(key, topic=topic, begin_ms=begin, end_ms=end))
            assert set(got) == truth.select(topic, key, begin, end), (topic, key, begin, end)
    for begin, end in windows[:12]:
        if begin > end:
            continue
        scanned = [o for batch in store.scan(begin_ms=begin, end_ms=end) for o in offsets(batch)]
        assert sorted(scanned) == sorted(truth.select(begin=begin, end=end))
        assert scanned == sorted(scanned)  # commit-log order
    everything = [o for batch in store.scan(topics=[PAYMENTS], partitions=[1]) for o in offsets(batch)]
    assert set(everything) == truth.select(topic=PAYMENTS, partitions={1})


def test_max_results_and_partitions(rocketmq_dataset, store):
    truth = rocketmq_dataset
    by_offset = truth.by_offset()
    ordered = sorted(truth.select(ORDERS, HOT_KEY),
                     key=lambda o: (by_offset[o].store_timestamp, by_offset[o].queue_id, by_offset[o].queue_offset))
    assert offsets(store.lookup(HOT_KEY, topic=ORDERS, max_results=70)) == ordered[:70]
    got = store.lookup(HOT_KEY, topic=ORDERS, partitions=[0, 2])
    assert set(offsets(got)) == truth.select(ORDERS, HOT_KEY, partitions={0, 2})


def test_a_query_value_stands_for_the_arguments(rocketmq_dataset, store):
    """``msgindex.Query`` works here as with ``msgindex.open(...).lookup``: the same rows as the
    keyword arguments; topics required (the index hashes them); another broker's name finds nothing."""
    query = msgindex.Query.of([HOT_KEY, DECOY_KEY], topics=[ORDERS, PAYMENTS], partitions=[0, 2], max_results=50)
    keywords = store.lookup([HOT_KEY, DECOY_KEY], topic=[ORDERS, PAYMENTS], partitions=[0, 2], max_results=50)
    assert store.lookup(query).equals(keywords) and keywords.num_rows == 50
    assert store.lookup(msgindex.Query.of(HOT_KEY, topic=ORDERS, brokers=["another"])).num_rows == 0
    with pytest.raises(InvalidOptionError, match="needs a topic"):
        store.lookup(msgindex.Query.of(HOT_KEY))
    with pytest.raises(InvalidArgumentError, match="also given: topics"):
        store.lookup(query, topic=ORDERS)


def test_values_and_properties(rocketmq_dataset, store):
    truth = rocketmq_dataset
    compressed = [m for m in truth.messages if m.tokens and m.tokens[0].startswith("big-")]
    with_props = [m for m in truth.messages if m.user_properties]
    for m in compressed + with_props[:3]:
        rows = store.lookup(m.uniq_key, topic=m.topic, fetch_values=True).to_pylist()
        assert len(rows) == 1
        properties = dict(rows[0]["properties"])
        assert rows[0]["value"] == m.body
        assert properties["TAGS"] == m.tags and properties["UNIQ_KEY"] == m.uniq_key
        assert {k: properties[k] for k in m.user_properties} == m.user_properties
    codecs = {store.commit_log.read_message(m.commit_log_offset).sys_flag >> 8 & 7 for m in compressed}
    assert codecs == {1, 2, 3}  # the producer really sent LZ4, ZSTD and ZLIB bodies


def test_the_broker_answers_a_subset(rocketmq_dataset, store, tmp_path):
    """The same queries through the broker's admin API (queryMessage, capped at 64, windows in
    whole seconds of index time): everything it returns that really has the key and is in the
    window, msgindex returns too; where the broker capped, msgindex returns more."""
    truth = rocketmq_dataset
    stamps = sorted(m.store_timestamp for m in truth.messages)
    queries = []
    for topic, key in [(ORDERS, HOT_KEY), (ORDERS, HOT_BATCH_KEY), (AAT, "k"), (BBT, "k"), (ORDERS, "Aa"),
                       (PAYMENTS, "dup"), (ORDERS, UNICODE_KEYS[0]), (PAYMENTS, "props-1"), (ORDERS, "user-3")]:
        queries.append({"topic": topic, "key": key, "maxNum": BROKER_CAP, "begin": FOREVER[0], "end": FOREVER[1]})
        queries.append({"topic": topic, "key": key, "maxNum": BROKER_CAP,
                        "begin": stamps[len(stamps) // 3] + 437, "end": stamps[2 * len(stamps) // 3] - 311})
    answers = truth.broker.query(queries, tmp_path)
    capped = 0
    for query, answer in zip(queries, answers):
        begin, end = query["begin"], query["end"]
        ours = set(offsets(store.lookup(query["key"], topic=query["topic"], begin_ms=begin, end_ms=end)))
        expected = truth.select(query["topic"], query["key"], begin, end)
        assert ours == expected
        real = {o for o in answer if o in expected}  # the broker may add messages outside the window
        assert real <= ours, query
        if len(expected) > BROKER_CAP:
            assert len(answer) <= BROKER_CAP < len(ours)
            capped += 1
        elif (begin, end) == FOREVER:
            assert set(answer) == ours  # uncapped and no window: the same messages
    assert capped >= 2


def test_cli_and_broker_name(rocketmq_dataset):
    truth = rocketmq_dataset
    done = subprocess.run(
        [str(Path(sys.executable).with_name("msgindex")), "lookup", str(truth.store_root), "--mode", "rocketmq",
         "--key", HOT_KEY, "--topic", ORDERS, "--hash-slot-num", str(HASH_SLOT_NUM), "--index-num", str(INDEX_NUM),
         "--broker-name", BROKER_NAME, "--format", "json", "--limit", "0"],
        capture_output=True, text=True, check=True,
    )
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert {r["commit_log_offset"] for r in rows} == truth.select(ORDERS, HOT_KEY)
    assert {r["broker"] for r in rows} == {BROKER_NAME} and all(r["verified"] for r in rows)
    stamps = sorted(m.store_timestamp for m in truth.messages)
    begin, end = stamps[200] + 1, stamps[900] - 1
    scan = subprocess.run(
        [str(Path(sys.executable).with_name("msgindex")), "lookup", str(truth.store_root), "--mode", "rocketmq",
         "--scan", "--topic", PAYMENTS, "--begin", str(begin), "--end", str(end), "--hash-slot-num",
         str(HASH_SLOT_NUM), "--index-num", str(INDEX_NUM), "--format", "csv", "--limit", "0"],
        capture_output=True, text=True, check=True,
    )
    rows = list(csv.DictReader(io.StringIO(scan.stdout)))
    assert {int(r["commit_log_offset"]) for r in rows} == truth.select(PAYMENTS, begin=begin, end=end)


def test_the_index_files_are_the_brokers(rocketmq_dataset, store):
    """The broker's files open with msgindex's byte-identical IndexFile at the broker's sizing."""
    for index in store.index_files():
        assert isinstance(index, IndexFile) and index.path.stat().st_size == IndexFile.file_size(HASH_SLOT_NUM, INDEX_NUM)


def test_a_store_kept_open_sees_what_the_broker_writes_later(rocketmq_dataset, store, tmp_path):
    """The broker keeps writing (and rolls a commit-log file: the bodies are 200 KiB of random
    bytes in 256 KiB files); a store opened before must find the new messages."""
    import base64
    import os
    import time

    files_before = len(store.commit_log.files)
    specs = [{"topic": ORDERS, "keys": "late-key", "tags": "t", "bodyB64": base64.b64encode(os.urandom(200_000)).decode()}
             for _ in range(3)]
    sent = rocketmq_dataset.broker.produce(specs, tmp_path)
    expected = {int(row["offsetMsgId"][-16:], 16) for row in sent}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and set(offsets(store.lookup("late-key", topic=ORDERS))) != expected:
        time.sleep(0.2)  # the broker indexes asynchronously
    rows = store.lookup("late-key", topic=ORDERS, fetch_values=True).to_pylist()
    assert {r["commit_log_offset"] for r in rows} == expected
    assert sorted(r["value"] for r in rows) == sorted(base64.b64decode(s["bodyB64"]) for s in specs)
    assert len(store.commit_log.files) > files_before
