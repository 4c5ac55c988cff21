"""One metadata-log segment: ``<20-digit base seq>.log`` (record batches, ``batch_format``) with
its Kafka-format ``.index`` and ``.timeindex`` (and, once sealed, a ``.summary``).

Index entries follow Kafka's LogSegment.append rule, batch by batch, one state machine for appends
and rebuilds alike: the running maximum timestamp is raised by a batch's max (with the batch's last
seq); when more than ``index_interval_bytes`` were written since the last entry, the batch gets an
offset-index entry (its LAST seq, its position: Kafka maps a batch's last offset to its start) and
the time index gets the running maximum. Because the rule only depends on the batches, rebuilding
a lost index gives the very entries the writer appended, and a checkpoint can record entry counts
that stay true across rebuilds.

Every batch's (position, base seq, count, min/max timestamp) and every block's (base seq,
position, lengths, checksum) and the batches' topic tables are the segment's batch directory, kept
in memory: a writer extends it as it appends; a reader builds it once, lazily, by hopping over the
batch heads of its committed extent (one small read per batch of thousands of records, its head
checksum verified). Lookups find a seq's block with one ``searchsorted`` over it and read just
that block; time scans skip batches by their min/max.

A segment is opened in one of three ways (the log decides which):
* sealed: immutable; entries = file length / entry size, summary gives its range;
* active with a committed ``SegmentState``: a writer truncates everything past it, a reader
  never reads past it (a writer may be appending in another process);
* active without a state: Kafka-style recovery, keeping the valid prefix of batches: a torn tail
  is dropped, an invalid batch followed by more bytes is corruption (an error naming the byte).

Readers never modify a file and never map one: they ``pread`` the committed bytes of the log and
copy the committed entries of the sparse indexes (``SparseIndex.load``), so a writer trimming,
regrowing or rolling files under them can neither fail them nor kill them with SIGBUS.
A missing or corrupt index is rebuilt (in memory for a reader).
"""

from __future__ import annotations

import bisect
import os
import stat
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from msgindex.errors import CorruptFileError, ForeignCheckpointError, InvalidAppendError, StorageFullError
from msgindex.storage.log import batch_format as bf
from msgindex.storage.log.segment_summary import SegmentSummary
from msgindex.storage.log.sparse_index import NO_TIMESTAMP, OffsetIndex, TimeIndex
from msgindex.storage.mapped_file import raise_if_storage_full
from msgindex.storage.sorted_runs import run_starts

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
SUMMARY_SUFFIX = ".summary"
NAME_DIGITS = 20
HEAD_READ_BYTES = 512  # a batch head is 64 + 16 per block + its topics: one read usually gets it all
# Blocks closer than this are read with one pread, the gap included: a pread costs a few us, and
# so does copying 16 kB (a wider gap made a 60-record lookup read most of a small log).
READ_GAP_BYTES = 16 * 1024


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


@dataclass(frozen=True)
class BatchDirectory:
    """Every batch and every block of a segment's extent, as parallel int64 arrays in log order
    (blocks: all batches' blocks, back to back; batch i owns blocks [first_blocks[i], first_blocks[i + 1]))."""

    positions: np.ndarray
    base_seqs: np.ndarray
    counts: np.ndarray
    lengths: np.ndarray
    min_timestamps: np.ndarray
    max_timestamps: np.ndarray
    first_blocks: np.ndarray
    block_base_seqs: np.ndarray
    block_positions: np.ndarray  # of the compressed bytes, in the file
    block_lengths: np.ndarray
    block_raw_lengths: np.ndarray
    block_crcs: np.ndarray
    block_counts: np.ndarray
    block_batches: np.ndarray
    topic_tables: tuple[tuple[bytes, ...], ...]  # per batch

    def __len__(self) -> int:
        return len(self.positions)

    def batch_of(self, seqs: np.ndarray) -> np.ndarray:
        """Index of the batch holding each seq (all must be in the extent)."""
        return np.searchsorted(self.base_seqs, seqs, side="right") - 1

    def block_of(self, seqs: np.ndarray) -> np.ndarray:
        """Index of the block holding each seq (all must be in the extent)."""
        return np.searchsorted(self.block_base_seqs, seqs, side="right") - 1

    @cached_property
    def topic_counts(self) -> np.ndarray:
        """How many topics each batch's table holds (int64): what the compiled reader checks each
        record's topic number against, taken per block by numpy rather than a len() per block."""
        return np.array([len(table) for table in self.topic_tables], dtype=np.int64)

    @cached_property
    def topic_numbering(self) -> tuple[tuple[bytes, ...], np.ndarray, np.ndarray]:
        """Every topic of the batches' tables once, and where batch i's topic t is among them:
        ``topic_map[table_starts[i] + t]`` (``bf.read_packed_records``). Made when first asked (a
        writer's directories never are), not per read: batches list their topics in the order
        they met them, so a segment holds tens of differently ordered tables."""
        topics, table_starts, topic_map = bf.numbered_topics(self.topic_tables)
        return tuple(topics), table_starts, topic_map

    @classmethod
    def of(cls, heads: list[tuple[int, bf.BatchHead]]) -> BatchDirectory:
        """The directory of the batches (position, checked head), in log order."""
        def column(values) -> np.ndarray:
            return np.fromiter(values, dtype=np.int64, count=len(heads))

        headers = [head.header for _, head in heads]
        positions = column(position for position, _ in heads)
        blocks = np.frombuffer(b"".join(head.table for _, head in heads), bf.BLOCK_ENTRY_DTYPE)
        per_batch = column(header.block_count for header in headers)
        first_blocks = np.zeros(len(heads) + 1, dtype=np.int64)
        np.cumsum(per_batch, out=first_blocks[1:])
        block_batches = np.repeat(np.arange(len(heads), dtype=np.int64), per_batch)
        block_counts = blocks["records"].astype(np.int64)
        block_lengths = blocks["length"].astype(np.int64)
        # A block starts after its batch's head and annotation and the blocks before it in its batch.
        within = np.cumsum(block_lengths) - block_lengths
        within -= within[first_blocks[:-1]][block_batches] if len(blocks) else 0
        starts = positions + column(header.blocks_offset for header in headers)
        seqs_within = np.cumsum(block_counts) - block_counts
        base_seqs = column(header.base_seq for header in headers)
        seqs_within -= seqs_within[first_blocks[:-1]][block_batches] if len(blocks) else 0
        return cls(
            positions, base_seqs, column(header.record_count for header in headers),
            column(header.batch_length for header in headers), column(header.min_timestamp for header in headers),
            column(header.max_timestamp for header in headers), first_blocks,
            base_seqs[block_batches] + seqs_within, starts[block_batches] + within, block_lengths,
            blocks["raw_length"].astype(np.int64), blocks["crc"].astype(np.int64), block_counts, block_batches,
            tuple(head.topics for _, head in heads),
        )


class _WalkedHeads:
    """Heads of batches the readers of this process walked, per segment file, so that the reader
    of each new commit walks only the batches committed since (a segment holds thousands). Sound
    because committed bytes never change; a reused prefix is checked by finding its last head
    again (a file replaced under the same name and inode number is not taken for the old one)."""

    def __init__(self, files: int) -> None:
        self._files = files
        self._known: OrderedDict[tuple[str, int, int], tuple[list[tuple[int, bf.BatchHead]], BatchDirectory]] = (
            OrderedDict())
        self._lock = threading.Lock()

    @staticmethod
    def _key(fd: int, path: Path) -> tuple[str, int, int]:
        info = os.fstat(fd)
        return str(path), info.st_dev, info.st_ino

    def recall(self, fd: int, path: Path) -> tuple[list[tuple[int, bf.BatchHead]], BatchDirectory] | None:
        """(the heads walked in the file, in order, and their directory), or None."""
        with self._lock:
            return self._known.get(self._key(fd, path))

    def remember(self, fd: int, path: Path, heads: list[tuple[int, bf.BatchHead]], directory: BatchDirectory) -> None:
        key = self._key(fd, path)
        with self._lock:
            known = self._known.get(key)
            if known is None or len(known[0]) < len(heads):
                self._known[key] = (list(heads), directory)
            self._known.move_to_end(key)
            while len(self._known) > self._files:
                self._known.popitem(last=False)


_WALKED = _WalkedHeads(files=256)


class BatchReads(ABC):
    """Reading a run of record batches (``batch_format``) wherever its bytes live: a log segment
    file (``LogSegment``, pread) or an object of an object store (``storage/objects``, ranged
    GETs). Subclasses give the extent (``base_seq``, ``next_seq``, ``min_timestamp``,
    ``max_timestamp``, ``path``: what errors name), the batch directory and two byte-range
    primitives; everything a lookup or scan does with blocks is here, once."""

    path: object
    base_seq: int
    next_seq: int
    min_timestamp: int | None
    max_timestamp: int | None
    # Blocks closer than this are read by one request, the gap included (see READ_GAP_BYTES).
    read_gap_bytes: int = READ_GAP_BYTES

    @abstractmethod
    def batches(self) -> BatchDirectory:
        """The batch directory of the committed extent."""

    @abstractmethod
    def read_bytes(self, position: int, length: int) -> bytes:
        """`length` bytes at `position`; CorruptFileError naming ``path`` when fewer exist."""

    def read_runs(self, buffer: memoryview, placed: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> None:
        """Read run i (`sizes[i]` bytes at `starts[i]`) into buffer[placed[i]:]: one request
        per run here; a store that can issue them together overrides it."""
        for at, start, size in zip(placed.tolist(), starts.tolist(), sizes.tolist()):
            buffer[at : at + size] = self.read_bytes(start, size)

    def read_blocks(self, blocks: np.ndarray, directory: BatchDirectory) -> tuple[bytes | np.ndarray, np.ndarray]:
        """(the raw bytes of blocks `blocks` (sorted indexes in `directory`) back to back, each
        block's raw length), each block checksum verified: one pread per run of blocks lying close
        together in the file, all into one buffer decompressed at once."""
        raw_lengths = directory.block_raw_lengths[blocks].astype(np.int64)
        if not len(blocks):
            return b"", raw_lengths
        positions, lengths = directory.block_positions[blocks], directory.block_lengths[blocks]
        ends = positions + lengths
        # a new read where the gap to the previous block would cost more than a second pread
        cuts = np.flatnonzero(positions[1:] - ends[:-1] > self.read_gap_bytes) + 1
        run_starts, run_ends = positions[np.r_[0, cuts]], ends[np.r_[cuts - 1, len(blocks) - 1]]
        run_sizes = run_ends - run_starts
        placed = np.cumsum(run_sizes) - run_sizes  # where each run goes in the buffer
        data = np.empty(int(run_sizes.sum()), dtype=np.uint8)
        self.read_runs(memoryview(data), placed, run_starts, run_sizes)
        run_of_block = np.zeros(len(blocks), dtype=np.int64)
        run_of_block[cuts] = 1
        np.cumsum(run_of_block, out=run_of_block)
        starts = placed[run_of_block] + positions - run_starts[run_of_block]
        compressed = bf.CompressedBlocks(data, starts, lengths, raw_lengths, directory.block_crcs[blocks],
                                         directory.positions[directory.block_batches[blocks]])
        return bf.decompress_all(compressed, self.path), raw_lengths

    def read_block(self, block: int, directory: BatchDirectory) -> bytes:
        """``read_blocks`` of one block, with Python ints: a lookup of a few records reads
        each from its own block, and numpy's per-call cost was most of such a read."""
        position, length = directory.block_positions[block].item(), directory.block_lengths[block].item()
        data = memoryview(self.read_bytes(position, length))
        return bf.decompress_block(data, directory.block_raw_lengths[block].item(), directory.block_crcs[block].item(),
                                   self.path, directory.positions[directory.block_batches[block]].item())

    def block_set(self, blocks: np.ndarray, directory: BatchDirectory | None = None) -> bf.BlockSet:
        """The blocks `blocks` (sorted indexes in the directory), read, checked, decompressed."""
        directory = self.batches() if directory is None else directory
        batches = directory.block_batches[blocks]
        distinct, table_of_block = np.unique(batches, return_inverse=True)
        return bf.BlockSet(*self.read_blocks(blocks, directory), directory.block_base_seqs[blocks],
                           directory.block_counts[blocks], [directory.topic_tables[b] for b in distinct.tolist()],
                           table_of_block, self.path, directory.positions[batches])

    def decode(self, index: int, directory: BatchDirectory | None = None) -> bf.DecodedRows:
        """Every record of batch number `index` of the directory, each block's checksum verified
        and every record's fields checked against its block (for verification and repair; the
        read paths decode only the blocks they need)."""
        directory = self.batches() if directory is None else directory
        blocks = np.flatnonzero(directory.block_batches == index)
        block_set = self.block_set(blocks, directory)
        return block_set.select(*block_set.all_rows()).rows()

    def annotation(self, index: int) -> bytes:
        """The annotation of batch number `index` (checksums verified)."""
        directory = self.batches()
        position, length = int(directory.positions[index]), int(directory.lengths[index])
        data = self.read_bytes(position, length)
        return bf.annotation_of(data, bf.checked_batch(data, length, self.path, position))

    def batch_range(self, start_seq: int, end_seq: int) -> tuple[int, int]:
        """[first, last) batch numbers holding the seqs [start_seq, end_seq)."""
        directory = self.batches()
        if start_seq >= end_seq:
            return 0, 0
        first = int(directory.batch_of(np.array([start_seq]))[0])
        last = int(directory.batch_of(np.array([end_seq - 1]))[0]) + 1
        return first, last

    def piece_bounds(self, start_seq: int, piece_bytes: int, begin_ms: int | None,
                     end_ms: int | None) -> list[tuple[int, int]]:
        """[start_seq, next_seq) cut at batch boundaries into pieces of about piece_bytes, with
        leading and trailing batches outside the window [begin_ms, end_ms] left out."""
        directory = self.batches()
        overlap = np.ones(len(directory), dtype=bool)
        if begin_ms is not None:
            overlap &= directory.max_timestamps >= begin_ms
        if end_ms is not None:
            overlap &= directory.min_timestamps <= end_ms
        overlap &= directory.base_seqs + directory.counts > start_seq
        hits = np.flatnonzero(overlap)
        if not len(hits):
            return []
        first, last = int(hits[0]), int(hits[-1])
        bounds = [max(start_seq, int(directory.base_seqs[first]))]
        piece_start = int(directory.positions[first])
        for i in range(first + 1, last + 1):
            if int(directory.positions[i]) - piece_start >= piece_bytes:
                bounds.append(int(directory.base_seqs[i]))
                piece_start = int(directory.positions[i])
        bounds.append(int(directory.base_seqs[last] + directory.counts[last]))
        return [(a, b) for a, b in zip(bounds, bounds[1:]) if a < b]


class LogSegment(BatchReads):
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
        # Index state machine: bytes since the last entry, running max timestamp and its batch's last seq.
        self._bytes_since_entry = 0
        self._max_so_far = NO_TIMESTAMP
        self._max_so_far_seq = base_seq
        # The batch directory: (position, head) of each batch; the writer extends it, readers walk
        # it up to `_walked` bytes.
        self._heads: list[tuple[int, bf.BatchHead]] = []
        self._walked = 0
        self._walked_seq = base_seq
        self._directory: BatchDirectory | None = None

    # ---- opening -------------------------------------------------------------------------
    @classmethod
    def create(cls, directory: Path, base_seq: int, *, index_interval_bytes: int,
               max_index_bytes: int) -> LogSegment:
        """A new empty writable segment (its files must not exist)."""
        segment = cls(directory, base_seq, index_interval_bytes=index_interval_bytes,
                      max_index_bytes=max_index_bytes, writable=True)
        try:
            segment._fd = os.open(segment.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as error:
            raise_if_storage_full(error, segment.path, "creating it")
            raise
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
        segment._open_fd()
        segment.size = os.fstat(segment._fd).st_size
        summary = SegmentSummary.read(segment.summary_path)
        if summary is not None and summary.base_seq == base_seq and summary.size_bytes != segment.size:
            # A sealed segment never changes and its summary was written when it was sealed:
            # valid (checksummed) and of another size, one of the two was replaced or altered,
            # e.g. by another shard's segment, whose seqs would otherwise pass every check.
            segment.close()
            raise CorruptFileError(
                f"{segment.path}: {segment.size} bytes, but its summary {segment.summary_path}, written when it "
                f"was sealed, says {summary.size_bytes}: the segment (or the summary) was replaced or altered (a "
                f"wrong summary may be deleted: it is recomputed)")
        if summary is None or summary.size_bytes != segment.size or summary.base_seq != base_seq or (
            next_seq is not None and summary.next_seq != next_seq
        ):
            summary = segment._summarize(next_seq)
            if writable:
                summary.write(segment.summary_path)
        segment.next_seq = summary.next_seq
        segment.min_timestamp, segment.max_timestamp = summary.min_timestamp, summary.max_timestamp
        segment._load_indexes(None)
        return segment

    @classmethod
    def open_active(cls, directory: Path, base_seq: int, *, index_interval_bytes: int,
                    max_index_bytes: int, writable: bool, state: SegmentState | None) -> LogSegment:
        """The last segment, cut to `state` (or recovered to its valid prefix when None)."""
        segment = cls(directory, base_seq, index_interval_bytes=index_interval_bytes,
                      max_index_bytes=max_index_bytes, writable=writable)
        segment._open_fd()
        if writable:
            segment.summary_path.unlink(missing_ok=True)
        if state is None:
            segment._recover_valid_prefix()
        else:
            segment._cut_to(state)
        return segment

    def _open_fd(self) -> None:
        try:
            self._fd = os.open(self.path, os.O_RDWR if self.writable else os.O_RDONLY)
        except FileNotFoundError:
            raise CorruptFileError(f"{self.path}: log segment does not exist") from None
        except IsADirectoryError:
            raise CorruptFileError(f"{self.path}: is a directory, not a log segment") from None
        # a read-only open of a directory succeeds (and the first read fails with EISDIR)
        if not stat.S_ISREG(os.fstat(self._fd).st_mode):
            os.close(self._fd)
            self._fd = None
            raise CorruptFileError(f"{self.path}: is a directory (or not a regular file), not a log segment")

    def _summarize(self, expected_next_seq: int | None) -> SegmentSummary:
        self._walk_to(self.size, verify=True)
        directory = self.batches()
        if not len(directory):
            raise CorruptFileError(f"{self.path}: sealed log segment holds no records")
        next_seq = self._walked_seq
        if expected_next_seq is not None and next_seq < expected_next_seq:
            # A gap: most likely the segment holding the records in between is gone (a truncated
            # sealed segment with its summary is refused in open_sealed, by its size).
            missing = self.path.with_name(segment_name(next_seq) + LOG_SUFFIX)
            raise CorruptFileError(
                f"{missing}: log segment is missing: {self.path.name} ends at record {next_seq - 1} and the next "
                f"segment present starts at {expected_next_seq}, so records {next_seq}..{expected_next_seq - 1} "
                f"are in no segment (or {self.path.name} lost its last batches); restore it from a backup")
        if expected_next_seq is not None and next_seq != expected_next_seq:
            raise CorruptFileError(
                f"{self.path}: holds records {self.base_seq}..{next_seq - 1} but the next segment "
                f"starts at {expected_next_seq}"
            )
        return SegmentSummary(self.base_seq, next_seq, self.size, int(directory.min_timestamps.min()),
                              int(directory.max_timestamps.max()))

    def _recover_valid_prefix(self) -> None:
        """Kafka's recovery: keep the batches that validate; a torn tail goes (a writer truncates
        it). Anything invalid that is not a tail is corruption, never silently dropped."""
        file_size = os.fstat(self._fd).st_size
        self.size = file_size
        end = self._walk_to(file_size, verify=True, stop_at_torn=True)
        if end < file_size and self.writable:
            os.ftruncate(self._fd, end)
        self.size = end
        directory = self.batches()
        self.next_seq = self._walked_seq
        if len(directory):
            self.min_timestamp = int(directory.min_timestamps.min())
            self.max_timestamp = int(directory.max_timestamps.max())
        self._rebuild_indexes()

    def _cut_to(self, state: SegmentState) -> None:
        file_size = os.fstat(self._fd).st_size
        if file_size < state.size_bytes:
            raise CorruptFileError(
                f"{self.path}: {file_size} bytes, but {state.size_bytes} were committed (committed data lost, or "
                f"{self.path.parent.parent / 'checkpoint'} is another shard's)"
            )
        if self.writable and file_size > state.size_bytes:
            os.ftruncate(self._fd, state.size_bytes)  # whatever lies past the commit is not real
        self.size, self.next_seq = state.size_bytes, state.next_seq
        self.min_timestamp, self.max_timestamp = state.min_timestamp, state.max_timestamp
        self._load_indexes(state)
        if self.writable:
            self._restore_state_machine()

    def _load_indexes(self, state: SegmentState | None) -> None:
        """Open both indexes (cut to `state`'s entry counts), rebuilding them when missing or
        inconsistent with the log."""
        counts = (None, None) if state is None else (state.offset_index_entries, state.time_index_entries)
        try:
            for path in (self.index_path, self.time_index_path):
                if not path.is_file():  # a writer would create an empty one: rebuild it instead
                    raise CorruptFileError(f"{path}: sparse index file is missing")
            for attribute, cls, path, entries in (("offset_index", OffsetIndex, self.index_path, counts[0]),
                                                  ("time_index", TimeIndex, self.time_index_path, counts[1])):
                if self.writable:
                    index = cls.open(path, self.base_seq, self.max_index_bytes, writable=True, entries=entries)
                    if entries is not None:
                        index.truncate_to_entries(entries)
                else:
                    index = cls.load(path, self.base_seq, self.max_index_bytes, entries=entries)
                setattr(self, attribute, index)
            self._check_indexes()
        except CorruptFileError:
            for attribute in ("offset_index", "time_index"):
                if hasattr(self, attribute):
                    getattr(self, attribute).close_handler()
            self._walk_to(self.size, verify=True)
            self._rebuild_indexes()

    def _check_indexes(self) -> None:
        count = self.next_seq - self.base_seq
        self.offset_index.sanity_check(count)
        self.time_index.sanity_check(count)
        position, since = 0, 0
        if self.offset_index.entries:
            seq, position = self.offset_index.entry(self.offset_index.entries - 1)
            checked = self._check_at(position, self.size, None, False) if position < self.size else None
            if not isinstance(checked, bf.BatchHead) or checked.header.last_seq != seq:
                raise CorruptFileError(f"{self.index_path}: last entry ({seq}, {position}) is not a batch's last seq")
        # Hop over the batches after the last entry (about one index interval): none may lack the
        # entry the rule gives it (a truncated index file passes every other check).
        while position < self.size:
            checked = self._check_at(position, self.size, None, False)
            if isinstance(checked, bf.BatchProblem):
                raise CorruptFileError(f"{self.path}: invalid batch at byte {position}: {checked.reason}")
            if since > self.index_interval_bytes and since != 0 and position != 0:
                raise CorruptFileError(f"{self.index_path}: lacks the entry due at batch {checked.header.base_seq}")
            since += checked.header.batch_length
            position += checked.header.batch_length
        if self.sealed and self.max_timestamp is not None and self.max_timestamp > NO_TIMESTAMP and (
            self.time_index.last_entry().timestamp != self.max_timestamp
        ):
            raise CorruptFileError(f"{self.time_index_path}: does not end with the segment's max timestamp")

    def _rebuild_indexes(self) -> None:
        """Recreate both indexes from the batch directory with the append rule (the writer's
        files, or in memory for a reader)."""
        if self.writable:
            for path in (self.index_path, self.time_index_path):
                if path.is_dir():  # never removed for the operator: it is not ours
                    raise CorruptFileError(f"{path}: a directory where the segment's sparse index belongs; remove "
                                           f"it (the index is rebuilt from the log, nothing is lost)")
            for path in (self.index_path, self.time_index_path):
                path.unlink(missing_ok=True)
            self.offset_index = OffsetIndex.open(self.index_path, self.base_seq, self.max_index_bytes, writable=True)
            self.time_index = TimeIndex.open(self.time_index_path, self.base_seq, self.max_index_bytes, writable=True)
        else:
            self.offset_index = OffsetIndex.in_memory(self.base_seq, self.max_index_bytes)
            self.time_index = TimeIndex.in_memory(self.base_seq, self.max_index_bytes)
        self._bytes_since_entry, self._max_so_far, self._max_so_far_seq = 0, NO_TIMESTAMP, self.base_seq
        directory = self.batches()
        for i in range(len(directory)):
            self._index_batch(int(directory.positions[i]), int(directory.lengths[i]),
                              int(directory.base_seqs[i] + directory.counts[i] - 1), int(directory.max_timestamps[i]))
        if self.sealed:
            self._seal_indexes()

    def rule_indexes(self) -> tuple[OffsetIndex, TimeIndex]:
        """The sparse indexes the index rule gives this segment's committed batches, built in
        memory without touching this segment or its files: what its ``.index`` / ``.timeindex``
        must hold (``verify`` compares them)."""
        directory = self.batches()
        twin = LogSegment(self.directory, self.base_seq, index_interval_bytes=self.index_interval_bytes,
                          max_index_bytes=self.max_index_bytes, writable=False)
        twin.size, twin.sealed = self.size, self.sealed
        twin._directory, twin._walked, twin._walked_seq = directory, self.size, self.next_seq
        twin._rebuild_indexes()
        return twin.offset_index, twin.time_index

    def _index_batch(self, position: int, length: int, last_seq: int, max_timestamp: int) -> None:
        """Kafka's LogSegment.append index rule for one batch."""
        if max_timestamp > self._max_so_far:
            self._max_so_far, self._max_so_far_seq = max_timestamp, last_seq
        if self._bytes_since_entry > self.index_interval_bytes:
            self.offset_index.append(last_seq, position)
            self.time_index.maybe_append(self._max_so_far, self._max_so_far_seq)
            self._bytes_since_entry = 0
        self._bytes_since_entry += length

    def _restore_state_machine(self) -> None:
        """The index rule's running state at the committed end: the time index's last entry is
        the running maximum as of the last offset-index entry (both are appended together); the
        batches after that entry (about one index interval) bring it up to date."""
        directory = self.batches()
        if self.offset_index.entries:
            start = self.offset_index.entry(self.offset_index.entries - 1).position
            self._max_so_far, self._max_so_far_seq = self.time_index.last_entry()
            first = int(np.searchsorted(directory.positions, start))
        else:
            start, first = 0, 0
            self._max_so_far, self._max_so_far_seq = NO_TIMESTAMP, self.base_seq
        for i in range(first + (1 if self.offset_index.entries else 0), len(directory)):
            if directory.max_timestamps[i] > self._max_so_far:
                self._max_so_far = int(directory.max_timestamps[i])
                self._max_so_far_seq = int(directory.base_seqs[i] + directory.counts[i] - 1)
        self._bytes_since_entry = self.size - start

    def _seal_indexes(self) -> None:
        # Kafka's onBecomeInactiveSegment: the final time entry may use the slot kept free.
        self.time_index.maybe_append(self._max_so_far, self._max_so_far_seq, skip_full_check=True)
        if self.writable and self.offset_index.path is not None:
            self.offset_index.trim_to_valid_size()
            self.time_index.trim_to_valid_size()

    # ---- the batch directory ---------------------------------------------------------------
    def _walk_to(self, end: int, *, verify: bool, stop_at_torn: bool = False) -> int:
        """Extend the batch directory by hopping over the batch heads up to byte `end` (each head's
        checksum verified); returns where the valid batches end. With `verify`, the checksums of
        annotations and blocks are checked too (recovery)."""
        position, seq = self._walked, self._walked_seq
        heads = self._heads
        while position < end:
            checked = self._check_at(position, end, seq, verify)
            if isinstance(checked, bf.BatchProblem):
                if stop_at_torn and checked.torn:
                    break
                if not verify and heads:
                    # A hop trusts the blocks of the batch before: the damage may be there.
                    last_position, last = heads[-1]
                    before = self._check_at(last_position, end, last.header.base_seq, True)
                    if isinstance(before, bf.BatchProblem):
                        checked, position = before, last_position
                self._blame_a_foreign_commit(position, end, seq)
                raise CorruptFileError(f"{self.path}: invalid batch at byte {position}: {checked.reason}")
            heads.append((position, checked))
            position += checked.header.batch_length
            seq += checked.header.record_count
        self._walked, self._walked_seq = position, seq
        self._directory = None
        return position

    def _blame_a_foreign_commit(self, position: int, end: int, seq: int) -> None:
        """ForeignCheckpointError when the batch at `position` is intact in the file but runs past
        `end`, the committed extent: the commit does not fall on a batch boundary of this segment,
        so it was not made for it (another shard's checkpoint, or an old copy), and the healthy
        segment must not be blamed."""
        file_size = os.fstat(self._fd).st_size
        if end >= file_size:
            return
        whole = self._check_at(position, file_size, seq, True)
        if isinstance(whole, bf.BatchHead) and position + whole.header.batch_length > end:
            checkpoint = self.path.parent.parent / "checkpoint"
            raise ForeignCheckpointError(
                f"{checkpoint}: commits {end} bytes of {self.path}, but its batch at byte {position} runs to byte "
                f"{position + whole.header.batch_length}: the checkpoint was not made for this log, or the log for "
                f"this shard (another shard's, or an old copy of either); `msgindex repair` rebuilds the checkpoint "
                f"from the shard's files")

    def _check_at(self, position: int, end: int, seq: int | None, verify: bool) -> bf.BatchHead | bf.BatchProblem:
        """``check_head`` (``check_batch`` with `verify`) of the batch at `position` (the file's
        extent ending at `end`), read with pread; problems carry file positions. A batch that
        fails a checksum and reaches exactly the end is a torn write of the last batch (pages
        reached the disk out of order)."""
        left = end - position
        data = os.pread(self._fd, min(HEAD_READ_BYTES, left), position)
        short = len(data) < min(HEAD_READ_BYTES, left)  # the file ends before `end`: truncated under us
        if not short and len(data) >= bf.HEADER_SIZE:
            head_length = bf.head_length_at(data)
            if len(data) < head_length <= left:
                data += os.pread(self._fd, head_length - len(data), position + len(data))
                short = len(data) < head_length
        checked = bf.check_head(data, 0, len(data) if short else left, seq)
        if verify and isinstance(checked, bf.BatchHead) or (
            isinstance(checked, bf.BatchProblem) and checked.reason == "checksum mismatch"
        ):
            length = bf.read_header(data).batch_length
            if len(data) < length:
                data += os.pread(self._fd, length - len(data), position + len(data))
            checked = bf.check_batch(data, 0, len(data), seq)
            if isinstance(checked, bf.BatchProblem) and checked.reason == "checksum mismatch" and (
                position + len(data) == end
            ):
                checked = bf.BatchProblem(0, checked.reason, True)
        if isinstance(checked, bf.BatchProblem):
            return bf.BatchProblem(position + checked.position, checked.reason, checked.torn)
        return checked

    def batches(self) -> BatchDirectory:
        """The batch directory of the committed extent (built on first use)."""
        if self._walked < self.size:
            if not self.writable and not self._heads:
                self._reuse_walked_heads()
            if self._walked < self.size:
                self._walk_to(self.size, verify=False)
        if self._directory is None:
            self._directory = BatchDirectory.of(self._heads)
            if not self.writable:
                _WALKED.remember(self._fd, self.path, self._heads, self._directory)
        return self._directory

    def _reuse_walked_heads(self) -> None:
        """Start from the heads another reader of this file walked (up to this reader's extent),
        once the last of them is found again where it was."""
        known = _WALKED.recall(self._fd, self.path)
        if known is None:
            return
        walked, directory = known
        heads = walked[: bisect.bisect_right([p + h.header.batch_length for p, h in walked], self.size)]
        if not heads:
            return
        position, last = heads[-1]
        again = self._check_at(position, self.size, last.header.base_seq, False)
        if isinstance(again, bf.BatchHead) and again.header == last.header:
            self._heads = list(heads)
            self._walked = position + last.header.batch_length
            self._walked_seq = last.header.next_seq
            self._directory = directory if len(heads) == len(walked) else None

    # ---- raw bytes (the byte-range primitive of BatchReads) ----------------------------------
    def read_bytes(self, position: int, length: int) -> bytes:
        """`length` bytes at `position` of the committed extent (one pread)."""
        data = os.pread(self._fd, length, position)
        self._check_read(len(data), length, position)
        return data

    def read_into(self, buffer: memoryview, position: int) -> None:
        """``read_bytes`` into `buffer` (as many bytes as it holds)."""
        self._check_read(os.preadv(self._fd, [buffer], position), len(buffer), position)

    def _check_read(self, read: int, wanted: int, position: int) -> None:
        if read != wanted:
            raise CorruptFileError(f"{self.path}: {read} bytes at byte {position} where {wanted} were "
                                   f"committed (the file was truncated)")

    def read_runs(self, buffer: memoryview, placed: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> None:
        for at, start, size in zip(placed.tolist(), starts.tolist(), sizes.tolist()):
            self.read_into(buffer[at : at + size], start)

    def raw_records_at(self, seqs: np.ndarray) -> bf.RawRecords:
        """The records of sorted unique `seqs` (all in this segment's extent), each block holding
        some read once (``bf.read_raw_records``: no numpy or Arrow per call, what a lookup of tens
        to hundreds of scattered records needs)."""
        return bf.read_raw_records(self._fd, self.path, *self._blocks_of(seqs), self._check_read)

    def packed_records_at(self, seqs: np.ndarray) -> bf.PackedRecords:
        """``raw_records_at``'s records as the compiled reader gives them (``bf.read_packed_records``;
        needs it): what a lookup renders its rows from in C."""
        return bf.read_packed_records(self._fd, self.path, *self._blocks_of(seqs), self._check_read,
                                      self.batches().topic_numbering)

    def columns_at(self, seqs: np.ndarray) -> bf.RecordColumns:
        """``raw_records_at`` as columns (``bf.read_record_columns``; needs the compiled reader)."""
        return bf.read_record_columns(self._fd, self.path, *self._blocks_of(seqs), seqs, self._check_read,
                                      self.batches().topic_numbering)

    def _blocks_of(self, seqs: np.ndarray) -> tuple[bf.BlockLocations, np.ndarray, np.ndarray]:
        """The distinct blocks holding sorted `seqs`, where each one's seqs start among them
        (one more at the end) and each seq's row in its block: what the compiled reader reads."""
        directory = self.batches()
        blocks = directory.block_of(seqs)
        firsts = np.flatnonzero(run_starts(blocks))  # sorted seqs: their blocks never go down
        distinct = blocks[firsts]
        batches = directory.block_batches[distinct]
        return (bf.BlockLocations(*(column[distinct] for column in (directory.block_positions, directory.block_lengths,
                                                                    directory.block_raw_lengths, directory.block_crcs)),
                                  directory.positions[batches],
                                  [directory.topic_tables[batch] for batch in batches.tolist()], batches,
                                  directory.topic_counts[batches]),
                np.append(firsts, len(seqs)), seqs - directory.block_base_seqs[blocks])


    # ---- appending -------------------------------------------------------------------------
    def append(self, batch: bytes, head: bf.BatchHead) -> None:
        """Append one encoded batch (its base seq must be next_seq) and index it."""
        header = head.header
        if header.base_seq != self.next_seq:
            raise InvalidAppendError(f"{self.path}: batch from seq {header.base_seq} cannot follow {self.next_seq - 1}")
        try:
            written = os.pwrite(self._fd, batch, self.size)
        except OSError as error:
            raise_if_storage_full(error, self.path, f"appending {len(batch):,} bytes (the last commit is intact)")
            raise
        if written != len(batch):  # a regular file only writes short when its filesystem is full
            raise StorageFullError(f"{self.path}: only {written:,} of {len(batch):,} bytes could be written (no space "
                                   f"left on its filesystem?); the last commit is intact")
        self._index_batch(self.size, len(batch), header.last_seq, header.max_timestamp)
        if self._walked == self.size:
            self._heads.append((self.size, head))
            self._walked += len(batch)
            self._walked_seq += header.record_count
            self._directory = None
        self.size += len(batch)
        self.next_seq += header.record_count
        self.min_timestamp = header.min_timestamp if self.min_timestamp is None else min(self.min_timestamp,
                                                                                         header.min_timestamp)
        self.max_timestamp = header.max_timestamp if self.max_timestamp is None else max(self.max_timestamp,
                                                                                         header.max_timestamp)

    def room(self) -> int:
        """Batches the sparse indexes can still take (each batch adds at most one entry to each;
        the time index keeps one slot for the roll entry)."""
        return min(self.offset_index.max_entries - self.offset_index.entries,
                   self.time_index.max_entries - 1 - self.time_index.entries)

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

    # ---- durability and lifecycle ----------------------------------------------------------
    def flush(self) -> None:
        if self._fd is not None and self.writable:
            try:
                os.fsync(self._fd)
            except OSError as error:  # delayed allocation: a full disk can show here first
                raise_if_storage_full(error, self.path, "syncing it")
                raise
        self.offset_index.flush()
        self.time_index.flush()

    def close(self) -> None:
        """Trim the indexes (writer) and release files."""
        if self.writable and hasattr(self, "offset_index"):
            self.offset_index.close()
            self.time_index.close()
        elif hasattr(self, "offset_index"):
            self.offset_index.close_handler()
            self.time_index.close_handler()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

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
