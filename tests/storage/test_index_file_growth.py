"""A hash index file grows ahead of its writer in steps (index_file's module docstring): its bytes
are a full-size file's up to its length, every byte of it allocated, readers follow a writer that
grew it, and a full disk while growing is a StorageFullError that changes nothing. RocketMQ's own
jar reads the short files: tests/interop/test_rocketmq_index_file.py."""

from __future__ import annotations

import errno
import os
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from msgindex import IndexFile
from msgindex.errors import StorageFullError
from msgindex.storage.hash_index import index_file as index_file_module
from msgindex.storage.hash_index.index_file import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE, reference_candidates
from msgindex.storage.hash_index.java_hash import index_hash, index_hashes

T0 = 1_700_000_000_000
SLOTS, NUM, STEP = 7, 300, 16
ENTRIES_AT = HEADER_SIZE + SLOTS * SLOT_SIZE
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_steps(monkeypatch):
    monkeypatch.setattr(index_file_module, "GROWTH_ENTRIES", STEP)


def puts(count: int, seed: int = 1) -> list[tuple[str, int, int]]:
    rng = random.Random(seed)
    return [(f"t#k{rng.randint(0, 40)}" if rng.random() < 0.8 else "t#hot", i, T0 + 37 * i) for i in range(count)]


def room(length: int) -> int:
    return (length - ENTRIES_AT) // ENTRY_SIZE


def test_a_file_grows_in_steps_and_holds_a_full_files_bytes(tmp_path: Path, small_steps) -> None:
    every = puts(NUM + 20)
    with IndexFile.create(tmp_path / "full", SLOTS, NUM) as full:
        pass
    with pytest.MonkeyPatch.context() as patch:  # the reference: full size from the start
        patch.setattr(index_file_module, "GROWTH_ENTRIES", NUM)
        with IndexFile.create(tmp_path / "reference", SLOTS, NUM) as reference:
            reference.put_keys(*zip(*every))
    expected = (tmp_path / "reference").read_bytes()
    assert len(expected) == IndexFile.file_size(SLOTS, NUM)
    path = tmp_path / "grown"
    lengths = []
    with IndexFile.create(path, SLOTS, NUM) as f:
        assert path.stat().st_size == ENTRIES_AT + STEP * ENTRY_SIZE and f.capacity == STEP
        done, rng = 0, random.Random(3)
        while done < len(every):
            n = rng.choice([1, 2, 5, 15, 16, 17, 40])
            batch = every[done : done + n]
            if n == 1:
                f.put_key(*batch[0])
            else:
                f.put_keys(*zip(*batch))
            done += n
            info = path.stat()
            lengths.append(info.st_size)
            assert room(info.st_size) == min(NUM, -(-f.index_count // STEP) * STEP) == f.capacity
            assert info.st_blocks * 512 >= info.st_size  # no hole under the writer's mapping
            data = path.read_bytes()
            assert data == expected[: len(data)] or f.index_count < NUM  # (the reference is full)
    assert lengths == sorted(lengths) and lengths[-1] == len(expected)  # it never shrank; full size once full
    assert path.read_bytes() == expected
    assert full.path.stat().st_size < len(expected)


def test_a_growing_file_equals_the_reference_at_every_step(tmp_path: Path, small_steps) -> None:
    """Byte for byte, not only once full: the grown file at each step is the reference's prefix
    and the reference holds zeros past it (RocketMQ's sparse tail)."""
    every = puts(200, seed=9)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(index_file_module, "GROWTH_ENTRIES", NUM)
        reference = IndexFile.create(tmp_path / "reference", SLOTS, NUM)
    with reference, IndexFile.create(tmp_path / "grown", SLOTS, NUM) as grown:
        for lo in range(0, len(every), 23):
            batch = every[lo : lo + 23]
            reference.put_keys(*zip(*batch))
            grown.put_keys(*zip(*batch))
            ours, theirs = (tmp_path / "grown").read_bytes(), (tmp_path / "reference").read_bytes()
            assert theirs[: len(ours)] == ours and not any(theirs[len(ours):])


def test_rollback_keeps_the_length_and_the_bytes_of_a_file_that_never_had_the_entries(tmp_path: Path,
                                                                                        small_steps) -> None:
    every = puts(120, seed=5)
    with IndexFile.create(tmp_path / "a", SLOTS, NUM) as a, IndexFile.create(tmp_path / "b", SLOTS, NUM) as b:
        a.put_keys(*zip(*every[:30]))
        b.put_keys(*zip(*every[:30]))
        header = a.header
        a.put_keys(*zip(*every[30:]))  # grows well past b
        grown = (tmp_path / "a").stat().st_size
        assert a.rollback_to(header.index_count, header)
        assert (tmp_path / "a").stat().st_size == grown  # a file never shrinks (readers may map it)
        ours, theirs = (tmp_path / "a").read_bytes(), (tmp_path / "b").read_bytes()
        assert ours[: len(theirs)] == theirs and not any(ours[len(theirs):])
        a.put_keys(*zip(*every[30:]))
        b.put_keys(*zip(*every[30:]))
        assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


@pytest.mark.parametrize("keys", [2, 8])
@pytest.mark.parametrize("compiled", [True, False])
def test_a_damaged_slot_does_not_hide_a_chain_a_writer_grew(tmp_path: Path, small_steps, monkeypatch, compiled,
                                                            keys) -> None:
    """Several keys' chains walked at once on a reader whose mapping a writer outgrew: one slot
    damaged past index_num (read as an empty chain) must not stop the mapping from growing over
    another key's head, which lies past it (the walk used to map up to the largest head only)."""
    if not compiled:
        monkeypatch.setattr(index_file_module, "_compiled_walk", None)
    path = tmp_path / "f"
    with IndexFile.create(path, SLOTS, NUM) as writer:
        writer.put_keys(["t#x"] * 5, range(5), [T0] * 5)
        reader = IndexFile.open(path, SLOTS, NUM, read_only=True)
        try:
            assert reader.capacity == STEP
            writer.put_keys([f"t#f{i}" for i in range(100)], range(5, 105), [T0] * 100)
            writer.put_keys(["t#x"], [105], [T0])
            hashes = index_hashes(["t#x"] + [f"t#other{i}" for i in range(keys - 1)]).astype(np.int64)
            damaged = next(int(h) % SLOTS for h in hashes[1:] if int(h) % SLOTS != int(hashes[0]) % SLOTS)
            writer._slots[damaged] = NUM + 5
            writer.flush()
            expected = reference_candidates(writer, "t#x")
            assert len(expected) == 6
            who, entries, _phys, _ms = reader.candidate_arrays(hashes)
            assert sorted(entries[who == 0].tolist(), reverse=True) == [hit[0] for hit in expected]
        finally:
            reader.close()


@pytest.mark.parametrize("compiled", [True, False])
def test_a_reader_follows_a_writer_that_grew_the_file(tmp_path: Path, small_steps, monkeypatch, compiled) -> None:
    """A reader maps the length it finds; slots a writer wrote after growing the file point past
    it: every walk maps the file again and finds the old entries below the new ones."""
    if not compiled:
        monkeypatch.setattr(index_file_module, "_compiled_walk", None)
    every = puts(250, seed=11)
    keys = sorted({key for key, _, _ in every}) + ["t#never"]
    path = tmp_path / "f"
    with IndexFile.create(path, SLOTS, NUM) as writer:
        writer.put_keys(*zip(*every[:10]))
        readers = [IndexFile.open(path, SLOTS, NUM, read_only=True) for _ in range(5)]
        assert all(r.capacity == STEP for r in readers)
        writer.put_keys(*zip(*every[10:]))
        assert writer.capacity > 200
        expected = {key: reference_candidates(writer, key) for key in keys}
        first, many, lock_step, select, oracle = readers
        try:
            assert {key: first.candidates(key) for key in keys} == expected
            assert dict(zip(keys, many.candidates_many(keys))) == expected
            who, entries, _phys, _ms = lock_step.candidate_arrays(index_hashes(keys).astype(np.int64))
            assert sorted(zip(who.tolist(), entries.tolist())) == sorted(
                (k, c[0]) for k, key in enumerate(keys) for c in expected[key])
            for key in keys:
                assert select.select_phy_offsets(key, 10_000, 0, 2**62) == writer.select_phy_offsets(key, 10_000, 0, 2**62)
                assert reference_candidates(oracle, key) == expected[key]
            assert all(r.capacity == writer.capacity for r in readers)
            # a committed limit below the reader's first mapping: new entries are skipped, old ones found
            limited = {key: [c for c in expected[key] if c[0] < 10] for key in keys}
            assert {key: first.candidates(key, limit_index_count=10) for key in keys} == limited
        finally:
            for reader in readers:
                reader.close()


def test_a_slot_past_the_file_ends_its_chain(tmp_path: Path, small_steps) -> None:
    """A damaged slot pointing past the file's length (nobody grew it): the walk ends there, as
    RocketMQ ends one at an index past indexCount; nothing is mapped past the file (no SIGBUS)."""
    path = tmp_path / "f"
    with IndexFile.create(path, SLOTS, NUM) as f:
        f.put_keys(*zip(*puts(10)))
        slot = index_hashes(["t#hot"])[0] % SLOTS
    with open(path, "r+b") as raw:
        raw.seek(HEADER_SIZE + int(slot) * SLOT_SIZE)
        raw.write((STEP + 50).to_bytes(4, "big"))
    with IndexFile.open(path, SLOTS, NUM, read_only=True) as f:
        assert f.candidates("t#hot") == [] == reference_candidates(f, "t#hot")
        assert f.select_phy_offsets("t#hot", 64, 0, 2**62) == []
        assert f.capacity == STEP


@pytest.mark.parametrize("partial", [False, True])
def test_growing_on_a_full_disk_is_storage_full_and_changes_nothing(tmp_path: Path, small_steps, monkeypatch,
                                                                   partial) -> None:
    """posix_fallocate failing with ENOSPC (after extending the file part of the way, as glibc's
    fallback that writes zeros can): StorageFullError naming the file, its length and bytes as
    before, and the next put, with space back, as if nothing happened."""
    path = tmp_path / "f"
    every = puts(60, seed=2)
    with IndexFile.create(path, SLOTS, NUM) as f:
        f.put_keys(*zip(*every[:15]))  # entries 1..15: the first step is full
        before = path.read_bytes()
        real = os.posix_fallocate

        def full_disk(fd: int, offset: int, length: int) -> None:
            if partial:
                os.ftruncate(fd, offset + 7)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", full_disk)
        with pytest.raises(StorageFullError, match=f"{path}: no space left to allocate"):
            f.put_keys(*zip(*every[15:]))
        with pytest.raises(StorageFullError):
            f.put_key(*every[15])  # entry 16 needs the next step too
        assert path.read_bytes() == before and f.capacity == STEP
        monkeypatch.setattr(os, "posix_fallocate", real)
        assert f.put_keys(*zip(*every[15:])) == 45
    with IndexFile.create(tmp_path / "g", SLOTS, NUM) as g:
        g.put_keys(*zip(*every))
    assert path.read_bytes() == (tmp_path / "g").read_bytes()


def test_a_reader_never_sees_a_header_or_slot_zeroed_while_the_writer_rewrites_it(tmp_path):
    """The writer rewrites the active file's header and a slot on every put while readers of other
    processes map the same file: they must see the old bytes or the new, never the zeros
    Struct.pack_into writes over its span before packing (a reader then saw indexCount 0, "behind
    its commit", and failed; CI saw it twice). Here another process puts one key over and over
    (its count set back each time), and every read of the header's count here must be the count
    before or after a put, and of the key's slot never 0."""
    path = tmp_path / "20240101000000000"
    index = IndexFile.create(path, 53, 1500)
    index.put_hashes(np.arange(1, 573, dtype=np.int32), np.arange(572, dtype=np.int64),
                     1_700_000_000_000 + np.arange(572, dtype=np.int64))
    committed = index.header.index_count  # (entry 0 is never written: 573)
    index.flush()
    index.close()
    slot_at = HEADER_SIZE + index_hash("t#k") % 53 * SLOT_SIZE
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", f"""
import os
from msgindex.storage.hash_index.index_file import IndexFile
index = IndexFile.open({str(path)!r}, 53, 1500)
committed = index.header
print("ready", flush=True)
while not os.path.exists({str(stop)!r}):
    for _ in range(1000):
        index._write_header(committed)  # (back to 572 entries: the put below goes on forever)
        index.put_key("t#k", 572, 1_700_000_001_000)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        fd = os.open(path, os.O_RDONLY)
        try:
            reads, deadline = 0, time.monotonic() + 1.5
            while time.monotonic() < deadline:
                for _ in range(500):
                    count = struct.unpack(">i", os.pread(fd, 4, HEADER_SIZE - 4))[0]
                    slot = struct.unpack(">i", os.pread(fd, SLOT_SIZE, slot_at))[0]
                    assert count in (committed, committed + 1) and slot != 0, \
                        f"read mid-rewrite: indexCount {count}, slot {slot}"
                reads += 500
        finally:
            os.close(fd)
    finally:
        stop.touch()
        writer.wait(timeout=30)
    assert writer.returncode == 0 and reads > 10_000
