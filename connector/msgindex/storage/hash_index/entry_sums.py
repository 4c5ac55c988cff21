"""Entry checksums: a derived sidecar that lets lookups notice damage in a hash index file's entries.

A RocketMQ index file has no checksum, and its entries are what a lookup follows: a few bytes
overwritten in the middle of a file (a disk error, a bad restore) change a chain's prevIndex or
keyHash, and the walk then silently stops short or wanders into other slots -- rows go missing
with no error. The checkpoint pins the header and the slot count (``verify.check_index_file``), not
the 20 bytes of each of up to 20M entries. So each hash index file of a shard gets
``<name>.entrysums``: a CRC-32 per chunk of CHUNK_ENTRIES entries of its committed entries.

* **Written by the shard's writer after each commit** (after the checkpoint, like the hash runs),
  over the entries that commit added to each file it touched: the chunks those entries complete
  and the committed part of the last, partial chunk (its CRC is extended in place, CRC-32 being
  incremental). So a full file's sidecar covers every entry, and the active file's covers every
  committed entry. A writer vouches only for entries it put, or that it checked: a sidecar that
  lags behind the commit before (a writer died between its checkpoint and its sidecar, or the
  sidecar was lost) is extended over the gap only when the gap is at most MAX_GAP_ENTRIES and
  each of its entries points at a committed record that carries a key of its hash and the gap
  has the shape of hash chains; else it is left for ``msgindex repair``, which writes sidecars
  after checking every entry against the log.
* **Checked by readers the first time a lookup touches a chunk** (each entry a walk visits or a
  scan reads): a chunk whose CRC differs is a CorruptFileError naming the index file. A sidecar is
  bound to its file by the hash runs' fingerprint (sizing, the first put's time and offset,
  sampled entries): one that is missing, torn, damaged or another file's is ignored, never an
  error -- a healthy file is never made unreadable by its sidecar.
* **Without a usable sidecar** (or past what it covers: the commit that a writer died before
  extending it for), the chunk's committed entries are checked for the shape every chain has
  instead (``structure_problem``): keyHash >= 0, each prevIndex 0 or an older entry of the same
  slot, the entries of one slot in the chunk linked newest to oldest, phyOffsets never going back,
  timeDiffs >= 0. Random damage breaks these almost surely (a random keyHash falls into another
  slot with probability 1 - 1/hashSlotNum), so it is still an error and not a miss; an entry
  forged to keep its slot is not caught. Readers log a warning naming the sidecar once per file,
  ``msgindex inspect`` reports it, ``msgindex repair`` writes it again.

The index files themselves stay byte-identical to RocketMQ's: nothing here touches them.

Layout (little-endian, msgindex's own format)::

    header  40 B   magic "MIENTSUM", version u32, hash_slot_num i32, index_num i32,
                   chunk_entries i32 (a power of two: CHUNK_ENTRIES for a new sidecar, 512 for
                   those written before; a sidecar is extended in its own size),
                   covered_count i32 (entries [0, covered_count) are covered),
                   fingerprint u32 (``hash_run.fingerprint`` of entries [1, covered_count)),
                   table_crc u32, header_crc u32 (of every header byte before it)
    table   ceil(covered_count / chunk_entries) x u32: zlib.crc32 of the entry bytes
            [k * chunk_entries, min((k + 1) * chunk_entries, covered_count)) (entry 0, never
            written, is part of chunk 0)
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from msgindex.errors import CorruptFileError
from msgindex.storage.checksum import crc32, crc32_slices
from msgindex.storage.durable import write_atomically
from msgindex.storage.hash_index import hash_run
from msgindex.storage.hash_index.hash_run import IndexFile
from msgindex.storage.sorted_runs import distinct_sorted

log = logging.getLogger(__name__)

SUFFIX = ".entrysums"
MAGIC = b"MIENTSUM"
VERSION = 1
# 1.25 KiB of entries: ~0.4 us of CRC-32 the first time a lookup touches the chunk, from memory
# (512 entries, as sidecars were first written: ~2.7 us). A key's first lookup touches a chunk
# per entry it walks, a hundred for a key of a hundred records: ~0.27 ms of a 5M-record store's
# ~1.2 ms lookup at 512, ~0.04 at 64. The table is 4 B per 64 entries (0.3% of the entries).
CHUNK_SHIFT = 6
CHUNK_ENTRIES = 1 << CHUNK_SHIFT
# Walks report the entries they read in chunks of 1 << TOUCH_SHIFT (Touched): the smallest chunk
# a sidecar may have, so that one report serves sidecars of any size (OLDEST_CHUNK_SHIFT..).
TOUCH_SHIFT = CHUNK_SHIFT
OLDEST_CHUNK_SHIFT = 9
CHUNK_SHIFTS = range(TOUCH_SHIFT, OLDEST_CHUNK_SHIFT + 1)
_HEADER_BEFORE_CRC = "<8sIiiiiII"
HEADER_STRUCT = struct.Struct(_HEADER_BEFORE_CRC + "I")
HEADER_SIZE = 40
HEADER_CRC_OFFSET = struct.calcsize(_HEADER_BEFORE_CRC)
TABLE_DTYPE = np.dtype("<u4")
_FIRST_INDEX = 1  # index_file.FIRST_INDEX (index_file imports this module)
ENTRY_BYTES = 20  # index_file.ENTRY_SIZE
MAX_GAP_ENTRIES = 1 << 16  # a lagging sidecar a writer brings up to date (checking the gap's records)
# Entries sampled into the fingerprint that binds a sidecar to its file: enough to tell another
# file's sidecar, few enough that damage to the entries is found by the chunk CRCs (which name
# the chunk) rather than by the fingerprint (which only makes the sidecar unusable).
FINGERPRINT_SAMPLES = 4

assert HEADER_STRUCT.size == HEADER_SIZE and 1 << CHUNK_SHIFT == CHUNK_ENTRIES


def sums_path(index_path: str | os.PathLike) -> Path:
    """The sidecar of the index file at `index_path`."""
    index_path = Path(index_path)
    return index_path.with_name(index_path.name + SUFFIX)


def is_sums_of(name: str, index_names: Iterable[str]) -> bool:
    """True when `name` is the sidecar of one of `index_names` (file names, not paths)."""
    names = index_names if isinstance(index_names, (set, frozenset, dict)) else set(index_names)
    return name.endswith(SUFFIX) and name[: -len(SUFFIX)] in names


def chunk_shift_of(chunk_entries: int) -> int | None:
    """The shift of a sidecar's chunks of `chunk_entries` entries, None when this msgindex does
    not read chunks of that size (CHUNK_SHIFTS)."""
    return next((shift for shift in CHUNK_SHIFTS if 1 << shift == chunk_entries), None)


class EntrySums:
    """A validated sidecar: the CRC of each covered chunk of 1 << `shift` entries (see the module
    docstring)."""

    def __init__(self, path: Path, covered_count: int, crcs: np.ndarray, shift: int = CHUNK_SHIFT) -> None:
        self.path = path
        self.covered_count = covered_count
        self.crcs = crcs
        self.shift = shift

    @property
    def chunk_entries(self) -> int:
        return 1 << self.shift

    @classmethod
    def load(cls, index_file: IndexFile) -> tuple[EntrySums | None, str | None]:
        """(the sidecar, None) when `index_file` may use it, else (None, why not)."""
        path = sums_path(index_file.path)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None, "missing"
        except OSError as error:
            return None, f"unreadable ({error.strerror or error})"
        problem = _check(raw, index_file)
        if problem is not None:
            return None, problem
        chunk, covered = HEADER_STRUCT.unpack_from(raw, 0)[4:6]
        return cls(path, covered, np.frombuffer(raw, TABLE_DTYPE, offset=HEADER_SIZE).copy(),
                   chunk_shift_of(chunk)), None


def chunk_crcs(index_file: IndexFile, start: int, end: int, first_crc: int = 0,
               chunk_entries: int = CHUNK_ENTRIES) -> list[int]:
    """CRC-32s of the chunks of `chunk_entries` overlapping entries [start, end) (`start` a chunk
    boundary, or inside the chunk whose bytes before it `first_crc` already covers)."""
    raw = _entry_bytes(index_file)
    crcs = []
    crc = first_crc
    at = start
    while at < end:
        stop = min((at // chunk_entries + 1) * chunk_entries, end)
        crcs.append(zlib.crc32(raw[at * ENTRY_BYTES : stop * ENTRY_BYTES], crc))
        crc, at = 0, stop
    return crcs


def build(index_file: IndexFile, covered_count: int, crcs: np.ndarray | list[int],
          chunk_entries: int = CHUNK_ENTRIES) -> bytes:
    """The bytes of a sidecar covering entries [0, covered_count) with these CRCs of chunks of
    `chunk_entries`."""
    table = np.asarray(crcs, dtype=TABLE_DTYPE).tobytes()
    assert len(table) // 4 == -(-covered_count // chunk_entries)
    fields = [MAGIC, VERSION, index_file.hash_slot_num, index_file.index_num, chunk_entries, covered_count,
              hash_run.fingerprint(index_file, _FIRST_INDEX, covered_count, FINGERPRINT_SAMPLES), zlib.crc32(table)]
    head = struct.pack(_HEADER_BEFORE_CRC, *fields)
    return head + struct.pack("<I", zlib.crc32(head)) + table


def write_all(index_file: IndexFile, covered_count: int) -> None:
    """Write the sidecar of `index_file` over its entries [0, covered_count) from their bytes now
    (for files whose entries were just checked against the log, or just built from it)."""
    write_atomically(sums_path(index_file.path), build(index_file, covered_count, chunk_crcs(index_file, 0, covered_count)))


def extend(index_file: IndexFile, committed_count: int, check_gap: Callable[[int, int], None], *,
           put_from: int | None = None) -> bool:
    """Bring the sidecar of `index_file` up to its `committed_count` entries: after a commit (the
    entries from `put_from` on were put by the caller), or when a writer opens the shard (None:
    it put none). Entries the sidecar does not cover that the caller did not put are vouched for
    only after ``check_gap(first, end)`` (CorruptFileError otherwise) and the shape check pass, and
    only up to MAX_GAP_ENTRIES of them (module docstring). Returns whether a sidecar was written;
    a full disk leaves it as it was."""
    sums = None
    if committed_count > _FIRST_INDEX:
        sums, _why = EntrySums.load(index_file)
        if sums is not None and sums.covered_count > committed_count:
            sums = None  # (never: it only covers committed entries) start over
    covered = sums.covered_count if sums is not None else _FIRST_INDEX
    if covered >= committed_count or (sums is None and committed_count <= _FIRST_INDEX):
        return False
    unchecked_end = committed_count if put_from is None else min(max(put_from, _FIRST_INDEX), committed_count)
    if covered < unchecked_end:
        if unchecked_end - covered > MAX_GAP_ENTRIES:
            return False
        try:
            check_gap(covered, unchecked_end)
            problem = structure_problem(index_file, covered, unchecked_end)
        except CorruptFileError as error:
            problem = str(error)
        if problem is not None:
            log.warning("%s: entry checksums not extended over entries %d..%d (%s)", sums_path(index_file.path),
                        covered, unchecked_end - 1, problem)
            return False
    chunk_entries = CHUNK_ENTRIES if sums is None else sums.chunk_entries  # (a sidecar keeps its chunks)
    if sums is None:
        crcs: list[int] = []
        start, first_crc = 0, 0  # chunk 0 starts with the never-written entry 0
    else:
        crcs = sums.crcs.tolist()
        start, first_crc = covered, 0
        if covered % chunk_entries:
            first_crc = crcs.pop()  # the partial chunk's CRC goes on over the new entries
    crcs += chunk_crcs(index_file, start, committed_count, first_crc, chunk_entries)
    try:
        write_atomically(sums_path(index_file.path), build(index_file, committed_count, crcs, chunk_entries))
    except OSError as error:  # derived: the commit stands; readers check structure instead
        log.warning("%s: entry checksums not written (%s)", sums_path(index_file.path), error)
        return False
    return True


def remove(index_path: str | os.PathLike) -> None:
    sums_path(index_path).unlink(missing_ok=True)


class Touched:
    """The chunks of 1 << TOUCH_SHIFT entries a lookup read (``IndexFile`` walks add to it as
    they go)."""

    def __init__(self) -> None:
        self.chunks: list[int] = []  # one per entry a Python walk read
        self.arrays: list[np.ndarray] = []  # from numpy steps, scans and compiled walks

    def add_range(self, low: int, high: int) -> None:
        """Entries [low, high] were read."""
        self.arrays.append(np.arange(low >> TOUCH_SHIFT, (high >> TOUCH_SHIFT) + 1, dtype=np.int64))

    def distinct(self, shift: int) -> np.ndarray:
        """The chunks of 1 << `shift` entries touched, each once, ascending."""
        parts = self.arrays + ([np.asarray(self.chunks, dtype=np.int64)] if self.chunks else [])
        if not parts:
            return np.zeros(0, np.int64)
        touched = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return distinct_sorted(touched >> (shift - TOUCH_SHIFT) if shift != TOUCH_SHIFT else touched)


class EntryGuard:
    """What a reader of one index file has checked of its entries (module docstring): each chunk
    once, against the sidecar where it covers the chunk, else for structure. Whole chunks found
    intact are remembered per process for the file's identity (device, inode, size, mtime):
    readers reopened after each commit do not check a sealed file's chunks again."""

    def __init__(self, index_file: IndexFile) -> None:
        self.index_file = index_file
        self._sums: EntrySums | None = None
        self._loaded = False
        self._unusable: str | None = None  # why the sidecar cannot be used (None: it can, or is not needed)
        self._warned = False
        self._opened_as = _identity(index_file.path)  # the file this reader reads: its inode (see _sidecar)
        # chunks of 1 << _shift entries (the sidecar's, once it is read) -> all its entries checked
        self._shift = CHUNK_SHIFT
        self._whole: np.ndarray | None = None
        self._partial: dict[int, int] = {}  # chunk -> entries below this end are checked

    def check(self, touched: Touched, limit: int) -> None:
        """CorruptFileError naming the file unless the committed entries (below `limit`) of
        every chunk `touched` holds are intact."""
        if self._whole is None:
            # the chunks are the sidecar's, as its header states them (the sidecar itself is read
            # only when a chunk is not known intact yet: a reader of a file other readers of the
            # process checked reads 40 bytes, not the table)
            self._shift = chunk_shift_of(claimed_by(self.index_file.path)[1]) or CHUNK_SHIFT
            self._whole = _whole_chunks(self.index_file, self._shift)
        whole, shift = self._whole, self._shift
        if not touched.arrays or sum(map(len, touched.arrays)) <= _FEW_TOUCHED:
            # a one-key lookup's walks: a Python set finds the distinct chunks (np.unique's set-up costs more)
            distinct = set(touched.chunks)
            for array in touched.arrays:
                distinct.update(array.tolist())
            if shift != TOUCH_SHIFT:
                distinct = {chunk >> (shift - TOUCH_SHIFT) for chunk in distinct}
            pending = sorted(chunk for chunk in distinct if chunk < whole.size and not whole[chunk])
        else:
            chunks = touched.distinct(shift)
            chunks = chunks[chunks < whole.size]
            pending = chunks[~whole[chunks]].tolist()
        entries = None
        if pending:
            # the sidecar first, then the entries' view (once: ~4 us, a chunk's CRC ~0.4): a view
            # taken before a commit the sidecar already covers would hold too few entries for its CRCs
            self._sidecar()
            entries = _entry_bytes(self.index_file)
            pending = self._check_whole_covered(entries, pending, limit)
        chunk_entries = 1 << shift
        for chunk in pending:
            low = chunk << shift
            need = min(low + chunk_entries, limit)
            if need <= max(low, _FIRST_INDEX) or self._partial.get(chunk, 0) >= need:
                continue
            self._check_chunk(entries, chunk, low, need)

    def _check_whole_covered(self, entries: np.ndarray, pending: list[int], limit: int) -> list[int]:
        """Checks the `pending` chunks the sidecar covers whole (what ``_check_chunk`` would do
        for each: its CRC, then it is whole) at once, and returns the others. A key's first
        lookup touches a chunk per entry, a hundred for a key of a hundred records: their CRCs
        in one compiled call cost ~1 us a chunk, where a Python call per chunk cost ~2 more."""
        sums = self._sums
        if sums is None or len(pending) < 2 or limit <= _FIRST_INDEX:
            return pending
        shift = sums.shift
        # the chunks the sidecar and the entries' view both hold whole, which hold a committed entry
        # (below `limit`; a chunk with none is not checked at all: _check_chunk's skip) and were not
        # checked in part before (_check_chunk's to finish); chosen in Python ints: a hundred
        # chunks cost less so than numpy's calls did (~60 us of a key's first lookup)
        whole_below = min(sums.covered_count, len(entries) // ENTRY_BYTES) >> shift
        partial = self._partial
        at_once = [chunk for chunk in pending if chunk < whole_below and chunk << shift < limit and chunk not in partial]
        if not at_once:
            return pending
        checked = np.array(at_once, dtype=np.int64)
        lows = checked << shift
        crcs = crc32_slices(entries, lows * ENTRY_BYTES, np.full(len(checked), sums.chunk_entries * ENTRY_BYTES))
        bad = np.flatnonzero(crcs != sums.crcs[checked])
        if len(bad):
            low = int(lows[bad[0]])
            raise self._sum_mismatch(sums, low, low + sums.chunk_entries)
        self._whole[checked] = True
        if len(at_once) == len(pending):
            return []
        done = set(at_once)
        return [chunk for chunk in pending if chunk not in done]

    def _sum_mismatch(self, sums: EntrySums, low: int, covered: int) -> CorruptFileError:
        return CorruptFileError(
            f"{self.index_file.path}: hash index entries {low}..{covered - 1} fail their checksum (in "
            f"{sums.path.name}): the file was damaged; `msgindex repair` rebuilds it from the log")

    def _check_chunk(self, entries: np.ndarray, chunk: int, low: int, need: int) -> None:
        sums = self._sidecar()
        covered = low
        if sums is not None and sums.covered_count > low:
            covered = min(low + sums.chunk_entries, sums.covered_count)
            crc = crc32(entries[low * ENTRY_BYTES : covered * ENTRY_BYTES])
            if crc != int(sums.crcs[chunk]):
                raise self._sum_mismatch(sums, low, covered)
        if need > covered:
            problem = structure_problem(self.index_file, max(covered, _FIRST_INDEX), need)
            if problem is not None:
                unusable = "" if self._unusable is None else f" (its entry checksums are {self._unusable})"
                raise CorruptFileError(f"{self.index_file.path}: {problem}: the file was damaged{unusable}; "
                                       f"`msgindex repair` rebuilds it from the log")
            if self._unusable is not None and not self._warned:
                # said once the answer stands on the weaker check (an error above says it itself)
                self._warned = True
                log.warning("%s: entry checksums %s: lookups check the entries they touch for the shape of hash "
                            "chains only (`msgindex repair` writes them again)", sums_path(self.index_file.path),
                            self._unusable)
        end = max(need, covered)
        if end >= low + (1 << self._shift):
            self._whole[chunk] = True
        else:
            self._partial[chunk] = end

    def _sidecar(self) -> EntrySums | None:
        if not self._loaded:
            self._loaded = True
            self._sums, why = EntrySums.load(self.index_file)
            if self._sums is not None and self._sums.shift != self._shift:
                # replaced by one of other chunks since its header was read (msgindex repair):
                # this reader's chunks are not its chunks, so it checks their shape instead
                self._sums, why = None, f"rewritten in chunks of {self._sums.chunk_entries} entries while read"
            # another file has this name now (a backfill rebuilt the shard, or retention removed it):
            # its sidecar is that file's and says nothing about the one read here, nor is it damage
            now = _identity(self.index_file.path)
            replaced = self._sums is None and (now is None or self._opened_as is None or now[:2] != self._opened_as[:2])
            # a new file's first commit may be read before its writer wrote the sidecar: no warning
            first_commit = why == "missing" and self.index_file.index_count <= 1 << OLDEST_CHUNK_SHIFT
            if self._sums is None and not replaced and not first_commit:
                self._unusable = why
        return self._sums


_CHECKED_FILES = 256  # index files whose checked chunks a process remembers
# Chunks a lookup touched up to which EntryGuard.check finds the distinct ones in Python: 1.2 us
# for 4 against numpy's 4.6, even at ~64, 20 against 15 us at 128.
_FEW_TOUCHED = 48
_checked_by_file: OrderedDict[tuple[int, ...], np.ndarray] = OrderedDict()


def _identity(path: os.PathLike | str) -> tuple[int, int, int, int] | None:
    """(device, inode, size, mtime) of the file at `path` now (None: there is none)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def _whole_chunks(index_file: IndexFile, shift: int) -> np.ndarray:
    """The process-wide flags of the chunks (of 1 << `shift` entries) of `index_file` found intact,
    for its identity now."""
    chunks = -(-index_file.index_num >> shift)
    identity = _identity(index_file.path)
    if identity is not None:
        identity = (*identity, shift)
    if identity is None:
        return np.zeros(chunks, dtype=bool)
    flags = _checked_by_file.pop(identity, None)
    if flags is None:
        flags = np.zeros(chunks, dtype=bool)
    _checked_by_file[identity] = flags
    while len(_checked_by_file) > _CHECKED_FILES:
        _checked_by_file.popitem(last=False)
    return flags


def forget_checked() -> None:
    """Forget which chunks were found intact (tests; a process that wants to check again)."""
    _checked_by_file.clear()


def structure_problem(index_file: IndexFile, low: int, high: int) -> str | None:
    """What breaks the shape of hash chains among entries [low, high) of `index_file` (None:
    nothing). See the module docstring for the rules; ``verify`` checks entries exactly, against
    the log."""
    entries = index_file.entry_array()
    high = min(high, len(entries))
    if high <= low:
        return None
    rows = entries[low:high]
    index = np.arange(low, high, dtype=np.int64)
    hashes = rows["key_hash"].astype(np.int64)
    prevs = rows["prev_index"].astype(np.int64)
    phys = rows["phy_offset"].astype(np.int64)
    n_slots = index_file.hash_slot_num

    def first(mask: np.ndarray, what: str) -> str | None:
        bad = np.flatnonzero(mask)
        if not bad.size:
            return None
        at = int(bad[0])
        return (f"hash index entry {low + at} {what} (keyHash {int(hashes[at])}, phyOffset {int(phys[at])}, "
                f"prevIndex {int(prevs[at])})")

    problem = (first(hashes < 0, "has a negative keyHash")
               or first((prevs < 0) | (prevs >= index), "has a prevIndex that is not an older entry")
               or first(rows["time_diff"].astype(np.int64) < 0, "has a negative timeDiff")
               or first(phys < 0, "has a negative phyOffset"))
    if problem:
        return problem
    going_back = np.zeros(phys.size, dtype=bool)
    going_back[1:] = phys[1:] < phys[:-1]
    if low > _FIRST_INDEX:
        going_back[0] = phys[0] < int(entries[low - 1]["phy_offset"])
    slots = hashes % n_slots
    linked = prevs > 0
    prev_hashes = entries["key_hash"][prevs[linked]].astype(np.int64)
    other_slot = np.zeros(prevs.size, dtype=bool)
    other_slot[linked] = (prev_hashes < 0) | (prev_hashes % n_slots != slots[linked])
    problem = (first(going_back, "has a phyOffset below the entry before it")
               or first(other_slot, "has a prevIndex into another hash slot's chain"))
    if problem:
        return problem
    # the entries of one slot here form one chain: each one's prev is the one before it
    order = np.lexsort((index, slots))
    same = np.zeros(order.size, dtype=bool)
    same[1:] = slots[order][1:] == slots[order][:-1]
    want = np.where(same, np.concatenate(([0], index[order][:-1])), -1)
    got = prevs[order]
    broken = np.where(same, got != want, got >= low)  # a slot's oldest entry here points below the range
    if broken.any():
        return first(np.isin(index, index[order][broken]), "breaks its hash chain")
    return None


def _entry_bytes(index_file: IndexFile) -> np.ndarray:
    """The written entries of `index_file` as one uint8 array (entry i at byte i * 20)."""
    return index_file.entry_array().view(np.uint8).reshape(-1)


def _check(raw: bytes, index_file: IndexFile) -> str | None:
    if len(raw) < HEADER_SIZE or raw[:8] != MAGIC:
        return "not an entry checksum file (torn or damaged)"
    fields = HEADER_STRUCT.unpack_from(raw, 0)
    _magic, version, slots, num, chunk, covered, print_, table_crc, header_crc = fields
    if zlib.crc32(raw[:HEADER_CRC_OFFSET]) != header_crc or version != VERSION:
        return "damaged (header checksum)"
    if (slots, num) != (index_file.hash_slot_num, index_file.index_num):
        return "made for other sizing"
    if chunk_shift_of(chunk) is None:
        return f"chunks of {chunk} entries (this msgindex reads {', '.join(str(1 << s) for s in CHUNK_SHIFTS)})"
    if not _FIRST_INDEX <= covered <= min(index_file.index_count, index_file.index_num):
        return f"covers {covered} entries, the file has {index_file.index_count} (stale)"
    if len(raw) != HEADER_SIZE + 4 * -(-covered // chunk) or zlib.crc32(raw[HEADER_SIZE:]) != table_crc:
        return "damaged (table checksum)"
    if print_ != hash_run.fingerprint(index_file, _FIRST_INDEX, covered, FINGERPRINT_SAMPLES):
        return "made for other entries (its fingerprint differs: stale, or another file's)"
    return None


def covered_count_of(index_path: str | os.PathLike) -> int:
    """How many entries the sidecar of `index_path` claims to cover (0: none or unreadable)."""
    return claimed_by(index_path)[0]


def claimed_by(index_path: str | os.PathLike) -> tuple[int, int]:
    """(entries covered, entries a chunk) as the sidecar of `index_path` claims ((0, 0): none or
    unreadable)."""
    try:
        with open(sums_path(index_path), "rb") as f:
            head = f.read(HEADER_SIZE)
    except OSError:
        return 0, 0
    if len(head) < HEADER_SIZE or head[:8] != MAGIC:
        return 0, 0
    fields = HEADER_STRUCT.unpack(head)
    return fields[5], fields[4]
