"""Retention: whole index files and log segments, oldest first, never the active ones, committed
through the checkpoint; on an object store whole chunks, oldest first, never the newest, committed
by a version and deleted after the grace period (both kinds: the ``stores`` fixture)."""

from __future__ import annotations

import random
import time

import pyarrow as pa
import pytest

from msgindex.errors import InvalidOptionError
from msgindex.storage.log.metadata_log import MetadataLog
from msgindex.storage.message import ROW_SCHEMA, MessageRecord
from msgindex.storage.objects.shard import ObjectTuning
from msgindex.storage.retention import apply_shard_retention
from msgindex.storage.store import open_store
from tests.storage.kinds import committed_state, shard_bytes, shard_contents
from tests.storage.shard_model import TINY, ShardModel, model_lookup, model_scan, shard_files, table_rows

BASE = 1_700_000_000_000
BATCHES = 8
PER_BATCH = 12
STEP_MS = 60_000  # each batch is a minute newer than the one before


def fill(store, broker="b"):
    model = ShardModel(broker)
    with store.writer(broker) as writer:
        for batch_id in range(BATCHES):
            batch = [
                MessageRecord("t", i % 2, batch_id * PER_BATCH + i, BASE + batch_id * STEP_MS + i, None, (f"k{i % 3}",))
                for i in range(PER_BATCH)
            ]
            writer.append(batch)
            model.append(batch)
    return model


def check_after(store, model, broker, cutoff_ms):
    model.log_start_seq = committed_state(store, broker)[0]
    with store.reader(broker) as reader:
        scanned = [row for s, e in reader.scan_ranges() for row in table_rows(reader.scan_range(s, e))]
        assert scanned == model_scan([model])
        found = {row[5] for row in table_rows(reader.lookup(["k0", "k1", "k2"]))}
        retained = {seq for seq, _ in model.rows()}
        assert found <= retained  # nothing from a deleted segment
        # every record newer than the cutoff is still found through the index
        assert {seq for seq, r in model.rows() if r.timestamp_ms >= cutoff_ms} <= found


def chunk_names(store, broker="b") -> list[str]:
    with store.reader(broker) as reader:
        return [chunk.name for chunk in reader.version.chunks]


def test_age_retention_deletes_old_files_only(stores):
    with stores.create("s", settings=TINY) as store:
        model = fill(store)
        now = BASE + BATCHES * STEP_MS
        cutoff = BASE + 4 * STEP_MS
        if stores.is_local:
            shard = store.root / "broker=b"
            index_before = sorted(p.name for p in (shard / "index").iterdir())
            logs_before = sorted(p.name for p in (shard / "log").glob("*.log"))
        else:
            chunks_before = chunk_names(store)
        report = store.apply_retention(max_age_ms=now - cutoff, now_ms=now)
        assert report.deleted_segments and report.bytes_freed > 0
        if stores.is_local:
            assert report.deleted_index_files
            index_after = sorted(p.name for p in (shard / "index").iterdir())
            logs_after = sorted(p.name for p in (shard / "log").glob("*.log"))
            assert index_after == index_before[len(index_before) - len(index_after):]  # oldest first
            assert logs_after == logs_before[len(logs_before) - len(logs_after):]
        else:  # whole chunks, oldest first: those of the 4 batches older than the cutoff
            chunks_after = chunk_names(store)
            assert chunks_after == chunks_before[len(chunks_before) - len(chunks_after):] == chunks_before[4:]
            assert [name.rsplit("/", 1)[-1] for name in report.deleted_segments] == \
                [name.rsplit("/", 1)[-1] for name in chunks_before[:4]]
        check_after(store, model, "b", cutoff)
        if stores.is_local:
            # everything expired: still never the active file or segment (here through the writer)
            with store.writer("b") as writer:
                apply_shard_retention(writer, max_age_ms=0, now_ms=now * 2)
            assert len(list((shard / "log").glob("*.log"))) == 1
            # index files stay only while a retained record needs them (R2): the active one, and any
            # older file whose last entry points into the retained log
            with store.reader("b") as reader:
                log_start = reader.checkpoint.log_start_seq
                kept = reader.checkpoint.index_files
            listed = [state.name for state in kept]  # and their entry checksums: sidecars go with their files
            assert sorted(p.name for p in (shard / "index").iterdir()) == \
                sorted(listed + [f"{n}.entrysums" for n in listed])
            assert all(state.header.end_phy_offset >= log_start for state in kept[:-1])
        else:  # everything expired: never the newest chunk
            store.apply_retention(max_age_ms=0, now_ms=now * 2)
            assert chunk_names(store) == chunks_before[-1:]
            check_after(store, model, "b", now * 2)
        with store.writer("b") as writer:  # and the shard keeps working
            writer.append([MessageRecord("t", 0, 999, now, None, ("new",))])
        assert store.lookup("new").num_rows == 1


def test_size_retention(stores):
    with stores.create("s", settings=TINY) as store:
        model = fill(store)
        total = shard_bytes(store, "b")
        report = store.apply_retention(max_bytes=total // 2)
        after = shard_bytes(store, "b")
        assert after <= total // 2 and total - after == report.bytes_freed
        check_after(store, model, "b", BASE + BATCHES * STEP_MS)
        assert store.apply_retention(max_bytes=total).bytes_freed == 0


def test_retention_is_committed_before_files_go(stores):
    if not stores.is_local:
        return _retention_deletes_objects_after_the_grace_period(stores)
    with stores.create("s", settings=TINY) as store:
        fill(store)
        shard = store.root / "broker=b"
        before = shard_files(shard)
        store.apply_retention(max_age_ms=STEP_MS, now_ms=BASE + BATCHES * STEP_MS)
        after = shard_files(shard)
        # a crash after the checkpoint but before the deletions: the files are still there
        for name, data in before.items():
            if name not in after:
                (shard / name).write_bytes(data)
        store.writer("b").close()  # the next open finishes the job
        assert shard_files(shard) == after


def _retention_deletes_objects_after_the_grace_period(stores):
    """An object store's retention commits a version without the dropped chunks; the chunks stay
    (a reader may hold the version before) until collection past the grace period."""
    with stores.create("s", settings=TINY, tuning=ObjectTuning(grace_s=1.0)) as store:
        model = fill(store)
        pinned = store.reader("b")
        before = shard_contents(store, "b")
        dropped = [name.rsplit("/", 1)[-1] for name in store.apply_retention(
            max_age_ms=STEP_MS, now_ms=BASE + BATCHES * STEP_MS).deleted_segments]
        assert dropped and before.items() <= shard_contents(store, "b").items()  # a version more, nothing gone
        assert table_rows(pinned.lookup(["k0", "k1", "k2"])) == model_lookup([model], ["k0", "k1", "k2"])
        writer = store.writer("b")
        assert writer.collect() == 0  # inside the grace period
        time.sleep(1.1)
        assert writer.collect() == len(dropped)
        left = {key.rsplit("/", 1)[-1] for key in shard_contents(store, "b")}
        assert not left & set(dropped) and set(chunk_names(store)) <= {f"chunks/{name}" for name in left}
        check_after(store, model, "b", BASE + BATCHES * STEP_MS - STEP_MS)


def test_a_reader_never_opens_segments_retention_committed_away(tmp_path, monkeypatch):
    """A reader lists the log directory, then opens the segments; retention (already committed)
    may delete the oldest ones in between. Replayed deterministically: the listing is the one taken
    before the deletion. The reader skips segments wholly below the checkpoint's log start (CI once
    saw the race turn into a CorruptFileError 'log segment does not exist')."""
    with open_store(tmp_path / "s", create=True, settings=TINY) as store:
        model = fill(store)
        log_dir = store.root / "broker=b" / "log"
        listed_before = sorted(int(p.stem) for p in log_dir.glob("*.log"))
        report = store.apply_retention(max_age_ms=STEP_MS, now_ms=BASE + BATCHES * STEP_MS)
        assert report.deleted_segments
        monkeypatch.setattr(MetadataLog, "_bases_on_disk", lambda self: listed_before)
        check_after(store, model, "b", BASE + BATCHES * STEP_MS - STEP_MS)


def test_retention_arguments(stores):
    with stores.create("s", settings=TINY) as store:
        fill(store)
        before = shard_contents(store, "b")
        for bad in ({"max_age_ms": -1}, {"max_bytes": -1}, {"max_bytes": True}, {"now_ms": 1.5}, {"max_age_ms": "1"}):
            with pytest.raises(InvalidOptionError, match=next(iter(bad))):
                store.apply_retention(**bad)
        assert store.apply_retention().bytes_freed == 0
        assert shard_contents(store, "b") == before


@pytest.mark.parametrize("seed", range(6))
def test_every_record_a_scan_returns_is_found_by_its_keys_after_retention(stores, seed):
    """R2: timestamps out of seq order (a catch-up batch over partitions mixes old and new times)
    must not make retention delete an index file before the log records it points at."""
    if not stores.is_local and seed >= 3:
        pytest.skip("an object-store chunk holds its records and their hash items together: three seeds check it")
    rng = random.Random(seed)
    with stores.create("s", settings=TINY) as store:
        offset = 0
        with store.writer("b") as writer:
            for _ in range(10):
                batch = [
                    MessageRecord(rng.choice(["t", "u"]), rng.randint(0, 3), offset + i,
                                  BASE + rng.choice([0, 5, 50, 500]) * STEP_MS + rng.randint(0, 999),
                                  None, (f"k{rng.randint(0, 40)}", f"x{rng.randint(0, 5)}")[: rng.randint(1, 2)])
                    for i in range(rng.randint(3, 25))
                ]
                offset += len(batch)
                writer.append(batch)
        total = shard_bytes(store, "b")
        for cap in (total * 3 // 4, total // 2, total // 4):
            store.apply_retention(max_bytes=cap)
            scanned = pa.Table.from_batches(list(store.scan()), schema=ROW_SCHEMA).to_pylist()
            assert scanned, "retention must keep the active segment"
            every_key = sorted({key for row in scanned for key in row["keys"]})
            assert sorted(store.lookup(every_key).column("seq").to_pylist()) == [r["seq"] for r in scanned if r["keys"]]
            if not stores.is_local:
                continue  # (one lookup per key costs ~100 requests per cap on an object store)
            found: dict[tuple[str, str], set[int]] = {}
            for row in scanned:
                for key in row["keys"]:
                    if (key, row["topic"]) not in found:
                        found[key, row["topic"]] = set(store.lookup(key, topic=row["topic"]).column("seq").to_pylist())
                    assert row["seq"] in found[key, row["topic"]], \
                        f"seq {row['seq']} scanned but not found by {key!r} after cap {cap}"


def test_dry_run_reports_and_deletes_nothing(stores):
    with stores.create("s", settings=TINY) as store:
        fill(store)
        before = shard_contents(store, "b")
        planned = store.apply_retention(max_age_ms=STEP_MS, now_ms=BASE + BATCHES * STEP_MS, dry_run=True)
        assert planned.deleted_segments and shard_contents(store, "b") == before
        done = store.apply_retention(max_age_ms=STEP_MS, now_ms=BASE + BATCHES * STEP_MS)
        assert done == planned
