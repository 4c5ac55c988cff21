"""Damage inside the entries of a hash index file (header and slots intact) is an error naming the
file, never a silent miss: with its entry checksums (entry_sums.py), without them (missing,
damaged, another file's: the chains' shape is checked instead, and a healthy file stays
readable), in a sealed file and in the committed part of the active one; and `msgindex repair`
rebuilds the damaged file from the log, byte for byte."""

from __future__ import annotations

import logging
import random
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

import msgindex
from msgindex.errors import CorruptFileError
from msgindex.storage import checksum
from msgindex.storage.hash_index import entry_sums
from msgindex.storage.hash_index.index_file import ENTRY_SIZE, HEADER_SIZE, IndexFile
from msgindex.storage.hash_index.java_hash import index_hash
from msgindex.storage.maintenance.repair import repair_store
from msgindex.storage.message import MessageRecord
from msgindex.storage.settings import StoreSettings
from msgindex.storage.store import open_store

SETTINGS = StoreSettings(hash_slot_num=1024, index_num=8192, segment_bytes=1 << 20, index_interval_bytes=4096)
RECORDS = 6000  # two keys each: one full file of 8,191 entries and an active one of 3,809
KEYS = 3000
BASE_MS = 1_700_000_000_000


def records() -> list[MessageRecord]:
    return [MessageRecord("orders", 0, i, BASE_MS + i * 7, f"k{i % KEYS}", (f"k{i % KEYS}", f"u{i}"),
                          commit_log_offset=i, size=1) for i in range(RECORDS)]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("entry-sums") / "store"
    rows = records()
    with open_store(root, create=True, settings=SETTINGS) as handle, handle.writer("b1") as writer:
        for start in range(0, RECORDS, 500):
            writer.append(rows[start : start + 500])
    return root


@pytest.fixture
def store(pristine, tmp_path) -> Path:
    entry_sums.forget_checked()
    copy = tmp_path / "store"
    shutil.copytree(pristine, copy)
    return copy


def index_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "broker=b1" / "index").iterdir() if p.name.isdigit())


def scribble_entries(path: Path, first_entry: int, entries: int = 100, seed: int = 1) -> None:
    """Random bytes over `entries` entries from `first_entry` on (header and slots untouched)."""
    at = HEADER_SIZE + SETTINGS.hash_slot_num * 4 + first_entry * ENTRY_SIZE
    raw = bytearray(path.read_bytes())
    rng = random.Random(seed)
    for i in range(at, at + entries * ENTRY_SIZE):
        raw[i] = rng.randrange(256)
    path.write_bytes(bytes(raw))


def lookup_every_key(root: Path) -> tuple[int, int, list[str]]:
    """(right answers, errors, the distinct error messages) over every key; a wrong answer fails."""
    right, errors, messages = 0, 0, set()
    with msgindex.open(root) as store:
        for n in range(KEYS):
            try:
                table = store.lookup(f"k{n}")
            except CorruptFileError as error:
                errors += 1
                messages.add(str(error))
                continue
            assert sorted(table.column("offset").to_pylist()) == [n, n + KEYS], f"k{n}: silent wrong answer"
            right += 1
    return right, errors, sorted(messages)


def assert_scribbled_file_is_named(root: Path, victim: Path) -> None:
    """Random bytes over entries of `victim`: lookups that touch them fail naming it, the others
    answer right (lookup_every_key fails on a wrong answer)."""
    scribble_entries(victim, 2000)
    right, errors, messages = lookup_every_key(root)
    assert errors > 0 and right + errors == KEYS
    assert all(str(victim) in message and "fail their checksum" in message for message in messages)


def test_the_writer_covers_every_committed_entry(store):
    sealed, active = index_files(store)
    for path in (sealed, active):
        with IndexFile.open(path, SETTINGS.hash_slot_num, SETTINGS.index_num, read_only=True) as index:
            sums, why = entry_sums.EntrySums.load(index)
            assert why is None and sums.covered_count == index.index_count
            assert sums.chunk_entries == entry_sums.CHUNK_ENTRIES == 64
            assert sums.crcs.tolist() == entry_sums.chunk_crcs(index, 0, index.index_count)
    assert lookup_every_key(store) == (KEYS, 0, [])


def rewrite_sidecars_in_chunks_of(root: Path, chunk_entries: int) -> None:
    """The sidecars as an older msgindex wrote them: the same entries, chunks of `chunk_entries`."""
    for path in index_files(root):
        with IndexFile.open(path, SETTINGS.hash_slot_num, SETTINGS.index_num, read_only=True) as index:
            sums, _ = entry_sums.EntrySums.load(index)
            crcs = entry_sums.chunk_crcs(index, 0, sums.covered_count, chunk_entries=chunk_entries)
            entry_sums.sums_path(path).write_bytes(entry_sums.build(index, sums.covered_count, crcs, chunk_entries))


@pytest.mark.parametrize("which", ["sealed", "active"])
def test_sidecars_of_512_entry_chunks_are_still_read_checked_and_extended(store, which):
    """Sidecars written before chunks of 64 (512 entries a chunk) keep their chunks: readers check
    against them (and remember them) as they are, writers extend them in their own size."""
    rewrite_sidecars_in_chunks_of(store, 512)
    assert lookup_every_key(store) == (KEYS, 0, [])
    sealed, active = index_files(store)
    with open_store(store) as handle, handle.writer("b1") as writer:
        writer.append([MessageRecord("orders", 0, RECORDS + i, BASE_MS + i, f"new{i}", (f"new{i}",), i, 1)
                       for i in range(700)])
    with IndexFile.open(active, SETTINGS.hash_slot_num, SETTINGS.index_num, read_only=True) as index:
        sums, why = entry_sums.EntrySums.load(index)
        assert why is None and sums.chunk_entries == 512 and sums.covered_count == index.index_count
        assert sums.crcs.tolist() == entry_sums.chunk_crcs(index, 0, index.index_count, chunk_entries=512)
    entry_sums.forget_checked()
    assert_scribbled_file_is_named(store, sealed if which == "sealed" else active)


def test_a_sidecar_rewritten_in_other_chunks_while_read_is_not_used(store):
    """A reader takes its chunk size from the sidecar's header and reads the table only when a
    chunk needs checking; a sidecar rewritten in between in other chunks (msgindex repair) is not
    applied to chunks of the old size: the touched entries are checked for their shape instead."""
    rewrite_sidecars_in_chunks_of(store, 512)
    sealed = index_files(store)[0]
    with IndexFile.open(sealed, SETTINGS.hash_slot_num, SETTINGS.index_num, read_only=True) as index:
        guard = entry_sums.EntryGuard(index)
        guard.check(entry_sums.Touched(), index.index_count)  # nothing touched: the header's chunks only
        rewrite_sidecars_in_chunks_of(store, 64)
        touched = entry_sums.Touched()
        touched.chunks.append(3)
        guard.check(touched, index.index_count)  # a healthy file: no error either way
        assert guard._sums is None and "rewritten in chunks of 64 entries while read" in guard._unusable


def test_a_sidecar_of_unknown_chunks_is_unusable_not_damage(store, caplog):
    rewrite_sidecars_in_chunks_of(store, 1024)
    with IndexFile.open(index_files(store)[0], SETTINGS.hash_slot_num, SETTINGS.index_num, read_only=True) as index:
        assert entry_sums.EntrySums.load(index) == (None, "chunks of 1024 entries (this msgindex reads 64, 128, 256, 512)")
    with caplog.at_level(logging.WARNING):
        assert lookup_every_key(store) == (KEYS, 0, [])
    assert "chunks of 1024 entries" in caplog.text


@pytest.mark.parametrize("compiled", [True, False], ids=["libdeflate", "zlib"])
def test_the_lookup_checksum_is_zlibs(monkeypatch, compiled):
    if compiled:
        assert checksum.compiled_blocks is not None, "msgindex.storage.log._blocks was not built: `make setup`"
    else:
        monkeypatch.setattr(checksum, "compiled_blocks", None)
    data = np.random.default_rng(1).integers(0, 256, 30_000, dtype=np.uint8)
    for piece in (data, data[7:10_247], memoryview(data.tobytes())[3:], b""):
        assert checksum.crc32(piece) == zlib.crc32(piece)
    # many slices at once (a lookup's first touch of its chunks), none outside the data
    starts, lengths = np.array([0, 7, 10_240, 29_999, 30_000]), np.array([30_000, 10_240, 0, 1, 0])
    assert checksum.crc32_slices(data, starts, lengths).tolist() == [
        zlib.crc32(data[start : start + length]) for start, length in zip(starts, lengths)]
    for start, length in ((29_999, 2), (-1, 1), (5, -1)):
        with pytest.raises(ValueError, match="outside"):
            checksum.crc32_slices(data, np.array([0, start]), np.array([1, length]))


@pytest.mark.parametrize("few_touched", [entry_sums._FEW_TOUCHED, 0], ids=["python-set", "numpy"])
@pytest.mark.parametrize("compiled", [True, False], ids=["libdeflate", "zlib"])
@pytest.mark.parametrize("which", ["sealed", "active"])
def test_scribbled_entries_are_an_error_naming_the_file(store, which, compiled, few_touched, monkeypatch):
    """Both ways a check finds the chunks a lookup touched (a set for a few, numpy for many)."""
    if not compiled:
        monkeypatch.setattr(checksum, "compiled_blocks", None)
    monkeypatch.setattr(entry_sums, "_FEW_TOUCHED", few_touched)
    sealed, active = index_files(store)
    assert_scribbled_file_is_named(store, sealed if which == "sealed" else active)


def test_a_commit_while_a_lookup_checks_its_chunks_is_no_damage(tmp_path, monkeypatch):
    """A writer commits (entries, indexCount, sidecar) while a fresh reader's lookup is between
    its walk and the check of the chunks it touched: the sidecar the check loads may cover
    entries the reader's first view of the file did not hold. A healthy file is no error."""
    entry_sums.forget_checked()
    path = tmp_path / "f"
    writer = IndexFile.create(path, 64, 4096)
    stamp = 1_700_000_000_000
    writer.put_keys([f"k{i % 50}" for i in range(300)], range(300), [stamp] * 300)
    entry_sums.write_all(writer, writer.index_count)
    reader = IndexFile.open(path, 64, 4096, read_only=True)
    reader.guard_entries()
    limit = reader.index_count
    real_view = entry_sums._entry_bytes

    def view_then_a_commit(index_file):
        view = real_view(index_file)
        if index_file is reader and writer.index_count == limit:  # once: another process commits now
            writer.put_keys([f"k{i % 50}" for i in range(100)], range(300, 400), [stamp] * 100)
            entry_sums.write_all(writer, writer.index_count)
        return view

    monkeypatch.setattr(entry_sums, "_entry_bytes", view_then_a_commit)
    try:
        who, _entries, _phys, _ms = reader.candidate_arrays(np.array([index_hash("k7")], np.int64),
                                                            limit_index_count=limit)
        assert len(who) == 6 and writer.index_count == 401
    finally:
        reader.close()
        writer.close()


@pytest.mark.parametrize("sidecar", ["missing", "damaged", "another file's"])
def test_without_usable_checksums_a_healthy_file_reads_right(store, sidecar, caplog):
    sealed, active = index_files(store)
    sums = entry_sums.sums_path(sealed)
    if sidecar == "missing":
        sums.unlink()
    elif sidecar == "damaged":
        raw = bytearray(sums.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        sums.write_bytes(bytes(raw))
    else:
        shutil.copy(entry_sums.sums_path(active), sums)
    with caplog.at_level(logging.WARNING, logger="msgindex.storage.hash_index.entry_sums"):
        assert lookup_every_key(store) == (KEYS, 0, [])
    assert any(str(sums) in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("sidecar", ["missing", "damaged"])
def test_without_usable_checksums_damage_is_still_an_error(store, sidecar):
    sealed, _ = index_files(store)
    sums = entry_sums.sums_path(sealed)
    if sidecar == "missing":
        sums.unlink()
    else:
        sums.write_bytes(sums.read_bytes()[:-3])
    scribble_entries(sealed, 4000)
    right, errors, messages = lookup_every_key(store)
    assert errors > 0 and right + errors == KEYS
    assert all(str(sealed) in message for message in messages)


def test_repair_rebuilds_the_damaged_files_byte_for_byte(store, pristine):
    before = {path.name: path.read_bytes() for path in index_files(pristine)}
    for path in index_files(store):
        scribble_entries(path, 1500)
    entry_sums.sums_path(index_files(store)[0]).unlink()
    report = repair_store(store)
    assert not report.refused and "rebuilt 2 hash index file(s) from the log" in report.lines()[1]
    assert {path.name: path.read_bytes() for path in index_files(store)} == before
    for path in index_files(store):
        assert entry_sums.sums_path(path).read_bytes() == entry_sums.sums_path(pristine / path.relative_to(store)) \
            .read_bytes()
    assert lookup_every_key(store) == (KEYS, 0, [])
    assert repair_store(store).lines()[1:] == ["  broker=b1: intact: nothing to repair"]


def test_repair_rebuilds_a_missing_file_and_writes_lost_checksums(store, pristine):
    sealed, active = index_files(store)
    original = sealed.read_bytes()
    sealed.unlink()
    entry_sums.sums_path(active).unlink()
    assert "dry run" not in " ".join(repair_store(store, dry_run=True).lines())
    assert not sealed.exists()  # a dry run writes nothing
    report = repair_store(store)
    assert not report.refused, report.lines()
    assert sealed.read_bytes() == original
    assert entry_sums.sums_path(active).read_bytes() == entry_sums.sums_path(
        pristine / active.relative_to(store)).read_bytes()


def append_one(root: Path) -> None:
    with msgindex.open(root) as handle, handle.writer("b1") as writer:
        writer.append([MessageRecord("orders", 0, RECORDS, BASE_MS + RECORDS * 7, "new", ("new",),
                                     commit_log_offset=RECORDS, size=1)])


def test_a_writer_checks_the_entries_a_lagging_sidecar_misses(store):
    """A sidecar lost (or a writer that died between its checkpoint and its sidecar): the next
    commit brings it up to date over entries it did not put only after checking them against
    their records."""
    _, active = index_files(store)
    original = entry_sums.sums_path(active).read_bytes()
    entry_sums.sums_path(active).unlink()
    append_one(store)
    assert entry_sums.covered_count_of(active) == 1 + 3809 + 1
    assert entry_sums.sums_path(active).read_bytes()[:20] == original[:20]  # magic, version, sizing, chunk


def test_a_writer_never_vouches_for_damaged_entries(store, caplog):
    _, active = index_files(store)
    entry_sums.sums_path(active).unlink()
    scribble_entries(active, 1000, entries=3)
    with caplog.at_level(logging.WARNING, logger="msgindex.storage.hash_index.entry_sums"):
        append_one(store)
    assert not entry_sums.sums_path(active).exists()
    assert any("not extended" in record.getMessage() for record in caplog.records)
    right, errors, messages = lookup_every_key(store)
    assert errors and all(str(active) in message for message in messages)
    assert not repair_store(store).refused  # rebuilt from the log, the new record's entry included
    assert entry_sums.covered_count_of(active) == 1 + 3809 + 1
    assert lookup_every_key(store) == (KEYS, 0, [])
