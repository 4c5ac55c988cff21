"""IndexFile chain lookups (candidates, candidate_arrays, candidates_many) against the plain walk.

``reference_candidates`` walks a chain one entry per step; the fast paths (numpy lock-step walks,
verified scans of dense chains, the sealed file's hash run) must answer exactly what it answers:
on chains that cross the committed limit, colliding hashes, hash 0 (entry 0 and unwritten entries
hold zeros), entries past a reader's committed count, and on corrupt bytes. The tuning constants
are shrunk here so that every path runs on small files.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgindex import IndexFile
from msgindex.storage.hash_index import hash_run
from msgindex.storage.hash_index import index_file as index_file_module
from msgindex.storage.hash_index.index_file import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE, reference_candidates
from msgindex.storage.hash_index.java_hash import index_hash

T0 = 1_700_000_000_000
SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# "Aa"/"BB" share a Java hash; "", and the MIN_VALUE strings have index hash 0 (slot 0)
KEYS = ["a", "b", "Aa", "BB", "", "polygenelubricants", "GydZG_", "hot", "k1", "k2", "t#\U0001F600"]
QUERY_HASHES = [index_hash(k) for k in KEYS] + [index_hash("never-put"), 0, 1, 2**31 - 1]

# (lock-step minimum keys, lock-step steps, probe hops, scan density, min window, max window).
# The compiled walk, where it is built, answers every walk of "production" and "lock-step-only";
# the others walk in Python and numpy (its oracles, and what runs where it is not built).
TUNINGS = {
    "production": None,
    "scan-everything": (2, 2, 1, 10**9, 1, 3),
    "scan-after-probe": (3, 1, 2, 4, 2, 5),
    "scalar-only": (10**9, 0, 10**9, 1, 1, 1),
    "python-production": None,
    "lock-step-only": (1, 10**9, 10**9, 1, 1, 1),
    "lock-step-numpy": (1, 10**9, 10**9, 1, 1, 1),
}
COMPILED_TUNINGS = ("production", "lock-step-only")


def tune(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    values = TUNINGS[name]
    if name not in COMPILED_TUNINGS:
        monkeypatch.setattr(index_file_module, "_compiled_walk", None)
    if values is None:
        return
    names = ("_VECTOR_MIN_KEYS", "_VECTOR_STEPS", "_PROBE_HOPS", "_SCAN_DENSITY", "_MIN_SCAN_WINDOW", "_MAX_SCAN_WINDOW")
    for attribute, value in zip(names, values):
        monkeypatch.setattr(index_file_module, attribute, value)


def per_key(arrays: tuple[np.ndarray, ...], n_keys: int) -> list[list[tuple[int, int, int]]]:
    """candidate_arrays' output as one list per key, in output order."""
    who, entries, phys, stamps = arrays
    assert all(a.dtype == np.int64 for a in arrays) and len({a.size for a in arrays}) == 1
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(n_keys)]
    for k, e, p, s in zip(who.tolist(), entries.tolist(), phys.tolist(), stamps.tolist()):
        out[k].append((e, p, s))
    return out


def assert_lookups_match_the_walk(f: IndexFile, hashes: list[int], limit: int | None) -> None:
    expected = [reference_candidates(f, h, limit_index_count=limit) for h in hashes]
    assert per_key(f.candidate_arrays(np.array(hashes, np.int64), limit_index_count=limit), len(hashes)) == expected
    for h, want in zip(hashes, expected):
        assert f.candidates(h, limit_index_count=limit) == want
        assert per_key(f.candidate_arrays(np.array([h]), limit_index_count=limit), 1) == [want]
    # a floor ends every walk below it: the walk's answer from the floor on
    for floor in {2, f.index_count // 3, f.index_count // 2 + 1, f.index_count - 1, f.index_count + 3}:
        above = [[c for c in want if c[0] >= floor] for want in expected]
        assert per_key(f.candidate_arrays(np.array(hashes, np.int64), limit_index_count=limit, floor_entry=floor),
                       len(hashes)) == above, floor
        for h, want in zip(hashes, above):
            assert per_key(f.candidate_arrays(np.array([h]), limit_index_count=limit, floor_entry=floor), 1) == [want]


puts_st = st.lists(
    st.tuples(st.one_of(st.sampled_from(KEYS), st.just("hot")), st.integers(0, 10**6), st.integers(T0 - 3000, T0 + 90_000)),
    max_size=120,
)


@SETTINGS
@given(puts=puts_st, more=puts_st, slots=st.integers(1, 6), run_ends=st.lists(st.floats(0, 1), max_size=3),
       limit=st.one_of(st.none(), st.integers(1, 260)), min_chain=st.integers(1, 4),
       tuning=st.sampled_from(sorted(TUNINGS)))
def test_every_lookup_path_answers_like_the_plain_walk(tmp_path_factory, monkeypatch, puts, more, slots,
                                                       run_ends, limit, min_chain, tuning) -> None:
    tune(monkeypatch, tuning)
    path = tmp_path_factory.mktemp("lk") / "f"
    with IndexFile.create(path, slots, 250) as f:
        if puts:
            f.put_keys(*zip(*puts))
        # a chain of runs over a prefix, then entries they do not cover (a file sealed part-way)
        start = 1
        for end in sorted(1 + int(at * f.entry_count) for at in run_ends):
            hash_run.write(f, start, end, min_chain=min_chain, block_rows=3)
            start = end
        f.forget_hash_runs()
        if more:
            f.put_keys(*zip(*more))
        assert_lookups_match_the_walk(f, QUERY_HASHES, limit)
        with IndexFile.open(path, slots, 250, read_only=True) as reader:
            assert_lookups_match_the_walk(reader, QUERY_HASHES, limit)
            assert reader.candidates_many(KEYS, limit_index_count=limit) == [
                reference_candidates(reader, k, limit_index_count=limit) for k in KEYS]


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
@pytest.mark.parametrize("seed", range(12))
def test_corrupt_bytes_get_the_walks_answer(tmp_path: Path, monkeypatch, tuning: str, seed: int) -> None:
    """Damaged chains (prevs pointing anywhere, hashes changed, slots pointing past the count,
    whole garbage files): the fast paths still give exactly what the plain walk gives."""
    tune(monkeypatch, tuning)
    rng = random.Random(seed)
    slots, num = rng.choice([1, 2, 3, 7]), 200
    path = tmp_path / "f"
    with IndexFile.create(path, slots, num) as f:
        n = rng.randint(20, num - 1)
        f.put_keys([rng.choice(KEYS) for _ in range(n)], range(n), [T0 + i for i in range(n)])
    data = bytearray(path.read_bytes())
    entries_at = HEADER_SIZE + slots * SLOT_SIZE
    if seed % 4 == 3:  # garbage of the right size
        data[HEADER_SIZE:] = rng.randbytes(len(data) - HEADER_SIZE)
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(num)
        field = rng.choice([(0, 4), (16, 4)])  # keyHash or prevIndex
        value = rng.choice([0, -1, i, i + 1, i - 1, rng.randrange(num), rng.randrange(-(2**31), 2**31)])
        at = entries_at + i * ENTRY_SIZE + field[0]
        data[at : at + 4] = value.to_bytes(4, "big", signed=True)
    s = rng.randrange(slots)
    slot_at = HEADER_SIZE + s * SLOT_SIZE
    data[slot_at : slot_at + SLOT_SIZE] = rng.choice([0, num + 5, rng.randrange(num)]).to_bytes(4, "big")
    path.write_bytes(bytes(data))
    with IndexFile.open(path, slots, num, read_only=True) as f:
        hashes = QUERY_HASHES + [int(h) for h in f.entry_array()["key_hash"][:20]]
        for limit in (None, 1, rng.randrange(num + 10)):
            assert_lookups_match_the_walk(f, hashes, limit)


def test_a_hot_chain_is_scanned_and_a_cold_one_walked(tmp_path: Path, monkeypatch) -> None:
    """The Python walk (where the compiled one is not built), with the real tuning: a key with
    every 3rd entry of a 30,000-entry file is found by verified scans, not one step per entry; a
    key with a few entries is walked; a key sharing the hot key's slot gets its few entries from
    the same scans."""
    tune(monkeypatch, "python-production")
    scans: list[tuple[int, int]] = []
    real_scan = IndexFile._scan_window

    def spy(self, key_hash, slot, low, high, limit):
        scans.append((low, high))
        return real_scan(self, key_hash, slot, low, high, limit)

    monkeypatch.setattr(IndexFile, "_scan_window", spy)
    slots, n = 1009, 30_000
    hot = index_hash("t#hot")
    neighbour = next(k for k in (f"t#n{i}" for i in range(10**6)) if index_hash(k) % slots == hot % slots)
    keys = [f"t#k{i}" for i in range(n)]
    keys[::3] = ["t#hot"] * len(keys[::3])
    keys[1::1000] = [neighbour] * len(keys[1::1000])  # shares the hot key's slot
    with IndexFile.create(tmp_path / "f", slots, n + 1) as f:
        f.put_keys(keys, np.arange(n), np.full(n, T0))
    pair = np.array([hot, index_hash(neighbour)])
    with IndexFile.open(tmp_path / "f", slots, n + 1, read_only=True) as f:
        assert per_key(f.candidate_arrays(pair), 2) == [reference_candidates(f, int(h)) for h in pair]
        assert len(reference_candidates(f, hot)) == keys.count("t#hot") > 9000
        assert len(reference_candidates(f, neighbour)) == keys.count(neighbour) == 30
        assert sum(high - low + 1 for low, high in scans) >= n  # both chains, scanned down to the start
        scans.clear()
        assert f.candidates("t#k5") == reference_candidates(f, "t#k5") != [] and not scans


def test_lookups_on_a_closed_file_fail_clearly(tmp_path: Path) -> None:
    from msgindex.errors import MsgIndexError

    f = IndexFile.create(tmp_path / "f", 3, 10)
    f.close()
    with pytest.raises(MsgIndexError, match="closed"):
        f.candidate_arrays(np.array([1, 2]))
    with pytest.raises(MsgIndexError, match="closed"):
        f.candidates("a")
    with pytest.raises(MsgIndexError, match="closed"):
        f.select_phy_offsets("a", 64, 0, 1)


def test_empty_and_missing(tmp_path: Path) -> None:
    with IndexFile.create(tmp_path / "f", 3, 10) as f:
        for arrays in (f.candidate_arrays(np.zeros(0, np.int64)), f.candidate_arrays(np.arange(20))):
            assert all(a.size == 0 and a.dtype == np.int64 for a in arrays)
        assert f.candidates_many([]) == []


def rocketmq_select(f: IndexFile, key: str, max_num: int, begin: int, end: int) -> list[int]:
    """RocketMQ's selectPhyOffset transcribed step by step (FACTS.md), Java long arithmetic."""
    entries, slots = f.entry_array(), f.slot_array()
    count, begin_ts = f.index_count, f.begin_timestamp
    key_hash = index_hash(key)
    cur = int(slots[key_hash % f.hash_slot_num])
    found: list[int] = []
    if cur <= 0 or cur > count or count <= 1:
        return found
    idle = 0
    while len(found) < max_num and cur < f.index_num and idle <= count:  # idle: where the JVM spins
        idle += 1
        row = entries[cur]
        diff = int(row["time_diff"])
        if diff < 0:
            break
        t = (begin_ts + diff * 1000 + 2**63) % 2**64 - 2**63
        if int(row["key_hash"]) == key_hash and begin <= t <= end:
            found.append(int(row["phy_offset"]))
            idle = 0
        prev = int(row["prev_index"])
        if prev <= 0 or prev > count or prev == cur or t < begin:
            break
        cur = prev
    return found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(puts=st.lists(st.tuples(st.sampled_from(["hot", "a", "Aa", "BB", ""]), st.integers(0, 10**6), st.one_of(
           st.integers(T0 - 3000, T0 + 90_000),
           st.sampled_from([-(2**63), -(2**63) + 5_000_000, 2**63 - 1, 0, -1])))),  # diffs that wrap
       slots=st.integers(1, 5), inherited=st.sampled_from([0, T0 - 5000, 2**63 - 10**9, -(2**62)]),
       windows=st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1)), max_size=4),
       max_num=st.sampled_from([0, 1, 2, 64, 1000]))
def test_select_phy_offsets_is_rocketmqs_walk(tmp_path_factory, puts, slots, inherited, windows, max_num) -> None:
    path = tmp_path_factory.mktemp("sel") / "f"
    with IndexFile.create(path, slots, 250, end_timestamp=inherited) as f:
        if puts:  # the first put's timestamp becomes begin: sometimes near Long.MAX_VALUE (wrapping)
            f.put_key(puts[0][0], puts[0][1], inherited if inherited > 2**62 else puts[0][2])
        if len(puts) > 1:
            f.put_keys(*zip(*puts[1:]))
        rng = random.Random(len(puts))
        windows = windows + [(T0 + rng.randint(-5000, 90_000), T0 + rng.randint(0, 100_000)), (-(2**63), 2**63 - 1)]
        for key in ["hot", "a", "Aa", "", "missing"]:
            for begin, end in windows:
                expected = rocketmq_select(f, key, max_num, begin, end)
                assert f.select_phy_offsets(key, max_num, begin, end) == expected  # compiled, where built
                assert f.python_select_phy_offsets(key, max_num, begin, end) == expected


def test_the_compiled_walk_is_built_where_a_compiler_is() -> None:
    """setup.py builds it optionally: a silent build failure would leave every install on the
    Python walk (twice the JVM's time per call) with no test noticing."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: msgindex installs without its compiled walk")
    assert index_file_module._compiled_walk is not None, "msgindex.storage.hash_index._index_walk was not built: `make setup`"


def test_compiled_walk_hashes_every_string_as_java_does(tmp_path: Path) -> None:
    """Astral characters (two UTF-16 units), lone surrogates (one), Latin-1 and BMP text, the
    Integer.MIN_VALUE hashes (mapped to 0): the compiled hash and walk answer as the Python ones."""
    keys = ["t#\U0001F600x", "t#\udc80", "t#\ud83d", "t#é", "t#日本", "polygenelubricants", "GydZG_", "", "a" * 300,
            "t#\x00", "t#\uffff\U00010000"]
    with IndexFile.create(tmp_path / "f", 3, 100) as f:
        f.put_keys(keys, list(range(1, len(keys) + 1)), [T0] * len(keys))
        for key in [*keys, "missing", "t#\U0010FFFF"]:
            for window in [(0, 2**62), (T0, T0), (T0 + 1000, 2**62), (-(2**63), 2**63 - 1)]:
                assert f.select_phy_offsets(key, 64, *window) == f.python_select_phy_offsets(key, 64, *window)
        assert f.select_phy_offsets("t#日本", 64, 0, 2**62) == [keys.index("t#日本") + 1]


def test_compiled_walk_leaves_what_c_cannot_hold_to_python(tmp_path: Path) -> None:
    from msgindex.errors import InvalidKeyError

    with IndexFile.create(tmp_path / "f", 3, 100) as f:
        f.put_keys(["a", "b", "a"], [1, 2, 3], [T0] * 3)
        assert f.select_phy_offsets("a", 2**70, -(2**80), 2**80) == [3, 1]  # beyond int64: the Python walk
        assert f.select_phy_offsets("a", 1, 0, 2**62) == [3]
        with pytest.raises(InvalidKeyError, match="str"):
            f.select_phy_offsets(b"a", 64, 0, 2**62)


def test_a_many_key_walk_racing_a_writer_that_grows_the_file_finds_every_committed_hit(tmp_path: Path, monkeypatch):
    """A writer may grow the file and link newer heads past a reader's mapping while the reader
    walks many chains: the walk starts from the heads the reader read (and mapped) first, so the
    entries committed before it are all found (a head past the mapping is not an empty chain)."""
    path = tmp_path / "f"
    keys = [f"k{n}" for n in range(64)]
    count = index_file_module.GROWTH_ENTRIES - 10
    with IndexFile.create(path, 97, 4 * index_file_module.GROWTH_ENTRIES) as writer:
        writer.put_keys([keys[n % 64] for n in range(count)], range(count), [T0 + n for n in range(count)])
        with IndexFile.open(path, 97, 4 * index_file_module.GROWTH_ENTRIES, read_only=True) as reader:
            hashes = np.array([index_hash(k) for k in keys], np.int64)
            limit = reader.index_count
            expected = [reference_candidates(reader, int(h), limit_index_count=limit) for h in hashes]
            walk = index_file_module._compiled_walk
            if walk is None:
                pytest.skip("msgindex.storage.hash_index._index_walk was not built (`make setup`): "
                            "the numpy walk reads heads once")
            more = 200

            class Racing:
                def walk_chains(self, *args):
                    writer.put_keys([keys[n % 64] for n in range(more)], range(count, count + more),
                                    [T0 + count + n for n in range(more)])  # grows the file, new heads past the mapping
                    return walk.walk_chains(*args)

            monkeypatch.setattr(index_file_module, "_compiled_walk", Racing())
            found = per_key(reader.candidate_arrays(hashes, limit_index_count=limit), len(keys))
            assert found == expected and sum(map(len, found)) == count
