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
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa

from msgindex.errors import (
    CorruptFileError,
    ForeignCheckpointError,
    InvalidAppendError,
    InvalidOptionError,
    OutOfRangeError,
    UpgradeRequiredError,
)
from msgindex.storage.durable import fsync_directory, is_temporary
from msgindex.storage.int_limits import INT32_MAX
from msgindex.storage.log import batch_format as bf
from msgindex.storage.log.columns import (
    LogColumns,
    records_from_table,  # noqa: F401  (re-exported)
)
from msgindex.storage.log.segment import (
    LOG_SUFFIX,
    BatchDirectory,
    BatchReads,
    LogSegment,
    SegmentState,
    parse_segment_name,
    segment_name,
)
from msgindex.storage.message import MessageRecord, encode_text

LEGACY_LOG_FORMAT = 1  # row-per-record segments, read only by `msgindex upgrade` (log/v1_records.py)
DEFAULT_MAX_INDEX_BYTES = 10 * 1024 * 1024  # Kafka's segment.index.bytes default
DEFAULT_SCAN_PIECE_BYTES = 64 * 1024 * 1024
# Records per batch: a point read decodes one whole batch, a scan pays a fixed cost per batch, and
# small batches compress worse. 4,096 keeps a batch decode near 0.1-0.2 ms at ~11 B/record
# (measurements in BENCHMARKS.md).
DEFAULT_BATCH_RECORDS = 4096
# up to this many records, reading them one by one (``read_few``) costs less than ``gather`` on
# every log (local, object store; shard.FEW_CANDIDATES measured where they part)
FEW_RECORDS = 64
# Up to this many records, a local log's ``chunks`` reads them with the compiled record reader as
# columns (``bf.RecordColumns``: one call keeps only the wanted rows of each block) instead of
# decoding BlockSets of their whole blocks on the reading threads. 500k long-key records, 2 cores:
# keys of 300-4,000 records 0.75x the CPU; 300-7,000 keys in one lookup (819-41,146 rows) 0.6-0.9x
# the wall time; peak memory lower. Above it, BlockSets a chunk at a time: a hot key's rows are
# never all held at once, and two threads decode.
COMPILED_COLUMNS_RECORDS = 65536
# ... when they are scattered: spread over at least this many times their count of seqs. Dense
# runs (a hot-key copy's stretch, a range read) keep BlockSets, whose two threads decode whole
# blocks of wanted rows; only scattered reads were measured on the compiled reader.
SCATTERED_SPAN = 4
MAX_SEGMENT_BYTES = INT32_MAX  # offset-index positions are i32
MAX_RELATIVE_SEQ = INT32_MAX  # sparse-index entries hold seqs relative to the segment base as i32


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
    log_format: int = bf.LOG_FORMAT  # positions recorded before format 2 lack it: read as 1

    @classmethod
    def initial(cls) -> LogPosition:
        """The position of an empty log: rolling back to it empties the log."""
        return cls(0, 0, 0)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LogPosition:
        try:
            position = cls(**{"log_format": LEGACY_LOG_FORMAT, **data})
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




class LogReads:
    """The read paths of a metadata log over its segments, wherever their bytes live: local
    segment files (``MetadataLog``) or the chunks of an object-store shard (``storage/objects``).
    A subclass keeps ``_segments`` (``BatchReads``, in seq order, contiguous), ``start_seq``,
    ``next_seq`` and ``directory`` (what errors name)."""

    directory: Path | str
    _segments: list[BatchReads]

    @property
    def next_seq(self) -> int:
        raise NotImplementedError

    @property
    def start_seq(self) -> int:
        raise NotImplementedError

    # ---- reading ---------------------------------------------------------------------------
    def _segment_of(self, seq: int) -> BatchReads:
        if not self.start_seq <= seq < self.next_seq:
            raise OutOfRangeError(f"{self.directory}: sequence {seq} is not in the log [{self.start_seq}, {self.next_seq})")
        i = bisect.bisect_right([s.base_seq for s in self._segments], seq) - 1
        return self._segments[i]

    def read(self, seq: int) -> MessageRecord:
        """The record with sequence number `seq`."""
        return self.read_few([seq])[0]

    def chunks(self, seqs: np.ndarray, work: Callable[[int, bf.SelectedRecords], R]) -> Iterator[R]:
        """work(first, records) for the records of sorted unique `seqs`, a chunk of blocks (about
        READ_CHUNK_RECORDS records) at a time, in order: `first` is the position in `seqs` of the
        chunk's first record. Each block holding some of them is read once (checksum verified).
        Chunks are read, decoded and worked on by a thread pool, a few ahead of the caller: a
        caller keeping only some records of each chunk never holds the blocks of all of them, and
        the work (numpy, Arrow, LZ4: mostly outside the GIL) runs on every core."""
        seqs = np.asarray(seqs, dtype=np.int64)
        if not len(seqs):
            return
        if seqs[0] < self.start_seq or seqs[-1] >= self.next_seq:
            bad = seqs[0] if seqs[0] < self.start_seq else seqs[-1]
            raise OutOfRangeError(f"{self.directory}: sequence {bad} is not in the log [{self.start_seq}, {self.next_seq})")
        bases = np.array([s.base_seq for s in self._segments[1:]], dtype=np.int64)
        cuts = np.searchsorted(seqs, bases).tolist()  # seqs of segment i: [cuts[i - 1], cuts[i])
        tasks = []  # (segment, directory, blocks to read, their seqs' positions in `seqs`, their first seqs)
        for segment, start, stop in zip(self._segments, [0, *cuts], [*cuts, len(seqs)]):
            if start == stop:
                continue
            directory = segment.batches()
            # planned per block, not per seq: a hot key has millions of seqs in thousands of blocks
            firsts = start + np.searchsorted(seqs[start:stop], directory.block_base_seqs)
            ends = np.append(firsts[1:], stop)
            touched = np.flatnonzero(ends > firsts)
            # about READ_CHUNK_RECORDS wanted records a chunk: cache-sized arrays for a hot key's
            # dense blocks, few chunks (each has a fixed cost) for scattered keys
            per_chunk = max(1, min(READ_CHUNK_BLOCKS, READ_CHUNK_RECORDS * len(touched) // (stop - start)))
            for piece in range(0, len(touched), per_chunk):
                blocks = touched[piece : piece + per_chunk]
                tasks.append((segment, directory, blocks, firsts[blocks], ends[blocks]))

        def read(task: tuple[BatchReads, BatchDirectory, np.ndarray, np.ndarray, np.ndarray]) -> R:
            segment, directory, blocks, firsts, ends = task
            block = np.repeat(np.arange(len(blocks)), ends - firsts)
            row = seqs[firsts[0] : ends[-1]] - directory.block_base_seqs[blocks][block]
            return work(int(firsts[0]), segment.block_set(blocks, directory).select(block, row))

        yield from self._in_order(read, tasks)

    def _in_order(self, work: Callable[[T], R], tasks: list[T]) -> Iterator[R]:
        """How ``chunks`` runs its tasks (``in_order``: a few ahead on the CPU pool); a log whose
        reads wait on the network runs them all at once."""
        return in_order(work, tasks)

    def read_few(self, seqs: Sequence[int]) -> list[MessageRecord]:
        """The records of a few sorted unique `seqs`, read record by record (``read_few_raw``):
        cheaper than ``gather`` up to ~70-110 scattered records (shard.FEW_CANDIDATES), dearer above."""
        return self.read_few_raw(seqs).messages()

    def read_few_raw(self, seqs: Sequence[int]) -> bf.RawRecords:
        """``read_few``'s records before they are MessageRecords, read record by record
        (``BlockRecords``): what a lookup verifies and renders without a Python object per record."""
        seqs = list(seqs)
        plan = []  # (segment, directory, the segment's seqs, their blocks), a segment at a time
        done = 0
        while done < len(seqs):  # numpy finds the blocks of all of a segment's seqs at once
            segment = self._segment_of(seqs[done])
            end = bisect.bisect_left(seqs, segment.next_seq, done)
            directory = segment.batches()
            plan.append((segment, directory, seqs[done:end], directory.block_of(np.array(seqs[done:end], np.int64))))
            done = end
        ints: list[tuple[int, ...]] = []
        texts: list[list[bytes]] = []
        tables: list[tuple[bytes, ...]] = []
        for (segment, directory, segment_seqs, blocks), raw in zip(plan, self._blocks_for_few(plan)):
            reader, last = None, -1
            for seq, block, block_base in zip(segment_seqs, blocks.tolist(), directory.block_base_seqs[blocks].tolist()):
                if block != last:  # seqs are sorted: a block's records come together
                    batch = directory.block_batches[block].item()
                    table = directory.topic_tables[batch]
                    reader, last = bf.BlockRecords(raw(block), table, segment.path, directory.positions[batch].item()), block
                fields, record_texts = reader.raw_record(seq - block_base)
                ints.append(fields)
                texts.append(record_texts)
                tables.append(table)
        return bf.raw_records(ints, texts, tables)

    def read_few_packed(self, seqs: Sequence[int]) -> bf.PackedRecords | None:
        """``read_few_raw``'s records as the compiled reader gives them (PackedRecords), or None
        where it does not read them: here (blocks that come by requests) and in a log on disk
        without the compiled reader, or whose `seqs` lie in several segments."""
        return None

    def _blocks_for_few(self, plan: list) -> Iterator[Callable[[int], bytes]]:
        """Per planned segment, a function from a block number to its decompressed bytes. Here
        each block is read when asked (a pread is cheap); a log whose reads are requests
        (object stores) fetches every planned block up front, together."""
        for segment, directory, _seqs, _blocks in plan:
            yield lambda block, segment=segment, directory=directory: segment.read_block(block, directory)

    def gather(self, seqs: np.ndarray) -> bf.DecodedRows:
        """The records of sorted unique `seqs`, in that order (see ``chunks``)."""
        return bf.concat_rows(list(self.chunks(seqs, lambda _, records: records.rows())))

    def block_crcs(self, start_seq: int, end_seq: int) -> np.ndarray:
        """The checksums (uint32, in log order) of the blocks holding the records [start_seq,
        end_seq): a fingerprint of exactly those bytes, from the batch heads (no block is read)."""
        crcs = []
        for segment in self._segments:
            if segment.next_seq <= start_seq or segment.base_seq >= end_seq:
                continue
            directory = segment.batches()
            block_ends = directory.block_base_seqs + directory.block_counts
            wanted = (directory.block_base_seqs < end_seq) & (block_ends > start_seq)
            crcs.append(directory.block_crcs[wanted].astype(np.uint32))
        return np.concatenate(crcs) if crcs else np.zeros(0, np.uint32)

    def read_many(self, seqs: Iterable[int]) -> list[MessageRecord]:
        """The records of `seqs`, in the order given."""
        seqs = np.fromiter(seqs, dtype=np.int64)
        unique, inverse = np.unique(seqs, return_inverse=True)
        found = bf.records(self.gather(unique))
        return [found[i] for i in inverse.tolist()]

    def field_columns(self, seqs: np.ndarray, fields: Sequence[tuple[str, str, str]]) -> list[pa.Array]:
        """``bf.field_columns`` of the records of `seqs` (any order, repeats allowed), in that order.
        A few records are read one by one (``read_few``: decompressing their whole blocks cost a
        40-row lookup 30 ms, 2.5x the lookup itself)."""
        unique, inverse = np.unique(np.asarray(seqs, dtype=np.int64), return_inverse=True)
        if len(unique) <= FEW_RECORDS:
            columns = bf.record_field_columns(self.read_few(unique.tolist()), fields)
        else:
            columns = bf.field_columns(self.gather(unique).keys, fields)
        at = pa.array(inverse.astype(np.int64))
        return [column.take(at) for column in columns]

    def read_rows(self, seqs: Iterable[int], broker: str) -> pa.RecordBatch:
        """The records of `seqs` as ROW_SCHEMA rows (checksums verified), in the order given."""
        seqs = np.fromiter(seqs, dtype=np.int64)
        unique, inverse = np.unique(seqs, return_inverse=True)
        return bf.rows(self.gather(unique), broker, inverse)

    def first_seq_at_or_after(self, timestamp_ms: int) -> int | None:
        """The first record in seq order whose timestamp is >= timestamp_ms, or None: the first
        batch whose max reaches it holds it."""
        for segment in self._segments:
            if segment.max_timestamp is None or segment.max_timestamp < timestamp_ms:
                continue
            directory = segment.batches()
            reaching = np.flatnonzero(directory.max_timestamps >= timestamp_ms)
            if len(reaching):
                i = int(reaching[0])
                blocks = np.arange(directory.first_blocks[i], directory.first_blocks[i + 1])
                block_set = segment.block_set(blocks, directory)
                records = block_set.select(*block_set.all_rows())
                return int(directory.base_seqs[i]) + int(np.argmax(records.timestamp_ms >= timestamp_ms))
        return None

    def scan_ranges(self, begin_ms: int | None = None, end_ms: int | None = None, *,
                    piece_bytes: int = DEFAULT_SCAN_PIECE_BYTES) -> list[tuple[int, int]]:
        """[start_seq, end_seq) pieces that together hold every record with a timestamp in
        [begin_ms, end_ms]: segments whose time range misses the window are skipped, and so are
        the leading and trailing batches of a segment that miss it; pieces of about piece_bytes
        are cut at batch boundaries (partitions for a parallel scan)."""
        ranges: list[tuple[int, int]] = []
        for segment in self._segments:
            if segment.min_timestamp is None or not _overlaps(segment.min_timestamp, segment.max_timestamp,
                                                              begin_ms, end_ms):
                continue
            ranges.extend(segment.piece_bounds(segment.base_seq, piece_bytes, begin_ms, end_ms))
        return ranges

    def scan_range(self, start_seq: int, end_seq: int, broker: str, begin_ms: int | None = None,
                   end_ms: int | None = None, batch_rows: int = 65536, *, topics: Iterable[str] | None = None,
                   partitions: Iterable[int] | None = None, verify: bool = True,
                   fields: Sequence[tuple[str, str, str]] = ()) -> Iterator[pa.RecordBatch]:
        """ROW_SCHEMA batches (with the columns of `fields`: ``bf.rows``) of the records in
        [start_seq, end_seq) whose timestamp is in [begin_ms, end_ms] (inclusive, ms) and, when
        given, whose topic / partition is listed.
        Batches whose time range misses the window are never read; the others are read about
        `batch_rows` records at a time and filtered with numpy kernels. Checksums are always
        verified (`verify` is kept for callers). Empty batches are not yielded."""
        start_seq = max(start_seq, self.start_seq)
        end_seq = min(end_seq, self.next_seq)
        wanted_topics = None if topics is None else {encode_text(t) for t in topics}
        wanted_partitions = None if partitions is None else np.array(sorted(set(partitions)), dtype=np.int64)
        for segment in self._segments:
            if segment.next_seq <= start_seq or segment.base_seq >= end_seq:
                continue
            if segment.min_timestamp is not None and not _overlaps(segment.min_timestamp, segment.max_timestamp,
                                                                   begin_ms, end_ms):
                continue
            directory = segment.batches()
            first, last = segment.batch_range(max(start_seq, segment.base_seq), min(end_seq, segment.next_seq))
            batches = np.arange(first, last)
            overlap = np.ones(len(batches), dtype=bool)
            if begin_ms is not None:
                overlap &= directory.max_timestamps[batches] >= begin_ms
            if end_ms is not None:
                overlap &= directory.min_timestamps[batches] <= end_ms
            batches = batches[overlap]
            # pieces of about batch_rows records, cut at batch boundaries
            piece_of = np.cumsum(directory.counts[batches]) // max(batch_rows, 1)
            for piece in np.split(batches, np.flatnonzero(np.diff(piece_of)) + 1) if len(batches) else ():
                touched = np.concatenate([np.arange(directory.first_blocks[i], directory.first_blocks[i + 1])
                                          for i in piece.tolist()])
                block_set = segment.block_set(touched, directory)
                records = block_set.select(*block_set.all_rows())
                keep = _window_mask(records, start_seq, end_seq, begin_ms, end_ms, wanted_partitions, wanted_topics)
                if keep is None:
                    yield bf.rows(records.rows(), broker, fields=fields)
                elif keep.any():  # only the records kept get their texts decoded
                    yield bf.rows(records.rows(np.flatnonzero(keep)), broker, fields=fields)

    # ---- annotations ---------------------------------------------------------------------------
    def annotations(self) -> Iterator[tuple[int, bytes]]:
        """(base seq, annotation) of every batch that carries one, in log order."""
        for segment in self._segments:
            directory = segment.batches()
            for i in range(len(directory)):
                annotation = segment.annotation(i)
                if annotation:
                    yield int(directory.base_seqs[i]), annotation

    def last_annotation(self) -> bytes:
        """The annotation of the log's last batch (b"" when it has none or the log is empty)."""
        for segment in reversed(self._segments):
            directory = segment.batches()
            if len(directory):
                return segment.annotation(len(directory) - 1)
        return b""

    # ---- lifecycle -------------------------------------------------------------------------


class MetadataLog(LogReads):
    """A directory of log segments (see the module docstring). Open with ``MetadataLog.open``."""

    def __init__(self, directory: Path, segment_bytes: int, index_interval_bytes: int,
                 max_index_bytes: int, writable: bool, batch_records: int = DEFAULT_BATCH_RECORDS,
                 block_records: int = bf.DEFAULT_BLOCK_RECORDS) -> None:
        if not 0 < segment_bytes <= MAX_SEGMENT_BYTES:
            raise InvalidOptionError(f"segment_bytes={segment_bytes} must be in [1, {MAX_SEGMENT_BYTES}]")
        if index_interval_bytes < 0:
            raise InvalidOptionError(f"index_interval_bytes={index_interval_bytes} must be >= 0")
        if max_index_bytes < 2 * 12:
            raise InvalidOptionError(f"max_index_bytes={max_index_bytes} must hold at least two time-index entries")
        if batch_records < 1:
            raise InvalidOptionError(f"batch_records={batch_records} must be >= 1")
        if block_records < 1 or -(-batch_records // block_records) > bf.MAX_BLOCKS:
            raise InvalidOptionError(f"block_records={block_records} must be >= 1 and cut a batch of "
                                     f"{batch_records} records into at most {bf.MAX_BLOCKS} blocks")
        self.batch_records = batch_records
        self.block_records = block_records
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.index_interval_bytes = index_interval_bytes
        self.max_index_bytes = max_index_bytes
        self.writable = writable
        self._segments: list[LogSegment] = []
        self._dir_dirty = False
        self._empty_next_seq = 0  # next_seq of a reader's log that has no segment
        self._retained_from = 0  # see open()

    # ---- opening -------------------------------------------------------------------------
    @classmethod
    def open(cls, directory: Path | str, *, segment_bytes: int, index_interval_bytes: int,
             max_index_bytes: int = DEFAULT_MAX_INDEX_BYTES, writable: bool,
             committed: LogPosition | None = None, batch_records: int = DEFAULT_BATCH_RECORDS,
             block_records: int = bf.DEFAULT_BLOCK_RECORDS, retained_from: int = 0) -> MetadataLog:
        """Open the log in `directory` (a writer creates it). With `committed`, the log is cut
        to that position (a writer truncates the files, a reader just never reads further);
        without, every valid record is kept and a torn tail is dropped (Kafka-style recovery).
        A reader given `retained_from` (the checkpoint's log start) does not open the sealed
        segments wholly below it: retention committed their removal and may be deleting them
        at this moment, so finding one gone is no damage."""
        log = cls(Path(directory), segment_bytes, index_interval_bytes, max_index_bytes, writable, batch_records,
                  block_records)
        log._retained_from = 0 if writable else retained_from
        if writable:
            log.directory.mkdir(parents=True, exist_ok=True)
            log._remove_strays(committed)
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

    def _remove_strays(self, committed: LogPosition | None) -> None:
        """Index/summary files without a log segment, and temporary files, left by a crash.
        Only past the committed position (or past the last segment, with none): the sidecars of
        a committed segment that is gone stay, since a crash never removes a committed segment;
        it was deleted by hand, and the open that follows says so naming it."""
        bases = set(self._bases_on_disk())
        last_kept = committed.segment_base if committed is not None else max(bases, default=-1)
        for path in self.directory.iterdir():
            base = parse_segment_name(path.name)
            if (base is not None and base not in bases and base > last_kept) or is_temporary(path.name):
                path.unlink()
                self._dir_dirty = True

    def _check_commit_fits(self, committed: LogPosition, bases: list[int]) -> None:
        """ForeignCheckpointError, before anything is deleted, when the committed position cannot be
        one of this log's: its active segment would start inside another segment (segments hold
        consecutive seqs from their base to the next one's), or a segment starts inside its
        committed range. A writer would otherwise delete the segments "past" it: committed data."""
        base, end = committed.segment_base, committed.next_seq
        inside = [b for b in bases if base < b < end]
        if base not in bases and end > base:  # (an empty committed active segment may be gone: _load)
            before = [b for b in bases if b < base]
            after = [b for b in bases if b > base]
            inside += [before[-1]] if before and after and after[0] > base else []
            if before and not after and self._segment_end(before[-1]) > base:
                inside.append(before[-1])  # the last segment holds the seqs the commit says start a segment
        if inside:
            checkpoint = self.directory.parent / "checkpoint"
            raise ForeignCheckpointError(
                f"{checkpoint}: commits records {base}..{end - 1} in a segment starting at {base}, but segment "
                f"{segment_name(inside[0])}{LOG_SUFFIX} overlaps them: the checkpoint was not made for this log "
                f"(another shard's, or an old copy); `msgindex repair` rebuilds it from the shard's files")

    def _segment_end(self, base: int) -> int:
        """The next seq after segment `base`'s valid batches (read-only; -1 when it cannot be read):
        only on the way to an error, it may read the whole segment."""
        try:
            segment = LogSegment.open_active(self.directory, base, writable=False, state=None, **self._kwargs())
        except CorruptFileError:
            return -1
        try:
            return segment.next_seq
        finally:
            segment.close()

    def _load(self, committed: LogPosition | None) -> None:
        if committed is not None and committed.log_format != bf.LOG_FORMAT:
            raise UpgradeRequiredError(
                f"{self.directory}: the committed log is in format {committed.log_format}; this msgindex reads "
                f"format {bf.LOG_FORMAT}: run `msgindex upgrade` on the store"
            )
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
        self._check_commit_fits(committed, bases)
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
                f"{self.directory / (segment_name(committed.segment_base) + LOG_SUFFIX)}: log segment "
                f"{committed.segment_base} of the committed position is missing"
            )

    def _open_sealed(self, bases: list[int], next_base: int) -> None:
        for base, following in zip(bases, bases[1:] + [next_base]):
            if following <= self._retained_from:
                continue
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
        raise OutOfRangeError(f"{self.directory}: no segment with base sequence {base_seq}")

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

    def append(self, records: Sequence[MessageRecord] | pa.Table | pa.RecordBatch | LogColumns, *,
               annotation: bytes = b"") -> range:
        """Append `records` (MessageRecords, Arrow with APPEND_SCHEMA's columns, or LogColumns)
        with consecutive seqs, as batches of at most batch_records; returns their seqs.
        `annotation` (opaque bytes, e.g. a writer's commit note) is stored in the header of the
        LAST batch written (``last_annotation``). Everything is validated and encoded before the
        first byte is written, so a bad record leaves the log untouched."""
        self._require_writable()
        if not isinstance(annotation, (bytes, bytearray)):
            raise InvalidAppendError(f"annotation must be bytes, got {type(annotation).__name__}")
        columns = LogColumns.of(records)
        first = self.next_seq
        count = len(columns)
        if count == 0:
            if annotation:
                raise InvalidAppendError("an annotation needs at least one record to ride on")
            return range(first, first)
        if first + count - 1 > bf.INT64_MAX:
            raise InvalidAppendError(f"sequence numbers {first}.. of a {count}-record batch do not fit in int64")
        starts = list(range(0, count, self.batch_records))
        encoded = [bf.encode_batch(first + start, columns.slice(start, min(start + self.batch_records, count)),
                                   bytes(annotation) if start == starts[-1] else b"", self.block_records)
                   for start in starts]
        for data in encoded:
            head = bf.check_head(data, 0, len(data))
            header = head.header
            active = self._segments[-1]
            if active.size and (active.size + len(data) > self.segment_bytes or active.room() < 1
                                or header.last_seq - active.base_seq > MAX_RELATIVE_SEQ):
                self._roll()
                active = self._segments[-1]
            active.append(data, head)
        return range(first, self.next_seq)

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

    def chunks(self, seqs: np.ndarray, work: Callable[[int, bf.SelectedRecords], R]) -> Iterator[R]:
        """``LogReads.chunks``; up to COMPILED_COLUMNS_RECORDS scattered records, each segment's
        are read by one compiled call (``LogSegment.columns_at``: no BlockSet over their whole
        blocks, no thread hand-off), in the caller's thread."""
        seqs = np.asarray(seqs, dtype=np.int64)
        scattered = len(seqs) and int(seqs[-1]) - int(seqs[0]) >= SCATTERED_SPAN * len(seqs)
        if bf.compiled_blocks is None or len(seqs) > COMPILED_COLUMNS_RECORDS or not scattered:
            yield from super().chunks(seqs, work)
            return
        done = 0
        while done < len(seqs):
            segment = self._segment_of(int(seqs[done]))  # (OutOfRangeError for a seq outside the log)
            end = int(np.searchsorted(seqs, segment.next_seq))
            yield work(done, segment.columns_at(seqs[done:end]))
            done = end

    def read_few_raw(self, seqs: Sequence[int]) -> bf.RawRecords:
        """``LogReads.read_few_raw`` for segments on disk: each segment's records by
        ``LogSegment.raw_records_at`` (one compiled call reads, checks and decodes their blocks
        with no numpy or Arrow per record; ``LogReads.read_few_raw`` is its oracle): cheaper than
        ``gather`` up to ~250-400 scattered records (shard.FEW_CANDIDATES), dearer above (``chunks``'
        compiled columns)."""
        return bf.RawRecords.concat([segment.raw_records_at(at) for segment, at in self._by_segment(seqs)])

    def read_few_packed(self, seqs: Sequence[int]) -> bf.PackedRecords | None:
        """``LogReads.read_few_packed`` for segments on disk: each segment's records in one
        compiled call (``LogSegment.packed_records_at``), joined (a key's records lie in every
        segment its producers wrote to while the log rolled)."""
        if bf.compiled_blocks is None or not len(seqs):
            return None
        return bf.PackedRecords.concat([segment.packed_records_at(at) for segment, at in self._by_segment(seqs)])

    def _by_segment(self, seqs: Sequence[int] | np.ndarray) -> Iterator[tuple[LogSegment, np.ndarray]]:
        """Sorted `seqs` a segment at a time (numpy then finds the blocks of all of a segment's
        seqs at once): each segment and its seqs, as int64."""
        seqs = np.asarray(seqs, dtype=np.int64)
        done = 0
        while done < len(seqs):
            segment = self._segment_of(int(seqs[done]))
            end = int(seqs.searchsorted(segment.next_seq)) if seqs[-1] >= segment.next_seq else len(seqs)
            yield segment, seqs[done:end]
            done = end

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


def _overlaps(low: int, high: int, begin_ms: int | None, end_ms: int | None) -> bool:
    return (begin_ms is None or high >= begin_ms) and (end_ms is None or low <= end_ms)


def _window_mask(records: bf.SelectedRecords, start_seq: int, end_seq: int, begin_ms: int | None, end_ms: int | None,
                 partitions: np.ndarray | None, topics: set[bytes] | None) -> np.ndarray | None:
    """Which records lie in the seq range, the time window and the filters (None: all of them)."""
    keep = None

    def narrow(mask: np.ndarray) -> None:
        nonlocal keep
        keep = mask if keep is None else keep & mask

    seqs = records.seqs
    if len(seqs) and (seqs[0] < start_seq or seqs[-1] >= end_seq):
        narrow((seqs >= start_seq) & (seqs < end_seq))
    if begin_ms is not None:
        narrow(records.timestamp_ms >= begin_ms)
    if end_ms is not None:
        narrow(records.timestamp_ms <= end_ms)
    if partitions is not None:
        narrow(np.isin(records.partition, partitions))
    if topics is not None:
        wanted = np.array([i for i, topic in enumerate(records.topics) if topic in topics], dtype=np.int64)
        narrow(np.isin(records.topic_ids, wanted))
    if keep is not None and keep.all():
        return None
    return keep


# Reading a block (pread, CRC, LZ4) runs outside the GIL, so a read touching many blocks reads
# them on every core, as DuckDB scans Parquet on every core. Chunks of about READ_CHUNK_RECORDS
# wanted records keep every array a read builds small enough to stay in the CPU's caches.
READ_CHUNK_RECORDS = 24_576
READ_CHUNK_BLOCKS = 4096
READ_AHEAD_CHUNKS = 4
PARALLEL_MIN_CHUNKS = 16
CPUS = os.cpu_count() or 1
T = TypeVar("T")
R = TypeVar("R")
_POOL: ThreadPoolExecutor | None = None


def in_order(work: Callable[[T], R], tasks: list[T]) -> Iterator[R]:
    """work(task) of each task, in order; with many, up to READ_AHEAD_CHUNKS run ahead on a
    thread pool while the caller consumes the results (fewer run inline: the GIL hand-offs of
    many short C calls cost more than a second core gives them, measured on 2 cores)."""
    if len(tasks) < PARALLEL_MIN_CHUNKS or CPUS < 2:
        yield from map(work, tasks)
        return
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=CPUS, thread_name_prefix="msgindex-read")
    pending: deque[Future] = deque(_POOL.submit(work, task) for task in tasks[:READ_AHEAD_CHUNKS])
    following = iter(tasks[READ_AHEAD_CHUNKS:])
    while pending:
        result = pending.popleft().result()
        task = next(following, None)
        if task is not None:
            pending.append(_POOL.submit(work, task))
        yield result
