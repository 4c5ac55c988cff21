"""The store: manifest, settings, shards, cross-shard lookups and scans, bad paths (on both kinds
of store where they apply: the ``stores`` fixture)."""

from __future__ import annotations

import json
import random

import pytest

import msgindex
from msgindex.errors import CorruptFileError, InvalidOptionError, StoreNotFoundError
from msgindex.storage.message import ROW_SCHEMA, MessageRecord
from msgindex.storage.objects.cache import STORE_CACHE
from msgindex.storage.objects.store import ObjectStore
from msgindex.storage.store import MANIFEST_FILE, Store, StoreSettings, open_store
from tests.storage.shard_model import TINY, ShardModel, make_batch, model_lookup, model_scan, table_rows

BASE = 1_700_000_000_000


def _put(stores, root, name: str, data: bytes) -> None:
    """Write a file (local) or an object (object store) `name` under `root`, as a user might."""
    if stores.is_local:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    else:
        from msgindex.storage.location import parse_location
        from msgindex.storage.objects.client import ObjectClient

        ObjectClient(parse_location(root, stores.options)).put(name, data)


def test_create_and_reopen_keeps_manifest_settings(stores):
    root = stores.root("deep/store")
    with stores.open(root, create=True, settings=TINY) as store:
        assert store.settings == TINY and store.brokers() == []
        raw = (root / MANIFEST_FILE).read_bytes() if stores.is_local else store.client.get(MANIFEST_FILE)
    manifest = json.loads(raw)
    assert manifest["version"] == 2 and manifest["settings"]["index_num"] == TINY.index_num
    reopened = msgindex.open(root, storage_options=stores.options)
    assert isinstance(reopened, Store if stores.is_local else ObjectStore) and reopened.settings == TINY
    # an existing store keeps its own settings whatever the caller passes
    assert stores.open(root, create=True, settings=StoreSettings()).settings == TINY


def test_not_a_store(stores):
    with pytest.raises(StoreNotFoundError, match="does not exist" if stores.is_local else "no such msgindex store"):
        stores.open(stores.root("missing"))
    plain = stores.root("plain")
    _put(stores, plain, "file.txt", b"hello")
    with pytest.raises(StoreNotFoundError, match="plain"):
        stores.open(plain)
    with pytest.raises(StoreNotFoundError, match="not empty" if stores.is_local else "holds objects"):
        stores.open(plain, create=True)
    if stores.is_local:  # a path that is a file (object stores have no such thing)
        (stores.tmp_path / "file").write_text("x")
        with pytest.raises(StoreNotFoundError, match="file"):
            open_store(stores.tmp_path / "file")


def test_bad_manifest_and_settings(stores):
    root = stores.root("s")
    stores.open(root, create=True).close()
    for body in ("{", json.dumps({"format": "other"}), json.dumps({"format": "msgindex-store", "format_version": 99}),
                 json.dumps({"format": "msgindex-store", "format_version": 1, "settings": {"index_num": 1}}),
                 json.dumps({"format": "msgindex-store", "format_version": 1, "settings": {"bogus": 1}})):
        _put(stores, root, MANIFEST_FILE, body.encode())
        # (a process that opened an object store keeps the manifest it checked: it is never
        # rewritten, objects/cache.py; a process opening it now finds the damage)
        STORE_CACHE.clear()
        with pytest.raises(CorruptFileError, match=MANIFEST_FILE):
            stores.open(root)
    for bad in ({"hash_slot_num": 0}, {"index_num": 1}, {"segment_bytes": -5}, {"index_interval_bytes": 1.5}):
        with pytest.raises(InvalidOptionError, match=next(iter(bad))):
            StoreSettings(**bad)


def test_broker_names(stores):
    with stores.create("s", settings=TINY) as store:
        for bad in ("", "a/b", "..", "."):
            with pytest.raises(InvalidOptionError, match="broker"):
                store.writer(bad)
        with pytest.raises(InvalidOptionError, match="no shard for broker 'nope'"):
            store.reader("nope")
        with store.writer("broker-1:9092") as w:
            w.append([])
            # a local shard exists once its writer opened it; an object-store shard once it
            # commits something (an empty append writes no object: store.py)
            assert store.brokers() == (["broker-1:9092"] if stores.is_local else [])
            w.append([MessageRecord("t", 0, 0, BASE, "k", ("k",))])
        assert store.brokers() == ["broker-1:9092"]
        assert store.lookup("k", brokers=["broker-1:9092"]).num_rows == 1


def test_cross_shard_lookup_and_scan_match_the_model(stores):
    rng = random.Random(11)
    models = {b: ShardModel(b) for b in ("a", "b", "c")}
    with stores.create("s", settings=TINY) as store:
        offset = 0
        for _ in range(4):
            for broker, model in models.items():
                batch = make_batch(rng, offset, 15)
                offset += 15
                with store.writer(broker) as writer:
                    writer.append(batch)
                model.append(batch)
                assert table_rows(store.lookup("Aa")) == model_lookup(
                    [m for m in models.values() if m.records], ["Aa"]
                )  # cached readers refresh after every commit
        all_models = list(models.values())
        for keys in (["Aa"], ["BB", "k2"], [b"k1"], ["ключ", "absent"]):
            for topic in (None, "orders"):
                texts = [k if isinstance(k, str) else k.decode() for k in keys]
                assert table_rows(store.lookup(keys, topic=topic)) == model_lookup(all_models, texts, topic=topic)
        got = store.lookup("Aa", brokers=["b", "c"], begin_ms=BASE + 2000, end_ms=BASE + 9000, partitions=[0, 2], max_results=4)
        assert table_rows(got) == model_lookup(all_models[1:], ["Aa"], begin_ms=BASE + 2000, end_ms=BASE + 9000,
                                               partitions=[0, 2], max_results=4)
        assert got.schema == ROW_SCHEMA
        assert table_rows(store.scan()) == model_scan(all_models)
        assert table_rows(store.scan(begin_ms=BASE + 7000, brokers=["a"], topics=["BB"])) == model_scan(
            all_models[:1], begin_ms=BASE + 7000, topics=["BB"]
        )
        empty = store.lookup("Aa", begin_ms=BASE + 10, end_ms=BASE)
        assert empty.num_rows == 0 and empty.schema == ROW_SCHEMA


def test_lookup_arguments_are_checked(stores):
    with stores.create("s", settings=TINY) as store:
        with store.writer("a") as w:
            w.append([MessageRecord("t", 0, 0, BASE, "k", ("k",))])
        with pytest.raises(InvalidOptionError, match="key"):
            store.lookup([1, 2])
        with pytest.raises(InvalidOptionError, match="begin_ms"):
            store.lookup("k", begin_ms=1.5)
        with pytest.raises(InvalidOptionError, match="max_results"):
            store.lookup("k", max_results=-1)
        assert store.lookup("k", max_results=0).num_rows == 0
        assert store.lookup([]).num_rows == 0


def test_scan_survives_commits_and_lookups_while_it_runs(stores):
    with stores.create("s", settings=TINY) as store:
        with store.writer("a") as writer:
            writer.append([MessageRecord("t", 0, i, BASE + i, None, ("k",)) for i in range(50)])
            scan = store.scan()
            first = next(scan)
            writer.append([MessageRecord("t", 0, 50, BASE, None, ("k",))])
            assert store.lookup("k").num_rows == 51  # refreshes the cached reader
            rest = sum(batch.num_rows for batch in scan)
        assert first.num_rows + rest == 50  # the scan kept its own snapshot


def test_create_under_a_regular_file_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreNotFoundError, match="file/store.*cannot create"):
        open_store(tmp_path / "file" / "store", create=True)


def test_listing_kept_while_the_root_is_unchanged_sees_new_and_removed_shards(tmp_path, monkeypatch):
    from msgindex.storage import store as store_module

    monkeypatch.setattr(store_module, "LISTING_SETTLED_NS", 0)  # keep every listing at once
    with open_store(tmp_path / "s", create=True, settings=TINY) as store:
        with store.writer("a") as writer:
            writer.append([MessageRecord("t", 0, 0, BASE, "k", ("k",))])
        assert store.brokers() == ["a"] and store._listed is not None
        assert store.lookup("k").num_rows == 1
        with store.writer("b") as writer:  # a new shard directory changes the root's mtime
            writer.append([MessageRecord("t", 0, 1, BASE, "k", ("k",))])
        assert store.brokers() == ["a", "b"] and store.lookup("k").num_rows == 2
        (tmp_path / "s" / "broker=b").rename(tmp_path / "elsewhere")
        with pytest.raises(CorruptFileError, match="broker=b: shard directory missing"):
            store.brokers()  # the manifest lists it: a removal is seen, and is an error
        (tmp_path / "elsewhere").rename(tmp_path / "s" / "broker=b")
        assert store.brokers() == ["a", "b"]
    monkeypatch.setattr(store_module, "LISTING_SETTLED_NS", 10**18)  # a root changed just now: never kept
    with open_store(tmp_path / "s") as store:
        assert store.brokers() == ["a", "b"] and store._listed is None
