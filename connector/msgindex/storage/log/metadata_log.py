"""The metadata log: a shard's commit log, a directory of segments named by base sequence number.

Every appended message gets the next sequence number; segments roll by size (or when a sparse
index fills, Kafka's rule), so the log is always the contiguous range [start_seq, next_seq).
Crash safety is split with the shard: ``position()`` is what the shard's checkpoint records at a
commit, and ``open(..., committed=position)`` / ``truncate_to(position)`` bring the files back to
exactly that state whatever a killed writer left behind. A reader opened with a committed
position sees exactly that prefix, takes no locks and writes nothing, so it never disturbs a
writer appending in another process.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import CorruptFileError, InvalidAppendError, InvalidOptionError
from msgindex.storage.durable import fsync_directory, is_temporary
from msgindex.storage.log import record_format as rf
from msgindex.storage.log.record_encoder import EncodedBatch, encode_batch
from msgindex.storage.log.record_encoder import records_from_table  # noqa: F401  (re-exported)
from msgindex.storage.log.segment import (
    LOG_SUFFIX,
    LogSegment,
    SegmentState,
    parse_segment_name,
)
from msgindex.storage.message import ROW_SCHEMA, MessageRecord

DEFAULT_MAX_INDEX_BYTES = 10 * 1024 * 1024  # Kafka's segment.index.bytes default
DEFAULT_SCAN_PIECE_BYTES = 64 * 1024 * 1024
MAX_SEGMENT_BYTES = 0x7FFF_FFFF  # offset-index positions are i32
MAX_RELATIVE_SEQ = 0x7FFF_FFFF  # sparse-index entries hold seqs relative to the segment base as i32


@dataclass(frozen=True, slots=True)
class LogPosition:
    """The log's extent at a commit: what a shard checkpoint records (JSON via to_dict).
    The active segment's index entry counts and time range travel with it, so that readers need
    not scan the active segment and a rollback restores it exactly."""

    next_seq: int
    segment_base: int
    segment_bytes: int
    offset_index_entries: int = 0
    time_index_entries: int = 0
    min_timestamp: int | None = None
    max_timestamp: int | None = None

    @classmethod
    def initial(cls) -> LogPosition:
        """The position of an empty log: rolling back to it empties the log."""
        return cls(0, 0, 0)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LogPosition:
        try:
            position = cls(**data)
        except TypeError as e:
            raise CorruptFileError(f"malformed log position {data!r}: {e}") from None
        for name, value in asdict(position).items():
            optional = name in ("min_timestamp", "max_timestamp")
            if not (isinstance(value, int) and not isinstance(value, bool)) and not (optional and value is None):
                raise CorruptFileError(f"malformed log position {data!r}: {name} must be an integer")
        if position.segment_base > position.next_seq or min(position.segment_base, position.segment_bytes) < 0:
            raise CorruptFileError(f"malformed log position {data!r}")
        return position

    def segment_state(self) -> SegmentState:
        return SegmentState(self.segment_bytes, self.next_seq, self.offset_index_entries,
                            self.time_index_entries, self.min_timestamp, self.max_timestamp)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment as listed by ``MetadataLog.segments()``."""

    base_seq: int
    next_seq: int
    size_bytes: int
    min_timestamp: int | None
    max_timestamp: int | None
    path: Path
    active: bool




class MetadataLog:
    """A directory of log segments (see the module docstring). Open with ``MetadataLog.open``."""

    def __init__(self, directory: Path, segment_bytes: int, index_interval_bytes: int,
                 max_index_bytes: int, writable: bool) -> None:
        if not 0 < segment_bytes <= MAX_SEGMENT_BYTES:
            raise InvalidOptionError(f"segment_bytes={segment_bytes} must be in [1, {MAX_SEGMENT_BYTES}]")
        if index_interval_bytes < 0:
            raise InvalidOptionError(f"index_interval_bytes={index_interval_bytes} must be >= 0")
        if max_index_bytes < 2 * 12:
            raise InvalidOptionError(f"max_index_bytes={max_index_bytes} must hold at least two time-index entries")
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.index_interval_bytes = index_interval_bytes
        self.max_index_bytes = max_index_bytes
        self.writable = writable
        self._segments: list[LogSegment] = []
        self._dir_dirty = False
        self._empty_next_seq = 0  # next_seq of a reader's log that has no segment

    # ---- opening -------------------------------------------------------------------------
    @classmethod
    def open(cls, directory: Path | str, *, segment_bytes: int, index_interval_bytes: int,
             max_index_bytes: int = DEFAULT_MAX_INDEX_BYTES, writable: bool,
             committed: LogPosition | None = None) -> MetadataLog:
        """Open the log in `directory` (a writer creates it). With `committed`, the log is cut
        to that position (a writer truncates the files, a reader just never reads further);
        without, every valid record is kept and a torn tail is dropped (Kafka-style recovery)."""
        log = cls(Path(directory), segment_bytes, index_interval_bytes, max_index_bytes, writable)
        if writable:
            log.directory.mkdir(parents=True, exist_ok=True)
            log._remove_strays()
        elif not log.directory.is_dir():
            if committed is not None and committed.next_seq > 0:
                raise CorruptFileError(f"{log.directory}: log directory does not exist")
            return log
        try:
            log._load(committed)
        except BaseException:
            log.close()
            raise
        return log

    def _kwargs(self) -> dict:
        return {"index_interval_bytes": self.index_interval_bytes, "max_index_bytes": self.max_index_bytes}

    def _bases_on_disk(self) -> list[int]:
        bases = (parse_segment_name(p.name) for p in self.directory.glob("*" + LOG_SUFFIX))
        return sorted(b for b in bases if b is not None)

    def _remove_strays(self) -> None:
        """Index/summary files without a log segment, and temporary files, left by a crash."""
        bases = set(self._bases_on_disk())
        for path in self.directory.iterdir():
            base = parse_segment_name(path.name)
            if (base is not None and base not in bases) or is_temporary(path.name):
                path.unlink()
                self._dir_dirty = True

    def _load(self, committed: LogPosition | None) -> None:
        bases = self._bases_on_disk()
        if committed is None:
            if bases:
                self._open_sealed(bases[:-1], bases[-1])
                self._segments.append(LogSegment.open_active(
                    self.directory, bases[-1], writable=self.writable, state=None, **self._kwargs()))
            elif self.writable:
                self._segments.append(self._create(0))
            return
        self._empty_next_seq = committed.next_seq
        if self.writable:
            for base in reversed([b for b in bases if b > committed.segment_base]):
                self._delete_files(base)
        bases = [b for b in bases if b <= committed.segment_base]
        if committed.segment_base in bases:
            self._open_sealed(bases[:-1], committed.segment_base)
            self._segments.append(LogSegment.open_active(
                self.directory, committed.segment_base, writable=self.writable,
                state=committed.segment_state(), **self._kwargs()))
        elif committed.next_seq == committed.segment_base and not committed.segment_bytes:
            # The committed active segment was empty and is gone (or was never created).
            self._open_sealed(bases, committed.segment_base)
            if self.writable:
                self._segments.append(self._create(committed.segment_base))
        else:
            raise CorruptFileError(
                f"{self.directory}: segment {committed.segment_base} of the committed position is missing"
            )

    def _open_sealed(self, bases: list[int], next_base: int) -> None:
        for base, following in zip(bases, bases[1:] + [next_base]):
            self._segments.append(LogSegment.open_sealed(
                self.directory, base, writable=self.writable, next_seq=following, **self._kwargs()))

    def _create(self, base_seq: int) -> LogSegment:
        self._dir_dirty = True
        return LogSegment.create(self.directory, base_seq, **self._kwargs())

    def _delete_files(self, base_seq: int) -> None:
        LogSegment(self.directory, base_seq, writable=True, **self._kwargs()).delete_files()
        self._dir_dirty = True

    # ---- extent ----------------------------------------------------------------------------
    @property
    def next_seq(self) -> int:
        """The sequence number the next appended record gets."""
        return self._segments[-1].next_seq if self._segments else self._empty_next_seq

    @property
    def start_seq(self) -> int:
        """The oldest sequence number still in the log (retention deletes from the start)."""
        return self._segments[0].base_seq if self._segments else self._empty_next_seq

    def position(self) -> LogPosition:
        """The current extent, for a checkpoint (call flush() first to make it durable)."""
        if not self._segments:
            return LogPosition.initial()
        active = self._segments[-1]
        state = active.state()
        return LogPosition(state.next_seq, active.base_seq, state.size_bytes, state.offset_index_entries,
                           state.time_index_entries, state.min_timestamp, state.max_timestamp)

    def segment(self, base_seq: int) -> LogSegment:
        """The open segment with `base_seq`, for tools that show its sparse indexes (inspect)."""
        for segment in self._segments:
            if segment.base_seq == base_seq:
                return segment
        raise KeyError(f"{self.directory}: no segment with base sequence {base_seq}")

    def segments(self) -> list[SegmentInfo]:
        return [
            SegmentInfo(s.base_seq, s.next_seq, s.size, s.min_timestamp, s.max_timestamp, s.path,
                        i == len(self._segments) - 1)
            for i, s in enumerate(self._segments)
        ]

    # ---- writing ---------------------------------------------------------------------------
    def _require_writable(self) -> None:
        if not self.writable:
            raise InvalidAppendError(f"{self.directory}: metadata log opened read-only")

    def append(self, records: Sequence[MessageRecord] | pa.Table | pa.RecordBatch) -> range:
        """Append `records` (MessageRecords, or Arrow with APPEND_SCHEMA's columns) with
        consecutive seqs; returns them. The whole batch is validated and encoded before the first
        byte is written, so a bad record leaves the log untouched."""
        self._require_writable()
        first = self.next_seq
        encoded = encode_batch(first, records)
        start = 0
        while start < len(encoded):
            active = self._segments[-1]
            count = self._fitting(active, encoded, start)
            if count == 0:
                self._roll()
                continue
            active.append(encoded.slice(start, start + count))
            start += count
        return range(first, self.next_seq)

    def _fitting(self, active: LogSegment, encoded: EncodedBatch, start: int) -> int:
        """How many of the records from `start` the active segment takes before it must roll
        (Kafka's shouldRoll per record: the size limit, a full sparse index, a relative seq
        overflow). Each record adds at most one entry to each index, hence the index room bound;
        an empty segment always takes a record, however big."""
        room = min(active.offset_index.max_entries - active.offset_index.entries,
                   active.time_index.max_entries - 1 - active.time_index.entries,
                   MAX_RELATIVE_SEQ - (active.next_seq - active.base_seq) + 1,
                   len(encoded) - start)
        ends = encoded.offsets[start + 1 : start + 1 + max(room, 0)] - encoded.offsets[start]
        count = int(np.searchsorted(ends, self.segment_bytes - active.size, side="right"))
        if active.size == 0 and room > 0:
            count = max(count, 1)
        return count

    def _roll(self) -> None:
        active = self._segments[-1]
        active.seal()
        self._segments.append(self._create(active.next_seq))

    def truncate_to(self, position: LogPosition) -> None:
        """Roll back to `position` (a committed one): drop newer segments, cut the segment it
        names and its sparse indexes to the committed size and entry counts."""
        self._require_writable()
        if position.next_seq > self.next_seq or position.segment_base < self.start_seq:
            raise InvalidOptionError(
                f"{self.directory}: cannot truncate to {position} (the log holds [{self.start_seq}, {self.next_seq}))"
            )
        while self._segments and self._segments[-1].base_seq > position.segment_base:
            self._segments.pop().delete()
            self._dir_dirty = True
        if self._segments and self._segments[-1].base_seq == position.segment_base:
            self._segments.pop().close()
        self._load_tail(position)

    def _load_tail(self, position: LogPosition) -> None:
        if position.segment_base in self._bases_on_disk():
            self._segments.append(LogSegment.open_active(
                self.directory, position.segment_base, writable=True, state=position.segment_state(),
                **self._kwargs()))
        elif position.next_seq == position.segment_base and not position.segment_bytes:
            self._segments.append(self._create(position.segment_base))
        else:
            raise CorruptFileError(f"{self.directory}: segment {position.segment_base} is missing")

    def flush(self) -> None:
        """Make everything appended durable: fsync the active segment and its indexes, and the
        directory when segments were created or deleted (sealed segments were synced on roll)."""
        self._require_writable()
        if self._segments:
            self._segments[-1].flush()
        if self._dir_dirty:
            fsync_directory(self.directory)
            self._dir_dirty = False

    def delete_segment(self, base_seq: int) -> None:
        """Retention: delete the oldest segment. Only the oldest can go (the log stays a
        contiguous seq range) and never the active one."""
        self._require_writable()
        if len(self._segments) < 2 or self._segments[0].base_seq != base_seq:
            raise InvalidOptionError(
                f"{self.directory}: segment {base_seq} is not the oldest inactive segment "
                f"(segments: {[s.base_seq for s in self._segments]})"
            )
        self._segments.pop(0).delete()
        self._dir_dirty = True

    # ---- reading ---------------------------------------------------------------------------
    def _segment_of(self, seq: int) -> LogSegment:
        if not self.start_seq <= seq < self.next_seq:
            raise IndexError(f"{self.directory}: sequence {seq} is not in the log [{self.start_seq}, {self.next_seq})")
        i = bisect.bisect_right([s.base_seq for s in self._segments], seq) - 1
        return self._segments[i]

    def read(self, seq: int) -> MessageRecord:
        """The record with sequence number `seq`."""
        return self._segment_of(seq).read(seq)

    def _grouped_positions(self, seqs: Sequence[int]) -> Iterator[tuple[LogSegment, np.ndarray, list[int]]]:
        """For sorted unique `seqs`: (segment, the seqs in it, their positions)."""
        bases = np.array([s.base_seq for s in self._segments], dtype=np.int64)
        seqs = np.asarray(seqs, dtype=np.int64)
        if len(seqs) and (seqs[0] < self.start_seq or seqs[-1] >= self.next_seq):
            bad = seqs[0] if seqs[0] < self.start_seq else seqs[-1]
            raise IndexError(f"{self.directory}: sequence {bad} is not in the log [{self.start_seq}, {self.next_seq})")
        owner = np.searchsorted(bases, seqs, side="right") - 1
        for i in np.unique(owner).tolist():
            mine = seqs[owner == i]
            segment = self._segments[i]
            yield segment, mine, segment.positions_of(mine.tolist())

    def read_many(self, seqs: Iterable[int]) -> list[MessageRecord]:
        """The records of `seqs`, in the order given; sorted access makes the hops amortised."""
        seqs = list(seqs)
        found: dict[int, MessageRecord] = {}
        for segment, mine, positions in self._grouped_positions(sorted(set(seqs))):
            view = segment._view()
            for seq, position in zip(mine.tolist(), positions):
                found[seq] = rf.decode_record(view, position, segment.size, segment.path)[1]
        return [found[s] for s in seqs]

    def read_rows(self, seqs: Iterable[int], broker: str) -> pa.RecordBatch:
        """The records of `seqs` as ROW_SCHEMA rows (checksums verified), in the order given."""
        seqs = np.fromiter(seqs, dtype=np.int64)
        unique, inverse = np.unique(seqs, return_inverse=True)
        batches = []
        for segment, mine, positions in self._grouped_positions(unique):
            view = segment._view()
            positions = np.asarray(positions, dtype=np.int64)
            headers = rf.header_columns(view, positions)
            rf.verify_checksums(view, positions, headers, segment.path)
            batches.append(rf.decode_batch(view, positions, broker, headers))
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=ROW_SCHEMA)
        table = pa.Table.from_batches(batches, schema=ROW_SCHEMA).take(pa.array(inverse))
        return table.combine_chunks().to_batches()[0] if table.num_rows else batches[0].slice(0, 0)

    def first_seq_at_or_after(self, timestamp_ms: int) -> int | None:
        """The first record in seq order whose timestamp is >= timestamp_ms, or None."""
        for segment in self._segments:
            found = segment.first_seq_at_or_after(timestamp_ms)
            if found is not None:
                return found
        return None

    def scan_ranges(self, begin_ms: int | None = None, end_ms: int | None = None, *,
                    piece_bytes: int = DEFAULT_SCAN_PIECE_BYTES) -> list[tuple[int, int]]:
        """[start_seq, end_seq) pieces that together hold every record with a timestamp in
        [begin_ms, end_ms]: segments whose time range misses the window are skipped, the scan of
        a segment starts at its time index entry for begin_ms, and big segments are cut into
        pieces of about piece_bytes at offset-index entries (partitions for a parallel scan)."""
        ranges: list[tuple[int, int]] = []
        for segment in self._segments:
            if segment.min_timestamp is None:
                continue
            if (begin_ms is not None and segment.max_timestamp < begin_ms) or (
                end_ms is not None and segment.min_timestamp > end_ms
            ):
                continue
            ranges.extend(segment.piece_bounds(segment.scan_start(begin_ms), piece_bytes))
        return ranges

    def scan_range(self, start_seq: int, end_seq: int, broker: str, begin_ms: int | None = None,
                   end_ms: int | None = None, batch_rows: int = 65536, *, topics: Iterable[str] | None = None,
                   partitions: Iterable[int] | None = None, verify: bool = True) -> Iterator[pa.RecordBatch]:
        """ROW_SCHEMA batches of the records in [start_seq, end_seq) whose timestamp is in
        [begin_ms, end_ms] (inclusive, ms) and, when given, whose topic / partition is listed.
        Checksums are verified unless `verify` is False. Empty batches are not yielded."""
        start_seq = max(start_seq, self.start_seq)
        end_seq = min(end_seq, self.next_seq)
        wanted_topics = None if topics is None else pa.array(sorted(set(topics)), pa.string())
        wanted_partitions = None if partitions is None else np.array(sorted(set(partitions)), dtype=np.int64)
        for segment in self._segments:
            if segment.next_seq <= start_seq or segment.base_seq >= end_seq:
                continue
            if segment.min_timestamp is not None and (
                (begin_ms is not None and segment.max_timestamp < begin_ms)
                or (end_ms is not None and segment.min_timestamp > end_ms)
            ):
                continue
            lo, hi = max(start_seq, segment.base_seq), min(end_seq, segment.next_seq)
            for view, positions, headers in segment.record_batches(lo, hi, batch_rows):
                batch = self._filtered_batch(view, positions, headers, broker, begin_ms, end_ms,
                                             wanted_partitions, wanted_topics, segment.path if verify else None)
                if batch.num_rows:
                    yield batch

    @staticmethod
    def _filtered_batch(view, positions: np.ndarray, headers: np.ndarray, broker: str, begin_ms: int | None,
                        end_ms: int | None, partitions: np.ndarray | None, topics: pa.Array | None,
                        verify_name: Path | None) -> pa.RecordBatch:
        # Header-level filters run first: only the records kept are checksummed and decoded.
        keep = np.ones(len(positions), dtype=bool)
        if begin_ms is not None:
            keep &= headers["timestamp_ms"] >= begin_ms
        if end_ms is not None:
            keep &= headers["timestamp_ms"] <= end_ms
        if partitions is not None:
            keep &= np.isin(headers["partition"].astype(np.int64), partitions)
        if not keep.all():
            positions, headers = positions[keep], headers[keep]
        if verify_name is not None:
            rf.verify_checksums(view, positions, headers, verify_name)
        batch = rf.decode_batch(view, positions, broker, headers)
        if topics is not None and batch.num_rows:
            batch = batch.filter(pc.is_in(batch.column("topic"), value_set=topics))
        return batch

    # ---- lifecycle -------------------------------------------------------------------------
    def unchanged_on_disk(self, position: LogPosition) -> bool:
        """True when the files still are exactly what this writer's view of `position` (its own
        last commit) says: no segment past the active one, the active segment and its sparse
        indexes at the lengths this view has them. False after another writer appended, rolled
        or closed (trimmed) meanwhile, or died mid-append: the view must then be released and
        the log reopened."""
        if not self._segments or self.position() != position:
            return False
        active = self._segments[-1]
        return active.files_match_mappings() and max(self._bases_on_disk(), default=-1) == active.base_seq

    def release(self) -> None:
        """Forget every file without writing anything (see ``LogSegment.release``): for a writer
        whose view went stale while another process held the shard."""
        for segment in self._segments:
            segment.release()
        self._segments = []

    def close(self) -> None:
        """Release every file (a writer's active indexes are trimmed, as Kafka does on close)."""
        for segment in self._segments:
            segment.close()
        self._segments = []

    def __enter__(self) -> MetadataLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
