"""One metadata-log segment: ``<20-digit base seq>.log`` with its Kafka-format ``.index`` and
``.timeindex`` (and, once sealed, a ``.summary``).

Index entries follow Kafka's LogSegment rule, one state machine for appends and rebuilds alike:
after more than ``index_interval_bytes`` were written since the last entry, the next record gets
an offset-index entry (its seq, its position) and the time index gets the running maximum
timestamp with the record that first reached it. Because the rule only depends on the records,
rebuilding a lost index gives the very entries the writer appended, and a checkpoint can record
entry counts that stay true across rebuilds.

A segment is opened in one of three ways (the log decides which):
* sealed: immutable; entries = file length / entry size, summary gives its range;
* active with a committed ``SegmentState``: a writer truncates everything past it, a reader
  never reads past it (a writer may be appending in another process);
* active without a state: Kafka-style recovery, keeping the valid prefix of records.
A reader never modifies a file: a missing or corrupt index is rebuilt in memory for it.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from msgindex.errors import CorruptFileError, InvalidAppendError
from msgindex.storage.log import record_format as rf
from msgindex.storage.log.record_encoder import EncodedBatch
from msgindex.storage.log.segment_summary import SegmentSummary
from msgindex.storage.log.sparse_index import NO_TIMESTAMP, OffsetIndex, TimeIndex
from msgindex.storage.mapped_file import map_file
from msgindex.storage.message import MessageRecord

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
SUMMARY_SUFFIX = ".summary"
NAME_DIGITS = 20


def segment_name(base_seq: int) -> str:
    return f"{base_seq:0{NAME_DIGITS}d}"


def parse_segment_name(file_name: str) -> int | None:
    """The base seq of a file named like a segment's, else None."""
    stem, _, _ = file_name.partition(".")
    return int(stem) if len(stem) == NAME_DIGITS and stem.isdigit() else None


@dataclass(frozen=True, slots=True)
class SegmentState:
    """The committed extent of the active segment: what a reader may see, what a writer keeps."""

    size_bytes: int
    next_seq: int
    offset_index_entries: int
    time_index_entries: int
    min_timestamp: int | None
    max_timestamp: int | None


class LogSegment:
    """A log segment file and its sparse indexes (see the module docstring)."""

    def __init__(self, directory: Path, base_seq: int, *, index_interval_bytes: int,
                 max_index_bytes: int, writable: bool) -> None:
        self.directory = Path(directory)
        self.base_seq = base_seq
        self.index_interval_bytes = index_interval_bytes
        self.max_index_bytes = max_index_bytes
        self.writable = writable
        stem = self.directory / segment_name(base_seq)
        self.path = stem.with_suffix(LOG_SUFFIX)
        self.index_path = stem.with_suffix(INDEX_SUFFIX)
        self.time_index_path = stem.with_suffix(TIME_INDEX_SUFFIX)
        self.summary_path = stem.with_suffix(SUMMARY_SUFFIX)
        self.size = 0
        self.next_seq = base_seq
        self.min_timestamp: int | None = None
        self.max_timestamp: int | None = None
        self.sealed = False
        self.offset_index: OffsetIndex
        self.time_index: TimeIndex
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        # Index state machine: bytes since the last entry, running max timestamp and its record.
        self._bytes_since_entry = 0
        self._max_so_far = NO_TIMESTAMP
        self._max_so_far_seq = base_seq

    # ---- opening -------------------------------------------------------------------------
    @classmethod
    def create(cls, directory: Path, base_seq: int, *, index_interval_bytes: int,
               max_index_bytes: int) -> LogSegment:
        """A new empty writable segment (its files must not exist)."""
        segment = cls(directory, base_seq, index_interval_bytes=index_interval_bytes,
                      max_index_bytes=max_index_bytes, writable=True)
        segment._fd = os.open(segment.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        for path in (segment.index_path, segment.time_index_path, segment.summary_path):
            path.unlink(missing_ok=True)
        segment.offset_index = OffsetIndex.open(segment.index_path, base_seq, max_index_bytes, writable=True)
        segment.time_index = TimeIndex.open(segment.time_index_path, base_seq, max_index_bytes, writable=True)
        return segment

    @classmethod
    def open_sealed(cls, directory: Path, base_seq: int, *, index_interval_bytes: int,
                    max_index_bytes: int, writable: bool, next_seq: int | None = None) -> LogSegment:
        """An immutable segment; `next_seq` (the following segment's base) is checked."""
        segment = cls(directory, base_seq, index_interval_bytes=index_interval_bytes,
                      max_index_bytes=max_index_bytes, writable=writable)
        segment.sealed = True
        segment.size = segment._file_size()
        summary = SegmentSummary.read(segment.summary_path)
        if summary is None or summary.size_bytes != segment.size or summary.base_seq != base_seq or (
            next_seq is not None and summary.next_seq != next_seq
        ):
            summary = segment._summarize(next_seq)
            if writable:
                summary.write(segment.summary_path)
        segment.next_seq = summary.next_seq
        segment.min_timestamp, segment.max_timestamp = summary.min_timestamp, summary.max_timestamp
        segment._load_indexes(None, None)
        return segment

    @classmethod
    def open_active(cls, directory: Path, base_seq: int, *, index_interval_bytes: int,
                    max_index_bytes: int, writable: bool, state: SegmentState | None) -> LogSegment:
        """The last segment, cut to `state` (or recovered to its valid prefix when None)."""
        segment = cls(directory, base_seq, index_interval_bytes=index_interval_bytes,
                      max_index_bytes=max_index_bytes, writable=writable)
        if writable:
            segment._file_size()  # a clear error when the file is missing
            segment._fd = os.open(segment.path, os.O_RDWR)
            segment.summary_path.unlink(missing_ok=True)
        if state is None:
            segment._recover_valid_prefix()
        else:
            segment._cut_to(state)
        return segment

    def _file_size(self) -> int:
        try:
            return os.path.getsize(self.path)
        except FileNotFoundError:
            raise CorruptFileError(f"{self.path}: log segment does not exist") from None

    def _summarize(self, expected_next_seq: int | None) -> SegmentSummary:
        positions = self._walk(0, self.size, verify=True)
        if not positions:
            raise CorruptFileError(f"{self.path}: sealed log segment holds no records")
        headers = rf.header_columns(self._view(), positions)
        next_seq = self.base_seq + len(positions)
        if expected_next_seq is not None and next_seq != expected_next_seq:
            raise CorruptFileError(
                f"{self.path}: holds records {self.base_seq}..{next_seq - 1} but the next segment "
                f"starts at {expected_next_seq}"
            )
        ts = headers["timestamp_ms"]
        return SegmentSummary(self.base_seq, next_seq, self.size, int(ts.min()), int(ts.max()))

    def _cut_to(self, state: SegmentState) -> None:
        actual = self._file_size()
        if actual < state.size_bytes:
            raise CorruptFileError(
                f"{self.path}: is {actual} bytes but {state.size_bytes} were committed (committed data lost)"
            )
        if self.writable and actual > state.size_bytes:
            self._map = None  # never touch a mapping past the new end (SIGBUS)
            os.ftruncate(self._fd, state.size_bytes)
        self.size = state.size_bytes
        self.next_seq = state.next_seq
        self.min_timestamp, self.max_timestamp = state.min_timestamp, state.max_timestamp
        self._load_indexes(state.offset_index_entries, state.time_index_entries)

    def _recover_valid_prefix(self) -> None:
        """Keep the records that validate from the start; a writer truncates the rest (a torn
        tail after a crash, KAFKA-1112) and rebuilds both indexes while walking."""
        end = self._file_size()
        self.size = end
        positions: list[int] = []
        view = self._view()
        position = 0
        while position < end:
            checked = rf.check_record(view, position, end, self.base_seq + len(positions))
            if isinstance(checked, rf.RecordProblem):
                break
            positions.append(position)
            position += checked
        self.size = position
        if self.writable and position < end:
            self._map = None
            os.ftruncate(self._fd, position)
        self.next_seq = self.base_seq + len(positions)
        self._rebuild_indexes(positions, in_memory=not self.writable)

    # ---- indexes ---------------------------------------------------------------------------
    def _load_indexes(self, offset_entries: int | None, time_entries: int | None) -> None:
        """Open both indexes and check them against the log; rebuild them when that fails."""
        try:
            for path in (self.index_path, self.time_index_path):
                if not path.exists():
                    raise CorruptFileError(f"{path}: missing")
            self.offset_index = OffsetIndex.open(self.index_path, self.base_seq, self.max_index_bytes,
                                                 writable=self.writable, entries=offset_entries)
            self.time_index = TimeIndex.open(self.time_index_path, self.base_seq, self.max_index_bytes,
                                             writable=self.writable, entries=time_entries)
            self._check_indexes()
        except CorruptFileError:
            for index in ("offset_index", "time_index"):
                if hasattr(self, index):
                    getattr(self, index).close_handler()
            self._rebuild_indexes(self._walk(0, self.size, verify=True), in_memory=not self.writable)
            return
        if self.writable and not self.sealed:
            self.offset_index.resize(self.max_index_bytes)
            self.time_index.resize(self.max_index_bytes)

    def _check_indexes(self) -> None:
        count = self.next_seq - self.base_seq
        self.offset_index.sanity_check(count)
        self.time_index.sanity_check(count)
        if self.offset_index.entries:
            seq, position = self.offset_index.entry(self.offset_index.entries - 1)
            if position >= self.size or self._seq_at(position) != seq:
                raise CorruptFileError(f"{self.index_path}: last entry ({seq}, {position}) is not a record boundary")
        if self.sealed and self.max_timestamp is not None and self.max_timestamp > NO_TIMESTAMP and (
            self.time_index.last_entry()[0] != self.max_timestamp
        ):
            raise CorruptFileError(f"{self.time_index_path}: does not end with the segment's max timestamp")
        self._restore_state_machine()

    def _seq_at(self, position: int) -> int | None:
        checked = rf.check_record(self._view(), position, self.size)
        return None if isinstance(checked, rf.RecordProblem) else rf.read_seq_timestamp(self._view(), position)[0]

    def _rebuild_indexes(self, positions: Sequence[int], *, in_memory: bool) -> None:
        """Recreate both indexes from the records at `positions` with the append rule."""
        if in_memory:
            self.offset_index = OffsetIndex.in_memory(self.base_seq, self.max_index_bytes)
            self.time_index = TimeIndex.in_memory(self.base_seq, self.max_index_bytes)
        else:
            for path in (self.index_path, self.time_index_path):
                path.unlink(missing_ok=True)
            self.offset_index = OffsetIndex.open(self.index_path, self.base_seq, self.max_index_bytes, writable=True)
            self.time_index = TimeIndex.open(self.time_index_path, self.base_seq, self.max_index_bytes, writable=True)
        self._bytes_since_entry, self._max_so_far, self._max_so_far_seq = 0, NO_TIMESTAMP, self.base_seq
        self.min_timestamp = self.max_timestamp = None
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions):
            timestamps = rf.header_columns(self._view(), positions)["timestamp_ms"]
            self._index_records(self.base_seq, positions, self.size, timestamps)
        if self.sealed:
            self._seal_indexes()

    def _index_records(self, first_seq: int, positions: np.ndarray, end: int, timestamps: np.ndarray) -> None:
        """Kafka's LogSegment.append index rule for the consecutive records from `first_seq` at
        `positions` (ending at byte `end`): a record gets an offset-index entry when more than
        index_interval_bytes were written since the last entry, and the time index then gets the
        running maximum timestamp with the record that first reached it. Whole batches at once:
        the loop runs once per entry (about one per interval), never once per record."""
        count = len(positions)
        if not count:
            return
        low, high = int(timestamps.min()), int(timestamps.max())
        self.min_timestamp = low if self.min_timestamp is None else min(self.min_timestamp, low)
        self.max_timestamp = high if self.max_timestamp is None else max(self.max_timestamp, high)
        running = np.maximum.accumulate(np.maximum(timestamps, self._max_so_far))
        before = np.concatenate(([self._max_so_far], running[:-1]))
        # The latest record (<= i) that raised the running maximum; none in this batch: the old one.
        last_rise = np.maximum.accumulate(np.where(timestamps > before, np.arange(count), -1))
        max_seqs = np.where(last_rise >= 0, first_seq + last_rise, self._max_so_far_seq)

        interval = self.index_interval_bytes
        following = np.searchsorted(positions, positions + interval, side="right").tolist()
        entries = []
        i = int(np.searchsorted(positions, positions[0] - self._bytes_since_entry + interval, side="right"))
        while i < count:  # once per entry, about one per index interval
            entries.append(i)
            i = following[i]
        if entries:
            self.offset_index.append_many(first_seq + np.array(entries), positions[entries])
            self.time_index.maybe_append_many(running[entries], max_seqs[entries])
            self._bytes_since_entry = end - int(positions[entries[-1]])
        else:
            self._bytes_since_entry += end - int(positions[0])
        self._max_so_far, self._max_so_far_seq = int(running[-1]), int(max_seqs[-1])

    def _restore_state_machine(self) -> None:
        """Walk from the last offset-index entry to the end (about one index interval) to check
        that no entry is missing there and to restore the index rule's running state. The time
        index's last entry is the running maximum as of the last offset-index entry: both are
        appended together."""
        if self.offset_index.entries:
            start_seq, start = self.offset_index.entry(self.offset_index.entries - 1)
            self._max_so_far, self._max_so_far_seq = self.time_index.last_entry()
        else:
            start_seq, start = self.base_seq, 0
            self._max_so_far, self._max_so_far_seq = NO_TIMESTAMP, self.base_seq
        positions = self._walk(start, self.size, verify=True, first_seq=start_seq)
        if start_seq + len(positions) != self.next_seq:
            raise CorruptFileError(
                f"{self.path}: records end at sequence {start_seq + len(positions)}, not at {self.next_seq}"
            )
        view = self._view()
        for i, position in enumerate(positions):
            if i and position - start > self.index_interval_bytes:
                raise CorruptFileError(f"{self.index_path}: lacks the entry due at record {start_seq + i}")
            timestamp = rf.read_seq_timestamp(view, position)[1]
            if timestamp > self._max_so_far:
                self._max_so_far, self._max_so_far_seq = timestamp, start_seq + i
        self._bytes_since_entry = self.size - start

    def _seal_indexes(self) -> None:
        # Kafka's onBecomeInactiveSegment: the final time entry may use the slot kept free.
        self.time_index.maybe_append(self._max_so_far, self._max_so_far_seq, skip_full_check=True)
        if self.offset_index.path is not None:
            self.offset_index.trim_to_valid_size()
            self.time_index.trim_to_valid_size()

    # ---- appending -------------------------------------------------------------------------
    def append(self, batch: EncodedBatch) -> None:
        """Append encoded records (their seqs must start at next_seq) and index them."""
        if batch.first_seq != self.next_seq:
            raise InvalidAppendError(
                f"{self.path}: records from seq {batch.first_seq} cannot follow {self.next_seq - 1}"
            )
        positions = self.size + (batch.offsets[:-1] - batch.offsets[0])
        end = self.size + batch.nbytes
        self._index_records(batch.first_seq, positions, end, batch.timestamps)
        payload = batch.payload()
        written = os.pwrite(self._fd, payload, self.size)
        if written != len(payload):
            raise OSError(f"{self.path}: short write ({written} of {len(payload)} bytes)")
        self.size = end
        self.next_seq += len(batch)

    def seal(self) -> None:
        """Make this segment immutable (on roll): final time entry, trimmed indexes, summary."""
        self._seal_indexes()
        self.flush()
        SegmentSummary(self.base_seq, self.next_seq, self.size, self.min_timestamp, self.max_timestamp).write(
            self.summary_path
        )
        self.sealed = True

    def state(self) -> SegmentState:
        return SegmentState(self.size, self.next_seq, self.offset_index.entries, self.time_index.entries,
                            self.min_timestamp, self.max_timestamp)

    # ---- reading ---------------------------------------------------------------------------
    def _view(self):
        """The segment's bytes (at least `size` of them) for reading."""
        if self.size == 0:
            return b""
        if self._map is None or len(self._map) < self.size:
            self._map = map_file(self.path)
        return self._map

    def _walk(self, start: int, end: int, *, verify: bool, first_seq: int | None = None,
              limit: int | None = None) -> list[int]:
        return rf.walk_records(self._view(), start, end, verify=verify, name=self.path,
                               first_seq=first_seq, limit=limit)

    def position_of(self, seq: int, hint: tuple[int, int] | None = None) -> int:
        """Byte position of record `seq` (next_seq gives the end): the offset index's largest
        entry <= seq, or `hint` (a known (seq, position) closer by), then hops over lengths."""
        if not self.base_seq <= seq <= self.next_seq:
            raise IndexError(f"{self.path}: sequence {seq} is not in [{self.base_seq}, {self.next_seq})")
        if seq == self.next_seq:
            return self.size
        at_seq, position = self.offset_index.lookup(seq)
        if hint is not None and at_seq <= hint[0] <= seq:
            at_seq, position = hint
        view = self._view()
        unpack = rf.LENGTH_STRUCT.unpack_from
        for _ in range(seq - at_seq):  # the hot loop of every lookup: kept minimal
            position += rf.LENGTH_SIZE + unpack(view, position)[0]
        if position >= self.size or rf.read_seq_timestamp(view, position)[0] != seq:
            raise CorruptFileError(f"{self.path}: record {seq} is not where the offset index says (byte {position})")
        return position

    def read(self, seq: int) -> MessageRecord:
        found_seq, record = rf.decode_record(self._view(), self.position_of(seq), self.size, self.path)
        if found_seq != seq:
            raise CorruptFileError(f"{self.path}: record {found_seq} found where {seq} was expected")
        return record

    def positions_of(self, sorted_seqs: Sequence[int]) -> list[int]:
        """Positions of ascending seqs, each hop continuing from the previous one when closer."""
        positions = []
        hint = None
        for seq in sorted_seqs:
            position = self.position_of(seq, hint)
            positions.append(position)
            hint = (seq, position)
        return positions

    def first_seq_at_or_after(self, timestamp_ms: int) -> int | None:
        """The first record (in seq order) whose timestamp is >= timestamp_ms, or None. The time
        index gives a safe start (every earlier record is older); a forward scan does the rest,
        because timestamps after it are not ordered."""
        if self.max_timestamp is None or self.max_timestamp < timestamp_ms:
            return None
        seq = self.time_index.lookup(timestamp_ms)[1]
        position = self.position_of(seq)
        view = self._view()
        while position < self.size:
            found_seq, found_ts = rf.read_seq_timestamp(view, position)
            if found_ts >= timestamp_ms:
                return found_seq
            position += rf.read_length(view, position)
        return None

    def scan_start(self, begin_ms: int | None) -> int:
        """Seq from which a scan for timestamps >= begin_ms must read (time index lookup)."""
        return self.base_seq if begin_ms is None else self.time_index.lookup(begin_ms)[1]

    def piece_bounds(self, start_seq: int, piece_bytes: int) -> list[tuple[int, int]]:
        """[start_seq, next_seq) cut at offset-index entries into pieces of about piece_bytes."""
        bounds = [start_seq]
        last_position = self.position_of(start_seq) if start_seq < self.next_seq else self.size
        entries = self.offset_index.entries_array()
        for relative, position in zip(entries["relative_seq"].tolist(), entries["position"].tolist()):
            seq = self.base_seq + relative
            if seq > bounds[-1] and position - last_position >= piece_bytes:
                bounds.append(seq)
                last_position = position
        bounds.append(self.next_seq)
        return [(a, b) for a, b in zip(bounds, bounds[1:]) if a < b]

    def record_batches(self, start_seq: int, end_seq: int, batch_rows: int
                       ) -> Iterator[tuple[object, np.ndarray, np.ndarray]]:
        """(buffer, positions, headers) of at most batch_rows records at a time for seqs
        [start_seq, end_seq). The walk hops over lengths unverified and the headers are checked
        as a whole (``check_headers``); checksums are left to the caller, who verifies only the
        records it keeps (a time-window scan discards most of what it walks)."""
        end_seq = min(end_seq, self.next_seq)
        if start_seq >= end_seq:
            return
        position = self.position_of(start_seq)
        end = self.position_of(end_seq)
        seq = start_seq
        while position < end:
            view = self._view()
            positions = np.asarray(self._walk(position, end, verify=False, limit=batch_rows), dtype=np.int64)
            if positions[-1] + rf.HEADER_SIZE > end:
                raise CorruptFileError(f"{self.path}: invalid record at byte {positions[-1]}: runs past byte {end}")
            headers = rf.header_columns(view, positions)
            rf.check_headers(headers, positions, seq, self.path)
            yield view, positions, headers
            seq += len(positions)
            position = int(positions[-1]) + rf.LENGTH_SIZE + int(headers["length"][-1])

    # ---- durability and lifecycle ----------------------------------------------------------
    def flush(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()

    def close(self) -> None:
        """Trim the indexes (writer) and release files."""
        if self.writable:
            self.offset_index.close()
            self.time_index.close()
        else:
            self.offset_index.close_handler()
            self.time_index.close_handler()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._map = None

    def release(self) -> None:
        """Drop the file handle and mappings without writing, trimming or syncing anything:
        another writer may have changed these files since they were opened (the shard lock was
        released in between), so nothing of this stale view may be touched."""
        for index in ("offset_index", "time_index"):
            if hasattr(self, index):
                getattr(self, index).close_handler()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._map = None

    def files_match_mappings(self) -> bool:
        """True when the segment file and its sparse index files still have the lengths this
        view was opened with (a writer that closed meanwhile trims them: never write then)."""
        try:
            if os.path.getsize(self.path) != self.size:
                return False
            return all(os.path.getsize(index.path) == index.length for index in (self.offset_index, self.time_index))
        except FileNotFoundError:
            return False

    def delete(self) -> None:
        """Close and remove every file of this segment."""
        self.close()
        self.delete_files()

    def delete_files(self) -> None:
        """Remove this segment's files, the log last: a crash part-way leaves either a whole
        segment (whose missing indexes are rebuilt) or strays the next writer removes."""
        for path in (self.summary_path, self.time_index_path, self.index_path, self.path):
            path.unlink(missing_ok=True)
