"""Kafka's sparse segment indexes, in Kafka's own file formats (AbstractIndex design).

* ``OffsetIndex`` (``.index``): 8-byte entries ``relative seq i32 | log position i32``.
* ``TimeIndex`` (``.timeindex``): 12-byte entries ``timestamp i64 | relative seq i32``.

Both big-endian, relative to the segment's base sequence number, memory-mapped, holding at most
``max_index_bytes`` rounded down to whole entries, and trimmed to their entries on close/roll: a
reopened file holds ``file length / entry size`` entries, exactly as Kafka reads it. Kafka
preallocates an active index at its maximum size (sparse); a writer here grows the file in steps
of GROWTH_BYTES ahead of its entries instead (every byte under a writable mapping is allocated, see
``mapped_file``, so preallocating would take ~3 MB per index of a 1 GiB segment before its first
entry).
A reader that must not see a concurrent writer's uncommitted entries passes the committed
``entries`` count instead, and never touches a byte past it (the writer may trim the file).

An entry (T, s) of the time index means "T is the largest timestamp of the records before and at
the index point, first reached by record s", so every record before s is older than T. That is
what makes "largest entry <= target" a safe place to start a scan for timestamps >= target even
though the log's timestamps are not monotonic.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import ClassVar, NamedTuple

import numpy as np

from msgindex.errors import (
    CorruptFileError,
    IndexFullError,
    InvalidAppendError,
    InvalidArgumentError,
    InvalidOptionError,
    OutOfRangeError,
)
from msgindex.storage.int_limits import INT32_MAX
from msgindex.storage.mapped_file import map_file, raise_if_storage_full

# Kafka's lookups search the last 8 KiB of entries first ("warm section", KAFKA-6432): appends and
# almost all lookups hit the end of the index, so a plain binary search over the whole file would
# keep touching cold middle pages and fault them in; the warm section's pages stay cached.
WARM_SECTION_BYTES = 8192
NO_TIMESTAMP = -1  # Kafka's RecordBatch.NO_TIMESTAMP: the time index's "last entry" when empty
GROWTH_BYTES = 1 << 16  # a writer's index file grows by up to this much ahead of its entries
MAX_RELATIVE = INT32_MAX  # entries hold seqs and positions relative to the segment as i32


class OffsetPosition(NamedTuple):
    """An offset index entry, absolute: record `seq` starts at byte `position` of the log."""

    seq: int
    position: int


class TimestampSeq(NamedTuple):
    """A time index entry, absolute: `timestamp` (ms) is the largest of the segment's records up
    to and including record `seq`, the first one to reach it."""

    timestamp: int
    seq: int


def round_down(number: int, factor: int) -> int:
    return factor * (number // factor)


class SparseIndex:
    """What Kafka's OffsetIndex and TimeIndex share: a growing, memory-mapped array of
    fixed-size big-endian entries, searched for the largest entry <= a target."""

    ENTRY: ClassVar[struct.Struct]
    DTYPE: ClassVar[np.dtype]
    KIND: ClassVar[str]
    KEY_FIELD: ClassVar[int]  # which entry field lookups search on

    def __init__(self, path: Path | None, base_seq: int, max_index_bytes: int, writable: bool) -> None:
        if max_index_bytes < self.ENTRY.size:
            raise InvalidOptionError(f"max_index_bytes {max_index_bytes} is smaller than one {self.KIND} entry")
        self.path = path
        self.base_seq = base_seq
        self.max_index_bytes = max_index_bytes
        self.writable = writable
        self._buf: mmap.mmap | bytearray | None = None
        self._length = 0
        self._entries = 0

    # ---- opening -------------------------------------------------------------------------
    @classmethod
    def open(cls, path: Path, base_seq: int, max_index_bytes: int, *, writable: bool,
             entries: int | None = None) -> SparseIndex:
        """Open (a writer creates it empty when missing) the index at `path`. `entries`
        overrides Kafka's "length / entry size" rule for a file still being appended to."""
        index = cls(Path(path), base_seq, max_index_bytes, writable)
        if not index.path.exists():
            if not writable:
                raise CorruptFileError(f"{index.path}: {cls.KIND} file does not exist")
            try:
                with open(index.path, "xb"):
                    pass  # grows with its entries (_reserve)
            except OSError as error:
                raise_if_storage_full(error, index.path, "creating it")
                raise
            entries = 0
        index._map()
        if index._length % cls.ENTRY.size:
            index.close_handler()
            raise CorruptFileError(
                f"{index.path}: {cls.KIND} file is {index._length} bytes, not a multiple of the "
                f"{cls.ENTRY.size}-byte entry size"
            )
        capacity = index._length // cls.ENTRY.size
        if entries is not None and not 0 <= entries <= capacity:
            index.close_handler()
            raise CorruptFileError(
                f"{index.path}: {cls.KIND} should hold {entries} entries but has room for {capacity}"
            )
        index._entries = capacity if entries is None else entries
        index._after_load()
        return index

    @classmethod
    def load(cls, path: Path, base_seq: int, max_index_bytes: int, *, entries: int | None = None) -> SparseIndex:
        """A read-only copy of the index at `path` in memory: its first `entries` entries (all of
        the file when None). Readers use this, never a mapping: a writer in another process may
        trim, regrow or replace the file, and a mapping that outlives a trim dies of SIGBUS. The
        bytes read are exactly the committed ones, so nothing the writer does later matters."""
        index = cls(Path(path), base_seq, max_index_bytes, False)
        try:
            with open(index.path, "rb") as f:
                raw = f.read() if entries is None else f.read(entries * cls.ENTRY.size)
        except FileNotFoundError:
            raise CorruptFileError(f"{index.path}: {cls.KIND} file does not exist") from None
        except OSError as error:
            raise CorruptFileError(f"{index.path}: cannot read ({error.strerror})") from None
        if len(raw) % cls.ENTRY.size or (entries is not None and len(raw) != entries * cls.ENTRY.size):
            raise CorruptFileError(
                f"{index.path}: {cls.KIND} file has {len(raw)} bytes, not "
                f"{'a multiple of ' + str(cls.ENTRY.size) if entries is None else entries * cls.ENTRY.size}"
            )
        index._buf = raw
        index._length = len(raw)
        index._entries = len(raw) // cls.ENTRY.size
        index._after_load()
        return index

    @classmethod
    def in_memory(cls, base_seq: int, max_index_bytes: int) -> SparseIndex:
        """An index with no file: what a reader rebuilds when a file is missing or corrupt
        (readers never modify files)."""
        index = cls(None, base_seq, max_index_bytes, True)
        index._length = round_down(max_index_bytes, cls.ENTRY.size)
        index._buf = bytearray(index._length)
        index._after_load()
        return index

    def _map(self) -> None:
        size = os.path.getsize(self.path)
        self._length = size
        self._buf = map_file(self.path, writable=self.writable) if size else None

    def _after_load(self) -> None:
        """Hook: recompute cached state (the time index's last entry)."""

    # ---- Kafka's accessors -----------------------------------------------------------------
    @property
    def entries(self) -> int:
        return self._entries

    @property
    def max_entries(self) -> int:
        """Entries the index can hold: a writer's grows its file up to max_index_bytes."""
        if self.writable:
            return round_down(self.max_index_bytes, self.ENTRY.size) // self.ENTRY.size
        return self._length // self.ENTRY.size

    @property
    def length(self) -> int:
        return self._length

    @property
    def size_in_bytes(self) -> int:
        return self._entries * self.ENTRY.size

    def is_full(self) -> bool:
        return self._entries >= self.max_entries

    def _relative_many(self, seqs: np.ndarray) -> np.ndarray:
        relative = seqs - self.base_seq
        bad = (relative < 0) | (relative > MAX_RELATIVE)
        if bad.any():
            raise InvalidAppendError(
                f"{self._name()}: sequence {int(seqs[np.argmax(bad)])} is not within 2^31-1 of the base "
                f"sequence {self.base_seq}"
            )
        return relative

    def raw_entry(self, n: int) -> tuple:
        """Entry `n` as stored (fields relative to the base)."""
        if not 0 <= n < self._entries:
            raise OutOfRangeError(f"{self._name()}: no entry {n} (it holds {self._entries})")
        return self.ENTRY.unpack_from(self._buf, n * self.ENTRY.size)

    def entry(self, n: int) -> OffsetPosition | TimestampSeq:
        """Entry `n` with its sequence number made absolute."""
        return self._absolute(self.raw_entry(n))

    def entries_array(self) -> np.ndarray:
        """All valid entries as a numpy structured array (a copy; fields relative)."""
        if not self._entries:
            return np.zeros(0, dtype=self.DTYPE)
        return np.frombuffer(self._buf, dtype=self.DTYPE, count=self._entries).copy()

    # ---- search ----------------------------------------------------------------------------
    def largest_lower_bound_slot(self, target: int, field: int | None = None) -> int:
        """Slot of the largest entry whose `field` is <= target, or -1 (Kafka's
        largestLowerBoundSlotFor: warm section first, then the rest, upper-midpoint search)."""
        field = self.KEY_FIELD if field is None else field
        entries = self._entries
        if entries == 0:
            return -1
        first_hot = max(0, entries - 1 - WARM_SECTION_BYTES // self.ENTRY.size)
        if self._field(first_hot, field) < target:
            return self._binary_search(target, field, first_hot, entries - 1)
        if self._field(0, field) > target:
            return -1
        return self._binary_search(target, field, 0, first_hot)

    def _binary_search(self, target: int, field: int, lo: int, hi: int) -> int:
        while lo < hi:
            # Upper midpoint: with `lo = mid` on "<", a lower midpoint would never move lo.
            mid = (lo + hi + 1) >> 1
            found = self._field(mid, field)
            if found > target:
                hi = mid - 1
            elif found < target:
                lo = mid
            else:
                return mid
        return lo

    def _field(self, n: int, field: int) -> int:
        return self.ENTRY.unpack_from(self._buf, n * self.ENTRY.size)[field]

    # ---- mutation --------------------------------------------------------------------------
    def _put_many(self, *columns: np.ndarray) -> None:
        """Write entries after the last one: one column per entry field, in file order."""
        entries = np.empty(len(columns[0]), dtype=self.DTYPE)
        for name, values in zip(self.DTYPE.names, columns):
            entries[name] = values
        self._reserve(self._entries + len(entries))
        start = self._entries * self.ENTRY.size
        self._buf[start : start + entries.nbytes] = entries.tobytes()
        self._entries += len(entries)

    def _require_writable(self) -> None:
        if not self.writable:
            raise InvalidAppendError(f"{self._name()}: opened read-only")

    def truncate_to(self, seq: int) -> None:
        """Drop every entry whose sequence number is >= `seq` (Kafka's truncateTo)."""
        seq_field = self.SEQ_FIELD
        slot = self.largest_lower_bound_slot(seq - self.base_seq, seq_field)
        if slot < 0:
            kept = 0
        elif self._field(slot, seq_field) == seq - self.base_seq:
            kept = slot
        else:
            kept = slot + 1
        self.truncate_to_entries(kept)

    def truncate_to_entries(self, entries: int) -> None:
        """Keep only the first `entries` entries."""
        if not 0 <= entries <= self._entries:
            raise InvalidArgumentError(f"{self._name()}: cannot truncate {self._entries} entries to {entries}")
        self._entries = entries
        self._after_load()

    def _reserve(self, entries: int) -> None:
        """Room for `entries` entries before writing them: the file grows to the next whole
        GROWTH_BYTES (at most max_index_bytes)."""
        needed = entries * self.ENTRY.size
        if needed <= self._length:
            return
        step = round_down(GROWTH_BYTES, self.ENTRY.size)
        self.resize(min(round_down(self.max_index_bytes, self.ENTRY.size), -(-needed // step) * step))

    def reset(self) -> None:
        """Remove every entry (the file keeps its length: appends write over it)."""
        self.truncate_to_entries(0)

    def trim_to_valid_size(self) -> None:
        """Shrink the file to exactly its entries (Kafka does this on close and on roll)."""
        self.resize(self.size_in_bytes)

    def resize(self, new_size: int) -> bool:
        """Set the file's length to `new_size` rounded down to whole entries; False if unchanged."""
        self._require_writable()
        rounded = round_down(new_size, self.ENTRY.size)
        if rounded == self._length:
            return False
        if rounded < self.size_in_bytes:
            raise InvalidArgumentError(f"{self._name()}: {rounded} bytes cannot hold its {self._entries} entries")
        if self.path is None:
            self._buf = self._buf[:rounded] + bytearray(max(0, rounded - len(self._buf)))
            self._length = rounded
            return True
        old = self._length
        self.close_handler()
        os.truncate(self.path, rounded)
        try:
            self._map()
        except BaseException:  # a full disk: no room for the new bytes; the index stays as it was
            os.truncate(self.path, old)
            self._map()
            raise
        return True

    def flush(self) -> None:
        if isinstance(self._buf, mmap.mmap) and self.writable:
            self._buf.flush()

    def close_handler(self) -> None:
        """Unmap without trimming."""
        if isinstance(self._buf, mmap.mmap):
            self._buf.close()
        self._buf = None

    def close(self) -> None:
        """Trim (when writable) and unmap."""
        if self.writable and self.path is not None:
            self.trim_to_valid_size()
        self.close_handler()

    def delete(self) -> None:
        self.close_handler()
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    # ---- validation ------------------------------------------------------------------------
    def sanity_check(self, record_count: int | None = None) -> None:
        """Kafka's sanityCheck, made stricter (every entry, not only the last, is checked for
        order): CorruptFileError naming the file. `record_count` bounds the relative seqs."""
        if self._length % self.ENTRY.size:
            self._corrupt(f"{self._length} bytes is not a multiple of {self.ENTRY.size}")
        array = self.entries_array()
        if not len(array):
            return
        seqs = array["relative_seq"].astype(np.int64)
        if seqs[0] < 0:
            self._corrupt(f"first relative sequence {seqs[0]} is negative")
        if record_count is not None and seqs[-1] >= record_count:
            self._corrupt(f"last relative sequence {seqs[-1]} is past the segment's {record_count} records")
        self._check_order(array)

    def _check_order(self, array: np.ndarray) -> None:
        raise NotImplementedError

    def _corrupt(self, reason: str) -> None:
        raise CorruptFileError(f"{self._name()}: corrupt {self.KIND}: {reason}")

    def _name(self) -> str:
        return str(self.path) if self.path is not None else f"in-memory {self.KIND} of segment {self.base_seq}"

    def _absolute(self, raw: tuple) -> OffsetPosition | TimestampSeq:
        raise NotImplementedError


class OffsetIndex(SparseIndex):
    """Kafka's OffsetIndex: relative sequence number -> byte position of that record in the log."""

    ENTRY = struct.Struct(">ii")
    DTYPE = np.dtype([("relative_seq", ">i4"), ("position", ">i4")])
    KIND = "offset index"
    KEY_FIELD = 0
    SEQ_FIELD = 0

    def last_seq(self) -> int:
        return self.base_seq + self.raw_entry(self._entries - 1)[0] if self._entries else self.base_seq

    def append(self, seq: int, position: int) -> None:
        """Add (seq, position); seq must be larger than the last one (InvalidAppendError)."""
        self.append_many(_int64s(seq), _int64s(position))

    def append_many(self, seqs: np.ndarray, positions: np.ndarray) -> None:
        """``append`` for each (seq, position) in turn, checked as a whole before any is written."""
        self._require_writable()
        seqs, positions = _int64s(seqs), _int64s(positions)
        if self._entries + len(seqs) > self.max_entries:
            raise IndexFullError(f"{self._name()}: full ({self._entries} entries)")
        relative = self._relative_many(seqs)
        last = self.raw_entry(self._entries - 1)[0] if self._entries else -1
        not_larger = np.diff(relative, prepend=last) <= 0
        if not_larger.any():
            i = int(np.argmax(not_larger))
            previous = self.base_seq + (last if i == 0 else int(relative[i - 1]))
            raise InvalidAppendError(
                f"{self._name()}: sequence {int(seqs[i])} is not larger than the last one indexed, {previous}"
            )
        if len(positions) and (positions.min() < 0 or positions.max() > MAX_RELATIVE):
            raise InvalidAppendError(f"{self._name()}: positions must be in [0, 2^31-1]")
        self._put_many(relative, positions)

    def lookup(self, seq: int) -> OffsetPosition:
        """The largest entry <= seq, or (base_seq, 0)."""
        slot = self.largest_lower_bound_slot(seq - self.base_seq)
        return OffsetPosition(self.base_seq, 0) if slot < 0 else self.entry(slot)

    def entry(self, n: int) -> OffsetPosition:
        return self._absolute(self.raw_entry(n))

    def _absolute(self, raw: tuple) -> OffsetPosition:
        return OffsetPosition(self.base_seq + raw[0], raw[1])

    def _check_order(self, array: np.ndarray) -> None:
        if np.any(np.diff(array["relative_seq"].astype(np.int64)) <= 0):
            self._corrupt("sequence numbers do not strictly increase")
        positions = array["position"].astype(np.int64)
        if positions[0] < 0 or np.any(np.diff(positions) <= 0):
            self._corrupt("positions do not strictly increase")


class TimeIndex(SparseIndex):
    """Kafka's TimeIndex: running-maximum timestamp -> the record that first reached it."""

    ENTRY = struct.Struct(">qi")
    DTYPE = np.dtype([("timestamp", ">i8"), ("relative_seq", ">i4")])
    KIND = "time index"
    KEY_FIELD = 0
    SEQ_FIELD = 1

    def _after_load(self) -> None:
        self._last = self.entry(self._entries - 1) if self._entries else TimestampSeq(NO_TIMESTAMP, self.base_seq)

    def is_full(self) -> bool:
        # One slot stays free for the entry appended when the segment rolls.
        return self._entries >= self.max_entries - 1

    def last_entry(self) -> TimestampSeq:
        """The last entry, or (NO_TIMESTAMP, base_seq) when empty."""
        return self._last

    def maybe_append(self, timestamp: int, seq: int, skip_full_check: bool = False) -> None:
        """Add (timestamp, seq) if timestamp is larger than the last one; a smaller timestamp or
        sequence number is an InvalidAppendError (callers pass the running maximum)."""
        self.maybe_append_many(_int64s(timestamp), _int64s(seq), skip_full_check)

    def maybe_append_many(self, timestamps: np.ndarray, seqs: np.ndarray, skip_full_check: bool = False) -> None:
        """``maybe_append`` for each (timestamp, seq) in turn; both must be non-decreasing, as a
        running maximum and the records that reached it are. Checked before any is written."""
        self._require_writable()
        timestamps, seqs = _int64s(timestamps), _int64s(seqs)
        if not len(timestamps):
            return
        last_ts, last_seq = self._last
        if self._entries and seqs[0] < last_seq:
            raise InvalidAppendError(
                f"{self._name()}: sequence {int(seqs[0])} is smaller than the last one indexed, {last_seq}"
            )
        if self._entries and timestamps[0] < last_ts:
            raise InvalidAppendError(
                f"{self._name()}: timestamp {int(timestamps[0])} is smaller than the last one indexed, {last_ts}"
            )
        for values, what in ((seqs, "sequence numbers"), (timestamps, "timestamps")):
            if (np.diff(values) < 0).any():
                raise InvalidAppendError(f"{self._name()}: {what} to append must not decrease")
        # Only rises above the last entry (NO_TIMESTAMP when empty) are appended.
        keep = timestamps > np.maximum.accumulate(np.concatenate(([last_ts], timestamps[:-1])))
        # Kafka checks fullness before every call, whether or not that call appends.
        if not skip_full_check and self._entries + int(keep[:-1].sum()) >= self.max_entries - 1:
            raise IndexFullError(f"{self._name()}: full ({self._entries} entries)")
        kept = int(keep.sum())
        if self._entries + kept > self.max_entries:
            raise IndexFullError(f"{self._name()}: no room left ({self._entries} entries)")
        if kept:
            self._put_many(timestamps[keep], self._relative_many(seqs[keep]))
            self._last = TimestampSeq(int(timestamps[keep][-1]), int(seqs[keep][-1]))

    def lookup(self, timestamp: int) -> TimestampSeq:
        """The largest entry <= timestamp, or (NO_TIMESTAMP, base_seq)."""
        slot = self.largest_lower_bound_slot(timestamp)
        return TimestampSeq(NO_TIMESTAMP, self.base_seq) if slot < 0 else self.entry(slot)

    def entry(self, n: int) -> TimestampSeq:
        return self._absolute(self.raw_entry(n))

    def _absolute(self, raw: tuple) -> TimestampSeq:
        return TimestampSeq(raw[0], self.base_seq + raw[1])

    def _check_order(self, array: np.ndarray) -> None:
        timestamps = array["timestamp"].astype(np.int64)
        if np.any(np.diff(timestamps) <= 0):
            self._corrupt("timestamps do not strictly increase")
        if np.any(np.diff(array["relative_seq"].astype(np.int64)) < 0):
            self._corrupt("sequence numbers decrease")


def _int64s(values: int | np.ndarray) -> np.ndarray:
    """`values` (one int or an array) as an int64 array; an int outside int64 cannot be a
    sequence number, position or timestamp of a Kafka index."""
    try:
        return np.atleast_1d(np.asarray(values, dtype=np.int64))
    except OverflowError:
        raise InvalidAppendError(f"{values!r} does not fit in a 64-bit index field") from None
