"""RocketMQ's IndexFile: an on-disk hash index from ``topic#key`` to a position, byte-compatible.

Layout (big-endian, as RocketMQ's broker writes it)::

    header   40 B   beginTimestamp i64, endTimestamp i64, beginPhyOffset i64, endPhyOffset i64,
                    hashSlotCount i32, indexCount i32
    slots    hashSlotNum x 4 B      slot -> newest entry index of its chain (0 = empty)
    entries  indexNum x 20 B        keyHash i32, phyOffset i64, timeDiff i32 (s), prevIndex i32

indexCount starts at 1 (entry 0 is never written: 0 means "no entry"), so a file holds indexNum - 1
entries. Every rule of RocketMQ's ``putKey`` is reproduced (see ``put_key``) so that the same calls
give the same bytes; ``select_phy_offsets`` answers like RocketMQ's ``selectPhyOffset``.
msgindex's own reads use ``candidates`` / ``candidate_arrays``: every entry of the key's chain with
the key's hash, with no early stop on time (a shard's timestamps are not monotonic), bounded by a
reader's committed count. They answer exactly what the plain walk (``reference_candidates``)
answers, but never walk a long chain one Python step per entry: dense chains (hot keys) are
scanned with numpy in verified windows, and a file's hash runs (``hash_run``: derived sidecars,
never required) answer whole stretches of a chain by binary search.

Length. RocketMQ maps a file at its full size (``file_size``: 420 MB at the default sizing) and
leaves the pages it has not written unallocated (a sparse file). msgindex writes through a mapping
too, and a write into an unallocated page when the filesystem is full kills the process (SIGBUS,
see ``mapped_file``), so it never writes into a hole; and it never allocates what it has not
written either: a file holds the header, the slot table (written at random positions, so
allocated whole when the file is created) and the entries up to its *capacity*, every byte of it
allocated. The writer grows the file in steps of GROWTH_ENTRIES entries just ahead of the entries
it writes (``_reserve``), up to the full size. A file's length is thus ``file_size`` or shorter by
whole entries, and the entries past its end are zeros, as in RocketMQ's sparse tail: its bytes are
RocketMQ's up to its length, and a full file's are RocketMQ's exactly (tests/interop: RocketMQ's
own IndexFile loads a short file, extending it to its full size, and answers alike). A reader maps
the length it finds; a slot pointing past it (a writer has grown the file since) makes it map the
file again at its new length (``_cover``). A file never shrinks.

The mapped bytes are the single source of truth, header included: a writer writes the header right
after each put (as RocketMQ does), so readers in other processes always see what is on disk.
Write order within a put is entry, then slot, then header: a concurrent reader that follows the
slot finds a complete entry.
"""

from __future__ import annotations

import os
import stat
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import astuple, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from msgindex.errors import CorruptFileError, InvalidOptionError, MsgIndexError
from msgindex.storage.hash_index import entry_sums, hash_run
from msgindex.storage.hash_index.hash_run import Jump, RunSet
from msgindex.storage.hash_index.java_hash import index_hash, index_hashes
from msgindex.storage.hash_index.rocketmq_sizing import DEFAULT_HASH_SLOT_NUM, DEFAULT_INDEX_NUM
from msgindex.storage.int_limits import INT32_MAX, INT64_MAX, INT64_MIN
from msgindex.storage.mapped_file import grow_mapping, map_file, preallocate

try:  # optional (setup.py): absent without a C compiler at install, and where msgindex arrives as a zip
    from msgindex.storage.hash_index import _index_walk as _compiled_walk
except ImportError:
    _compiled_walk = None

HEADER_SIZE = 40
HEADER_STRUCT = struct.Struct(">qqqqii")  # the six IndexHeader fields, in file order
SLOT_SIZE = 4
_SLOT_STRUCT = struct.Struct(">i")
_WALK_HEADER_STRUCT = struct.Struct(">q28xi")  # beginTimestamp and indexCount only
SLOT_DTYPE = np.dtype(">i4")
ENTRY_SIZE = 20
ENTRY_STRUCT = struct.Struct(">iqii")
ENTRY_DTYPE = np.dtype(
    [("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev_index", ">i4")]
)
INVALID_INDEX = 0  # a slot or prevIndex value meaning "no entry"
FIRST_INDEX = 1  # indexCount of an empty file; entry 0 is never written
TIME_DIFF_UNIT_MS = 1000  # entries store whole seconds since beginTimestamp
NAME_FORMAT = "%Y%m%d%H%M%S"  # + 3 digits of milliseconds: RocketMQ's yyyyMMddHHmmssSSS
NAME_LENGTH = 17

assert ENTRY_DTYPE.itemsize == ENTRY_SIZE == ENTRY_STRUCT.size and HEADER_STRUCT.size == HEADER_SIZE
# Walks unpack only the fields each step needs (fewer int objects per step), the rest on a hit.
_HASH_PREV_STRUCT = struct.Struct(">i12xi")  # keyHash, prevIndex
_HASH_DIFF_PREV_STRUCT = struct.Struct(">i8xii")  # keyHash, timeDiff, prevIndex
_PHY_DIFF_STRUCT = struct.Struct(">qi")  # phyOffset, timeDiff: at entry + 4
_PHY_STRUCT = struct.Struct(">q")  # phyOffset: at entry + 4
assert _HASH_PREV_STRUCT.size == _HASH_DIFF_PREV_STRUCT.size == ENTRY_SIZE == 4 + _PHY_DIFF_STRUCT.size + 4


_ZERO_RUN_ENTRIES = 4096  # rollback: an all-zero run this long ends the written entries
# A writer grows its file by whole steps of this many entries (1.25 MiB) ahead of the entries it
# writes: at most that much is allocated and not yet written, and a 20M-entry file is grown ~300
# times as it fills (each a fallocate and a new mapping: tens of us).
GROWTH_ENTRIES = 1 << 16

# Chain lookups (candidates / candidate_arrays); figures measured in bench/bench_index_file.py.
# Without the compiled walk, fewer walks than this go one Python step per entry (~0.5 us) rather
# than a numpy step for all of them (~10 us): both for few keys and for the last walks of a
# lock-step walk.
_VECTOR_MIN_KEYS = 8
_VECTOR_STEPS = 64  # lock-step steps before the walks still going continue one by one
_PROBE_HOPS = 32  # steps a walk takes before it judges how dense its chain is
# A chain with at least one entry per _SCAN_DENSITY entries of the file is scanned, not walked:
# a verified scan costs ~3 ns per file entry, a walk step ~0.5-1 us.
_SCAN_DENSITY = 256
_MIN_SCAN_WINDOW = 4096
_MAX_SCAN_WINDOW = 1 << 16  # rows per scanned window (1.3 MB): stays in L2 cache while verified


@dataclass(frozen=True)
class IndexHeader:
    """The six header fields of an index file, in file order."""

    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = FIRST_INDEX


class IndexEntry(NamedTuple):
    """One written entry, as stored (``time_diff`` in seconds since the file's beginTimestamp)."""

    index: int
    key_hash: int
    phy_offset: int
    time_diff: int
    prev_index: int


def _wrap64(value: int) -> int:
    """Java long arithmetic wraps; Python ints do not."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _java_div(value: int, divisor: int) -> int:
    """Java's long division truncates toward zero."""
    quotient = abs(value) // divisor
    return -quotient if value < 0 else quotient


def time_diff_seconds(store_timestamp: int, begin_timestamp: int) -> int:
    """The timeDiff RocketMQ stores for a put at `store_timestamp` (ms): whole seconds since
    beginTimestamp, 0 while the file has no begin time, clamped to [0, Integer.MAX_VALUE]."""
    if begin_timestamp <= 0:
        return 0
    diff = _java_div(_wrap64(store_timestamp - begin_timestamp), TIME_DIFF_UNIT_MS)
    return min(max(diff, 0), INT32_MAX)


def time_diffs_seconds(store_timestamps: np.ndarray, begin_timestamp: int) -> np.ndarray:
    """Vectorized ``time_diff_seconds`` for one begin time (int64 in, int32 out)."""
    if begin_timestamp <= 0:
        return np.zeros(store_timestamps.size, dtype=np.int32)
    with np.errstate(over="ignore"):
        diff = store_timestamps - np.int64(begin_timestamp)  # wraps like Java's long
    # numpy floors where Java truncates, but the two differ only for negative diffs, which the
    # clamp turns into 0 either way.
    return np.clip(diff // TIME_DIFF_UNIT_MS, 0, INT32_MAX).astype(np.int32)


def index_file_name(timestamp_ms: int, *, utc: bool = False) -> str:
    """RocketMQ's index file name for a creation time: ``yyyyMMddHHmmssSSS`` (the broker uses local
    time; pass ``utc=True`` for machine-independent names)."""
    seconds, millis = divmod(int(timestamp_ms), 1000)
    moment = datetime.fromtimestamp(seconds, UTC) if utc else datetime.fromtimestamp(seconds)
    return f"{moment.strftime(NAME_FORMAT)}{millis:03d}"


def parse_index_file_name(name: str, *, utc: bool = False) -> int | None:
    """The creation time (ms) encoded in an index file name, or None if `name` is not one."""
    if len(name) != NAME_LENGTH or not name.isdigit() or not name.isascii():
        return None
    try:
        moment = datetime.strptime(name[:-3], NAME_FORMAT)
    except ValueError:
        return None
    if utc:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp()) * 1000 + int(name[-3:])


def check_sizing(path: Path, hash_slot_num: int, index_num: int) -> None:
    """InvalidOptionError naming `path` unless both sizes are Java ints >= 1."""
    for name, value in (("hash_slot_num", hash_slot_num), ("index_num", index_num)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= INT32_MAX:
            raise InvalidOptionError(f"{path}: {name} must be an int in [1, {INT32_MAX}], got {value!r}")


def _header_field(name: str, doc: str) -> property:
    """A read-only property for one header field, read live from the mapped bytes."""
    return property(lambda self: getattr(self.header, name), doc=f"Header {name}: {doc}.")


class IndexFile:
    """One RocketMQ-format hash index file, memory-mapped (see the module docstring for the layout)."""

    def __init__(self, path: Path, hash_slot_num: int, index_num: int, read_only: bool) -> None:
        self.path = Path(path)
        self.hash_slot_num = int(hash_slot_num)
        self.index_num = int(index_num)
        self.read_only = read_only
        self._slots_offset = HEADER_SIZE
        self._entries_offset = HEADER_SIZE + self.hash_slot_num * SLOT_SIZE
        self._runs: RunSet | None = None  # loaded at the first lookup
        self._guard: entry_sums.EntryGuard | None = None  # see guard_entries
        self._mm = None
        try:  # a length that cannot be right is refused before mapping (an empty file cannot be mapped)
            info = os.stat(self.path)
        except OSError:
            info = None  # map_file says what is wrong with the path
        if info is not None and stat.S_ISREG(info.st_mode):
            self.capacity_of(info.st_size, self.hash_slot_num, self.index_num, self.path)
        self._use(map_file(self.path, writable=not read_only))

    def _use(self, mm) -> None:
        """Read and write through the mapping `mm` of the whole file from now on. A mapping
        replaced by a longer one is not closed: views of it (a lookup in another thread, arrays
        handed out) keep it alive until they are dropped, then it is unmapped."""
        try:
            capacity = self.capacity_of(len(mm), self.hash_slot_num, self.index_num, self.path)
        except CorruptFileError:
            mm.close()
            raise
        self._mm = mm
        self.capacity = capacity  # entries the file has room for now (index_num once full size)
        self._last_entry = capacity - 1  # the highest entry index the file has room for
        self._slots = np.frombuffer(mm, SLOT_DTYPE, self.hash_slot_num, self._slots_offset)
        self._entries = np.frombuffer(mm, ENTRY_DTYPE, capacity, self._entries_offset)

    # ----------------------------------------------------------------- creating and opening
    @staticmethod
    def file_size(hash_slot_num: int, index_num: int) -> int:
        """Bytes of a full-size file with this sizing (the file does not record it): RocketMQ's
        length for every file, msgindex's once the file is full (see the module docstring)."""
        return HEADER_SIZE + hash_slot_num * SLOT_SIZE + index_num * ENTRY_SIZE

    @classmethod
    def capacity_of(cls, length: int, hash_slot_num: int, index_num: int, path: Path | str = "index file") -> int:
        """Entries a file of `length` bytes has room for: the whole entries that follow its header
        and slot table (a partial last one is a writer still growing it, on a filesystem whose
        allocation writes zeros). CorruptFileError naming `path` when the header and slot table do
        not fit, or the file is longer than the sizing allows: truncated, or the wrong sizing."""
        entries_offset = HEADER_SIZE + hash_slot_num * SLOT_SIZE
        full = cls.file_size(hash_slot_num, index_num)
        if length < entries_offset:
            raise CorruptFileError(
                f"{path}: file is {length} bytes, shorter than the {entries_offset}-byte header and slot table of "
                f"an index file with {hash_slot_num} slots, {full} bytes when full (truncated, or opened with the "
                f"wrong sizing)")
        if length > full:
            raise CorruptFileError(
                f"{path}: file is {length} bytes, longer than the {full} bytes of an index file with "
                f"{hash_slot_num} slots and {index_num} entries (opened with the wrong sizing, or not an index file)")
        return (length - entries_offset) // ENTRY_SIZE

    @classmethod
    def create(cls, path: str | os.PathLike, hash_slot_num: int = DEFAULT_HASH_SLOT_NUM,
               index_num: int = DEFAULT_INDEX_NUM, end_phy_offset: int = 0,
               end_timestamp: int = 0) -> IndexFile:
        """A new zero-filled file: its header, slot table and first GROWTH_ENTRIES entries (see
        the module docstring). Like RocketMQ's constructor, positive `end_phy_offset` /
        `end_timestamp` (the previous full file's end) become both begin and end of this one."""
        path = Path(path)
        check_sizing(path, hash_slot_num, index_num)
        preallocate(path, cls.file_size(hash_slot_num, min(index_num, GROWTH_ENTRIES)))
        index = cls(path, hash_slot_num, index_num, read_only=False)
        phy = end_phy_offset if end_phy_offset > 0 else 0
        ts = end_timestamp if end_timestamp > 0 else 0
        index._write_header(IndexHeader(ts, ts, phy, phy, 0, FIRST_INDEX))
        return index

    @classmethod
    def open(cls, path: str | os.PathLike, hash_slot_num: int = DEFAULT_HASH_SLOT_NUM,
             index_num: int = DEFAULT_INDEX_NUM, *, read_only: bool = False) -> IndexFile:
        """An existing file (msgindex's or a RocketMQ broker's). A size that does not match the
        sizing, or a header that cannot be right, is a CorruptFileError naming the file."""
        path = Path(path)
        check_sizing(path, hash_slot_num, index_num)
        index = cls(path, hash_slot_num, index_num, read_only=read_only)
        try:
            index._validate_header()
        except BaseException:
            index.close()
            raise
        return index

    def _reserve(self, entries: int) -> None:
        """Make room for entries [0, `entries`) before writing them: grow the file to the next
        whole step of GROWTH_ENTRIES (at most index_num), its new bytes allocated first."""
        if entries <= self.capacity:
            return
        capacity = min(self.index_num, -(-entries // GROWTH_ENTRIES) * GROWTH_ENTRIES)
        old_size = self._entries_offset + self.capacity * ENTRY_SIZE
        self._use(grow_mapping(self.path, old_size, self.file_size(self.hash_slot_num, capacity)))

    def _cover(self, entry: int) -> bool:
        """A reader met `entry` past its mapping (a slot a writer wrote after growing the file):
        map the file at its length now. Whether `entry` is then inside it (if not, nothing wrote
        there: a damaged slot, read as the end of its chain, as RocketMQ reads an index past
        indexCount)."""
        if entry < self.capacity or entry >= self.index_num:
            return entry < self.capacity
        try:
            length = os.stat(self.path).st_size
        except OSError:  # gone (retention): this mapping is all there is
            return False
        if length > self._entries_offset + self.capacity * ENTRY_SIZE:
            self._use(map_file(self.path, writable=not self.read_only))
        return entry < self.capacity

    def _cover_heads(self, heads: np.ndarray) -> None:
        """``_cover`` for many chains' heads: the newest a writer may have written. Not simply the
        largest: a damaged slot's head past index_num would then stop the mapping from growing
        over the others, and their chains would read as empty."""
        if not heads.size or int(heads.max()) < self.capacity:
            return  # (every lookup: the usual answer costs one reduction)
        past = heads[(heads >= self.capacity) & (heads < self.index_num)]
        if past.size:
            self._cover(int(past.max()))

    def follow_growth(self) -> None:
        """Map the file again if its header counts entries past this mapping (a writer grew the
        file since it was mapped): RocketMQ's walks, and reports, go up to the header's indexCount."""
        count = _WALK_HEADER_STRUCT.unpack_from(self._buffer(), 0)[1]
        if count > self.capacity:
            self._cover(min(count, self.index_num) - 1)

    def _validate_header(self) -> None:
        raw_count = HEADER_STRUCT.unpack_from(self._mm, 0)[5]
        if raw_count > self.index_num:
            raise CorruptFileError(
                f"{self.path}: header indexCount {raw_count} exceeds the file's {self.index_num} "
                f"entries (wrong index_num, or not an index file)"
            )

    # ----------------------------------------------------------------- header
    @property
    def header(self) -> IndexHeader:
        """The header as on disk, indexCount <= 0 read as 1 (RocketMQ's load rule)."""
        fields = HEADER_STRUCT.unpack_from(self._buffer(), 0)
        if fields[5] <= 0:
            fields = fields[:5] + (FIRST_INDEX,)
        return IndexHeader(*fields)

    def _walk_header(self) -> tuple[int, int]:
        """(beginTimestamp, indexCount) without building an IndexHeader: lookups are hot paths."""
        fields = _WALK_HEADER_STRUCT.unpack_from(self._buffer(), 0)
        return fields[0], max(fields[1], FIRST_INDEX)

    def _write_header(self, header: IndexHeader) -> None:
        # Packed apart, then copied in one piece: readers map the active file while the writer
        # puts, and Struct.pack_into first zeroes its whole span in place, so a reader could see
        # indexCount 0 (a file "behind its commit") for as long as the fields took to pack.
        self._mm[:HEADER_SIZE] = HEADER_STRUCT.pack(*astuple(header))

    begin_timestamp = _header_field("begin_timestamp", "ms of the first put (or inherited)")
    end_timestamp = _header_field("end_timestamp", "ms of the last put (not the maximum)")
    begin_phy_offset = _header_field("begin_phy_offset", "phyOffset of the first put (or inherited)")
    end_phy_offset = _header_field("end_phy_offset", "phyOffset of the last put")
    hash_slot_count = _header_field("hash_slot_count", "puts that found their slot empty")
    index_count = _header_field("index_count", "next entry index; 1 when empty")

    @property
    def entry_count(self) -> int:
        """Entries written (index_count - 1)."""
        return self.index_count - FIRST_INDEX

    @property
    def is_full(self) -> bool:
        return self.index_count >= self.index_num

    def is_time_matched(self, begin: int, end: int) -> bool:
        """RocketMQ's ``isTimeMatched``: may this file hold entries for the window [begin, end]?"""
        h = self.header
        return ((begin < h.begin_timestamp and end > h.end_timestamp)
                or h.begin_timestamp <= begin <= h.end_timestamp
                or h.begin_timestamp <= end <= h.end_timestamp)

    # ----------------------------------------------------------------- writing
    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """RocketMQ's ``putKey``: index `key` (the full ``topic#key``) at `phy_offset`. False when full."""
        self._require_writable()
        _check_int64("phy_offset", phy_offset)
        _check_int64("store_timestamp", store_timestamp)
        h = self.header
        count = h.index_count
        if count >= self.index_num:
            return False
        self._reserve(count + 1)
        key_hash = index_hash(key)
        slot_pos = self._slots_offset + (key_hash % self.hash_slot_num) * SLOT_SIZE
        prev = _SLOT_STRUCT.unpack_from(self._mm, slot_pos)[0]
        if prev <= INVALID_INDEX or prev > count:
            prev = INVALID_INDEX
        # The diff uses the begin time from before this put, even for a file's first entry.
        diff = time_diff_seconds(store_timestamp, h.begin_timestamp)
        ENTRY_STRUCT.pack_into(self._mm, self._entries_offset + count * ENTRY_SIZE,
                               key_hash, phy_offset, diff, prev)
        self._mm[slot_pos : slot_pos + SLOT_SIZE] = _SLOT_STRUCT.pack(count)  # (never zeroed in place: _write_header)
        first = count <= FIRST_INDEX
        self._write_header(IndexHeader(
            begin_timestamp=store_timestamp if first else h.begin_timestamp,
            end_timestamp=store_timestamp,
            begin_phy_offset=phy_offset if first else h.begin_phy_offset,
            end_phy_offset=phy_offset,
            hash_slot_count=h.hash_slot_count + (prev == INVALID_INDEX),
            index_count=count + 1,
        ))
        return True

    def put_keys(self, keys: Sequence[str] | pa.Array | pa.ChunkedArray | np.ndarray,
                 phy_offsets: Sequence[int] | np.ndarray, store_timestamps: Sequence[int] | np.ndarray) -> int:
        """``put_key`` for each (key, offset, timestamp) in order, vectorized; the bytes equal those
        of the one-by-one puts. Returns how many were written (fewer than given when the file fills)."""
        self._require_writable()
        offsets = _int64_array("phy_offsets", phy_offsets)
        stamps = _int64_array("store_timestamps", store_timestamps)
        if not len(keys) == offsets.size == stamps.size:
            raise InvalidOptionError(
                f"put_keys: {len(keys)} keys, {offsets.size} phy_offsets and {stamps.size} "
                f"store_timestamps; the three must have the same length"
            )
        n = max(0, min(len(keys), self.index_num - self.index_count))
        if n == 0:
            return 0
        return self.put_hashes(index_hashes(keys[:n] if len(keys) != n else keys), offsets[:n], stamps[:n])

    def put_hashes(self, hashes: np.ndarray, phy_offsets: np.ndarray, store_timestamps: np.ndarray) -> int:
        """``put_keys`` of keys already hashed (``java_hash.index_hashes``: int32, >= 0), e.g.
        the entries a shard's log calls for when ``msgindex repair`` rebuilds a file."""
        self._require_writable()
        h = self.header
        count = h.index_count
        n = max(0, min(len(hashes), self.index_num - count))
        if n == 0:
            return 0
        hashes = np.asarray(hashes[:n], dtype=np.int32)
        offsets = _int64_array("phy_offsets", phy_offsets)[:n]
        stamps = _int64_array("store_timestamps", store_timestamps)[:n]
        self._reserve(count + n)
        slots = hashes % np.int32(self.hash_slot_num)  # hashes are >= 0
        prevs, chain_heads = self._resolve_prevs(slots, count)
        first = count <= FIRST_INDEX
        diffs = time_diffs_seconds(stamps, h.begin_timestamp)
        if first and n > 1:  # after the first put, the begin time is the first put's timestamp
            diffs[1:] = time_diffs_seconds(stamps[1:], int(stamps[0]))
        block = self._entries[count : count + n]  # written in place: no 20-byte-row temporary
        block["key_hash"] = hashes
        block["phy_offset"] = offsets
        block["time_diff"] = diffs
        block["prev_index"] = prevs
        self._slots[chain_heads[0]] = chain_heads[1]
        self._write_header(IndexHeader(
            begin_timestamp=int(stamps[0]) if first else h.begin_timestamp,
            end_timestamp=int(stamps[-1]),
            begin_phy_offset=int(offsets[0]) if first else h.begin_phy_offset,
            end_phy_offset=int(offsets[-1]),
            hash_slot_count=h.hash_slot_count + int(np.count_nonzero(prevs == INVALID_INDEX)),
            index_count=count + n,
        ))
        return n

    def _resolve_prevs(self, slots: np.ndarray, first_index: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """Each new entry's prevIndex as sequential puts would set it, and the final (slot, head).

        Sorting by (slot, put order) lines up each slot's new entries: an entry's prev is the
        entry before it in its group, and a group's first entry gets the slot's old value, valid
        only if in (0, indexCount at the time of its put] -- the put's own index. Working in
        sorted order also makes the slot reads and writes sweep the slot table front to back."""
        # (slot << 32 | position) sorts as plain int64 (SIMD in numpy): no argsort needed.
        # Everything after the sort is int32 (indexes are int32 on disk): half the memory traffic.
        packed = np.sort((slots.astype(np.int64) << 32) | np.arange(slots.size, dtype=np.int64))
        position = (packed & 0xFFFFFFFF).astype(np.int32)
        sorted_slots = (packed >> 32).astype(np.int32)
        put_index = position + np.int32(first_index)
        same_slot = sorted_slots[1:] == sorted_slots[:-1]
        old = self._slots[sorted_slots].astype(np.int32)
        prev_sorted = np.where((old > INVALID_INDEX) & (old <= put_index), old, np.int32(INVALID_INDEX))
        np.copyto(prev_sorted[1:], put_index[:-1], where=same_slot)
        prevs = np.empty_like(prev_sorted)
        prevs[position] = prev_sorted
        heads = np.flatnonzero(np.append(~same_slot, True))
        return prevs, (sorted_slots.take(heads), put_index.take(heads))

    def rollback_to(self, index_count: int, header: IndexHeader) -> bool:
        """Undo every entry at or past `index_count`, newest first: each slot gets back the
        prevIndex it held before, the entry bytes are zeroed and `header` (the values at the time
        the file had `index_count`) is written. The file then equals one that never had them.
        True when anything changed.

        The on-disk header is not trusted for where the undone entries end: a put writes entry,
        then slot, then header, so a writer killed mid-batch leaves entries (and slots) past the
        header's count. The end is the furthest of: the header's count, the last non-zero entry,
        and the highest entry a slot points at (an entry may legitimately be all zeros).

        Nor is an undone entry trusted for its slot's old value unless its put reached the slot:
        ``put_hashes`` writes the entries column by column (keyHash first, prevIndex last) and the
        slots after them all, so a writer killed in between leaves entries with a keyHash and a
        prevIndex of 0 while their slots still point at committed entries. Only a slot pointing
        into the undone entries was moved by the dead batch; it gets back the prevIndex of its
        oldest undone entry (complete: its put wrote the slot after it). Every other slot keeps
        its value. The same rule makes a rollback killed halfway safe to run again: a slot it
        already restored points below `index_count` and is left alone, and it writes the header
        before zeroing the entries, the first undone entry last, so that whatever it left undone
        still shows (``ShardWriter`` looks at the header and the first entry past the commit)."""
        self._require_writable()
        if header.index_count != index_count or not FIRST_INDEX <= index_count <= self.index_num:
            raise InvalidOptionError(
                f"{self.path}: cannot roll back to index_count {index_count} with header "
                f"index_count {header.index_count} (the file holds {self.index_num} entries)"
            )
        on_disk = self.index_count
        if index_count > on_disk:  # a committed header is msync'd before its checkpoint is written
            raise InvalidOptionError(
                f"{self.path}: cannot roll back to index_count {index_count}: the file's header "
                f"only reached {on_disk} (the file lost committed entries)"
            )
        end = min(max(self._written_end(index_count), on_disk, int(self._slots.max()) + 1), self.capacity)
        changed = end > index_count or self.header != header
        if end > index_count:
            undone = self._entries[index_count:end]
            hashes = undone["key_hash"].astype(np.int64)
            if np.any(hashes < 0):
                bad = index_count + int(np.argmax(hashes < 0))
                raise CorruptFileError(f"{self.path}: entry {bad} has a negative key hash; cannot roll back")
            slots = hashes % self.hash_slot_num
            unique_slots, first = np.unique(slots, return_index=True)
            moved = self._slots[unique_slots] >= index_count  # committed slots point below it
            self._slots[unique_slots[moved]] = undone["prev_index"][first[moved]]
        self._write_header(header)
        if end > index_count:
            undone[1:] = np.zeros(1, dtype=ENTRY_DTYPE)
            undone[:1] = np.zeros(1, dtype=ENTRY_DTYPE)
        if hash_run.covered_count_of(self.path) > index_count:
            # runs over entries that are gone (they should only ever cover committed ones)
            self.forget_hash_runs()
            hash_run.remove_runs(self.path, ending_after=index_count)
        if entry_sums.covered_count_of(self.path) > index_count:  # likewise (entry_sums)
            entry_sums.remove(self.path)
        return changed

    def _written_end(self, start: int) -> int:
        """One past the last non-zero entry at or after `start`. A batch writes its entries
        contiguously, so the search ends at the first chunk of all-zero entries."""
        raw = self._entries.view(np.uint8).reshape(self.capacity, ENTRY_SIZE)
        end = start
        while start < self.capacity:
            written = np.flatnonzero(raw[start : start + _ZERO_RUN_ENTRIES].any(axis=1))
            if written.size == 0:
                break
            end = start + int(written[-1]) + 1
            start += _ZERO_RUN_ENTRIES
        return end

    def flush(self) -> None:
        """Force the mapped bytes to disk (msync)."""
        self._require_writable()
        self._mm.flush()

    # ----------------------------------------------------------------- reading
    def select_phy_offsets(self, key: str, max_num: int, begin: int, end: int) -> list[int]:
        """RocketMQ's ``selectPhyOffset``: phyOffsets of entries whose *hash* equals the key's,
        newest first, with second-granularity times in [begin, end], walking the chain until
        `max_num` results, an invalid prev, or an entry older than `begin` (the early stop).
        A cyclic chain (corrupt file) gives what the JVM gives while results keep coming; where
        the JVM would spin forever (indexCount steps without a result) the walk ends.

        Walked by the compiled module where it was built (``_index_walk.c``: within 2x of the
        JVM's call, which Python cannot be), else by ``python_select_phy_offsets``, its oracle."""
        mm = self._mm
        if mm is not None and self.capacity < self.index_num:
            self.follow_growth()
            mm = self._mm
        if mm is not None and _compiled_walk is not None:
            found = _compiled_walk.select_phy_offsets(mm, key, self.hash_slot_num, self.capacity, max_num, begin, end)
            if found is not None:
                return found
        return self.python_select_phy_offsets(key, max_num, begin, end)

    def python_select_phy_offsets(self, key: str, max_num: int, begin: int, end: int) -> list[int]:
        """``select_phy_offsets`` walked in Python (the compiled walk's oracle, and the walk
        wherever the compiled module is absent)."""
        if self._mm is not None and self.capacity < self.index_num:
            self.follow_growth()
        mm = self._mm
        if mm is None:
            self._buffer()  # raises: closed
        # (a hot path: every name below is a local or a literal-like constant, no builtin calls)
        key_hash = index_hash(key)
        begin_ts, count = _WALK_HEADER_STRUCT.unpack_from(mm, 0)
        cur = _SLOT_STRUCT.unpack_from(mm, self._slots_offset + key_hash % self.hash_slot_num * SLOT_SIZE)[0]
        # a walk never goes past indexCount, nor past the file's room (index_num once full size)
        last = self._last_entry if count > self._last_entry else count
        found: list[int] = []
        if cur <= INVALID_INDEX or cur > last or count <= FIRST_INDEX or max_num <= 0:
            return found
        if begin_ts > _NO_WRAP_BEGIN_MAX:
            return self._select_wrapping(key_hash, cur, last, begin_ts, count, max_num, begin, end)
        # begin_ts + diff * 1000 cannot wrap here, so the time tests become tests on diff (the hot
        # loop then does no arithmetic): in [begin, end] <=> diff in [low, high]; diff < low is
        # RocketMQ's early stop (older than begin) and diff < 0 its other stop
        low = -((begin_ts - begin) // TIME_DIFF_UNIT_MS)
        if low < 0:
            low = 0
        high = (end - begin_ts) // TIME_DIFF_UNIT_MS
        base, entry_size, no_entry = self._entries_offset, ENTRY_SIZE, INVALID_INDEX
        unpack_entry, unpack_phy = _HASH_DIFF_PREV_STRUCT.unpack_from, _PHY_STRUCT.unpack_from
        idle_steps = 0
        while idle_steps <= count:
            idle_steps += 1
            at = base + cur * entry_size
            stored_hash, diff, prev = unpack_entry(mm, at)
            if diff < low:
                break
            if stored_hash == key_hash and diff <= high:
                found.append(unpack_phy(mm, at + 4)[0])
                if len(found) >= max_num:
                    break
                idle_steps = 0
            if prev <= no_entry or prev > last or prev == cur:
                break
            cur = prev
        return found

    def _select_wrapping(self, key_hash: int, cur: int, last: int, begin_ts: int, count: int,
                         max_num: int, begin: int, end: int) -> list[int]:
        """``select_phy_offsets``' walk where beginTimestamp + timeDiff can overflow a Java long
        (a beginTimestamp within 2**41 of Long.MAX_VALUE): stamps computed and wrapped as the JVM does."""
        mm, base, unpack_entry = self._mm, self._entries_offset, ENTRY_STRUCT.unpack_from
        found: list[int] = []
        idle_steps = 0
        while idle_steps <= count:
            idle_steps += 1
            stored_hash, phy, diff, prev = unpack_entry(mm, base + cur * ENTRY_SIZE)
            if diff < 0:
                break
            stamp = _stamp(begin_ts, diff)
            if stored_hash == key_hash and begin <= stamp <= end:
                found.append(phy)
                if len(found) >= max_num:
                    break
                idle_steps = 0
            if prev <= INVALID_INDEX or prev > last or prev == cur or stamp < begin:
                break
            cur = prev
        return found

    def first_entry_from(self, phy_offset: int, limit: int) -> int:
        """The first entry of [FIRST_INDEX, limit) whose phyOffset is >= `phy_offset` (`limit`
        when none), by binary search: a shard's files index records in log order, so their
        entries' phyOffsets never decrease. A damaged entry can mislead the search, and only
        into ending it just after that entry: a caller that bounds its walks with the answer
        checks the entry before it (``ShardReader._candidates``)."""
        low, high = FIRST_INDEX, max(min(limit, self.capacity), FIRST_INDEX)
        mm, base, unpack_phy = self._buffer(), self._entries_offset + 4, _PHY_STRUCT.unpack_from
        while low < high:
            middle = (low + high) // 2
            if unpack_phy(mm, base + middle * ENTRY_SIZE)[0] < phy_offset:
                low = middle + 1
            else:
                high = middle
        return low

    def candidates(self, key_or_hash: str | int, *, limit_index_count: int | None = None) -> list[tuple[int, int, int]]:
        """(entry index, phyOffset, approximate store time ms) of every entry in the key's chain
        whose hash equals the key's, newest first, with no time-based early stop.

        Entries at or past `limit_index_count` (a reader's committed count; default the header's
        indexCount) are skipped but their prevIndex is followed. A chain only points backwards; a
        prev that does not is corruption and ends the walk, so this never loops. The answer is
        exactly ``reference_candidates``' (the plain walk); long chains get it from the file's
        hash run or from verified scans instead of one Python step per entry (see
        ``candidate_arrays``)."""
        key_hash = index_hash(key_or_hash) if isinstance(key_or_hash, str) else int(key_or_hash)
        begin_ts, limit, runs = self._lookup_setup(limit_index_count)
        slot = key_hash % self.hash_slot_num
        head = _SLOT_STRUCT.unpack_from(self._mm, self._slots_offset + slot * SLOT_SIZE)[0]
        found: list[tuple[int, int, int]] = []
        touched = entry_sums.Touched()
        pieces = self._chain_pieces(key_hash, slot, head, limit, runs.jumps(slot), touched)
        self._check_touched(touched, limit)
        for entries, phys, diffs in pieces:
            if isinstance(entries, list):
                found += [(e, p, _stamp(begin_ts, d)) for e, p, d in zip(entries, phys, diffs)]
            else:
                found += zip(entries.tolist(), phys.tolist(), _stamps(begin_ts, diffs).tolist())
        return found

    def candidates_many(self, keys: Sequence[str] | pa.Array | np.ndarray, *,
                        limit_index_count: int | None = None) -> list[list[tuple[int, int, int]]]:
        """``candidates`` for many keys at once (see ``candidate_arrays``)."""
        hashes = index_hashes(keys) if len(keys) else np.zeros(0, np.int32)
        results: list[list[tuple[int, int, int]]] = [[] for _ in range(hashes.size)]
        hits = self.candidate_arrays(hashes, limit_index_count=limit_index_count)
        # each key's hits come newest first (see candidate_arrays)
        for k, index, phy, stamp in zip(*(column.tolist() for column in hits)):
            results[k].append((index, phy, stamp))
        return results

    def candidate_arrays(self, hashes: np.ndarray, *, limit_index_count: int | None = None,
                         floor_entry: int = FIRST_INDEX) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``candidates`` of many precomputed key hashes as flat int64 arrays: (position in
        `hashes`, entry index, phyOffset, approximate store time ms). Each key's hits appear
        newest first (keys' hits may interleave); callers that only need the offsets skip
        building a Python tuple per hit. Identical to ``reference_candidates`` for every key, on
        any bytes (corrupt files included), as long as the entries a hash run covers are those it
        was built from (runs only ever cover committed entries, which never change; a sampled
        fingerprint catches a run left from other bytes). With `floor_entry`, a walk ends below
        that entry (a chain only points backwards): the hits are reference_candidates' from it on.

        How: where the compiled module was built, all chains are walked in one call
        (``_walk_compiled``) but those a hash run may shorten, which walk one by one as below.
        Else the chains of all keys are walked in lock-step with numpy (one gather per step)
        while many keys are still walking; the few left walk on one by one (a plain Python step
        per entry costs less than a numpy step then). A walk that finds its chain dense (at least
        one entry in ``_SCAN_DENSITY`` of the file's, like a hot key's) switches to scanning
        windows of the keyHash column below it with numpy, each window checked to hold exactly the
        chain's entries the walk would visit (else the walk goes on one step at a time). A chain
        that reaches the newest entry one of the file's hash runs holds of its slot takes the hits
        down to that run's range from it (a binary search) and goes on below -- see ``hash_run``."""
        hashes = np.asarray(hashes, dtype=np.int64).reshape(-1)
        begin_ts, limit, runs = self._lookup_setup(limit_index_count)
        pieces: list[tuple[int | np.ndarray, Sequence[int] | np.ndarray, Sequence[int] | np.ndarray,
                           Sequence[int] | np.ndarray]] = []
        touched = entry_sums.Touched()
        # one key or 50,000: a C step per entry beats Python's and numpy's (see _walk_compiled)
        if not self._walk_compiled(hashes, limit, runs, pieces, touched, floor_entry):
            if hashes.size < _VECTOR_MIN_KEYS:
                mm, slots_offset = self._mm, self._slots_offset
                for k, key_hash in enumerate(hashes.tolist()):
                    slot = key_hash % self.hash_slot_num
                    head = _SLOT_STRUCT.unpack_from(mm, slots_offset + slot * SLOT_SIZE)[0]
                    pieces += [(k, *piece) for piece in self._chain_pieces(key_hash, slot, head, limit,
                                                                           runs.jumps(slot), touched, floor_entry)]
            else:
                self._walk_lock_step(hashes, limit, runs, pieces, touched, floor_entry)
        self._check_touched(touched, limit)
        return _assemble(pieces, begin_ts)

    def guard_entries(self) -> None:
        """From now on, lookups check every chunk of entries they touch, once (``entry_sums``):
        damage they depend on is a CorruptFileError naming the file, not a silent miss. A shard's
        readers call it (again when the file changed under them: its chunks are checked anew); a
        RocketMQ broker's own files have no checksums."""
        self._guard = entry_sums.EntryGuard(self)

    def _check_touched(self, touched: entry_sums.Touched, limit: int) -> None:
        if self._guard is not None:
            self._guard.check(touched, limit)

    def _lookup_setup(self, limit_index_count: int | None) -> tuple[int, int, RunSet]:
        """(beginTimestamp, the limit, the hash runs that may answer now) for one lookup."""
        begin_ts, count = self._walk_header()
        runs = self._hash_runs()
        if runs.covered_count > count:  # rolled back below them: not this file's entries any more
            runs = _NO_RUNS
        return begin_ts, count if limit_index_count is None else int(limit_index_count), runs

    def _walk_compiled(self, hashes: np.ndarray, limit: int, runs: RunSet, pieces: list,
                       touched: entry_sums.Touched, floor: int) -> bool:
        """``_walk_lock_step``'s walks in one call of the compiled module (``walk_chains``): a
        bulk lookup's 50,000 keys walked 0.35 s in numpy steps; one key's chains in four topics
        (long-keys, 500k records) 22 against 53 us in Python steps at 60 hits, 4.2 against 8.5 ms
        for a key on 13% of the records (the Python walk's scans of dense chains included), 3 us
        more for a key of one record. The walks a hash run may shorten (``RunSet.jumping``) go
        through ``_chain_pieces``, with their jumps. False where it does not answer (not built,
        arguments C does not hold): Python or numpy walks then."""
        mm = self._mm
        if _compiled_walk is None or mm is None:
            return False
        if hashes.size and int(hashes.min()) < 0:
            return False  # not RocketMQ key hashes: numpy's modulo decides their slots
        slots = hashes % self.hash_slot_num
        # the heads are read once, here, and the mapping grown to hold them all: a writer may link
        # newer heads meanwhile, past this mapping, which the walk must not take for empty chains
        heads = self._slots[slots].astype(np.int64)
        self._cover_heads(heads)  # (a chain only points backwards: only its head can be past the mapping)
        # a walk a hash run may shorten (a key sharing a hot key's slot) goes step by step, with
        # its jumps; every other walk is C's, which a run would not shorten
        jumping = runs.jumping(hashes, slots) if runs.runs else None
        walking = None if jumping is None or not jumping.any() else np.flatnonzero(~jumping)
        walked_hashes, walked_heads = (hashes, heads) if walking is None else (hashes[walking], heads[walking])
        walked = _compiled_walk.walk_chains(self._mm, np.ascontiguousarray(walked_hashes, np.int64), walked_heads,
                                            self._entries_offset, self.capacity, limit, floor, entry_sums.TOUCH_SHIFT)
        if walked is None:
            return False
        who, entries, phys, diffs, chunks = (np.frombuffer(column, np.int64) for column in walked)
        touched.arrays.append(chunks)
        if len(who):
            pieces.append((who if walking is None else walking[who], entries, phys, diffs))
        if walking is not None:
            for k in np.flatnonzero(jumping).tolist():
                key_hash, slot = int(hashes[k]), int(slots[k])
                pieces += [(k, *piece) for piece in self._chain_pieces(key_hash, slot, int(heads[k]), limit,
                                                                       runs.jumps(slot), touched, floor)]
        return True

    def _walk_lock_step(self, hashes: np.ndarray, limit: int, runs: RunSet, pieces: list,
                        touched: entry_sums.Touched, floor: int) -> None:
        """The chains of all `hashes` a numpy step at a time; hands the last few walks, and those
        that reach a run's top of their slot, to ``_chain_pieces``. Appends (who, entries, phys,
        diffs) to `pieces` and the chunks of the entries it read (``entry_sums``) to `touched`."""
        slots = hashes % self.hash_slot_num
        cur = self._slots[slots].astype(np.int64)
        self._cover_heads(cur)
        who = np.arange(hashes.size)
        tops = runs.tops(slots)  # (runs, keys)
        at_top: list[tuple[np.ndarray, np.ndarray]] = []
        for _ in range(_VECTOR_STEPS):
            alive = (cur >= floor) & (cur > INVALID_INDEX) & (cur < self.capacity)
            if tops.shape[0]:
                reached = alive & (tops == cur).any(axis=0)
                if reached.any():
                    at_top.append((who[reached], cur[reached]))
                    alive &= ~reached
            who, cur, tops = who[alive], cur[alive], tops[:, alive]
            if who.size < _VECTOR_MIN_KEYS:
                break
            touched.arrays.append(cur >> entry_sums.TOUCH_SHIFT)
            rows = self._entries[cur]
            hit = (cur < limit) & (rows["key_hash"] == hashes[who])
            if hit.any():
                pieces.append((who[hit], cur[hit], rows["phy_offset"][hit], rows["time_diff"][hit]))
            prev = rows["prev_index"].astype(np.int64)
            cur = np.where(prev < cur, prev, INVALID_INDEX)  # a chain only points backwards
        at_top.append((who, cur))  # the walks still going (those that ended find nothing more)
        for keys, starts in at_top:
            for k, start in zip(keys.tolist(), starts.tolist()):
                key_hash = int(hashes[k])
                slot = key_hash % self.hash_slot_num
                pieces += [(k, *piece) for piece in self._chain_pieces(key_hash, slot, start, limit, runs.jumps(slot),
                                                                       touched, floor)]

    def _chain_pieces(self, key_hash: int, slot: int, cur: int, limit: int,
                      jumps: dict[int, Jump], touched: entry_sums.Touched,
                      floor: int = FIRST_INDEX) -> list[tuple]:
        """The hits of one chain from entry `cur` down to entry `floor`, newest first, as pieces
        (entries, phyOffsets, time diffs): Python lists from walking, numpy arrays from scans and
        runs. `jumps` maps the tops runs hold of the slot to where the walk goes (``hash_run.Jump``);
        the chunks of the entries read (``entry_sums``) are added to `touched`."""
        pieces: list[tuple] = []
        entries: list[int] = []
        phys: list[int] = []
        diffs: list[int] = []
        if cur >= self.capacity:  # (a chain only points backwards: only its head can be past the mapping)
            self._cover(cur)
        capacity, mm, base, unpack_entry = self.capacity, self._mm, self._entries_offset, _HASH_PREV_STRUCT.unpack_from
        touch, shift = touched.chunks.append, entry_sums.TOUCH_SHIFT
        hops, probe_from, scans = 0, cur, True
        floor = max(floor, FIRST_INDEX)
        while floor <= cur < capacity:
            if cur in jumps and jumps[cur].left_out != key_hash:  # (the left-out hash walks the range)
                run, after, _ = jumps[cur]
                hits = run.hits(key_hash, limit)
                if hits is not None:  # else the run failed its checksum: walk on
                    if entries:
                        pieces.append((entries, phys, diffs))
                        entries, phys, diffs = [], [], []
                    above = hits.entries >= floor
                    pieces.append((hits.entries[above], hits.phy_offsets[above], hits.time_diffs[above]) if floor >
                                  FIRST_INDEX else (hits.entries, hits.phy_offsets, hits.time_diffs))
                    cur, hops, probe_from = after, 0, after
                    continue
                jumps = {top: jump for top, jump in jumps.items() if jump[0] is not run}
            if hops >= _PROBE_HOPS and scans:
                if probe_from - cur <= hops * _SCAN_DENSITY:  # dense: scanning costs less than walking
                    if entries:
                        pieces.append((entries, phys, diffs))
                        entries, phys, diffs = [], [], []
                    # scan down to just above the next run's top: the walk then jumps over that run
                    scan_floor = max(max((top for top in jumps if top < cur), default=INVALID_INDEX) + 1, floor)
                    cur, scans = self._scan_chain(key_hash, slot, cur, scan_floor, limit, 2 * (probe_from - cur),
                                                  pieces, touched)
                    hops, probe_from = 0, cur
                    continue
                hops, probe_from = 0, cur
            at = base + cur * ENTRY_SIZE
            touch(cur >> shift)
            stored_hash, prev = unpack_entry(mm, at)
            if cur < limit and stored_hash == key_hash:
                phy, diff = _PHY_DIFF_STRUCT.unpack_from(mm, at + 4)
                entries.append(cur)
                phys.append(phy)
                diffs.append(diff)
            if prev >= cur:
                break
            cur = prev
            hops += 1
        if entries:
            pieces.append((entries, phys, diffs))
        return pieces

    def _scan_chain(self, key_hash: int, slot: int, cur: int, floor: int, limit: int, window: int,
                    pieces: list, touched: entry_sums.Touched) -> tuple[int, bool]:
        """Scan windows of entries below `cur` (down to `floor`) for the chain's entries while
        the chain stays dense there; append the hits to `pieces`. Returns (where the walk goes
        on, whether scanning may be tried again): a window whose entries are not exactly what
        the walk would visit ends the scanning for this chain, the walk then goes on from there."""
        window = max(window, _MIN_SCAN_WINDOW)
        while floor <= cur < self.capacity and cur > INVALID_INDEX:
            low = max(floor, cur - window + 1)
            touched.add_range(low, cur)
            scanned = self._scan_window(key_hash, slot, low, cur, limit)
            if scanned is None:
                return cur, False
            hits, members, cur = scanned
            if hits[0].size:
                pieces.append(hits)
            if members * _SCAN_DENSITY < window:
                break  # the chain thinned out: walking is cheaper again
            window = min(2 * window, _MAX_SCAN_WINDOW)
        return cur, True

    def _scan_window(self, key_hash: int, slot: int, low: int, high: int, limit: int,
                     ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], int, int] | None:
        """The walk from entry `high` through entries [low, high], done by a scan: the entries of
        `slot` there must form exactly the chain the walk follows (`high` the newest, each one's
        prev the one before it, the oldest one's prev leaving the window or ending the walk), so
        that the walk would visit exactly them. Returns ((entries, phyOffsets, time diffs) of the
        hits newest first, how many entries the chain has in the window, where the walk goes on:
        0 when it ends), or None when the window is not that (corruption)."""
        rows = self._entries[low : high + 1]
        stored, scratch, is_member = _scan_scratch(rows.size)
        np.copyto(stored, rows["key_hash"], casting="unsafe")  # big-endian to native: same values
        n_slots = np.int32(self.hash_slot_num)
        # stored % n_slots, but ~8x faster: numpy divides by a scalar with libdivide, while its
        # remainder divides element by element
        np.floor_divide(stored, n_slots, out=scratch)
        np.multiply(scratch, n_slots, out=scratch)
        np.subtract(stored, scratch, out=scratch)
        np.equal(scratch, slot, out=is_member)
        member = np.flatnonzero(is_member)
        if member.size == 0 or member[-1] != high - low:
            return None
        prev = rows["prev_index"][member].astype(np.int64)
        entry = member + low
        if not np.array_equal(prev[1:], entry[:-1]):
            return None
        oldest, oldest_prev = int(entry[0]), int(prev[0])
        if oldest_prev >= oldest:
            after = INVALID_INDEX  # the walk stops there
        elif oldest_prev < low:
            after = oldest_prev
        else:
            return None
        hit = member[(stored[member] == key_hash) & (entry < limit)][::-1]
        found = (hit + low, rows["phy_offset"][hit], rows["time_diff"][hit])
        return found, int(member.size), after

    def _hash_runs(self) -> RunSet:
        """The file's usable hash runs (looked for once per open file)."""
        if self._runs is None:
            self._runs = RunSet.load(self)
        return self._runs

    def forget_hash_runs(self) -> None:
        """Look for the hash runs afresh at the next lookup (after some were written or removed)."""
        runs, self._runs = self._runs, None
        if runs is not None:
            runs.close()

    def slot_array(self) -> np.ndarray:
        """Read-only big-endian int32 view of all slots (values are entry indexes, 0 = empty)."""
        view = self._slots.view()
        view.flags.writeable = False
        return view

    def entry_array(self) -> np.ndarray:
        """Read-only structured view (``ENTRY_DTYPE``) of entries [0, index_count): row i is entry i
        (row 0 is the never-written entry 0)."""
        view = self._entries[: min(self.index_count, self.capacity)].view()
        view.flags.writeable = False
        return view

    def entry(self, index: int) -> IndexEntry:
        """Entry `index` as stored (an IndexError past the file's room)."""
        if not 0 <= index < self.capacity:
            raise IndexError(f"{self.path}: no entry {index} (room for {self.capacity})")
        return IndexEntry(index, *ENTRY_STRUCT.unpack_from(self._buffer(), self._entries_offset + index * ENTRY_SIZE))

    def iter_entries(self) -> Iterator[IndexEntry]:
        """Every written entry, oldest first."""
        for index in range(FIRST_INDEX, min(self.index_count, self.capacity)):
            yield self.entry(index)

    # ----------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Unmap. Views handed out by slot_array/entry_array keep the mapping alive until dropped."""
        if self._mm is None:
            return
        self.forget_hash_runs()
        mm, self._mm = self._mm, None
        del self._slots, self._entries
        try:
            mm.close()
        except BufferError:
            pass  # a caller still holds a numpy view; the mapping is released with it

    def __enter__(self) -> IndexFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._mm is None else f"{self.entry_count} entries"
        return f"IndexFile({str(self.path)!r}, slots={self.hash_slot_num}, index_num={self.index_num}, {state})"

    def _buffer(self):
        if self._mm is None:
            raise MsgIndexError(f"{self.path}: index file is closed")
        return self._mm

    def _require_writable(self) -> None:
        self._buffer()
        if self.read_only:
            raise MsgIndexError(f"{self.path}: index file was opened read-only")


# beginTimestamp + timeDiff * 1000 (timeDiff in [0, Integer.MAX_VALUE]) fits a Java long up to here
_NO_WRAP_BEGIN_MAX = INT64_MAX - INT32_MAX * TIME_DIFF_UNIT_MS


_scratch = threading.local()
_NO_RUNS = RunSet([])


def _scan_scratch(rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reused per-thread buffers for a scanned window (stored hashes, a temporary, a mask): fresh
    arrays of this size come from mmap and cost a page fault per 4 KiB on every window."""
    buffers = getattr(_scratch, "buffers", None)
    if buffers is None or buffers[0].size < rows:
        size = max(rows, _MAX_SCAN_WINDOW)
        buffers = _scratch.buffers = (np.empty(size, np.int32), np.empty(size, np.int32), np.empty(size, bool))
    return tuple(buffer[:rows] for buffer in buffers)


def reference_candidates(index_file: IndexFile, key_or_hash: str | int, *,
                         limit_index_count: int | None = None) -> list[tuple[int, int, int]]:
    """The plain chain walk, one entry per step: what ``IndexFile.candidates`` and
    ``candidate_arrays`` must answer (their test oracle). Entries at or past the limit (default:
    the header's indexCount) are skipped but followed; a prev that does not point backwards ends
    the walk; times are beginTimestamp + timeDiff s in Java long arithmetic."""
    key_hash = index_hash(key_or_hash) if isinstance(key_or_hash, str) else int(key_or_hash)
    begin_ts, count = index_file._walk_header()
    limit = count if limit_index_count is None else limit_index_count
    cur = _SLOT_STRUCT.unpack_from(index_file._buffer(), index_file._slots_offset
                                   + (key_hash % index_file.hash_slot_num) * SLOT_SIZE)[0]
    index_file._cover(cur)
    mm = index_file._buffer()
    found = []
    while INVALID_INDEX < cur < index_file.capacity:
        stored_hash, phy, diff, prev = ENTRY_STRUCT.unpack_from(mm, index_file._entries_offset + cur * ENTRY_SIZE)
        if cur < limit and stored_hash == key_hash:
            found.append((cur, phy, _stamp(begin_ts, diff)))
        if prev >= cur:
            break
        cur = prev
    return found


def _stamp(begin_timestamp: int, time_diff: int) -> int:
    """An entry's approximate store time (ms): beginTimestamp + timeDiff s, as a Java long."""
    stamp = begin_timestamp + time_diff * TIME_DIFF_UNIT_MS
    return stamp if INT64_MIN <= stamp <= INT64_MAX else _wrap64(stamp)


_UINT64_MASK = (1 << 64) - 1


def _stamps(begin_timestamp: int, time_diffs: Sequence[int] | np.ndarray, *, reuse: bool = False) -> np.ndarray:
    """``_stamp`` of many diffs (int64 arithmetic wraps like Java's long), in a new array, or in
    `time_diffs` itself when `reuse` says it is an int64 array nobody else holds."""
    stamps = time_diffs if reuse else np.array(time_diffs, dtype=np.int64)
    # in uint64, whose arithmetic wraps as Java's long does, with no overflow check to silence (an
    # np.errstate block cost ~5 us, a tenth of a one-key lookup's hash step)
    unsigned = stamps.view(np.uint64)
    unsigned *= np.uint64(TIME_DIFF_UNIT_MS)
    unsigned += np.uint64(begin_timestamp & _UINT64_MASK)
    return stamps


def _as_int64(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """`values` as an int64 array (no copy when they already are one, in native byte order)."""
    return np.asarray(values, dtype=np.int64)


def _assemble(pieces: list[tuple], begin_timestamp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Flat int64 (who, entry, phyOffset, approximate ms) arrays of lookup pieces, in order."""
    if not pieces:
        return tuple(np.zeros(0, np.int64) for _ in range(4))
    whos = [np.full(len(piece[1]), piece[0], np.int64) if isinstance(piece[0], int) else piece[0]
            for piece in pieces]
    if len(pieces) == 1:  # a single key's chain, often one run or scan slice: no concatenation
        _, entry, phy, diff = pieces[0]
        return _as_int64(whos[0]), _as_int64(entry), _as_int64(phy), _stamps(begin_timestamp, diff)
    columns = [whos] + [[piece[i] for piece in pieces] for i in (1, 2, 3)]
    who, entry, phy, diff = (np.concatenate(column, dtype=np.int64, casting="same_kind") for column in columns)
    return who, entry, phy, _stamps(begin_timestamp, diff, reuse=True)


def _check_int64(name: str, value: int) -> None:
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidOptionError(f"{name} {value} does not fit a Java long")


def _int64_array(name: str, values: Sequence[int] | np.ndarray) -> np.ndarray:
    try:
        return np.ascontiguousarray(values, dtype=np.int64).reshape(-1)
    except (OverflowError, ValueError, TypeError) as e:
        raise InvalidOptionError(f"put_keys: {name} must be 64-bit integers ({e})") from None
