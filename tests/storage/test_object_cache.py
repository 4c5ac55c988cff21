"""What a process keeps of an object store between store objects (storage/objects/cache.py): the
requests a one-key lookup sends, fresh and warm (counted by the store's client: a regression that
adds a round trip fails here), and that nothing kept makes a lookup miss committed data or read a
deleted store."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import msgindex
from msgindex.errors import StoreNotFoundError
from msgindex.storage.message import MessageRecord
from msgindex.storage.objects.cache import STORE_CACHE
from msgindex.storage.store import open_store

BASE = 1_700_000_000_000
# A one-key lookup on a store opened anew in a warm process: the shards' marks (LIST), per shard
# its versions from the newest this process saw (LIST), and the log block of the key (GET); the
# manifest, the version and the chunk's footer with its hash section come from the process.
WARM_PER_STORE = {"LIST": 1}
WARM_PER_SHARD = {"LIST": 1, "GET": 1}


def _records(start: int, count: int, key: str = "k") -> list[MessageRecord]:
    return [MessageRecord("orders", 0, i, BASE + i, f"{key}{i % 10}", [f"{key}{i % 10}"]) for i in range(start, start + count)]


def _filled(s3, brokers=("a",)) -> str:
    url = s3.url()
    with msgindex.open(url, create=True, storage_options=s3.options) as store:
        for broker in brokers:
            store.writer(broker).append(_records(0, 100))
    return url


def _requests(store) -> dict[str, int]:
    return {kind: n for kind, n in store.client.requests.items() if n}


def _expected(shards: int) -> dict[str, int]:
    return {kind: WARM_PER_STORE.get(kind, 0) + shards * WARM_PER_SHARD.get(kind, 0)
            for kind in {*WARM_PER_STORE, *WARM_PER_SHARD}}


@pytest.mark.parametrize("shards", [1, 3])
def test_a_warm_one_key_lookup_sends_one_request_per_shard_and_two_lists(s3, shards):
    url = _filled(s3, [f"b{i}" for i in range(shards)])
    STORE_CACHE.clear()  # a fresh process
    fresh = msgindex.open(url, storage_options=s3.options)
    assert fresh.lookup("k3").num_rows == 10 * shards
    # manifest, shards LIST; per shard versions LIST + version GET, footer+hashes GET, log GET
    assert _requests(fresh) == {"GET": 1 + 3 * shards, "LIST": 1 + shards}
    for _ in range(2):  # every new store object (a new query) in this process
        warm = msgindex.open(url, storage_options=s3.options, max_staleness_s=60)
        assert warm.lookup("k3").num_rows == 10 * shards
        assert _requests(warm) == _expected(shards)
    before = warm.client.requests.copy()
    assert warm.lookup("k4").num_rows == 10 * shards  # the same store within max_staleness_s: the log only
    assert warm.client.requests - before == {"GET": shards}


def test_a_store_opened_after_a_commit_by_another_process_sees_it(s3):
    url = _filled(s3)
    with msgindex.open(url, storage_options=s3.options) as store:
        assert store.lookup("k3").num_rows == 10
    # another process commits a version of the shard this process knows, and a new shard
    program = ("import json, sys, msgindex; from msgindex.storage.message import MessageRecord as R\n"
               "s = msgindex.open(sys.argv[1], storage_options=json.loads(sys.argv[2]))\n"
               "s.writer('a').append([R('orders', 0, 100, 1_700_000_000_100, 'k3', ['k3'])])\n"
               "s.writer('new').append([R('orders', 1, 0, 1_700_000_000_100, 'k3', ['k3'])])\n")
    subprocess.run([sys.executable, "-c", program, url, json.dumps(s3.options)], check=True, timeout=120)
    with msgindex.open(url, storage_options=s3.options) as store:
        found = store.lookup("k3")
        assert found.num_rows == 12 and sorted(set(found["broker"].to_pylist())) == ["a", "new"]
    with msgindex.open(url, storage_options=s3.options) as store:  # and a commit by another store object
        store.writer("a").append(_records(101, 1, key="x"))
    with msgindex.open(url, storage_options=s3.options) as store:
        assert store.lookup("x1").num_rows == 1


def test_a_deleted_store_is_not_answered_from_its_cached_manifest(s3):
    url = _filled(s3)
    assert msgindex.open(url, storage_options=s3.options).lookup("k1").num_rows == 10
    bucket = url.split("/")[2]
    from tests.object_store import _boto3_client

    client = _boto3_client(s3.endpoint)
    for item in client.list_objects_v2(Bucket=bucket).get("Contents", ()):
        client.delete_object(Bucket=bucket, Key=item["Key"])
    with pytest.raises(StoreNotFoundError, match="no such msgindex store"):
        msgindex.open(url, storage_options=s3.options).lookup("k1")


def test_tasks_of_a_query_read_the_pinned_versions_without_asking_again(s3):
    url = _filled(s3, ["a", "b"])
    driver = msgindex.open(url, storage_options=s3.options)
    pin = driver.pin()
    assert [broker for broker, _ in pin.versions] == ["a", "b"]
    driver.writer("a").append(_records(100, 10))  # committed after the query began
    task = open_store(url, storage_options=s3.options, pin=pin)
    assert task.lookup("k3").num_rows == 20  # the pinned snapshot, not the newer version
    # per shard its chunk's footer with the hash section and the key's log block: no manifest, no
    # LIST, no version GET (the driver's pin read them in this process)
    assert _requests(task) == {"GET": 4}
    STORE_CACHE.clear()  # a task in a fresh process
    task = open_store(url, storage_options=s3.options, pin=pin)
    assert task.lookup("k3").num_rows == 20
    assert _requests(task) == {"GET": 6}  # per shard: its pinned version, footer+hashes, log block
    assert msgindex.open(url, storage_options=s3.options).lookup("k3").num_rows == 21  # a new query sees it


def test_a_chunk_read_page_by_page_is_kept_whole_once_a_process_keeps_coming_back(s3, monkeypatch):
    from msgindex.storage.objects import shard as object_shard

    # this chunk's hash section (100 items, 800 bytes) counts as too big to read with the footer
    monkeypatch.setattr(object_shard, "CACHED_HASH_BYTES", 100)
    url = _filled(s3)
    STORE_CACHE.clear()
    store = msgindex.open(url, storage_options=s3.options, max_staleness_s=60)
    assert store.lookup("k0").num_rows == 10  # footer, then the key's hash pages, then its log block
    gets = []
    for key in ["k1", "k2", "k3", "k4", "k5"]:
        before = store.client.requests.copy()
        found = store.lookup(key)
        assert sorted(found["offset"].to_pylist()) == list(range(int(key[1]), 100, 10))
        gets.append((store.client.requests - before)["GET"])
    # lookup n of the chunk (k0 is the first) reads its hash pages and log block while n <
    # WARM_PAGE_READS, the whole section and the log block when n == WARM_PAGE_READS, and from
    # then on the log block alone
    paged = object_shard.WARM_PAGE_READS - 1  # of k1..k5
    assert gets == [2] * paged + [1] * (len(gets) - paged)
    assert store.lookup("absent").num_rows == 0
