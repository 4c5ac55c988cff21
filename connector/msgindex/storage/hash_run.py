"""Hot-slot runs: a derived sidecar that answers long hash chains of an index file without walking them.

A RocketMQ index file answers a key by walking its slot's chain one entry at a time, newest
first. A hot key (10^5-10^6 entries) makes that chain, and the chain of every key sharing its
slot, that long. A *hot-slot run* lists, for one index file, every entry of every slot whose
chain holds at least ``min_chain`` entries among the file's first ``covered_count`` entries,
sorted by (keyHash, entry): a key's entries there are one contiguous slice, found by binary
search, with their phyOffsets and time diffs beside them.

The run is derived and never required: it lives beside the index file as ``<name>.hashrun``,
carries the entry count it covers, and a lookup uses it only when it is intact (checksums), fits
the index file (sizing, a fingerprint of the covered entries, the file still holds them) and the
walk reaches the slot's newest covered entry exactly where the run says. Anything else, and the
lookup walks or scans the index file itself. Since the hash files stay byte-identical to
RocketMQ's, deleting every run changes no answer, only its speed.

A run only ever covers entries that are already committed: a shard seals (writes the run of) a
file up to the count its last checkpoint committed (``seal_committed``), and committed entries of
a listed file never change. The run is only built from slots whose chains are clean (each entry's
prevIndex is the entry before it in the slot, the oldest ends the chain), so that answering from
the run gives exactly what walking the same chain gives.

Layout (little-endian: msgindex's own format, read by numpy without byte swapping)::

    header     64 B    see HEADER_STRUCT (magic, version, sizing, covered count, row counts,
                       fingerprint of the covered entries, checksums)
    directory  L x 8   hot slot i32, newest covered entry of that slot i32; sorted by slot
    phy_offset M x 8   i64  \\
    key_hash   M x 4   i32   | the M entries of the hot slots, sorted by (key_hash, entry)
    entry      M x 4   i32   |
    time_diff  M x 4   i32  /
    block_crc  B x 4   u32  zlib.crc32 of rows [b*block_rows, (b+1)*block_rows) of the four
                            columns, in column order (B = ceil(M / block_rows))

Blocks are verified when a lookup first touches them; a verified sidecar (same device, inode,
size and mtime: runs are only ever replaced by a rename, never rewritten in place) is remembered
per process, so readers reopened after each commit do not verify it again.
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
from typing import TYPE_CHECKING

import numpy as np

from msgindex.errors import CorruptFileError
from msgindex.storage.durable import write_atomically
from msgindex.storage.mapped_file import map_file

if TYPE_CHECKING:
    from msgindex.storage.index_file import IndexFile

log = logging.getLogger(__name__)

SUFFIX = ".hashrun"
MAGIC = b"MIHSHRUN"
VERSION = 1
HEADER_SIZE = 64
# magic, version, hash_slot_num, index_num, covered_count, min_chain, slot_rows (L),
# entry_rows (M), block_rows, fingerprint, directory_crc, block_crc_crc | header_crc | 8 spare bytes
_HEADER_FIELDS_BEFORE_CRC = "<8sIiiiiiiiIII"
HEADER_STRUCT = struct.Struct(_HEADER_FIELDS_BEFORE_CRC + "I8x")
HEADER_CRC_OFFSET = struct.calcsize(_HEADER_FIELDS_BEFORE_CRC)  # header_crc covers every byte before it
DIRECTORY_DTYPE = np.dtype([("slot", "<i4"), ("top", "<i4")])
DIRECTORY_ROW = 8
COLUMNS = (("phy_offset", np.dtype("<i8")), ("key_hash", np.dtype("<i4")), ("entry", np.dtype("<i4")),
           ("time_diff", np.dtype("<i4")))
BLOCK_CRC_DTYPE = np.dtype("<u4")
DEFAULT_MIN_CHAIN = 64  # a chain shorter than this is walked (< ~30 us): not worth a run row
DEFAULT_BLOCK_ROWS = 1 << 16
RESEAL_FRACTION = 8  # a run is rewritten once 1/8 of the committed entries are not covered
# Smaller files get no run: a verified scan of all their entries takes well under a millisecond.
MIN_SEAL_ENTRIES = 1 << 16
FINGERPRINT_SAMPLES = 64  # entry rows of the covered range hashed into the fingerprint
_VERIFIED_SIDECARS = 256  # sidecars whose verified blocks a process remembers
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1

assert HEADER_STRUCT.size == HEADER_SIZE and DIRECTORY_DTYPE.itemsize == DIRECTORY_ROW
assert COLUMNS[0][1].itemsize == 8  # the i64 column first keeps every column aligned


def sidecar_path(index_path: str | os.PathLike) -> Path:
    """Where the run of the index file at `index_path` lives (beside it)."""
    index_path = Path(index_path)
    return index_path.with_name(index_path.name + SUFFIX)


def is_sidecar_of(name: str, index_names: Iterable[str]) -> bool:
    """True when `name` is the run sidecar of one of `index_names` (file names, not paths)."""
    return name.endswith(SUFFIX) and name[: -len(SUFFIX)] in set(index_names)


@dataclass(frozen=True)
class RunHits:
    """One key's entries from a run, newest first: entry indexes, phyOffsets, time diffs (s)."""

    entries: np.ndarray
    phy_offsets: np.ndarray
    time_diffs: np.ndarray


class HashRun:
    """A validated, memory-mapped hot-slot run of one index file (see the module docstring).
    Obtain one with ``HashRun.load``; it never answers for entries at or past ``covered_count``."""

    def __init__(self, path: Path, mm, fields: tuple, identity: tuple[int, ...]) -> None:
        (_magic, _version, self.hash_slot_num, self.index_num, self.covered_count, self.min_chain,
         slot_rows, entry_rows, self.block_rows, self.fingerprint, _dir_crc, _blocks_crc, _crc) = fields
        self.path = path
        self._mm = mm
        offset = HEADER_SIZE
        directory = np.frombuffer(mm, DIRECTORY_DTYPE, slot_rows, offset)
        self.slots = directory["slot"]
        self.tops = directory["top"]
        offset += slot_rows * DIRECTORY_ROW
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
        self._corrupt = False

    @property
    def entry_rows(self) -> int:
        return int(self.key_hashes.size)

    # --- opening ----------------------------------------------------------------------------------
    @classmethod
    def load(cls, index_file: IndexFile) -> HashRun | None:
        """The run beside `index_file` if there is one it may use, else None. A missing, torn,
        corrupt or stale run is ignored (logged at debug level), never an error: it is derived."""
        path = sidecar_path(index_file.path)
        try:
            stat = os.stat(path)
        except OSError:
            return None
        try:
            mm = map_file(path)
        except CorruptFileError as bad:
            log.debug("ignoring hash run: %s", bad)
            return None
        try:
            problem, fields = _check_header(mm, stat.st_size, index_file)
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
        del self.slots, self.tops, self.phy_offsets, self.key_hashes, self.entries, self.time_diffs
        del self._block_crcs
        try:
            mm.close()
        except BufferError:
            pass  # a caller still holds a view of the run's columns; released with it

    # --- lookups ----------------------------------------------------------------------------------
    def slot_tops(self, slots: np.ndarray) -> np.ndarray:
        """For each slot, the newest entry the run holds of it, or 0 when the run has no rows of
        that slot (its covered chain is short, or was not clean)."""
        slots = np.asarray(slots, dtype=np.int64)
        if self.slots.size == 0 or self._corrupt:
            return np.zeros(slots.size, dtype=np.int64)
        # slots are < hash_slot_num, an int32: searched as int32 so numpy does not convert the directory
        at = np.minimum(self.slots.searchsorted(slots.astype(np.int32)), self.slots.size - 1)
        return np.where(self.slots[at] == slots, self.tops[at], 0).astype(np.int64)

    def slot_top(self, slot: int) -> int:
        """``slot_tops`` of one slot."""
        if self.slots.size == 0 or self._corrupt:
            return 0
        at = int(self.slots.searchsorted(np.int32(slot)))
        return int(self.tops[at]) if at < self.slots.size and self.slots[at] == slot else 0

    def hits(self, key_hash: int, limit_index_count: int) -> RunHits | None:
        """The run's entries with `key_hash` below `limit_index_count`, newest first; None when a
        block they lie in fails its checksum (the whole run is then ignored from here on)."""
        if not _INT32_MIN <= key_hash <= _INT32_MAX:
            return RunHits(self.entries[:0], self.phy_offsets[:0], self.time_diffs[:0])
        # the needle has the column's dtype: else numpy converts the whole column first
        needle = np.int32(key_hash)
        lo = int(self.key_hashes.searchsorted(needle, side="left"))
        hi = int(self.key_hashes.searchsorted(needle, side="right"))
        if hi > lo and limit_index_count <= _INT32_MAX:
            # entries ascend within one hash: those below the limit are a prefix of the slice
            hi = lo + int(self.entries[lo:hi].searchsorted(np.int32(max(limit_index_count, 0)), side="left"))
        if hi <= lo:
            return RunHits(self.entries[:0], self.phy_offsets[:0], self.time_diffs[:0])
        if not self._verify_rows(lo, hi):
            return None
        return RunHits(self.entries[lo:hi][::-1], self.phy_offsets[lo:hi][::-1], self.time_diffs[lo:hi][::-1])

    def _verify_rows(self, lo: int, hi: int) -> bool:
        if self._corrupt:
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
                self._corrupt = True
                return False
            self._verified.add(block)
        return True


# --- building ---------------------------------------------------------------------------------------
def build(index_file: IndexFile, covered_count: int, *, min_chain: int = DEFAULT_MIN_CHAIN,
          block_rows: int = DEFAULT_BLOCK_ROWS) -> bytes | None:
    """The sidecar bytes of `index_file`'s run over entries [1, covered_count), or None when the
    entries cannot have one (a negative key hash: not a file RocketMQ or msgindex wrote)."""
    from msgindex.storage.index_file import FIRST_INDEX, INVALID_INDEX

    n_slots = index_file.hash_slot_num
    if not FIRST_INDEX <= covered_count <= min(index_file.index_count, index_file.index_num):
        raise ValueError(f"{index_file.path}: cannot cover {covered_count} entries of {index_file.index_count}")
    rows = index_file.entry_array()[FIRST_INDEX:covered_count]
    stored = rows["key_hash"].astype(np.int32)
    if stored.size and int(stored.min()) < 0:
        return None
    slot_of = stored % np.int32(n_slots)
    counts = np.bincount(slot_of, minlength=n_slots) if stored.size else np.zeros(n_slots, np.int64)
    member = np.flatnonzero((counts >= min_chain)[slot_of]).astype(np.int64)  # positions in `rows`
    # slot-major order, entries ascending within a slot (np.sort of slot << 32 | position)
    by_slot = np.sort((slot_of[member].astype(np.int64) << 32) | member)
    position = by_slot & 0xFFFFFFFF
    slot = by_slot >> 32
    entry = position + FIRST_INDEX
    prev = rows["prev_index"][position].astype(np.int64)
    starts_group = np.ones(slot.size, dtype=bool)
    starts_group[1:] = slot[1:] != slot[:-1]
    # a clean chain: every entry's prev is the entry before it in the slot, and the oldest one's
    # prev ends a walk (<= 0, or not smaller than itself)
    linked = np.empty(slot.size, dtype=bool)
    linked[1:] = prev[1:] == entry[:-1]
    linked[starts_group] = (prev[starts_group] <= INVALID_INDEX) | (prev[starts_group] >= entry[starts_group])
    group = np.cumsum(starts_group) - 1
    clean_group = np.logical_and.reduceat(linked, np.flatnonzero(starts_group)) if slot.size else np.zeros(0, bool)
    keep = clean_group[group] if slot.size else np.zeros(0, bool)
    ends_group = np.append(starts_group[1:], True) & keep
    directory = np.empty(int(np.count_nonzero(ends_group)), dtype=DIRECTORY_DTYPE)
    directory["slot"] = slot[ends_group]
    directory["top"] = entry[ends_group]
    kept_position = position[keep]
    kept_hash = stored[kept_position].astype(np.int64)
    order = np.sort((kept_hash << 32) | (kept_position + FIRST_INDEX))
    sorted_entry = (order & 0xFFFFFFFF).astype(np.int32)
    sorted_rows = rows[sorted_entry - FIRST_INDEX]
    columns = {
        "phy_offset": sorted_rows["phy_offset"].astype("<i8"),
        "key_hash": (order >> 32).astype("<i4"),
        "entry": sorted_entry.astype("<i4"),
        "time_diff": sorted_rows["time_diff"].astype("<i4"),
    }
    return _encode(index_file, covered_count, min_chain, block_rows, directory, columns)


def write(index_file: IndexFile, covered_count: int, *, min_chain: int = DEFAULT_MIN_CHAIN,
          block_rows: int = DEFAULT_BLOCK_ROWS) -> bool:
    """Build and durably write the run of `index_file` over its first `covered_count` entries
    (which the caller guarantees are committed: see the module docstring). A file that cannot
    have a run loses any old one. True when a run was written."""
    data = build(index_file, covered_count, min_chain=min_chain, block_rows=block_rows)
    path = sidecar_path(index_file.path)
    if data is None:
        path.unlink(missing_ok=True)
        return False
    write_atomically(path, data)
    return True


def covered_count_of(index_path: str | os.PathLike) -> int:
    """The entry count the run beside `index_path` claims to cover (1 when there is no readable
    run). Only for deciding whether to seal again: lookups validate the whole run."""
    try:
        with open(sidecar_path(index_path), "rb") as f:
            head = f.read(HEADER_SIZE)
    except OSError:
        return 1
    if len(head) < HEADER_SIZE or head[:8] != MAGIC:
        return 1
    fields = HEADER_STRUCT.unpack(head)
    if fields[1] != VERSION or zlib.crc32(head[:HEADER_CRC_OFFSET]) != fields[12]:
        return 1
    return fields[4]


def seal_committed(index_files: Iterable[IndexFile], committed_counts: Mapping[str, int]) -> int:
    """Write the runs of a shard's `index_files` up to the entry counts its last checkpoint
    committed (``committed_counts``: file name -> committed indexCount; files it does not name
    hold nothing committed and are left alone). A file with at least MIN_SEAL_ENTRIES committed
    entries gets a new run when it has none or when the committed entries its run does not cover
    are at least 1/RESEAL_FRACTION of them (a short uncovered tail is walked or scanned at lookup
    time). Returns the number of runs written.
    Runs never cover uncommitted entries, so a crash at any point leaves only runs that are right."""
    written = 0
    for index_file in index_files:
        committed = committed_counts.get(Path(index_file.path).name)
        if committed is None or committed - 1 < MIN_SEAL_ENTRIES:
            continue
        covered = covered_count_of(index_file.path)
        if covered > 1 and (committed - covered) * RESEAL_FRACTION < committed:
            continue
        written += write(index_file, committed)
        index_file.forget_hash_run()
    return written


# --- internals ---------------------------------------------------------------------------------------
def _block_count(rows: int, block_rows: int) -> int:
    return -(-rows // block_rows)


def fingerprint(index_file: IndexFile, covered_count: int) -> int:
    """CRC32 of what identifies the covered entries of `index_file`: its beginTimestamp and
    beginPhyOffset (fixed from the first put on) and FINGERPRINT_SAMPLES entry rows spread over
    [1, covered_count), the last covered one included. A run written for other bytes (a file
    re-created under the same name, rolled back below the run) fails it."""
    from msgindex.storage.index_file import FIRST_INDEX

    header = index_file.header
    crc = zlib.crc32(struct.pack("<qqii", header.begin_timestamp, header.begin_phy_offset,
                                 index_file.hash_slot_num, index_file.index_num))
    if covered_count > FIRST_INDEX:
        samples = np.unique(np.linspace(FIRST_INDEX, covered_count - 1, FINGERPRINT_SAMPLES).astype(np.int64))
        crc = zlib.crc32(np.ascontiguousarray(index_file.entry_array()[samples]).tobytes(), crc)
    return crc


def _encode(index_file: IndexFile, covered_count: int, min_chain: int, block_rows: int,
            directory: np.ndarray, columns: dict[str, np.ndarray]) -> bytes:
    entry_rows = columns["key_hash"].size
    block_crcs = np.empty(_block_count(entry_rows, block_rows), dtype=BLOCK_CRC_DTYPE)
    for block in range(block_crcs.size):
        start, end = block * block_rows, min((block + 1) * block_rows, entry_rows)
        crc = 0
        for name, _ in COLUMNS:
            crc = zlib.crc32(columns[name][start:end], crc)
        block_crcs[block] = crc
    directory_bytes = directory.tobytes()
    block_crc_bytes = block_crcs.tobytes()
    fields = [MAGIC, VERSION, index_file.hash_slot_num, index_file.index_num, covered_count, min_chain,
              directory.size, entry_rows, block_rows, fingerprint(index_file, covered_count),
              zlib.crc32(directory_bytes), zlib.crc32(block_crc_bytes), 0]
    head = HEADER_STRUCT.pack(*fields)
    fields[-1] = zlib.crc32(head[:HEADER_CRC_OFFSET])
    parts = [HEADER_STRUCT.pack(*fields), directory_bytes]
    parts += [columns[name].tobytes() for name, _ in COLUMNS]
    parts.append(block_crc_bytes)
    return b"".join(parts)


def _check_header(mm, size: int, index_file: IndexFile) -> tuple[str | None, tuple]:
    """(None, header fields) when the run may be used with `index_file`, else (why not, ())."""
    if size < HEADER_SIZE:
        return f"{size} bytes, shorter than its header", ()
    head = mm[:HEADER_SIZE]
    fields = HEADER_STRUCT.unpack(head)
    (magic, version, slots, num, covered, _min_chain, slot_rows, entry_rows, block_rows, print_, dir_crc,
     blocks_crc, header_crc) = fields
    if magic != MAGIC or version != VERSION:
        return "not a version-1 hash run", ()
    if zlib.crc32(head[:HEADER_CRC_OFFSET]) != header_crc:
        return "header checksum mismatch", ()
    if (slots, num) != (index_file.hash_slot_num, index_file.index_num):
        return f"made for {slots} slots / {num} entries, the index file has other sizing", ()
    if slot_rows < 0 or entry_rows < 0 or block_rows < 1 or not 1 <= covered <= num:
        return "impossible row counts", ()
    expected = (HEADER_SIZE + slot_rows * DIRECTORY_ROW + sum(d.itemsize for _, d in COLUMNS) * entry_rows
                + BLOCK_CRC_DTYPE.itemsize * _block_count(entry_rows, block_rows))
    if size != expected:
        return f"{size} bytes where its header implies {expected} (torn or corrupt)", ()
    if covered > index_file.index_count:
        return f"covers {covered} entries, the index file holds {index_file.index_count} (stale)", ()
    if print_ != fingerprint(index_file, covered):
        return "fingerprint differs from the index file's entries (stale)", ()
    directory_end = HEADER_SIZE + slot_rows * DIRECTORY_ROW
    if zlib.crc32(mm[HEADER_SIZE:directory_end]) != dir_crc:
        return "directory checksum mismatch", ()
    if zlib.crc32(mm[size - BLOCK_CRC_DTYPE.itemsize * _block_count(entry_rows, block_rows) :]) != blocks_crc:
        return "block checksum table mismatch", ()
    return None, fields


_verified_by_sidecar: OrderedDict[tuple[int, ...], set[int]] = OrderedDict()


def _verified_blocks(identity: tuple[int, ...]) -> set[int]:
    """The process-wide set of verified blocks of the sidecar with this (dev, ino, size, mtime)."""
    blocks = _verified_by_sidecar.pop(identity, None)
    if blocks is None:
        blocks = set()
    _verified_by_sidecar[identity] = blocks
    while len(_verified_by_sidecar) > _VERIFIED_SIDECARS:
        _verified_by_sidecar.popitem(last=False)
    return blocks
