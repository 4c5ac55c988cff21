"""Hot-slot runs: derived sidecars that answer long hash chains of an index file without walking them.

A RocketMQ index file answers a key by walking its slot's chain one entry at a time, newest
first. A hot key (10^5-10^6 entries) makes that chain, and the chain of every key sharing its
slot, that long. A *hot-slot run* of an index file covers a range [start, end) of its entries and
lists every entry of each slot that has at least ``min_chain`` entries in that range, sorted by
(keyHash, entry): a key's entries there are one contiguous slice, found by binary search, with
their phyOffsets and time diffs beside them. For each such slot it also records the slot's newest
entry in the range (``top``) and where the chain leaves the range (``exit``: the prevIndex of the
slot's oldest entry there, 0 when the walk ends there).

So a walk that arrives at a run's ``top`` of its slot takes every hit down to the range's start
from the run and goes on at ``exit``, exactly as if it had walked: a run is only built from slots
whose chains are clean in its range (each entry's prevIndex is the slot's entry before it, the
oldest one leaves the range or ends the walk). A file's runs form a chain of ranges
[1, e1), [e1, e2), ...: the first is ``<name>.hashrun``, the others ``<name>.<start>.hashrun``, so
that a growing file (the active one) gets a run for each new committed stretch instead of
rebuilding one over everything (``seal_committed`` merges them back when there are many).

Version 2 leaves out each hot slot's *dominant* hash: the one holding at least half the slot's
entries in the range (``left_out`` in its directory row), a hot key's as a rule. A walk of that
hash does not jump at the slot's top; it walks the range as if the run were not there, which costs
it at most twice its own entries (and a hot key's walk ends where its copies do:
``ShardReader._floor_entry``). Every other key of the slot, which a hot key's chain would make
walk tens of thousands of entries for a few hits of its own (4-17 ms on a 5M-record Zipf store),
takes its hits from the run. So a run holds the few entries of the keys that share hot slots, not
the hot keys' own: version 1 listed every entry of a hot slot, 20 bytes each (~1 B a record of a
Zipf store, 64-70 MB at 5M), which is why writers stopped sealing them; version 2 runs take about
a hundredth of that, and writers seal them after each commit (``ShardWriter``). Version-1 runs are
still read (their ``left_out`` is none), and an older msgindex ignores version 2 runs (it walks).

Runs are derived and never required: a lookup uses a run only when it is intact (checksums),
fits the index file (sizing, a fingerprint of its entries, the file still holds them) and the walk
reaches its ``top`` exactly; otherwise it walks or scans the index file itself. Since the hash
files stay byte-identical to RocketMQ's, deleting every run changes no answer, only its speed.
A run only ever covers entries that are already committed (``seal_committed`` is given the
counts of the shard's last checkpoint), and committed entries of a listed file never change.

Layout of one run (little-endian: msgindex's own format, read by numpy without byte swapping)::

    header     64 B     see HEADER_STRUCT (magic, version, sizing, range, row counts,
                        fingerprint of the range's entries, checksums)
    directory  L x 16   hot slot i32, top i32, exit i32, left_out i32 (its dominant key hash, -1
                        when none); sorted by slot (version 1: L x 12, no left_out)
    phy_offset M x 8    i64  \\
    key_hash   M x 4    i32   | the M entries of the hot slots in the range but their left_out
                              | hash's, sorted by
    entry      M x 4    i32   | (key_hash, entry)
    time_diff  M x 4    i32  /
    block_crc  B x 4    u32  zlib.crc32 of rows [b*block_rows, (b+1)*block_rows) of the four
                             columns, in column order (B = ceil(M / block_rows))

Blocks are verified when a lookup first touches them; a verified run (same device, inode, size
and mtime: runs are only ever replaced by a rename, never rewritten in place) is remembered per
process, so readers reopened after each commit do not verify it again.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from msgindex.errors import CorruptFileError, InvalidArgumentError
from msgindex.storage.durable import write_atomically
from msgindex.storage.int_limits import INT32_MAX, INT32_MIN
from msgindex.storage.mapped_file import map_file
from msgindex.storage.sorted_runs import run_starts


class IndexFile(Protocol):
    """What a run needs of the RocketMQ index file it is derived from (``index_file.IndexFile``,
    which imports this module to use runs: hence a protocol here, not an import)."""

    path: Path
    hash_slot_num: int
    index_num: int

    @property
    def header(self) -> Any: ...

    @property
    def index_count(self) -> int: ...

    def entry_array(self) -> np.ndarray: ...

    def forget_hash_runs(self) -> None: ...

log = logging.getLogger(__name__)

SUFFIX = ".hashrun"
MAGIC = b"MIHSHRUN"
VERSION = 2
READ_VERSIONS = (1, 2)
HEADER_SIZE = 64
# magic, version, hash_slot_num, index_num, start_count, end_count, min_chain, slot_rows (L),
# entry_rows (M), block_rows, fingerprint, directory_crc, block_crc_crc | header_crc | spare
_HEADER_FIELDS_BEFORE_CRC = "<8sIiiiiiiiiIII"
HEADER_STRUCT = struct.Struct(_HEADER_FIELDS_BEFORE_CRC + "I4x")
HEADER_CRC_OFFSET = struct.calcsize(_HEADER_FIELDS_BEFORE_CRC)  # header_crc covers every byte before it
DIRECTORY_DTYPES = {1: np.dtype([("slot", "<i4"), ("top", "<i4"), ("exit", "<i4")]),
                    2: np.dtype([("slot", "<i4"), ("top", "<i4"), ("exit", "<i4"), ("left_out", "<i4")])}
DIRECTORY_DTYPE = DIRECTORY_DTYPES[VERSION]
DIRECTORY_ROW = 16
NO_LEFT_OUT = -1  # (stored key hashes are >= 0: build refuses a file with a negative one)
COLUMNS = (("phy_offset", np.dtype("<i8")), ("key_hash", np.dtype("<i4")), ("entry", np.dtype("<i4")),
           ("time_diff", np.dtype("<i4")))
BLOCK_CRC_DTYPE = np.dtype("<u4")
# A slot with fewer entries than this in a run's range is walked there. A chain runs through every
# range of its file (a full file of 5M records has five), so a per-range 64 left chains of up to
# ~300 entries walked: 2% of keys of a 1M-slot file share a slot with another key's 64+ entries,
# and a key of one record there walked 181 on the 5M long-keys store (0.7-1.0 ms on its first
# lookup: each entry a page and a chunk checksum not touched before). At 16 its walk is 92 at most,
# the runs take 0.5% of the file (were 0.1%), and 1,000 keys took 39 against 40 ms; at 8 the walks
# end sooner still, but the Python walk that takes a run's hits (~10 us a run) serves twice the keys.
DEFAULT_MIN_CHAIN = 16
DEFAULT_BLOCK_ROWS = 1 << 16
FINGERPRINT_SAMPLES = 64  # entry rows of the range hashed into the fingerprint
# Sealing policy (seal_committed): a file gets its first run at MIN_SEAL_ENTRIES committed entries
# (a verified scan of fewer takes well under a millisecond), then a run for each further
# TAIL_ENTRIES committed ones (the entries past the last run are walked: a key sharing a hot
# key's slot walks that key's entries there, ~0.1 us each); past MAX_RUNS runs they are merged
# into one (a build costs ~0.25 us an entry of its range: a merge is rare, a run per commit would
# cost more than the walks it saves).
MIN_SEAL_ENTRIES = 1 << 16
TAIL_ENTRIES = 1 << 20
MAX_RUNS = 16
_VERIFIED_RUNS = 256  # run files whose verified blocks a process remembers
_FEW_WALKS = 64
_FIRST_INDEX = 1  # index_file.FIRST_INDEX (entry 0 is never written); index_file imports this module

assert HEADER_STRUCT.size == HEADER_SIZE and DIRECTORY_DTYPE.itemsize == DIRECTORY_ROW
assert COLUMNS[0][1].itemsize == 8 and (HEADER_SIZE + DIRECTORY_ROW) % 8 == 0  # columns stay aligned


def run_path(index_path: str | os.PathLike, start: int = _FIRST_INDEX) -> Path:
    """Where the run of the index file at `index_path` whose range starts at entry `start` lives."""
    index_path = Path(index_path)
    middle = "" if start == _FIRST_INDEX else f".{start}"
    return index_path.with_name(f"{index_path.name}{middle}{SUFFIX}")


def is_sidecar_of(name: str, index_names: Iterable[str]) -> bool:
    """True when `name` is a run of one of `index_names` (file names, not paths)."""
    if not name.endswith(SUFFIX):
        return False
    stem = name[: -len(SUFFIX)]
    names = index_names if isinstance(index_names, (set, frozenset, dict)) else set(index_names)
    if stem in names:
        return True
    owner, _, start = stem.rpartition(".")
    return owner in names and start.isdigit()


def remove_runs(index_path: str | os.PathLike, *, ending_after: int = 0) -> int:
    """Delete the runs of `index_path` whose range ends past entry count `ending_after` (all by
    default), e.g. with the file, or after a rollback below them. Returns how many went."""
    index_path = Path(index_path)
    removed = 0
    for path in sorted(index_path.parent.glob(f"{index_path.name}*{SUFFIX}")):
        if not is_sidecar_of(path.name, [index_path.name]):
            continue
        if ending_after and _header_range(path)[1] <= ending_after:
            continue
        path.unlink(missing_ok=True)
        removed += 1
    return removed


@dataclass(frozen=True)
class RunHits:
    """One key's entries from a run, newest first: entry indexes, phyOffsets, time diffs (s)."""

    entries: np.ndarray
    phy_offsets: np.ndarray
    time_diffs: np.ndarray


class HashRun:
    """One validated, memory-mapped hot-slot run (see the module docstring). It never answers
    for entries outside [start_count, end_count)."""

    def __init__(self, path: Path, mm, fields: tuple, identity: tuple[int, ...]) -> None:
        (_magic, self.version, self.hash_slot_num, self.index_num, self.start_count, self.end_count, self.min_chain,
         slot_rows, entry_rows, self.block_rows, self.fingerprint, _dir_crc, _blocks_crc, _crc) = fields
        self.path = path
        self._mm = mm
        offset = HEADER_SIZE
        directory_dtype = DIRECTORY_DTYPES[self.version]
        directory = np.frombuffer(mm, directory_dtype, slot_rows, offset)
        self.slots = directory["slot"]
        self.tops = directory["top"]
        self.exits = directory["exit"]
        self.left_out = directory["left_out"] if "left_out" in directory_dtype.names else np.full(slot_rows, NO_LEFT_OUT,
                                                                                                  np.int32)
        offset += slot_rows * directory_dtype.itemsize
        columns = {}
        for name, dtype in COLUMNS:
            columns[name] = np.frombuffer(mm, dtype, entry_rows, offset)
            offset += entry_rows * dtype.itemsize
        self.phy_offsets = columns["phy_offset"]
        self.key_hashes = columns["key_hash"]
        self.entries = columns["entry"]
        self.time_diffs = columns["time_diff"]
        self._block_crcs = np.frombuffer(mm, BLOCK_CRC_DTYPE, _block_count(entry_rows, self.block_rows), offset)
        self._verified = _verified_blocks(identity)
        self.corrupt = False

    @property
    def entry_rows(self) -> int:
        return int(self.key_hashes.size)

    @classmethod
    def load(cls, path: Path, index_file: IndexFile, start: int) -> HashRun | None:
        """The run at `path` if `index_file` may use it and its range starts at `start`, else
        None: a missing, torn, corrupt or stale run is ignored (logged at debug level)."""
        try:
            stat = os.stat(path)
            mm = map_file(path)
        except (OSError, CorruptFileError):
            return None
        try:
            problem, fields = _check_header(mm, stat.st_size, index_file, start)
        except BaseException:
            mm.close()
            raise
        if problem is not None:
            mm.close()
            log.debug("ignoring hash run %s: %s", path, problem)
            return None
        return cls(path, mm, fields, (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns))

    def close(self) -> None:
        if self._mm is None:
            return
        mm, self._mm = self._mm, None
        del self.slots, self.tops, self.exits, self.left_out, self.phy_offsets, self.key_hashes, self.entries, self.time_diffs
        del self._block_crcs
        try:
            mm.close()
        except BufferError:
            pass  # a caller still holds a view of the run's columns; released with it

    def hits(self, key_hash: int, limit_index_count: int) -> RunHits | None:
        """The run's entries with `key_hash` below `limit_index_count`, newest first; None when a
        block the answer rests on fails its checksum (the run is then marked corrupt and left
        alone), or was found to earlier.

        The binary search reads unchecked rows, and a damaged one can send it astray; what it
        finds is trusted only when the rows it returns and the two around them are intact and
        bracket it: the row before below `key_hash`, the row after above. Those two were
        neighbours when the run was written sorted, so no row of `key_hash` lay anywhere else (an
        empty answer rests on them alone)."""
        if self.corrupt:
            return None
        if not INT32_MIN <= key_hash <= INT32_MAX:
            return RunHits(self.entries[:0], self.phy_offsets[:0], self.time_diffs[:0])
        # the needle has the column's dtype: else numpy converts the whole column first
        needle = np.int32(key_hash)
        lo = int(self.key_hashes.searchsorted(needle, side="left"))
        hi = int(self.key_hashes.searchsorted(needle, side="right"))
        if not self._verify_rows(max(lo - 1, 0), min(hi + 1, self.entry_rows)):
            return None
        if (lo > 0 and self.key_hashes[lo - 1] >= needle) or (hi < self.entry_rows and self.key_hashes[hi] <= needle) \
                or (hi > lo and (self.key_hashes[lo] != needle or self.key_hashes[hi - 1] != needle)):
            log.warning("%s: hash run rows are out of order around keyHash %d; the run is ignored", self.path, key_hash)
            self.corrupt = True
            return None
        if hi > lo and limit_index_count <= INT32_MAX:
            # entries ascend within one hash: those below the limit are a prefix of the slice
            hi = lo + int(self.entries[lo:hi].searchsorted(np.int32(max(limit_index_count, 0)), side="left"))
        if hi <= lo:
            return RunHits(self.entries[:0], self.phy_offsets[:0], self.time_diffs[:0])
        return RunHits(self.entries[lo:hi][::-1], self.phy_offsets[lo:hi][::-1], self.time_diffs[lo:hi][::-1])

    def _verify_rows(self, lo: int, hi: int) -> bool:
        if self.corrupt:
            return False
        for block in range(lo // self.block_rows, (hi - 1) // self.block_rows + 1):
            if block in self._verified:
                continue
            start = block * self.block_rows
            end = min(start + self.block_rows, self.entry_rows)
            crc = 0
            for column in (self.phy_offsets, self.key_hashes, self.entries, self.time_diffs):
                crc = zlib.crc32(column[start:end], crc)
            if crc != int(self._block_crcs[block]):
                log.warning("%s: hash run block %d fails its checksum; the run is ignored", self.path, block)
                self.corrupt = True
                return False
            self._verified.add(block)
        return True


class RunSet:
    """The usable runs of one index file, found by following the chain of ranges from entry 1;
    ``covered_count`` is where that chain ends (1: no run)."""

    def __init__(self, runs: list[HashRun]) -> None:
        self.runs = runs
        self.covered_count = runs[-1].end_count if runs else _FIRST_INDEX
        # slot -> {top: Jump}: a walk at a top of its slot jumps over that run's range (but a walk
        # of the hash the run leaves out there)
        self._jumps: dict[int, dict[int, Jump]] = {}
        for run in runs:
            for slot, top, exit_, left_out in zip(run.slots.tolist(), run.tops.tolist(), run.exits.tolist(),
                                                  run.left_out.tolist()):
                self._jumps.setdefault(slot, {})[top] = Jump(run, exit_, left_out)

    @classmethod
    def load(cls, index_file: IndexFile) -> RunSet:
        runs: list[HashRun] = []
        start = _FIRST_INDEX
        while True:
            run = HashRun.load(run_path(index_file.path, start), index_file, start)
            if run is None:
                break
            if run.end_count <= start:  # an empty range: nothing in it, nothing after it
                run.close()
                break
            runs.append(run)
            start = run.end_count
        return cls(runs)

    def jumps(self, slot: int) -> dict[int, Jump]:
        """{top: Jump} of the runs holding `slot` (empty when none does)."""
        return self._jumps.get(slot, _NO_JUMPS)

    def jumping(self, hashes: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Whether a run may answer part of the walk of each of `hashes` (in `slots`): a run holds
        the slot and does not leave that hash out there. The other walks never jump."""
        if len(hashes) <= _FEW_WALKS:  # a lookup's few keys: dict probes cost less than numpy calls per run
            return np.array([any(jump.left_out != key_hash and not jump.run.corrupt
                                 for jump in self._jumps.get(slot, _NO_JUMPS).values())
                             for key_hash, slot in zip(np.asarray(hashes).tolist(), np.asarray(slots).tolist())], dtype=bool)
        slots32 = np.asarray(slots, dtype=np.int64).astype(np.int32)  # slots are < hash_slot_num
        out = np.zeros(slots32.size, dtype=bool)
        for run in self.runs:
            if run.slots.size and not run.corrupt:
                at = np.minimum(run.slots.searchsorted(slots32), run.slots.size - 1)
                out |= (run.slots[at] == slots32) & (run.left_out[at] != hashes)
        return out

    def tops(self, slots: np.ndarray) -> np.ndarray:
        """(runs, len(slots)) int64: each run's top of each slot, 0 where the run has none."""
        slots32 = np.asarray(slots, dtype=np.int64).astype(np.int32)  # slots are < hash_slot_num
        out = np.zeros((len(self.runs), slots32.size), dtype=np.int64)
        for row, run in zip(out, self.runs):
            if run.slots.size and not run.corrupt:
                # searched as int32 so numpy does not convert the directory
                at = np.minimum(run.slots.searchsorted(slots32), run.slots.size - 1)
                row[:] = np.where(run.slots[at] == slots32, run.tops[at], 0)
        return out

    def close(self) -> None:
        for run in self.runs:
            run.close()
        self.runs = []
        self._jumps = {}


class Jump(NamedTuple):
    """Where a walk at a run's top of its slot goes: the run's hits, then on at `exit` (0: the
    walk ends), unless it walks the hash the run leaves out there (`left_out`)."""

    run: HashRun
    exit: int
    left_out: int


_NO_JUMPS: dict[int, Jump] = {}


# --- building ---------------------------------------------------------------------------------------
def build(index_file: IndexFile, start: int, end: int, *, min_chain: int = DEFAULT_MIN_CHAIN,
          block_rows: int = DEFAULT_BLOCK_ROWS, version: int = VERSION) -> bytes | None:
    """The bytes of `index_file`'s run over entries [start, end), or None when those entries
    cannot have one (a negative key hash: not a file RocketMQ or msgindex wrote). `version` 1
    lists every entry of a hot slot (for checking a version-1 run)."""
    if version not in READ_VERSIONS:
        raise InvalidArgumentError(f"hash run version {version}: this msgindex writes {READ_VERSIONS}")
    n_slots = index_file.hash_slot_num
    if not _FIRST_INDEX <= start <= end <= min(index_file.index_count, index_file.index_num):
        raise InvalidArgumentError(f"{index_file.path}: cannot cover entries [{start}, {end}) of {index_file.index_count}")
    rows = index_file.entry_array()[start:end]
    stored = rows["key_hash"].astype(np.int32)
    if stored.size and int(stored.min()) < 0:
        return None
    slot_of = stored - stored // np.int32(n_slots) * np.int32(n_slots)  # % by libdivide (see index_file)
    if stored.size * 4 >= n_slots:
        counts = np.bincount(slot_of, minlength=n_slots)
        member = np.flatnonzero((counts >= min_chain)[slot_of])  # positions in `rows`
    else:  # a short range: counting by sort beats clearing a counter per slot
        unique, inverse, counts = np.unique(slot_of, return_inverse=True, return_counts=True)
        member = np.flatnonzero(counts[inverse] >= min_chain)
    member = member.astype(np.int64)
    # slot-major order, entries ascending within a slot (np.sort of slot << 32 | position)
    by_slot = np.sort((slot_of[member].astype(np.int64) << 32) | member)
    position = by_slot & 0xFFFFFFFF
    slot = by_slot >> 32
    entry = position + start
    prev = rows["prev_index"][position].astype(np.int64)
    first = run_starts(slot)
    last = np.append(first[1:], True)
    # a clean chain in the range: each entry's prev is the slot's entry before it; the oldest one's
    # prev leaves the range (< start, possibly 0) or ends the walk (>= itself)
    linked = np.empty(slot.size, dtype=bool)
    linked[1:] = prev[1:] == entry[:-1]
    linked[first] = (prev[first] < start) | (prev[first] >= entry[first])
    group = np.cumsum(first) - 1
    group_starts = np.flatnonzero(first)
    clean = np.logical_and.reduceat(linked, group_starts) if slot.size else np.zeros(0, bool)
    keep = clean[group] if slot.size else np.zeros(0, bool)
    directory = np.empty(int(np.count_nonzero(clean)), dtype=DIRECTORY_DTYPES[version])
    directory["slot"] = slot[last & keep]
    directory["top"] = entry[last & keep]
    oldest_prev = prev[first & keep]
    oldest = entry[first & keep]
    directory["exit"] = np.where(oldest_prev >= oldest, 0, np.maximum(oldest_prev, 0))  # 0: the walk ends
    kept_position = position[keep]
    if version >= 2:
        directory["left_out"] = left_out = _dominant_hashes(slot[keep], stored[kept_position])
        # the left-out hash's entries are not listed: its walk never jumps (Jump)
        slot_rows = np.diff(np.append(np.flatnonzero(first[keep]), kept_position.size))
        listed = stored[kept_position] != np.repeat(left_out, slot_rows)
        kept_position = kept_position[listed]
    order = np.sort((stored[kept_position].astype(np.int64) << 32) | (kept_position + start))
    sorted_entry = (order & 0xFFFFFFFF).astype(np.int64)
    sorted_rows = rows[sorted_entry - start]
    columns = {
        "phy_offset": sorted_rows["phy_offset"].astype("<i8"),
        "key_hash": (order >> 32).astype("<i4"),
        "entry": sorted_entry.astype("<i4"),
        "time_diff": sorted_rows["time_diff"].astype("<i4"),
    }
    return _encode(index_file, start, end, min_chain, block_rows, directory, columns, version)


def _dominant_hashes(slots: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Per distinct slot of `slots` (ascending, runs of equal values) the hash of `hashes` that
    holds at least half of that slot's rows, the larger count winning and the smaller hash on a
    tie; NO_LEFT_OUT where none does."""
    pair = (slots.astype(np.int64) << 32) | hashes.astype(np.int64)  # hashes >= 0 (build)
    pairs, counts = np.unique(pair, return_counts=True)
    if not pairs.size:
        return np.zeros(0, dtype=np.int32)
    pair_slot = pairs >> 32
    slot_start = np.flatnonzero(run_starts(pair_slot))
    slot_rows = np.add.reduceat(counts, slot_start)
    best = np.maximum.reduceat(counts, slot_start)
    # the first pair of each slot reaching its best count: the smallest such hash
    group = np.repeat(np.arange(slot_start.size), np.diff(np.append(slot_start, pairs.size)))
    is_best = counts == best[group]
    first_best = np.full(slot_start.size, pairs.size, dtype=np.int64)
    np.minimum.at(first_best, group[is_best], np.flatnonzero(is_best))
    dominant = (pairs[first_best] & 0xFFFFFFFF).astype(np.int32)
    return np.where(2 * best >= slot_rows, dominant, np.int32(NO_LEFT_OUT)).astype(np.int32)


def write(index_file: IndexFile, start: int, end: int, *, min_chain: int = DEFAULT_MIN_CHAIN,
          block_rows: int = DEFAULT_BLOCK_ROWS) -> bool:
    """Build and durably write the run of `index_file` over entries [start, end) (which the
    caller guarantees are committed: module docstring). True when a run was written; a range that
    cannot have one loses any old run starting there."""
    data = build(index_file, start, end, min_chain=min_chain, block_rows=block_rows)
    path = run_path(index_file.path, start)
    if data is None:
        path.unlink(missing_ok=True)
        return False
    write_atomically(path, data)
    return True


def chain_ranges(index_path: str | os.PathLike) -> list[tuple[int, int]]:
    """The [start, end) ranges of the run chain of `index_path` as their headers claim (header
    checksums only): for deciding what to seal. Lookups validate every run in full."""
    ranges: list[tuple[int, int]] = []
    start = _FIRST_INDEX
    while True:
        found = _header_range(run_path(index_path, start))
        if found[0] != start or found[1] <= start:
            return ranges
        ranges.append(found)
        start = found[1]


def covered_count_of(index_path: str | os.PathLike) -> int:
    """Where the run chain of `index_path` ends, as its headers claim (1 when there is none)."""
    ranges = chain_ranges(index_path)
    return ranges[-1][1] if ranges else _FIRST_INDEX


def seal_committed(index_files: Iterable[IndexFile], committed_counts: Mapping[str, int]) -> int:
    """Extend the runs of a shard's `index_files` up to the entry counts its last checkpoint
    committed (``committed_counts``: file name -> committed indexCount; files it does not name
    hold nothing committed and are left alone). A file gets its first run at MIN_SEAL_ENTRIES
    committed entries, then a run over each further TAIL_ENTRIES committed ones (a shorter
    uncovered tail is walked or scanned at lookup time); past MAX_RUNS runs they are merged into
    one. Runs never cover uncommitted entries, so a crash at
    any point leaves only runs that are right. Returns the number of runs written."""
    written = 0
    for index_file in index_files:
        committed = committed_counts.get(Path(index_file.path).name)
        if committed is None or committed - _FIRST_INDEX < MIN_SEAL_ENTRIES:
            continue
        ranges = chain_ranges(index_file.path)
        covered = ranges[-1][1] if ranges else _FIRST_INDEX
        if ranges and committed - covered < TAIL_ENTRIES:
            continue
        try:
            if len(ranges) >= MAX_RUNS:  # merge: one run over everything, then drop the others
                written += write(index_file, _FIRST_INDEX, committed)
                for start, _ in ranges[1:]:
                    run_path(index_file.path, start).unlink(missing_ok=True)
            else:
                written += write(index_file, covered, committed)
        except OSError as error:  # e.g. a full disk: runs are never needed, the shard's commit is
            log.warning("%s: hash run not written (%s); lookups walk or scan instead", index_file.path, error)
        index_file.forget_hash_runs()
    return written


# --- internals ---------------------------------------------------------------------------------------
def _block_count(rows: int, block_rows: int) -> int:
    return -(-rows // block_rows)


def fingerprint(index_file: IndexFile, start: int, end: int, samples: int = FINGERPRINT_SAMPLES) -> int:
    """CRC32 of what identifies entries [start, end) of `index_file`: its sizing, beginTimestamp
    and beginPhyOffset (fixed from the first put on) and `samples` entry rows spread over the
    range, its last one included. A run written for other bytes (a file re-created under the
    same name, rolled back below the run) fails it."""
    header = index_file.header
    crc = zlib.crc32(struct.pack("<qqiiii", header.begin_timestamp, header.begin_phy_offset,
                                 index_file.hash_slot_num, index_file.index_num, start, end))
    if end > start:
        rows = np.unique(np.linspace(start, end - 1, samples).astype(np.int64))
        crc = zlib.crc32(np.ascontiguousarray(index_file.entry_array()[rows]).tobytes(), crc)
    return crc


def _encode(index_file: IndexFile, start: int, end: int, min_chain: int, block_rows: int,
            directory: np.ndarray, columns: dict[str, np.ndarray], version: int) -> bytes:
    entry_rows = columns["key_hash"].size
    block_crcs = np.empty(_block_count(entry_rows, block_rows), dtype=BLOCK_CRC_DTYPE)
    for block in range(block_crcs.size):
        lo, hi = block * block_rows, min((block + 1) * block_rows, entry_rows)
        crc = 0
        for name, _ in COLUMNS:
            crc = zlib.crc32(columns[name][lo:hi], crc)
        block_crcs[block] = crc
    directory_bytes = directory.tobytes()
    block_crc_bytes = block_crcs.tobytes()
    fields = [MAGIC, version, index_file.hash_slot_num, index_file.index_num, start, end, min_chain,
              directory.size, entry_rows, block_rows, fingerprint(index_file, start, end),
              zlib.crc32(directory_bytes), zlib.crc32(block_crc_bytes), 0]
    fields[-1] = zlib.crc32(HEADER_STRUCT.pack(*fields)[:HEADER_CRC_OFFSET])
    parts = [HEADER_STRUCT.pack(*fields), directory_bytes]
    parts += [columns[name].tobytes() for name, _ in COLUMNS]
    parts.append(block_crc_bytes)
    return b"".join(parts)


def _header_fields(head: bytes) -> tuple | None:
    """The header fields if `head` is an intact run header of a version this msgindex reads,
    else None."""
    if len(head) < HEADER_SIZE or head[:8] != MAGIC:
        return None
    fields = HEADER_STRUCT.unpack(head[:HEADER_SIZE])
    if fields[1] not in READ_VERSIONS or zlib.crc32(head[:HEADER_CRC_OFFSET]) != fields[13]:
        return None
    return fields


def _header_range(path: Path) -> tuple[int, int]:
    """(start, end) of the run at `path` as its header claims; (0, 0) when unreadable."""
    try:
        with open(path, "rb") as f:
            fields = _header_fields(f.read(HEADER_SIZE))
    except OSError:
        return 0, 0
    return (fields[4], fields[5]) if fields is not None else (0, 0)


def _check_header(mm, size: int, index_file: IndexFile, start: int) -> tuple[str | None, tuple]:
    """(None, header fields) when the run may be used with `index_file`, else (why not, ())."""
    fields = _header_fields(mm[:HEADER_SIZE]) if size >= HEADER_SIZE else None
    if fields is None:
        return f"not an intact hash run header of version {' or '.join(map(str, READ_VERSIONS))}", ()
    (_magic, version, slots, num, first, end, _min_chain, slot_rows, entry_rows, block_rows, print_, dir_crc,
     blocks_crc, _header_crc) = fields
    if (slots, num) != (index_file.hash_slot_num, index_file.index_num):
        return f"made for {slots} slots / {num} entries, the index file has other sizing", ()
    if first != start or not first <= end <= num:
        return f"covers [{first}, {end}), expected a range starting at {start}", ()
    if slot_rows < 0 or entry_rows < 0 or block_rows < 1:
        return "impossible row counts", ()
    block_table = BLOCK_CRC_DTYPE.itemsize * _block_count(entry_rows, block_rows)
    directory_bytes = slot_rows * DIRECTORY_DTYPES[version].itemsize
    expected = HEADER_SIZE + directory_bytes + sum(d.itemsize for _, d in COLUMNS) * entry_rows + block_table
    if size != expected:
        return f"{size} bytes where its header implies {expected} (torn or corrupt)", ()
    if end > index_file.index_count:
        return f"covers up to {end}, the index file holds {index_file.index_count} (stale)", ()
    if print_ != fingerprint(index_file, first, end):
        return "fingerprint differs from the index file's entries (stale)", ()
    if zlib.crc32(mm[HEADER_SIZE : HEADER_SIZE + directory_bytes]) != dir_crc:
        return "directory checksum mismatch", ()
    if zlib.crc32(mm[size - block_table :]) != blocks_crc:
        return "block checksum table mismatch", ()
    return None, fields


_verified_by_run: OrderedDict[tuple[int, ...], set[int]] = OrderedDict()


def _verified_blocks(identity: tuple[int, ...]) -> set[int]:
    """The process-wide set of verified blocks of the run file with this (dev, ino, size, mtime)."""
    blocks = _verified_by_run.pop(identity, None)
    if blocks is None:
        blocks = set()
    _verified_by_run[identity] = blocks
    while len(_verified_by_run) > _VERIFIED_RUNS:
        _verified_by_run.popitem(last=False)
    return blocks
