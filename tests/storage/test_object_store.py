"""A store on a real S3 API server (moto's, over HTTP): the same answers as a local store, exactly
once under concurrent writers and lost versions, compaction and collection, one-line errors."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import msgindex
from msgindex.errors import InvalidOptionError, ObjectStoreError, StoreNotFoundError
from msgindex.storage.location import parse_location
from msgindex.storage.message import ROW_SCHEMA, MessageRecord
from msgindex.storage.objects.client import ObjectClient
from msgindex.storage.objects.shard import ObjectTuning
from msgindex.storage.objects.store import ObjectStore, open_object_store
from tests.storage.shard_model import ShardModel, make_batch, model_lookup, model_scan, table_rows

BASE = 1_700_000_000_000
CLI = str(Path(sys.executable).parent / "msgindex")  # the console script, as users run it


def _store(s3, **tuning) -> ObjectStore:
    location = parse_location(s3.url(), s3.options)
    return open_object_store(location, create=True, tuning=ObjectTuning(**tuning) if tuning else None)


def _reopen(store: ObjectStore, s3) -> ObjectStore:
    """Another store object on the same index, answering from the newest version every time."""
    return msgindex.open(store.root, storage_options=s3.options, max_staleness_s=0)


def test_urls_are_never_local_directories(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for url, message in (("foo://bucket/x", "unknown scheme 'foo'"), ("hdfs://nn/x", "unknown scheme 'hdfs'"),
                         ("s3:/bucket/x", "s3://bucket/prefix"), ("s3:///x", "no bucket"),
                         ("s3://b/team#2", "'\\?' and '#' cannot be part of a store URL"),
                         ("s3://b/team?v=2", "'\\?' and '#' cannot be part of a store URL")):
        with pytest.raises(InvalidOptionError, match=message):
            msgindex.open(url, create=True)
    with pytest.raises(InvalidOptionError, match="storage options"):
        msgindex.open(tmp_path / "local", create=True, storage_options={"endpoint": "http://x"})
    assert list(tmp_path.iterdir()) == []  # nothing was created locally


@pytest.mark.parametrize("options, env, message", [
    ({"endpoint": "127.0.0.1:9000"}, {}, "storage option endpoint = '127.0.0.1:9000' is not an endpoint URL"),
    ({"endpoint": " http://127.0.0.1:9000"}, {}, "storage option endpoint = ' http://127.0.0.1:9000' is not an"),
    ({}, {"AWS_ENDPOINT_URL": ""}, "AWS_ENDPOINT_URL = '' is not an endpoint URL"),
    ({}, {"AWS_ENDPOINT_URL": "localhost:9000"}, "AWS_ENDPOINT_URL = 'localhost:9000' is not an endpoint URL"),
    ({"max_retries": "-1"}, {}, "storage option max_retries='-1': must be a whole number >= 0"),
    ({"retry_timeout": "nan"}, {}, "storage option retry_timeout='nan': must be seconds, a number > 0"),
    ({"retry_timeout": "inf"}, {}, "retry_timeout='inf': must be seconds"),
    ({"retry_timeout": "-5"}, {}, "retry_timeout='-5': must be seconds"),
    ({"allow_http": "maybe"}, {}, "storage option allow_http='maybe': not a boolean"),
    ({"endpoint": "http://127.0.0.1:9000", "allow_http": "false"}, {}, "allow_http=false, but the endpoint"),
])
def test_storage_options_the_client_cannot_take_are_one_line(monkeypatch, options, env, message):
    """Found by an attack run: an endpoint without http:// made the client library panic
    mid-request (88 lines of Rust backtrace, past `except Exception`), nan and inf timeouts
    crashed, negative values came back in the client library's words."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidOptionError, match=message) as failed:
        msgindex.open("s3://bucket/index", storage_options=options)
    assert "\n" not in str(failed.value)


def test_same_answers_as_a_local_store(s3, tmp_path):
    rng = random.Random(5)
    models = {b: ShardModel(b) for b in ("a", "b")}
    remote = _store(s3)
    local = msgindex.open(tmp_path / "local", create=True)
    offset = 0
    for _ in range(6):
        for broker, model in models.items():
            batch = make_batch(rng, offset, 40)
            offset += 40
            model.append(batch)
            remote.writer(broker).append(batch)
            with local.writer(broker) as writer:
                writer.append(batch)
    reader = _reopen(remote, s3)
    keys = sorted({k for m in models.values() for _, r in m.rows() for k in r.keys})
    for ask in (keys[:1], keys[3:9], keys, ["absent"]):
        for window in ((None, None), (BASE + 50, BASE + 400)):
            got = reader.lookup(ask, begin_ms=window[0], end_ms=window[1])
            assert table_rows(got) == model_lookup(models.values(), ask, begin_ms=window[0], end_ms=window[1])
            assert got.equals(local.lookup(ask, begin_ms=window[0], end_ms=window[1]))
            assert got.schema == local.lookup(ask).schema
    assert reader.lookup(keys, max_results=7).equals(local.lookup(keys, max_results=7))
    assert reader.lookup(keys[:5], partitions=[1], topic="orders").equals(
        local.lookup(keys[:5], partitions=[1], topic="orders"))
    assert table_rows(list(reader.scan(begin_ms=BASE + 100, end_ms=BASE + 900))) == model_scan(
        models.values(), begin_ms=BASE + 100, end_ms=BASE + 900)
    assert reader.brokers() == ["a", "b"]


def test_exactly_once_by_offsets_across_writers_and_lost_versions(s3):
    store = _store(s3)
    records = [MessageRecord("t", i % 2, i, BASE + i, f"k{i % 9}", [f"k{i % 9}"]) for i in range(300)]
    first, second = store.writer("a"), store.writer("a")
    first.refresh()
    second.refresh()  # both now know version 0
    assert first.append(records[:200]).appended == 200
    # second still believes version 0: it loses version 1, reads what won, keeps only rows 200..299
    result = second.append(records[100:300])
    assert (result.appended, result.already_committed) == (100, 100)
    assert first.append(records).appended == 0
    rows = _reopen(store, s3).lookup([f"k{i}" for i in range(9)])
    assert sorted(rows.column("offset").to_pylist()) == list(range(300))


def test_before_commit_is_told_what_each_version_put_adds_and_when_a_lost_one_added_nothing(s3):
    """The pipeline counts a batch's new records from these calls (spark/pipeline/attempt_counts.py):
    when another writer commits the same rows between the call and the put, the put is lost and
    the append ends adding nothing, which it must say (a second job's count was 966 too high)."""
    store = _store(s3)
    records = [MessageRecord("t", 0, i, BASE + i, f"k{i}", [f"k{i}"]) for i in range(50)]
    rival, writer = store.writer("a"), store.writer("a")
    writer.refresh()
    told: list[tuple[int, int]] = []

    def before_commit(result):
        told.append((result.appended, result.already_committed))
        if len(told) == 1:  # another job commits the rows right now: this put loses
            assert rival.append(records[:30]).appended == 30

    result = writer.append(records[:30], before_commit=before_commit)
    assert (result.appended, result.already_committed) == (0, 30) and told == [(30, 0), (0, 30)]
    told.clear()
    result = writer.append(records, before_commit=lambda r: told.append((r.appended, r.already_committed)))
    assert (result.appended, told) == (20, [(20, 30)])


def test_compaction_keeps_answers_and_collection_waits_for_the_grace_period(s3):
    store = _store(s3, compaction_interval_s=3600, grace_s=60, ratio=4)
    writer = store.writer("a")
    records = [MessageRecord("t", 0, i, BASE + i, f"k{i % 13}", [f"k{i % 13}"]) for i in range(600)]
    for start in range(0, 600, 50):
        writer.append(records[start : start + 50])
    assert len(writer.refresh().chunks) == 12
    before = _reopen(store, s3)
    expected = before.lookup([f"k{i}" for i in range(13)])
    pinned = before.reader("a")  # a reader that keeps the old version
    assert writer.compact(everything=True) == 11
    assert len(writer.refresh().chunks) == 1
    assert _reopen(store, s3).lookup([f"k{i}" for i in range(13)]).equals(expected)
    assert pinned.lookup([f"k{i}" for i in range(13)]).equals(expected)  # its chunks are still there
    removed_at = min(removed.at_ms for removed in writer.refresh().removed)
    assert writer.collect(now_ms=removed_at + 59_000) == 0  # (explicit times: a loaded machine is slow)
    assert pinned.lookup(["k1"]).num_rows  # inside the grace period nothing is deleted
    assert writer.collect(now_ms=removed_at + 61_000) == 12
    assert _reopen(store, s3).lookup([f"k{i}" for i in range(13)]).equals(expected)


def test_compaction_runs_by_itself_and_keeps_lookups_flat(s3):
    store = _store(s3, compaction_interval_s=0, max_chunks=4)
    writer = store.writer("a")
    for start in range(0, 2000, 20):  # a hundred appends
        writer.append([MessageRecord("t", 0, i, BASE + i, f"k{i % 50}", [f"k{i % 50}"]) for i in range(start, start + 20)])
    chunks = writer.refresh().chunks
    assert len(chunks) <= 6, [c.info.records for c in chunks]
    reader = _reopen(store, s3)
    reader.lookup("k3")
    before = reader.client.request_count()
    assert reader.lookup("k3").num_rows == 40
    assert reader.client.request_count() - before <= 2 + 2 * len(chunks)


def test_bad_buckets_credentials_and_endpoints_are_one_line(s3, tmp_path):
    with pytest.raises(ObjectStoreError, match="bucket 'no-such-bucket' does not exist") as missing:
        msgindex.open("s3://no-such-bucket/index", storage_options=s3.options)
    assert "\n" not in str(missing.value)
    bucket = s3.bucket()
    msgindex.open(f"s3://{bucket}/i", create=True, storage_options=s3.options)
    # (wrong credentials: test_object_faults, on a server that checks them)
    dead = {**s3.options, "endpoint": "http://127.0.0.1:9", "max_retries": "0", "connect_timeout": "1s"}
    began = time.monotonic()
    with pytest.raises(ObjectStoreError, match=r"endpoint http://127.0.0.1:9 does not answer") as unreachable:
        msgindex.open(f"s3://{bucket}/i", storage_options=dead)
    assert time.monotonic() - began < 15 and "\n" not in str(unreachable.value)
    with pytest.raises(StoreNotFoundError, match="no such msgindex store"):
        msgindex.open(f"s3://{bucket}/elsewhere", storage_options=s3.options)


def test_a_process_that_saw_newer_versions_reads_what_is_left_after_they_are_deleted(s3):
    """Found by an attack run: after `msgindex repair --roll-back` (versions deleted from the
    top), a long-lived process (a notebook, `msgindex serve`) never went back below the newest
    version it had seen: its fresh handles found no committed state. The versions above 2 are
    deleted here by hand, as the roll-back does."""
    store = _store(s3)
    writer = store.writer("b0")
    for n in range(3):
        writer.append(make_batch(random.Random(n), n * 10, 10))
    assert sum(batch.num_rows for batch in _reopen(store, s3).scan()) == 30  # this process has seen version 3
    bucket, _, prefix = store.root.removeprefix("s3://").partition("/")
    newest = max(key for key in s3.keys(store.root) if "/_commits/" in key)
    boto3_client = __import__("tests.object_store", fromlist=["_boto3_client"])._boto3_client(s3.endpoint)
    boto3_client.delete_object(Bucket=bucket, Key=newest)
    assert sum(batch.num_rows for batch in _reopen(store, s3).scan()) == 20
    writer = _reopen(store, s3).writer("b0")  # and a writer commits after what is left
    writer.append(make_batch(random.Random(9), 100, 5))
    assert sum(batch.num_rows for batch in _reopen(store, s3).scan()) == 25


def test_a_store_made_again_at_its_url_is_read_as_the_new_one(s3):
    """A long-lived process saw version 3 of a store; the store is deleted and indexed again at
    its URL by another process, up to version 3 again: the number is the same, the object is
    another (a size unlike the one known makes the process read it again)."""
    store = _store(s3)
    writer = store.writer("b0")
    for n in range(3):
        writer.append(make_batch(random.Random(n), n * 10, 10))
    assert sum(batch.num_rows for batch in _reopen(store, s3).scan()) == 30
    bucket = store.root.removeprefix("s3://").partition("/")[0]
    boto3_client = __import__("tests.object_store", fromlist=["_boto3_client"])._boto3_client(s3.endpoint)
    for key in s3.keys(store.root):
        boto3_client.delete_object(Bucket=bucket, Key=key)
    made_again = textwrap.dedent(f"""
        import random, msgindex
        from tests.storage.shard_model import make_batch
        writer = msgindex.open({store.root!r}, create=True, storage_options={s3.options!r}).writer("b0")
        for n in range(3):
            writer.append(make_batch(random.Random(100 + n), 1000 + n * 7, 7))
    """)
    subprocess.run([sys.executable, "-c", made_again], check=True, cwd=Path(__file__).resolve().parents[2])
    assert sorted(offset for batch in _reopen(store, s3).scan() for offset in batch.column("offset").to_pylist()) == \
        list(range(1000, 1021))


def test_creating_a_store_another_process_created_meanwhile_opens_it(s3):
    """The interleaving of two jobs started at once on a new index: our GET of the manifest found
    nothing, then the other process created the store (manifest first, then its objects), then we
    LIST the prefix: its objects are there, and so is its manifest, which is opened."""
    url = f"s3://{s3.bucket()}/index"
    location = parse_location(url, s3.options)
    with msgindex.open(url, create=True, storage_options=s3.options) as first, first.writer("b0") as writer:
        writer.append(make_batch(random.Random(7), 0, 10))

    class ManifestFirstMissing(ObjectClient):
        gets = 0

        def get(self, key: str):
            self.gets += 1
            return None if self.gets == 1 else super().get(key)

    store = open_object_store(location, create=True, client=ManifestFirstMissing(location))
    assert store.brokers() == ["b0"] and sum(batch.num_rows for batch in store.scan()) == 10
    # objects and no manifest, before and after: still refused, naming the URL
    other = parse_location(f"{url}-other", s3.options)
    ObjectClient(other).put_if_absent("stray", b"x")
    with pytest.raises(StoreNotFoundError, match=f"{url}-other: cannot create a msgindex store here: it holds objects"):
        open_object_store(other, create=True)


def test_cli_takes_urls_and_storage_options(s3):
    store = _store(s3)
    store.writer("a").append([MessageRecord("orders", 0, i, BASE + i, f"o-{i}", [f"o-{i}"]) for i in range(10)])
    env = {**os.environ, **s3.env}
    done = subprocess.run([CLI, "lookup", store.root, "--key", "o-3"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "o-3" in done.stdout
    options = [arg for k, v in s3.options.items() for arg in ("--storage-option", f"{k}={v}")]
    done = subprocess.run([CLI, "lookup", store.root, "--key", "o-4", *options],
                          capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                               if not k.startswith("AWS_")}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "o-4" in done.stdout


def test_rows_match_the_row_schema(s3):
    store = _store(s3)
    store.writer("a").append([MessageRecord("t", 0, 0, BASE, None, ["u1"], commit_log_offset=5, size=9)])
    table = _reopen(store, s3).lookup("u1")
    assert table.schema == ROW_SCHEMA
    assert table.to_pylist()[0]["commit_log_offset"] == 5 and table.to_pylist()[0]["key"] is None
