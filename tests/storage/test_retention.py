"""Retention: whole index files and log segments, oldest first, never the active ones, committed
through the checkpoint."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from msgindex.errors import InvalidOptionError
from msgindex.storage.log.metadata_log import MetadataLog
from msgindex.storage.message import ROW_SCHEMA, MessageRecord
from msgindex.storage.retention import apply_shard_retention
from msgindex.storage.store import open_store
from tests.storage.shard_model import TINY, ShardModel, model_scan, shard_files, table_rows

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
    with store.reader(broker) as reader:
        model.log_start_seq = reader.checkpoint.log_start_seq
        scanned = [row for s, e in reader.scan_ranges() for row in table_rows(reader.scan_range(s, e))]
        assert scanned == model_scan([model])
        found = {row[5] for row in table_rows(reader.lookup(["k0", "k1", "k2"]))}
        retained = {seq for seq, _ in model.rows()}
        assert found <= retained  # nothing from a deleted segment
        # every record newer than the cutoff is still found through the index
        assert {seq for seq, r in model.rows() if r.timestamp_ms >= cutoff_ms} <= found


def test_age_retention_deletes_old_files_only(tmp_path):
    with open_store(tmp_path / "s", create=True, settings=TINY) as store:
        model = fill(store)
        shard = store.root / "broker=b"
        index_before = sorted(p.name for p in (shard / "index").iterdir())
        logs_before = sorted(p.name for p in (shard / "log").glob("*.log"))
        now = BASE + BATCHES * STEP_MS
        cutoff = BASE + 4 * STEP_MS
        report = store.apply_retention(max_age_ms=now - cutoff, now_ms=now)
        assert report.deleted_index_files and report.deleted_segments and report.bytes_freed > 0
        index_after = sorted(p.name for p in (shard / "index").iterdir())
        logs_after = sorted(p.name for p in (shard / "log").glob("*.log"))
        assert index_after == index_before[len(index_before) - len(index_after):]  # oldest first
        assert logs_after == logs_before[len(logs_before) - len(logs_after):]
        check_after(store, model, "b", cutoff)
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
        assert sorted(p.name for p in (shard / "index").iterdir()) == sorted(listed + [f"{n}.entrysums" for n in listed])
        assert all(state.header.end_phy_offset >= log_start for state in kept[:-1])
        with store.writer("b") as writer:  # and the shard keeps working
            writer.append([MessageRecord("t", 0, 999, now, None, ("new",))])
        assert store.lookup("new").num_rows == 1


def test_size_retention(tmp_path):
    with open_store(tmp_path / "s", create=True, settings=TINY) as store:
        model = fill(store)
        shard = store.root / "broker=b"
        total = sum(p.stat().st_size for d in ("index", "log") for p in (shard / d).iterdir())
        report = store.apply_retention(max_bytes=total // 2)
        after = sum(p.stat().st_size for d in ("index", "log") for p in (shard / d).iterdir())
        assert after <= total // 2 and total - after == report.bytes_freed
        check_after(store, model, "b", BASE + BATCHES * STEP_MS)
        assert store.apply_retention(max_bytes=total).bytes_freed == 0


def test_retention_is_committed_before_files_go(tmp_path):
    with open_store(tmp_path / "s", create=True, settings=TINY) as store:
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


def test_retention_arguments(tmp_path):
    with open_store(tmp_path / "s", create=True, settings=TINY) as store:
        fill(store)
        with pytest.raises(InvalidOptionError, match="max_age_ms"):
            store.apply_retention(max_age_ms=-1)
        assert store.apply_retention().bytes_freed == 0


@pytest.mark.parametrize("seed", range(6))
def test_every_record_a_scan_returns_is_found_by_its_keys_after_retention(tmp_path, seed):
    """R2: timestamps out of seq order (a catch-up batch over partitions mixes old and new times)
    must not make retention delete an index file before the log records it points at."""
    rng = random.Random(seed)
    with open_store(tmp_path / "s", create=True, settings=TINY) as store:
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
        total = sum(p.stat().st_size for d in ("index", "log") for p in (store.root / "broker=b" / d).iterdir())
        for cap in (total * 3 // 4, total // 2, total // 4):
            store.apply_retention(max_bytes=cap)
            scanned = pa.Table.from_batches(list(store.scan()), schema=ROW_SCHEMA).to_pylist()
            assert scanned, "retention must keep the active segment"
            for row in scanned:
                for key in row["keys"]:
                    found = store.lookup(key, topic=row["topic"]).column("seq").to_pylist()
                    assert row["seq"] in found, f"seq {row['seq']} scanned but not found by {key!r} after cap {cap}"


def test_dry_run_reports_and_deletes_nothing(tmp_path):
    with open_store(tmp_path / "s", create=True, settings=TINY) as store:
        fill(store)
        shard = store.root / "broker=b"
        before = shard_files(shard)
        planned = store.apply_retention(max_age_ms=STEP_MS, now_ms=BASE + BATCHES * STEP_MS, dry_run=True)
        assert planned.deleted_segments and shard_files(shard) == before
        done = store.apply_retention(max_age_ms=STEP_MS, now_ms=BASE + BATCHES * STEP_MS)
        assert done == planned
