"""Hash runs (``<index file>.hashrun``): derived, checksummed, never trusted when they do not fit.

A run must change no answer: lookups with it equal the plain walk, and a missing, torn, corrupt,
stale or foreign run is ignored. It lists a hot slot's entries but its dominant hash's, whose walk
never jumps. In a shard it only ever covers committed entries (sealed after each commit from the
checkpoint just written), survives recovery only for listed files, and goes with its file when
retention drops it.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import numpy as np
import pytest

from msgindex import IndexFile
from msgindex.storage.checkpoint import CHECKPOINT_FILE, read_checkpoint
from msgindex.storage.hash_index import hash_run
from msgindex.storage.hash_index.hash_run import HEADER_SIZE, HashRun, run_path
from msgindex.storage.hash_index.index_file import reference_candidates
from msgindex.storage.hash_index.java_hash import index_hash
from msgindex.storage.shard import index_entries
from msgindex.storage.store import open_store
from tests.storage.shard_model import KEY_POOL, TINY, TOPICS, make_batch
from tests.storage.test_index_file_lookup import per_key

T0 = 1_700_000_000_000
SLOTS, NUM = 13, 4000
HOT = "t#hot"


def hot_file(path: Path, n: int = 3000, seed: int = 1) -> list[str]:
    """A file where HOT has a third of the entries, a few keys share its slot, the rest is cold."""
    rng = random.Random(seed)
    keys = [HOT if rng.random() < 0.34 else f"t#k{rng.randrange(400)}" for _ in range(n)]
    with IndexFile.create(path, SLOTS, NUM) as f:
        f.put_keys(keys, range(n), [T0 + 10 * i for i in range(n)])
    return keys


def lookups(f: IndexFile, limit: int | None = None) -> list:
    hashes = sorted({index_hash(k) for k in [HOT, "t#k1", "t#k2", "missing"]} | {index_hash(HOT) + SLOTS, 0})
    many = per_key(f.candidate_arrays(np.array(hashes), limit_index_count=limit), len(hashes))
    expected = [reference_candidates(f, h, limit_index_count=limit) for h in hashes]
    assert many == expected
    assert [f.candidates(h, limit_index_count=limit) for h in hashes] == expected
    return expected


def run_hits(monkeypatch: pytest.MonkeyPatch, asked: list[int] | None = None) -> list[bool]:
    """Record whether each HashRun.hits call answered (True) or refused (None -> False), and the
    key hash it was asked for in `asked`."""
    calls: list[bool] = []
    real = HashRun.hits

    def spy(self, key_hash, limit):
        result = real(self, key_hash, limit)
        calls.append(result is not None)
        if asked is not None:
            asked.append(key_hash)
        return result

    monkeypatch.setattr(HashRun, "hits", spy)
    return calls


def test_a_run_answers_hot_slots_exactly(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "20231114221320123"
    hot_file(path)
    calls = run_hits(monkeypatch)
    with IndexFile.open(path, SLOTS, NUM) as f:
        without = lookups(f)
        assert hash_run.write(f, 1, f.index_count, block_rows=100)
        f.forget_hash_runs()
        assert run_path(path) == tmp_path / "20231114221320123.hashrun"
        assert run_path(path, 77) == tmp_path / "20231114221320123.77.hashrun"
        (run,) = f._hash_runs().runs
        assert (run.start_count, run.end_count) == (1, f.index_count) and run.entry_rows > 1000
        # every slot of a 3000-entry, 13-slot file has a long chain: all are in the run
        assert sorted(run.slots.tolist()) == list(range(SLOTS))
        assert lookups(f) == without and calls and all(calls)
        # a reader whose committed count is older than the run: entries past it are left out
        assert lookups(f, limit=1500) == [[c for c in chain if c[0] < 1500] for chain in without]


def test_runs_jump_a_chain_that_fills_only_a_little_of_each_range(tmp_path: Path, monkeypatch) -> None:
    """A key with 16 entries in each run's range makes a chain of 48 all the same (a full file of
    5M records has five ranges): every run written with the default holds its slot, and a key of
    one record that shares the slot takes its hits from them instead of walking the other key's."""
    slots, ranges, per_range = 1000, 3, 16
    spread = "t#spread"
    slot = index_hash(spread) % slots
    sharing = next(key for key in (f"t#b{i}" for i in range(100_000))
                   if index_hash(key) % slots == slot and index_hash(key) != index_hash(spread))
    rng = random.Random(3)
    keys = []
    for _ in range(ranges):  # the other keys of a range: a few entries a slot, far below the threshold
        part = [spread] * per_range + [f"t#c{rng.randrange(10**6)}" for _ in range(400)]
        rng.shuffle(part)
        keys += part
    keys.insert(5, sharing)
    path = tmp_path / "f"
    with IndexFile.create(path, slots, 4 * len(keys)) as f:
        f.put_keys(keys, range(len(keys)), [T0 + i for i in range(len(keys))])
        expected = reference_candidates(f, index_hash(sharing))
        assert len(expected) == 1
        bounds = [1, *(1 + len(keys) * (r + 1) // ranges for r in range(ranges))]
        for start, end in zip(bounds, bounds[1:]):
            assert hash_run.write(f, start, end)
        f.forget_hash_runs()
        runs = f._hash_runs().runs
        assert len(runs) == ranges and all(slot in run.slots.tolist() for run in runs)
        asked: list[int] = []
        calls = run_hits(monkeypatch, asked)
        assert f.candidates(index_hash(sharing)) == expected
        assert asked == [index_hash(sharing)] * ranges and all(calls)


def test_a_run_leaves_out_the_hash_that_dominates_a_slot(tmp_path: Path, monkeypatch) -> None:
    """HOT holds most of its slot's entries: the run lists only the others' entries there, a key
    sharing the slot jumps over HOT's chain, and HOT's own walk never asks the run."""
    path = tmp_path / "f"
    hot_file(path)
    hot, sharing = index_hash(HOT), index_hash(HOT) + SLOTS
    with IndexFile.open(path, SLOTS, NUM) as f:
        f.put_keys(["t#k1"] * 3, [9000, 9001, 9002], [T0] * 3)  # cold keys in HOT's slot too
        expected = lookups(f)
        assert hash_run.write(f, 1, f.index_count, min_chain=8)
        f.forget_hash_runs()
        (run,) = f._hash_runs().runs
        row = run.slots.tolist().index(hot % SLOTS)
        assert run.left_out[row] == hot and hot not in run.key_hashes.tolist()
        slot_entries = sum(1 for e in f.iter_entries() if e.key_hash % SLOTS == hot % SLOTS)
        hot_entries = len(reference_candidates(f, hot))
        assert run.entry_rows == f.index_count - 1 - hot_entries and 2 * hot_entries >= slot_entries
        # the cold slots have no dominant hash: all of their entries are listed
        assert sorted(set(run.left_out.tolist())) == [hash_run.NO_LEFT_OUT, hot]
        asked: list[int] = []
        calls = run_hits(monkeypatch, asked)
        assert lookups(f) == expected
        assert sharing in asked and hot not in asked and all(calls)
        # many keys at once (RunSet.jumping's numpy form): the same answers, the sharing key's jump taken
        asked.clear()
        many = sorted({index_hash(f"t#k{i}") for i in range(400)} | {hot, sharing})
        assert per_key(f.candidate_arrays(np.array(many)), len(many)) == [reference_candidates(f, h) for h in many]
        assert sharing in asked and hot not in asked
        # a walk of HOT goes through the run's range entry by entry: it touches HOT's whole chain
        asked.clear()
        assert f.candidates(hot) == expected[sorted({hot, sharing, index_hash("t#k1"), index_hash("t#k2"),
                                                     index_hash("missing"), 0}).index(hot)]
        assert asked == []


def test_a_version_1_run_is_still_read(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "f"
    hot_file(path)
    with IndexFile.open(path, SLOTS, NUM) as f:
        expected = lookups(f)
        run_path(path).write_bytes(hash_run.build(f, 1, f.index_count, version=1))
        f.forget_hash_runs()
        (run,) = f._hash_runs().runs
        assert run.version == 1 and run.entry_rows == f.index_count - 1  # every entry of the hot slots
        assert set(run.left_out.tolist()) == {hash_run.NO_LEFT_OUT}
        asked: list[int] = []
        run_hits(monkeypatch, asked)
        assert lookups(f) == expected and index_hash(HOT) in asked


def test_a_run_of_a_newer_version_is_ignored(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "f"
    hot_file(path)
    with IndexFile.open(path, SLOTS, NUM) as f:
        expected = lookups(f)
        data = bytearray(hash_run.build(f, 1, f.index_count))
        struct.pack_into("<I", data, 8, 3)
        struct.pack_into("<I", data, hash_run.HEADER_CRC_OFFSET, __import__("zlib").crc32(data[:hash_run.HEADER_CRC_OFFSET]))
        run_path(path).write_bytes(bytes(data))
        f.forget_hash_runs()
        assert not f._hash_runs().runs
        calls = run_hits(monkeypatch)
        assert lookups(f) == expected and not calls


def test_entries_past_the_run_are_walked_or_scanned(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "f"
    hot_file(path)
    with IndexFile.open(path, SLOTS, NUM) as f:
        hash_run.write(f, 1, 1200)  # sealed part-way, as a shard seals a file's committed prefix
        f.forget_hash_runs()
        calls = run_hits(monkeypatch)
        for limit in (None, 600, 1200, 2500):
            lookups(f, limit)
        assert calls and all(calls)


def test_a_chain_of_tail_runs_answers_like_the_walk(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "f"
    hot_file(path)
    ranges = [(1, 500), (500, 1700), (1700, 2400)]  # a growing file sealed stretch by stretch
    with IndexFile.open(path, SLOTS, NUM) as f:
        expected = lookups(f)
        for start, end in ranges:
            assert hash_run.write(f, start, end, min_chain=8)
        f.forget_hash_runs()
        assert [(r.start_count, r.end_count) for r in f._hash_runs().runs] == ranges
        assert hash_run.chain_ranges(path) == ranges and hash_run.covered_count_of(path) == 2400
        calls = run_hits(monkeypatch)
        for limit in (None, 300, 1000, 2000, 2900):
            lookups(f, limit)
        assert len(calls) >= 3 and all(calls)
        # a missing link ends the chain: the runs after it are not found
        run_path(path, 500).unlink()
        f.forget_hash_runs()
        assert [(r.start_count, r.end_count) for r in f._hash_runs().runs] == [(1, 500)]
        assert lookups(f) == expected
        assert hash_run.remove_runs(path) == 2 and not list(tmp_path.glob("*.hashrun"))


def test_seal_committed_extends_the_chain_then_merges_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hash_run, "MIN_SEAL_ENTRIES", 100)
    monkeypatch.setattr(hash_run, "TAIL_ENTRIES", 300)
    monkeypatch.setattr(hash_run, "MAX_RUNS", 3)
    path = tmp_path / "20231114221320123"
    hot_file(path)
    name = path.name
    steps = [
        ({name: 50}, 0, []),  # too few committed entries for a run
        ({"20231114221320999": 3000}, 0, []),  # nothing committed of this file
        ({name: 1000}, 1, [(1, 1000)]),
        ({name: 1200}, 0, [(1, 1000)]),  # a short uncovered tail: scanned at lookup time
        ({name: 1400}, 1, [(1, 1000), (1000, 1400)]),
        ({name: 1800}, 1, [(1, 1000), (1000, 1400), (1400, 1800)]),
        ({name: 2200}, 1, [(1, 2200)]),  # MAX_RUNS reached: merged into one
    ]
    with IndexFile.open(path, SLOTS, NUM) as f:
        for committed, written, chain in steps:
            assert hash_run.seal_committed([f], committed) == written
            assert hash_run.chain_ranges(path) == chain
            lookups(f)
        assert sorted(p.name for p in tmp_path.glob("*.hashrun")) == [name + ".hashrun"]


@pytest.mark.parametrize("damage", ["header", "directory", "column", "block table", "truncated", "extended", "empty"])
def test_a_damaged_run_is_ignored(tmp_path: Path, monkeypatch, damage: str) -> None:
    path = tmp_path / "f"
    hot_file(path)
    with IndexFile.open(path, SLOTS, NUM) as f:
        expected = lookups(f)
        hash_run.write(f, 1, f.index_count, block_rows=64)
    side = run_path(path)
    data = bytearray(side.read_bytes())
    slot_rows = struct.unpack_from("<i", data, 32)[0]
    if damage == "header":
        data[20] ^= 1
    elif damage == "directory":
        data[HEADER_SIZE + 4] ^= 0x10
    elif damage == "column":
        entry_rows = struct.unpack_from("<i", data, 36)[0]
        key_hashes = np.frombuffer(bytes(data), "<i4", entry_rows, HEADER_SIZE + 16 * slot_rows + 8 * entry_rows)
        row = int(np.flatnonzero(key_hashes == index_hash("t#k2"))[0])  # a row lookups read
        data[HEADER_SIZE + 16 * slot_rows + 8 * row + 3] ^= 0x40  # its phyOffset
    elif damage == "block table":
        data[-2] ^= 1
    elif damage == "truncated":
        data = data[:-4]
    elif damage == "extended":
        data += b"\0" * 8
    else:
        data = bytearray()
    side.write_bytes(bytes(data))
    hash_run._verified_by_run.clear()
    calls = run_hits(monkeypatch)
    with IndexFile.open(path, SLOTS, NUM, read_only=True) as f:
        assert lookups(f) == expected
        runs = f._hash_runs()
        if damage == "column":  # found when a lookup reads that block; the run is dropped then
            assert runs.runs and False in calls
            assert runs.tops(np.arange(SLOTS)).tolist() == [[0] * SLOTS]
        else:
            assert not runs.runs and not calls


@pytest.mark.parametrize("column", ["key_hash", "entry"])
def test_a_damaged_row_near_the_search_is_found_not_trusted(tmp_path: Path, column: str) -> None:
    """A run's binary search reads rows it has not checked: a damaged key hash of a key's only
    row (the search then finds nothing there) or a damaged entry (the limit's search cuts the
    slice short) must fail the run's checksums, never shorten an answer; and a run found damaged
    once answers nothing after (not even an empty slice)."""
    path = tmp_path / "f"
    hot_file(path)
    with IndexFile.open(path, SLOTS, NUM) as f:
        assert hash_run.write(f, 1, f.index_count, min_chain=8)  # one block: every search rests on it
        f.forget_hash_runs()
        (run,) = f._hash_runs().runs
        hashes, counts = np.unique(run.key_hashes, return_counts=True)
        victim = int(next(h for h, c in zip(hashes, counts) if c == (1 if column == "key_hash" else 2)
                          and h + 1 not in hashes))
        row = int(np.flatnonzero(run.key_hashes == victim)[-1])
    data = bytearray(run_path(path).read_bytes())
    slot_rows, entry_rows = struct.unpack_from("<ii", data, 32)
    columns_at = HEADER_SIZE + 16 * slot_rows
    if column == "key_hash":
        struct.pack_into("<i", data, columns_at + 8 * entry_rows + 4 * row, victim + 1)
    else:  # the newest of the key's two entries made older than any limit a reader passes
        struct.pack_into("<i", data, columns_at + 12 * entry_rows + 4 * row, 2**31 - 1)
    run_path(path).write_bytes(bytes(data))
    hash_run._verified_by_run.clear()
    with IndexFile.open(path, SLOTS, NUM, read_only=True) as f:
        expected = reference_candidates(f, victim)
        assert expected and f.candidates(victim) == expected
        assert per_key(f.candidate_arrays(np.array([victim])), 1) == [expected]
        assert f._hash_runs().runs[0].corrupt
        assert f._hash_runs().runs[0].hits(victim + 12345, f.index_count) is None


def test_a_stale_or_foreign_run_is_ignored(tmp_path: Path, monkeypatch) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    hot_file(a, seed=1)
    hot_file(b, seed=2)
    with IndexFile.open(a, SLOTS, NUM) as f:
        hash_run.write(f, 1, f.index_count)
    # the same name now holds other entries (re-created): the fingerprint differs
    run_path(a).rename(run_path(b))
    calls = run_hits(monkeypatch)
    with IndexFile.open(b, SLOTS, NUM, read_only=True) as f:
        assert not f._hash_runs().runs
        lookups(f)
    # other sizing
    with IndexFile.create(tmp_path / "c", SLOTS + 1, NUM) as c:
        c.put_keys([HOT] * 10, range(10), [T0] * 10)
        hash_run.write(c, 1, c.index_count, min_chain=2)
    run_path(tmp_path / "c").rename(run_path(a))
    with IndexFile.open(a, SLOTS, NUM, read_only=True) as f:
        assert not f._hash_runs().runs
    assert not calls


def test_rolling_back_below_a_run_deletes_it(tmp_path: Path) -> None:
    path = tmp_path / "f"
    hot_file(path, n=1000)
    with IndexFile.open(path, SLOTS, NUM) as f:
        header = f.header
        f.put_keys([HOT] * 500, range(500), [T0] * 500)
        hash_run.write(f, 1, 700)
        hash_run.write(f, 700, f.index_count)  # wrongly over entries about to be undone
        assert f.rollback_to(header.index_count, header)
        assert run_path(path).exists() and not run_path(path, 700).exists()
        assert [(r.start_count, r.end_count) for r in f._hash_runs().runs] == [(1, 700)]
        f.put_keys(["t#other"] * 500, range(500), [T0] * 500)
        lookups(f)
        f.rollback_to(header.index_count, header)  # a run below the count survives a rollback above it
        assert run_path(path).exists()


def test_unclean_chains_are_left_out_of_the_run(tmp_path: Path) -> None:
    path = tmp_path / "f"
    hot_file(path)
    with IndexFile.open(path, SLOTS, NUM) as f:
        hot_slot = index_hash(HOT) % SLOTS
        chain = [c[0] for c in reference_candidates(f, HOT)]
        f._entries["prev_index"][chain[100]] = chain[300]  # skips part of the chain (a broken file)
        hash_run.write(f, 1, f.index_count)
        f.forget_hash_runs()
        (run,) = f._hash_runs().runs
        assert hot_slot not in run.slots.tolist() and run.slots.size == SLOTS - 1
        lookups(f)


def test_negative_key_hashes_get_no_run(tmp_path: Path) -> None:
    path = tmp_path / "f"
    hot_file(path, n=200)
    with IndexFile.open(path, SLOTS, NUM) as f:
        assert hash_run.write(f, 1, f.index_count)
        f._entries["key_hash"][5] = -7  # no RocketMQ or msgindex file has one
        assert not hash_run.write(f, 1, f.index_count) and not run_path(path).exists()
        with pytest.raises(ValueError):
            hash_run.build(f, 1, f.index_count + 1)  # never over entries the file does not hold


def test_verified_blocks_are_remembered_per_sidecar(tmp_path: Path) -> None:
    path = tmp_path / "f"
    hot_file(path)
    with IndexFile.open(path, SLOTS, NUM) as f:
        hash_run.write(f, 1, f.index_count, block_rows=50)
    hash_run._verified_by_run.clear()
    with IndexFile.open(path, SLOTS, NUM, read_only=True) as f:
        f.candidates("t#k2")  # (HOT is left out of its slot's run: its walk reads no block)
        verified = set(f._hash_runs().runs[0]._verified)
        assert verified
    with IndexFile.open(path, SLOTS, NUM, read_only=True) as g:
        assert g._hash_runs().runs[0]._verified == verified  # the same run file: not verified twice


# --- in a shard ----------------------------------------------------------------------------------
@pytest.fixture
def sealing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hash_run, "MIN_SEAL_ENTRIES", 1)  # TINY files hold 8 entries
    monkeypatch.setattr(hash_run, "TAIL_ENTRIES", 1)


def all_keys_lookup(reader) -> list:
    return [reader.lookup([key], topic=topic).to_pylist() for key in KEY_POOL for topic in TOPICS]


def assert_runs_cover_only_committed(index_dir: Path, index_files) -> None:
    committed = {state.name: state.index_count for state in index_files}
    for run in index_dir.glob("*" + hash_run.SUFFIX):
        index_name = run.name[: -len(hash_run.SUFFIX)].split(".")[0]  # (<name>.<start>.hashrun: a tail run)
        assert index_name in committed and hash_run.covered_count_of(index_dir / index_name) <= committed[index_name]


@pytest.fixture
def shard_store(tmp_path: Path, sealing):
    """A TINY store whose shard "b" committed 4 batches of 20 records (files roll every 8 entries),
    with the hash runs its writer sealed after each commit: over each file's committed entries."""
    rng = random.Random(5)
    with open_store(tmp_path / "store", create=True, settings=TINY) as store:
        with store.writer("b") as writer:
            for batch_id in range(4):
                writer.append(make_batch(rng, batch_id * 20, 20))
        yield store


def test_runs_a_writer_seals_cover_committed_entries_and_answer_alike(shard_store) -> None:
    shard = shard_store.root / "broker=b"
    index_dir = shard / "index"
    runs = sorted(index_dir.glob("*" + hash_run.SUFFIX))
    assert len(runs) >= 3
    assert_runs_cover_only_committed(index_dir, read_checkpoint(shard / CHECKPOINT_FILE).index_files)
    with shard_store.reader("b") as reader:
        with_runs = all_keys_lookup(reader)
    saved = {run: run.read_bytes() for run in runs}
    for run in runs:
        run.unlink()
    with shard_store.reader("b") as reader:
        assert all_keys_lookup(reader) == with_runs
    for run, data in saved.items():
        run.write_bytes(data)

    # a batch that fills files but dies before its checkpoint: runs cover only committed entries
    lost = make_batch(random.Random(9), 80, 40)
    writer = shard_store.writer("b")
    checkpoint = writer.checkpoint
    writer._put_keys(*index_entries(lost, writer.log.append(lost)))
    writer.close()
    assert_runs_cover_only_committed(index_dir, checkpoint.index_files)
    (index_dir / "20991231235959999.hashrun").write_bytes(b"left by a file that never committed")
    shard_store.writer("b").close()  # recovery keeps the runs of listed files only
    assert_runs_cover_only_committed(index_dir, checkpoint.index_files)
    assert len(list(index_dir.glob("*" + hash_run.SUFFIX))) >= 3


def test_retention_drops_a_run_with_its_file(shard_store) -> None:
    with shard_store.writer("b") as writer:
        oldest = writer.index_file_paths()[0]
        assert run_path(oldest).exists()
        writer.drop_oldest(1, 0)
        assert not oldest.exists() and not list(oldest.parent.glob(oldest.name + "*"))


def test_a_run_that_cannot_be_written_does_not_fail_the_sealing(tmp_path: Path, monkeypatch, caplog, sealing) -> None:
    def disk_full(path, data):
        raise OSError(28, "No space left on device")

    path = tmp_path / "f"
    hot_file(path)
    monkeypatch.setattr(hash_run, "write_atomically", disk_full)
    with IndexFile.open(path, SLOTS, NUM) as f:
        assert hash_run.seal_committed([f], {path.name: f.index_count}) == 0
    assert "hash run not written" in caplog.text and not run_path(path).exists()


def test_each_commit_seals_runs_of_the_files_it_wrote(shard_store) -> None:
    """Appends that fill and roll files get runs over each file's committed entries, of version 2."""
    index_dir = shard_store.root / "broker=b" / "index"
    before = set(index_dir.glob("*" + hash_run.SUFFIX))
    with shard_store.writer("b") as writer:
        writer.append(make_batch(random.Random(3), 500, 30))
        writer.append(make_batch(random.Random(4), 600, 30))
        states = writer.checkpoint.index_files
    assert set(index_dir.glob("*" + hash_run.SUFFIX)) > before
    for state in states:
        assert hash_run.covered_count_of(index_dir / state.name) == state.index_count
    assert {struct.unpack_from("<I", run.read_bytes(), 8)[0] for run in index_dir.glob("*" + hash_run.SUFFIX)} == {2}


def test_inspect_checks_runs_of_either_version(shard_store) -> None:
    """`msgindex inspect` rebuilds each run as its version lists entries: the runs a writer
    seals and a version-1 run pass; a version-1 run relabelled as version 2 is reported, naming it."""
    from msgindex.storage.maintenance.inspect import inspect_path

    shard = shard_store.root / "broker=b"
    assert inspect_path(shard_store.root)["problems"] == []
    state = read_checkpoint(shard / CHECKPOINT_FILE).index_files[-1]
    path = shard / "index" / state.name
    hash_run.remove_runs(path)
    with IndexFile.open(path, TINY.hash_slot_num, TINY.index_num, read_only=True) as f:
        version_1 = hash_run.build(f, 1, state.index_count, min_chain=1, version=1)
        version_2 = hash_run.build(f, 1, state.index_count, min_chain=1)
    assert version_1 != version_2
    run_path(path).write_bytes(version_1)
    assert inspect_path(shard_store.root)["problems"] == []
    # version 1's rows under a version-2 header: its header checksum and its size no longer hold
    forged = bytearray(version_1)
    struct.pack_into("<I", forged, 8, 2)
    run_path(path).write_bytes(bytes(forged))
    problems = inspect_path(shard_store.root)["problems"]
    assert problems and all(run_path(path).name in problem for problem in problems)
