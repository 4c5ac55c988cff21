"""One shard on an object store: its writers (append, compaction, retention, collection) and its
readers, over the versions of ``versions.py`` and the chunks of ``chunk_format.py``.

```
<root>/broker=<name>/_commits/<20-digit number>.json   the shard's versions (put-if-absent)
<root>/broker=<name>/chunks/<ms>-<unique>.chunk        chunk objects (immutable)
<root>/_shards/<name>                                  marks that the shard has committed
```

**Writing without locks.** Any number of writers of a shard (the tasks of a micro-batch, their
retries and speculative copies, a second job, ``msgindex compact``) append concurrently. An append
drops the rows whose source offsets the newest version it knows already holds, writes a chunk of
the rest, then creates the next version. A writer that loses that version to another reads the
newest one and tries again: if the winner committed none of its rows, the same chunk is committed
at the next number (its seqs are relative: the version gives the base); if it committed some, the
chunk is written again without them (the first one is deleted at once, never having been
listed). So every row is committed exactly once, by source offsets, as in a local shard.

**Compaction** keeps the chunk count, and with it the requests of a lookup, small however many
appends there were: after a commit, at most once per ``compaction_interval_s`` (or at once past
``max_chunks``), a writer merges the newest chunks while the next older one is at most ``ratio``
times their size (RocksDB's universal compaction rule: sizes grow geometrically from newest to
oldest, so a shard holds O(log(records / append)) chunks and a record is rewritten O(log) times),
up to ``max_merged_records``, within ``max_work_bytes`` a run. The merged chunk replaces its
inputs in one version; an input another writer removed meanwhile abandons the merge.

**Deleting.** Nothing a version lists is deleted. A replaced chunk is recorded in the version that
removed it (``removed``) and deleted only after ``grace_s``, longer than any reader keeps a
version (Delta's vacuum rule); objects no version names (a writer died before its commit) are
deleted once older than ``grace_s``; version objects beyond the newest ``keep_versions``.

**Reading.** A reader holds one version: it never sees a torn or missing committed row while
writers and compaction run. Its lookups read, per chunk that may hold a key (bloom filter of the
cached footer), the pages of hash items of the wanted hashes (one request per chunk, ranges
coalesced), then the log blocks of the candidates (one request per chunk), all chunks in parallel,
and verify every candidate against the log (``verified_reads``), as a local shard does.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Self, TypeVar

import numpy as np
import pyarrow as pa

from msgindex.errors import CommitConflictError, CorruptFileError, InvalidAppendError, InvalidArgumentError
from msgindex.storage import fields
from msgindex.storage.append_columns import AppendColumns
from msgindex.storage.backfill import (
    BackfillResult,
    FieldBackfill,
    RecordValues,
    concat_columns,
    extra_after,
    growth,
    rewritten_columns,
)
from msgindex.storage.fields import FieldDefinition
from msgindex.storage.fields import check_carried as check_carried_fields
from msgindex.storage.fields import extra_after_append as fields_extra_after_append
from msgindex.storage.log.columns import LogColumns
from msgindex.storage.log.metadata_log import LogReads
from msgindex.storage.log.segment import BatchDirectory, BatchReads
from msgindex.storage.message import MessageRecord, stored_window
from msgindex.storage.objects.cache import FOOTERS, CachedFooter
from msgindex.storage.objects.chunk_format import (
    HASH_ITEM_DTYPE,
    HASH_ITEM_SIZE,
    MAX_CHUNK_RECORDS,
    ChunkFooter,
    ChunkInfo,
    decode_footer,
    encode_chunk,
    merge_chunks,
)
from msgindex.storage.objects.client import ObjectClient, ObjectInfo, ObjectMissingError, ObjectShorterError
from msgindex.storage.objects.versions import CHUNK_SUFFIX, CHUNKS_DIR, ChunkRef, Removed, ShardVersion, ShardVersions
from msgindex.storage.query import KeysArg, Query, as_query, empty_rows
from msgindex.storage.result_order import in_result_order
from msgindex.storage.retention import RetentionReport, check_retention_arguments
from msgindex.storage.shard import (
    SCAN_BATCH_ROWS,
    AppendResult,
    BeforeCommit,
    own_coordinates,
    refuse_out_of_range_timestamps,
    refuse_unindexed_keys,
)
from msgindex.storage.source_ranges import SourceRanges, SourceRows, appended_ranges
from msgindex.storage.verified_reads import VerifiedReads, WantedKeys

# Up to this many hash candidates a lookup reads and checks them record by record (LogReads'
# Python reader: chunks have no compiled record reader, their blocks come by ranged reads), ~24 us
# a record against ~1 ms of numpy and Arrow calls on the vectorized path (they cross at 70-110)
FEW_CANDIDATES = 64

logger = logging.getLogger(__name__)

SHARDS_DIR = "_shards"
# A shard's mark (store.py) is put empty before the shard's first commit and rewritten to this once
# that commit exists: a marked shard without versions is then damage only when its mark says it
# committed, not when its first writer died before committing (nothing of it was ever visible).
MARK_COMMITTED = b"committed\n"
MAX_COMMIT_ATTEMPTS = 64
IO_THREADS = 16
# A chunk whose hash section is at most this big has it read with its footer and cached (a
# micro-batch's chunk: ~10k records, 90 kB); bigger ones are read a page range at a time, until
# a process's lookups have read pages of the chunk WARM_PAGE_READS times: then the whole section
# (8 bytes per indexed key; a compacted chunk of 4M records: ~40 MB) is read once and kept, and
# the chunk's lookups need one request (its log blocks) instead of two dependent ones. A one-shot
# reader (the CLI, a task that looks up once) never pays for a section it would not reuse; a
# process that keeps coming back (the search page, a notebook, a Spark executor) pays it once.
# Sections over a quarter of the footer cache stay page-read (they would evict everything else).
CACHED_HASH_BYTES = 256 * 1024
WARM_PAGE_READS = 3
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class ObjectTuning:
    """How object-store shards compact and delete (see the module docstring); the defaults suit
    S3's request prices and latencies, tests shorten the times."""

    compaction_interval_s: float = 10.0
    max_chunks: int = 16  # more chunks than this: compact at once, whatever the interval
    ratio: float = 4.0
    # A merge runs inside an append (the pipeline's tasks): bounded so that a batch is never held
    # up long (~50-60 MB chunks at most; a shard of 100M records keeps ~25 of them, each skipped
    # by its bloom filter when it holds no wanted key).
    max_merged_records: int = 4 * 1024 * 1024
    max_work_bytes: int = 128 * 1024 * 1024
    grace_s: float = 3600.0
    collect_interval_s: float = 300.0
    keep_versions: int = 100

    def __post_init__(self) -> None:
        if not 0 < self.max_merged_records <= MAX_CHUNK_RECORDS or self.ratio <= 0 or self.grace_s < 0:
            raise InvalidArgumentError(f"impossible object-store tuning {self}")


# --- shared by every shard of the process: the I/O threads (footers: cache.py) ------------------
_IO_POOL: ThreadPoolExecutor | None = None
_IO_POOL_LOCK = threading.Lock()


def io_pool() -> ThreadPoolExecutor:
    """Threads that wait on requests (obstore releases the GIL while it waits). Work submitted
    here never submits more work here, so the pool cannot deadlock on itself."""
    global _IO_POOL
    with _IO_POOL_LOCK:
        if _IO_POOL is None:
            _IO_POOL = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="msgindex-objects")
        return _IO_POOL


def in_parallel(work: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """work(item) for every item, on the I/O threads when there are several; results in order."""
    if len(items) <= 1:
        return [work(item) for item in items]
    futures: list[Future] = [io_pool().submit(work, item) for item in items]
    return [future.result() for future in futures]


# --- reading -------------------------------------------------------------------------------------
class ObjectChunk(BatchReads):
    """A chunk object as a run of record batches (``BatchReads``): seqs from its version's base,
    bytes by ranged GETs, its footer from the process-wide cache."""

    def __init__(self, client: ObjectClient, shard_prefix: str, ref: ChunkRef) -> None:
        self.client = client
        self.ref = ref
        self.key = f"{shard_prefix}/{ref.name}"
        self.path = f"{client.location.url.rstrip('/')}/{self.key}"
        self.base_seq, self.next_seq = ref.base_seq, ref.next_seq
        self.min_timestamp, self.max_timestamp = ref.info.min_timestamp, ref.info.max_timestamp
        self.read_gap_bytes = client.gap_bytes
        self._directory: BatchDirectory | None = None

    def footer(self) -> ChunkFooter:
        return FOOTERS.get(self.path, self._load_footer).footer

    def _load_footer(self) -> CachedFooter:
        """The footer, and with it the whole hash section when that is small: one request gets
        both, and the chunk's lookups then need no request for hash items at all (a fresh
        reader's first lookup pays one request per small chunk instead of two)."""
        info = self.ref.info
        hash_bytes = info.hash_entries * HASH_ITEM_SIZE
        if hash_bytes > CACHED_HASH_BYTES:
            return CachedFooter(listed_footer(self._ranges([info.footer_offset], [info.footer_length])[0], info, self.path))
        data = self._ranges([info.footer_offset - hash_bytes], [hash_bytes + info.footer_length])[0]
        footer = listed_footer(data[hash_bytes:], info, self.path)
        items = footer.checked_items(data[:hash_bytes], 0, self.path) if hash_bytes else np.zeros(0, HASH_ITEM_DTYPE)
        return CachedFooter(footer, items.copy())

    def batches(self) -> BatchDirectory:
        if self._directory is None:
            relative = self.footer().directory
            self._directory = dataclasses.replace(relative, base_seqs=relative.base_seqs + self.base_seq,
                                                  block_base_seqs=relative.block_base_seqs + self.base_seq)
        return self._directory

    def read_bytes(self, position: int, length: int) -> bytes:
        return bytes(self._ranges([position], [length])[0])

    def read_runs(self, buffer: memoryview, placed: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> None:
        for at, piece in zip(placed.tolist(), self._ranges(starts.tolist(), sizes.tolist())):
            buffer[at : at + len(piece)] = piece

    def _ranges(self, starts: list[int], lengths: list[int]) -> list[memoryview]:
        try:
            return self.client.get_ranges(self.key, starts, lengths)
        except ObjectMissingError:
            raise CorruptFileError(f"{self.path}: chunk object listed by the shard version is missing") from None
        except ObjectShorterError:
            raise CorruptFileError(f"{self.path}: the chunk object is shorter than its shard version records "
                                   f"({self.ref.info.size:,} bytes): it was replaced or truncated") from None

    def candidates_in_memory(self, key_hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """`hash_candidates` when the process holds what answers it (the bloom filter says none,
        or the whole hash section is cached): None when a request is needed. A warm lookup
        answers most chunks so, in its own thread: handing each to the I/O threads cost more
        than the answer."""
        cached = FOOTERS.get(self.path, self._load_footer)
        hashes = key_hashes[cached.footer.may_hold(key_hashes)]
        if not len(hashes):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return None if cached.items is None else self._items_of(cached.items, hashes)

    def hash_candidates(self, key_hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(seqs, key hashes) of the chunk's items of `key_hashes` (distinct, uint32): the pages
        that may hold them read in one request, checked, filtered."""
        cached = FOOTERS.get(self.path, self._load_footer)
        footer = cached.footer
        hashes = key_hashes[footer.may_hold(key_hashes)]
        if not len(hashes):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if cached.items is None and self._keep_whole_section(footer):
            cached = self._whole_section(footer)
        if cached.items is not None:
            return self._items_of(cached.items, hashes)
        firsts, lasts = footer.page_spans(hashes)
        merged: list[list[int]] = []
        for first, last in zip(firsts.tolist(), lasts.tolist()):  # sorted by first page
            if first > last:
                continue
            if merged and first <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([first, last])
        if not merged:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        ranges = [footer.page_range(first, last) for first, last in merged]
        pieces = self._ranges([r[0] for r in ranges], [r[1] for r in ranges])
        items = np.concatenate([footer.checked_items(piece, first, self.path)
                                for piece, (first, _) in zip(pieces, merged)])
        return self._items_of(items, hashes)  # merged runs are in page order: still sorted

    def _keep_whole_section(self, footer: ChunkFooter) -> bool:
        if footer.hash_entries * HASH_ITEM_SIZE > FOOTERS.capacity // 4:
            return False
        n = FOOTERS.count_page_read(self.path)
        return n >= WARM_PAGE_READS

    def _whole_section(self, footer: ChunkFooter) -> CachedFooter:
        data = self._ranges([footer.hash_offset], [footer.hash_entries * HASH_ITEM_SIZE])[0]
        whole = CachedFooter(footer, footer.checked_items(data, 0, self.path).copy())
        FOOTERS.replace(self.path, whole)
        return whole

    def _items_of(self, items: np.ndarray, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(seqs, key hashes) of the items of `hashes` among `items` (sorted by key hash, as a
        chunk writes them): each hash's run found by binary search, in item order."""
        wanted = np.sort(hashes.astype(np.uint32))
        starts = np.searchsorted(items["key_hash"], wanted, side="left")
        ends = np.searchsorted(items["key_hash"], wanted, side="right")
        lengths = ends - starts
        total = int(lengths.sum())
        if not total:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        # positions starts[i] .. ends[i] - 1 of every run, back to back
        run_of = np.repeat(np.arange(len(starts)), lengths)
        positions = starts[run_of] + (np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths))
        hit = items[positions]
        return hit["rel_seq"].astype(np.int64) + self.base_seq, hit["key_hash"].astype(np.int64)


class _HeldChunk(ObjectChunk):
    """A chunk whose whole object was read with one GET: its ranges come from memory (a backfill
    decodes every batch, a request each otherwise)."""

    def __init__(self, client: ObjectClient, shard_prefix: str, ref: ChunkRef, data: bytes) -> None:
        super().__init__(client, shard_prefix, ref)
        self._data = memoryview(data)

    def _ranges(self, starts: list[int], lengths: list[int]) -> list[memoryview]:
        if any(start + length > len(self._data) for start, length in zip(starts, lengths)):
            raise CorruptFileError(f"{self.path}: chunk object is shorter than its shard version records")
        return [self._data[start : start + length] for start, length in zip(starts, lengths)]


def listed_footer(data: bytes | memoryview, info: ChunkInfo, name: object) -> ChunkFooter:
    """The footer whose bytes are `data`, checked by the checksum its shard version records and
    against the facts it records (CorruptFileError naming `name`)."""
    footer = decode_footer(data, info.footer_crc, name)
    if (footer.records, footer.hash_entries, footer.min_timestamp, footer.max_timestamp) != (
            info.records, info.hash_entries, info.min_timestamp, info.max_timestamp):
        raise CorruptFileError(f"{name}: chunk footer does not match what its shard version records")
    return footer


class ObjectLog(LogReads):
    """The log of an object-store shard version: its chunks, read by ranged GETs in parallel."""

    def __init__(self, chunks: list[ObjectChunk], start_seq: int, next_seq: int, name: str) -> None:
        self._segments = chunks
        self._start_seq, self._next_seq = start_seq, next_seq
        self.directory = name

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def start_seq(self) -> int:
        return self._start_seq

    def chunk_objects(self) -> list[ObjectChunk]:
        return list(self._segments)

    def load_footers(self, chunks: Iterable[ObjectChunk] | None = None) -> None:
        """Fetch the footers not cached yet, all at once (a fresh reader's first request per chunk).
        Cached ones are not handed to the I/O threads: a warm lookup of a shard of 6 chunks spent
        ~0.3 ms waiting for threads to return what the cache held."""
        missing = [chunk for chunk in (self._segments if chunks is None else chunks) if not FOOTERS.holds(chunk.path)]
        in_parallel(lambda chunk: chunk.footer(), missing)

    def _in_order(self, work: Callable[[T], R], tasks: list[T]) -> Iterator[R]:
        self.load_footers({task[0] for task in tasks})  # type: ignore[index]
        yield from in_parallel(work, tasks)

    def _blocks_for_few(self, plan: list) -> Iterator[Callable[[int], bytes]]:
        def fetch(item):
            segment, directory, _seqs, blocks = item
            distinct = np.unique(blocks)
            data, raw_lengths = segment.read_blocks(distinct, directory)
            ends = np.cumsum(raw_lengths)
            starts = ends - raw_lengths
            where = dict(zip(distinct.tolist(), zip(starts.tolist(), ends.tolist())))
            view = memoryview(data)
            return lambda block: bytes(view[where[block][0] : where[block][1]])

        yield from in_parallel(fetch, plan)

    def scan_ranges(self, begin_ms: int | None = None, end_ms: int | None = None, **kwargs) -> list[tuple[int, int]]:
        self.load_footers([c for c in self._segments if _overlaps(c, begin_ms, end_ms)])
        return super().scan_ranges(begin_ms, end_ms, **kwargs)


def _overlaps(chunk: ObjectChunk, begin_ms: int | None, end_ms: int | None) -> bool:
    return (begin_ms is None or chunk.max_timestamp >= begin_ms) and (end_ms is None or chunk.min_timestamp <= end_ms)


class ObjectShardReader(VerifiedReads):
    """A consistent read-only view of one version of an object-store shard (module docstring)."""

    def __init__(self, client: ObjectClient, shard_prefix: str, broker: str, version: ShardVersion) -> None:
        self.broker = broker
        self.client = client
        self.version = version
        self.url = f"{client.location.url.rstrip('/')}/{shard_prefix}"
        self._coverage: tuple | None = None  # (the version, its field coverage): fields.cached_coverage
        chunks = [ObjectChunk(client, shard_prefix, ref) for ref in version.chunks]
        self._log = ObjectLog(chunks, version.log_start_seq, version.record_count, self.url) if chunks else None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: a reader holds no files, only its version."""

    @property
    def record_count(self) -> int:
        return self.version.record_count - self.version.log_start_seq

    @property
    def topics(self) -> tuple[str, ...]:
        return self.version.topics

    @property
    def log(self) -> ObjectLog | None:
        return self._log

    @property
    def committed_ranges(self):
        return self.version.source_ranges

    def lookup(self, keys: KeysArg | Query, *, topic: str | None = None, begin_ms: int | None = None,
               end_ms: int | None = None, max_results: int | None = None,
               partitions: Iterable[int] | None = None) -> pa.Table:
        """As ``ShardReader.lookup``: verified rows in ROW_SCHEMA and result order."""
        query = as_query(keys, topic=topic, begin_ms=begin_ms, end_ms=end_ms, max_results=max_results,
                         partitions=partitions)
        if query.keys is None:
            raise InvalidArgumentError("a lookup needs keys (a Query without keys is a scan: scan_range)")
        return self._with_field_columns(self._lookup_rows(query), query)

    def _lookup_rows(self, query: Query) -> pa.Table:
        """``lookup``'s rows in ROW_SCHEMA."""
        topics = query.topics_among(self.version.topics)
        window = query.stored_window()
        field_pairs = self._field_pairs(query)
        if self._log is None or query.looks_up_nothing or not topics or window is None:
            return empty_rows()
        begin, end = window
        wanted = WantedKeys.of(topics, list(query.keys), field_pairs)
        seqs, who = self._candidates(wanted, begin, end)
        if len(seqs) <= FEW_CANDIDATES:
            return self._verified_few(seqs, who, wanted, begin, end, query.partitions, query.max_results)
        found = self._verified(seqs, who, wanted, begin, end, query.partitions)
        if not found:
            return empty_rows()
        found.sort(key=lambda part: (int(part.order.timestamp_ms[0]), int(part.order.seqs[0])))
        return in_result_order(found, query.max_results)

    @property
    def field_coverage(self) -> fields.FieldCoverage:
        """The fields the shard indexes and the source offsets each covers (storage/fields.py)."""
        self._coverage = fields.cached_coverage(self._coverage, self.version, self.version.extra, source=self.url)
        return self._coverage[1]

    def _field_pairs(self, query: Query) -> tuple[tuple[str, str], ...]:
        """As ``ShardReader._field_pairs``: names as indexed, a warning per field not covering
        what the shard holds."""
        if not query.fields:
            return ()
        coverage = self.field_coverage
        pairs = tuple((coverage.spelled(name), value) for name, value in query.fields)
        fields.warn_uncovered(f"shard {self.broker!r}", self.version.source_ranges, coverage,
                              (name for name, _ in pairs), topics=query.topics, partitions=query.partitions)
        return pairs

    def _candidates(self, wanted: WantedKeys, begin_ms: int | None, end_ms: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(seq, wanted pair) of every hash item of a wanted hash in the chunks the window meets."""
        chunks = [c for c in self._log.chunk_objects() if _overlaps(c, begin_ms, end_ms)]
        self._log.load_footers(chunks)
        distinct = np.unique(wanted.hashes).astype(np.uint32)
        found = [chunk.candidates_in_memory(distinct) for chunk in chunks]
        pending = [at for at, result in enumerate(found) if result is None]
        for at, result in zip(pending, in_parallel(lambda at: chunks[at].hash_candidates(distinct), pending)):
            found[at] = result
        seqs = np.concatenate([s for s, _ in found]) if found else np.zeros(0, np.int64)
        hashes = np.concatenate([h for _, h in found]) if found else np.zeros(0, np.int64)
        if not len(seqs):
            return seqs, hashes
        # each item stands for every wanted (topic, key) pair of its hash (usually one)
        order = np.argsort(wanted.hashes, kind="stable")
        sorted_hashes = wanted.hashes[order]
        low = np.searchsorted(sorted_hashes, hashes, side="left")
        count = np.searchsorted(sorted_hashes, hashes, side="right") - low
        item = np.repeat(np.arange(len(seqs)), count)
        pair = order[np.repeat(low, count) + (np.arange(len(item)) - np.repeat(np.cumsum(count) - count, count))]
        return seqs[item], pair.astype(np.int64)

    def _file_pointing_at(self, key_hash: int, seq: int) -> str:
        for chunk in self._log.chunk_objects() if self._log is not None else ():
            if chunk.base_seq <= seq < chunk.next_seq:
                return chunk.path
        return self.url

    def scan_ranges(self, begin_ms: int | None = None, end_ms: int | None = None) -> list[tuple[int, int]]:
        window = stored_window(begin_ms, end_ms)
        if self._log is None or window is None:
            return []
        return self._log.scan_ranges(*window)

    def scan_range(self, start_seq: int, end_seq: int, query: Query | None = None, *, begin_ms: int | None = None,
                   end_ms: int | None = None, topics: Iterable[str] | None = None,
                   partitions: Iterable[int] | None = None) -> Iterator[pa.RecordBatch]:
        query = as_query(query, begin_ms=begin_ms, end_ms=end_ms, topics=topics, partitions=partitions)
        window = query.stored_window()
        if self._log is None or window is None:
            return
        start, end = max(start_seq, self.version.log_start_seq), min(end_seq, self.version.record_count)
        if start >= end:
            return
        self._log.load_footers([c for c in self._log.chunk_objects()
                                if c.next_seq > start and c.base_seq < end and _overlaps(c, *window)])
        yield from self._log.scan_range(start, end, self.broker, window[0], window[1], SCAN_BATCH_ROWS,
                                        topics=query.topics, partitions=query.partitions,
                                        fields=self._rendered_fields(query))


# --- writing -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _WrittenChunk:
    """A chunk this writer put but has not seen committed yet, and the input rows it holds."""

    name: str
    rows: np.ndarray
    info: object
    topics: frozenset[str]
    put_at: float  # time.monotonic() of its put: collection may delete it once past the grace period


@dataclass(frozen=True)
class _Rewrite:
    """What a backfill made of a listed chunk: the chunk written in its place (no name: none, no
    record of it gets values) and what that added."""

    name: str = ""
    info: ChunkInfo | None = None
    records_with_values: int = 0
    values_added: int = 0
    put_at: float = 0.0


class ObjectShardWriter:
    """A writer of one object-store shard (module docstring): no lock, commits settle races.
    ``locked(timeout)`` exists for the pipeline's sake (a local shard's writer needs it) and
    only refreshes the writer's view."""

    def __init__(self, client: ObjectClient, shard_prefix: str, broker: str, *,
                 tuning: ObjectTuning | None = None, now_ms: Callable[[], int] | None = None,
                 on_commit: Callable[[ShardVersion], None] | None = None) -> None:
        self.client = client
        self.broker = broker
        self.prefix = shard_prefix.rstrip("/")
        self.tuning = tuning or ObjectTuning()
        self.versions = ShardVersions(client, self.prefix)
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        self._state: ShardVersion | None = None
        self._on_commit = on_commit
        self._state_at = 0.0  # time.monotonic() when _state was last known to be the newest
        self._registered = False
        self._collected_at = 0.0
        self.last_revalidation = ""

    @property
    def url(self) -> str:
        return f"{self.client.location.url.rstrip('/')}/{self.prefix}"

    # --- the version this writer knows ----------------------------------------------------------
    def refresh(self) -> ShardVersion:
        """The newest version (one LIST; one GET when there is a newer one)."""
        return self._know(self.versions.latest(self._state))

    def _know(self, version: ShardVersion) -> ShardVersion:
        self._state, self._state_at = version, time.monotonic()
        return version

    @property
    def state(self) -> ShardVersion:
        """The newest version as this writer last knew it, read again when that is older than
        half the grace period: collection deletes a version object once its successor is older
        than the grace period, so a view that old could find its next number free again, below
        the newest, and commit there unseen (``collect``)."""
        if self._state is None or self._may_be_collected(self._state_at):
            return self.refresh()
        return self._state

    @property
    def committed_ranges(self):
        return self.state.source_ranges

    @contextmanager
    def locked(self, timeout_s: float) -> Iterator[Self]:
        """No lock: brings the view up to date, so the append usually wins its version at once."""
        self.refresh()
        yield self

    def close(self) -> None:
        """Forget the view (nothing is held)."""
        self._state = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- appending ------------------------------------------------------------------------------
    def append(self, records: pa.Table | Sequence[MessageRecord], sources: SourceRows | None = None,
               fields: Sequence[FieldDefinition] = (), before_commit: BeforeCommit | None = None,
               settled: SourceRanges | None = None) -> AppendResult:
        """Commit the rows whose source offsets the shard does not hold yet (exactly once, as
        ``ShardWriter.append``, `fields` and `settled` too), retrying on lost versions. Returns what was
        appended by THIS call and what was found committed before. `before_commit` as
        ``ShardWriter.append``'s: called before each version put that adds records (after a lost
        put, again with the rows still new: fewer when the winner committed some, and with none
        when it committed them all)."""
        if not isinstance(records, (pa.Table, pa.RecordBatch)):
            records = list(records)
        check_carried_fields(records, fields, f"shard {self.broker!r}")
        if sources is None:
            sources = own_coordinates(records)
        elif len(sources) != len(records):
            raise InvalidAppendError(f"shard {self.broker!r}: {len(sources)} source coordinates for {len(records)} records")
        first = sources.first_occurrences()
        state = self.state
        written: _WrittenChunk | None = None
        announced = False  # before_commit was told of rows a lost version held
        try:
            for _attempt in range(MAX_COMMIT_ATTEMPTS):
                committed = state.source_ranges
                fresh = first[~committed.covered(sources.take(first))] if len(first) else first
                appended = appended_ranges(sources, committed, settled)
                ranges = committed.union(appended)
                extra = fields_extra_after_append(state.extra, fields, committed, appended, source=self.url)
                if written is not None and not np.array_equal(written.rows, fresh):
                    self._discard(written)  # the winner committed some of its rows: write the rest again
                    written = None
                if not len(fresh):
                    if announced:  # a lost version announced rows another writer has committed since
                        before_commit(AppendResult(0, len(records), 0))
                        announced = False
                    if ranges == committed and extra == state.extra:
                        return AppendResult(0, len(records), 0)
                    candidate = state.successor(source_ranges=ranges, extra=extra, **self._stamps(state))
                else:
                    if written is not None and self._may_be_collected(written.put_at):
                        # unlisted for so long (a stalled writer) that collection may have taken it
                        # as an orphan: a version must never list a chunk that could be gone
                        written = None  # (left to collection)
                    if written is None:
                        written = self._write_chunk(records, fresh)
                    candidate = state.successor(
                        chunks=(*state.chunks, ChunkRef(written.name, state.record_count, written.info)),
                        record_count=state.record_count + len(fresh),
                        topics=tuple(sorted(set(state.topics) | written.topics)),
                        source_ranges=ranges, extra=extra, **self._stamps(state))
                self._register(state)
                if before_commit is not None and len(fresh):
                    before_commit(AppendResult(len(fresh), len(records) - len(fresh), written.info.hash_entries))
                    announced = True
                try:
                    won = self._commit(candidate)
                except BaseException:
                    # the version may exist and list the chunk (its answer lost, the read-back
                    # failed too): the chunk stays; collection deletes it if no version names it
                    written = None
                    raise
                if won:
                    self._adopt(candidate)
                    if candidate.number == 1:
                        self._mark_committed()
                    self._after_commit(candidate)
                    appended = len(fresh)
                    written = None
                    return AppendResult(appended, len(records) - appended,
                                        candidate.chunks[-1].info.hash_entries if appended else 0)
                state = self._know(self.versions.latest(state))
            raise CommitConflictError(f"{self.url}: no version won in {MAX_COMMIT_ATTEMPTS} attempts (other writers "
                                      f"commit faster than this one can); nothing of this append is committed")
        finally:
            if written is not None:
                self._discard(written)

    def _write_chunk(self, records, rows: np.ndarray) -> _WrittenChunk:
        taken = records.take(pa.array(rows)) if isinstance(records, (pa.Table, pa.RecordBatch)) \
            else [records[i] for i in rows.tolist()]
        try:
            columns = LogColumns.of(taken)
            refuse_out_of_range_timestamps(columns)
            refuse_unindexed_keys(columns)
        except InvalidAppendError as bad:
            raise InvalidAppendError(f"shard {self.broker!r}: {bad}") from None
        encoded = encode_chunk(columns)
        name = self._put_chunk(encoded.data())
        return _WrittenChunk(name, rows, encoded.info, frozenset(AppendColumns.from_log_columns(columns).topics()),
                             time.monotonic())

    def _put_chunk(self, data: bytes) -> str:
        """Put a new chunk object (unlisted until a version names it); its name, time-ordered and unique."""
        name = f"{CHUNKS_DIR}/{self._now_ms():013d}-{uuid.uuid4().hex[:16]}{CHUNK_SUFFIX}"
        self.client.put(f"{self.prefix}/{name}", data)
        return name

    def _discard(self, written: _WrittenChunk) -> None:
        """Delete a chunk no version lists (best effort: collection finds it otherwise)."""
        try:
            self.client.delete([f"{self.prefix}/{written.name}"])
        except Exception as error:  # noqa: BLE001 - an orphan is collected later
            logger.warning("%s: could not delete the uncommitted chunk %s (%s); collection will", self.url,
                           written.name, error)

    def _stamps(self, state: ShardVersion, **extra: int) -> dict:
        """The fields every successor sets: its commit time and the removals still in grace."""
        now = self._now_ms()
        keep_after = now - int(2 * self.tuning.grace_s * 1000)
        stamps = {"committed_at_ms": now, "removed": tuple(r for r in state.removed if r.at_ms >= keep_after), **extra}
        if not state.compacted_at_ms:  # a new shard: its first compaction is an interval after its first commit
            stamps.setdefault("compacted_at_ms", now)
        return stamps

    def _may_be_collected(self, since: float) -> bool:
        """True when an object put (or a view read) at monotonic time `since` may already be past
        what collection keeps: half the grace period, the other half a margin for clocks and for
        the one request (a version put) that follows the check -- requests time out in seconds,
        the grace period is an hour."""
        return time.monotonic() - since >= self.tuning.grace_s / 2

    def _commit(self, candidate: ShardVersion) -> bool:
        """Put `candidate` if its number is free; True only when it landed on top of the shard.

        Collection deletes a version once its successor is older than the grace period, so a
        view older than that can find its next number free again BELOW the newest and commit
        there unseen (``state`` re-reads a view older than half the grace period, but an append
        under a stalled machine can take longer than that between reading and committing). A
        version put that long after its view was read is checked with one LIST: when newer
        versions exist it is treated as lost (the caller re-reads the newest and tries again;
        the stray version is never the newest, so no reader takes it)."""
        if not self.versions.try_commit(candidate):
            return False
        if not self._may_be_collected(self._state_at):
            return True  # nothing the view was built on can have been collected yet
        newer = self.versions.numbers(after=candidate.number)
        if not newer:
            return True
        logger.warning("%s: version %d was committed below the newest (%d; the view it was built on was older "
                       "than half the grace period): committing again on the newest", self.url,
                       candidate.number, newer[-1])
        return False

    def _adopt(self, committed: ShardVersion) -> None:
        """This writer committed `committed`: its view, and its store's lookups, move to it."""
        self._know(committed)
        if self._on_commit is not None:
            self._on_commit(committed)

    def _register(self, state: ShardVersion) -> None:
        """Mark the shard in the store before its first version (store.py says why)."""
        if not state.number and not self._registered:
            self.client.put_if_absent(f"{SHARDS_DIR}/{self.broker}", b"")
        self._registered = True

    def _mark_committed(self) -> None:
        """Record in the shard's mark that its first version exists (MARK_COMMITTED). Best effort:
        the version is committed either way; a mark left empty only makes a later loss of all
        the shard's versions read as a shard that never committed."""
        try:
            self.client.put(f"{SHARDS_DIR}/{self.broker}", MARK_COMMITTED)
        except Exception as error:  # noqa: BLE001 - the append is committed
            logger.warning("%s: could not mark the shard as committed (%s)", self.url, error)

    def _after_commit(self, committed: ShardVersion) -> None:
        if committed.record_count and self._compaction_due(committed):
            try:
                self.compact()
            except Exception as error:  # noqa: BLE001 - compaction is upkeep: the append is committed
                logger.warning("%s: compaction failed (%s); lookups stay right, with more requests", self.url, error)

    # --- compaction -----------------------------------------------------------------------------
    def _compaction_due(self, state: ShardVersion) -> bool:
        if len(self.plan(state.chunks)) == 0:
            return False
        overdue = self._now_ms() - state.compacted_at_ms >= self.tuning.compaction_interval_s * 1000
        return overdue or len(state.chunks) > self.tuning.max_chunks

    def plan(self, chunks: Sequence[ChunkRef], *, everything: bool = False) -> list[tuple[int, int]]:
        """[start, end) runs of consecutive chunks to merge. The rule: the newest chunks, joined
        by each next older one while it is at most ``ratio`` times their total (``compact``
        applies it again to its result); with `everything`, every run of chunks (newest first)
        whose total fits in one merged chunk."""
        cap, runs, end = self.tuning.max_merged_records, [], len(chunks)
        while end > 1:
            start, total = end - 1, chunks[end - 1].info.records
            while start > 0:
                older = chunks[start - 1].info.records
                if total + older > cap or (not everything and older > self.tuning.ratio * total):
                    break
                start, total = start - 1, total + older
            if end - start >= 2:
                runs.append((start, end))
            if not everything:
                break
            end = start
        return runs

    def compact(self, *, everything: bool = False, max_work_bytes: int | None = None) -> int:
        """Merge chunks by the compaction rule (or, with `everything`, as many as fit together),
        within `max_work_bytes` read (default the tuning's). Returns how many chunks were merged
        away. Runs concurrently with appends and other compactions (module docstring)."""
        budget = self.tuning.max_work_bytes if max_work_bytes is None else max_work_bytes
        merged_away = 0
        state = self.refresh()
        while budget > 0:
            runs = self.plan(state.chunks, everything=everything)
            if not runs:
                break
            start, end = runs[0]
            group = state.chunks[start:end]
            size = sum(c.info.size for c in group)
            if size > budget and merged_away:
                break
            budget -= size
            result = self._merge(group)
            if result is None:
                break
            state = result
            merged_away += len(group) - 1
        self._maybe_collect()
        return merged_away

    def _merge(self, group: tuple[ChunkRef, ...]) -> ShardVersion | None:
        """Merge `group` (consecutive chunks of the newest version) and commit the result in
        their place; None when another writer removed one of them first."""
        chunks = [ObjectChunk(self.client, self.prefix, ref) for ref in group]
        datas = in_parallel(lambda c: self.client.get(c.key), chunks)
        if any(d is None for d in datas):
            return None  # collected: a newer version no longer lists it
        encoded = merge_chunks([(data, chunk.footer()) for data, chunk in zip(datas, chunks)])
        name = self._put_chunk(encoded.data())
        put_at = time.monotonic()
        names = [ref.name for ref in group]
        state = self.state
        for _attempt in range(MAX_COMMIT_ATTEMPTS):
            if self._may_be_collected(put_at):
                return None  # (see append) the merged chunk may be collected as an orphan: leave it
            positions = [i for i, ref in enumerate(state.chunks) if ref.name in names]
            if len(positions) != len(names) or positions != list(range(positions[0], positions[0] + len(names))):
                self.client.delete([f"{self.prefix}/{name}"])
                return None
            first = positions[0]
            now = self._now_ms()
            replaced = ChunkRef(name, state.chunks[first].base_seq, encoded.info)
            stamps = self._stamps(state)
            stamps["removed"] = (*stamps["removed"], *(Removed(n, now) for n in names))
            candidate = state.successor(chunks=(*state.chunks[:first], replaced, *state.chunks[first + len(names):]),
                                        compacted_at_ms=now, **stamps)
            if self._commit(candidate):
                self._adopt(candidate)
                return candidate
            state = self._know(self.versions.latest(state))
        self.client.delete([f"{self.prefix}/{name}"])
        return None

    # --- backfill -------------------------------------------------------------------------------
    def backfill(self, backfill: FieldBackfill) -> BackfillResult:
        """Give the committed records `backfill`'s values and grow the fields' coverage by the
        offsets they were evaluated over (backfill.py): each chunk holding records that get values
        is rewritten (the same records and seqs, their new terms) and all are committed in place
        of the old ones, with the grown coverage, in one version; the old ones are removed as
        compaction removes its inputs. A lost version is read again and the backfill redone over
        it: growth recomputed (another backfill may have covered offsets meanwhile; a change drops
        every rewrite), the rewrites of chunks it still lists kept, chunks new to it (compacted,
        appended) read. InvalidOptionError when a field is defined otherwise than the shard's."""
        rewrites: dict[str, _Rewrite] = {}  # by the name of the listed chunk
        grown_for: dict | None = None
        values: RecordValues | None = None
        state = self.refresh()
        try:
            for attempt in range(MAX_COMMIT_ATTEMPTS):
                if attempt:
                    state = self._know(self.versions.latest(state))
                coverage = fields.coverage_in(state.extra, source=self.url)
                fields.check_compatible(coverage.definitions(), backfill.definitions, f"shard {self.broker!r}",
                                        spelling=True)
                grown = growth(coverage, state.source_ranges, backfill)
                if not any(ranges.ranges for ranges in grown.values()):
                    return BackfillResult(self.broker, grown)
                if grown != grown_for:  # a chunk rewritten for other growth could get values twice
                    self._drop_rewrites(rewrites, list(rewrites))
                    values, grown_for = RecordValues(backfill, grown), grown
                listed = {ref.name for ref in state.chunks}
                # rewrites of chunks no longer listed (compacted away) go, and so do those unlisted for so long
                # that collection may take them for orphans (made again)
                self._drop_rewrites(rewrites, [name for name, rewrite in rewrites.items() if name not in listed or (
                    rewrite.name and self._may_be_collected(rewrite.put_at))])
                for ref in state.chunks:
                    if ref.name in rewrites:
                        continue
                    # no record gets a value (evaluated, none there): the coverage grows alone, no chunk read
                    rewrite = self._rewrite_chunk(ref, values) if values else _Rewrite()
                    if rewrite is not None:
                        rewrites[ref.name] = rewrite
                if len(rewrites) < len(state.chunks) or any(r.name and self._may_be_collected(r.put_at)
                                                            for r in rewrites.values()):
                    continue  # a chunk was compacted away and collected meanwhile, or the rewrites took that long
                now = self._now_ms()
                changed = [ref.name for ref in state.chunks if rewrites[ref.name].name]
                stamps = self._stamps(state)
                stamps["removed"] = (*stamps["removed"], *(Removed(name, now) for name in changed))
                chunks = tuple(ChunkRef(rewrites[ref.name].name, ref.base_seq, rewrites[ref.name].info)
                               if rewrites[ref.name].name else ref for ref in state.chunks)
                candidate = state.successor(chunks=chunks, extra=extra_after(
                    state.extra, grown, backfill.definitions, source=self.url), **stamps)
                try:
                    won = self._commit(candidate)
                except BaseException:
                    rewrites.clear()  # the version may exist and list them: collection deletes them if not
                    raise
                if won:
                    self._adopt(candidate)
                    done = [rewrites.pop(name) for name in changed]
                    return BackfillResult(self.broker, grown, sum(r.records_with_values for r in done),
                                          sum(r.values_added for r in done), sum(r.info.records for r in done))
            raise CommitConflictError(f"{self.url}: backfill of shard {self.broker!r} lost {MAX_COMMIT_ATTEMPTS} "
                                      f"versions in a row; nothing of it is committed")
        finally:
            self._drop_rewrites(rewrites, list(rewrites))

    def _rewrite_chunk(self, ref: ChunkRef, values: RecordValues) -> _Rewrite | None:
        """Chunk `ref` with `values` added to its records' terms, written under a new name (an
        empty _Rewrite when none of its records gets values); None when its object was collected
        (a newer version no longer lists it)."""
        data = self.client.get(f"{self.prefix}/{ref.name}")
        if data is None:
            if self.refresh().chunk_named(ref.name) is not None:
                raise CorruptFileError(f"{self.url}/{ref.name}: chunk object listed by the shard version is missing")
            return None
        chunk = _HeldChunk(self.client, self.prefix, ref, data)
        directory = chunk.batches()
        parts, with_values, added = [], 0, 0
        for batch in range(len(directory)):  # a batch at a time: decoded rows of a big chunk are large
            columns, got, count = rewritten_columns(chunk.decode(batch, directory), values)
            parts.append(columns)
            with_values, added = with_values + got, added + count
        if not with_values:
            return _Rewrite()
        columns = concat_columns(parts)
        if len(columns) != ref.info.records:
            raise CorruptFileError(f"{chunk.path}: chunk holds {len(columns)} records, its shard version says "
                                   f"{ref.info.records}; shard {self.broker!r} was not backfilled")
        encoded = encode_chunk(columns)
        name = self._put_chunk(encoded.data())
        return _Rewrite(name, encoded.info, with_values, added, time.monotonic())

    def _drop_rewrites(self, rewrites: dict[str, _Rewrite], names: Iterable[str]) -> None:
        """Forget the rewrites of `names`, deleting the chunks written (no version lists them)."""
        doomed = [f"{self.prefix}/{rewrite.name}" for rewrite in (rewrites.pop(name) for name in names) if rewrite.name]
        if doomed:
            try:
                self.client.delete(doomed)
            except Exception as error:  # noqa: BLE001 - orphans are collected later
                logger.warning("%s: could not delete uncommitted backfill chunks (%s); collection will", self.url,
                               error)

    # --- retention and collection ---------------------------------------------------------------
    def apply_retention(self, *, max_age_ms: int | None = None, max_bytes: int | None = None,
                        now_ms: int | None = None, dry_run: bool = False) -> RetentionReport:
        """Drop the oldest whole chunks (never the newest) whose newest record is older than
        now_ms - max_age_ms, or while the shard is over max_bytes; committed by a version, the
        objects deleted after the grace period. `now_ms` only moves the age cutoff: the grace
        period runs from the wall clock's now (readers pin versions in real time)."""
        check_retention_arguments(max_age_ms=max_age_ms, max_bytes=max_bytes, now_ms=now_ms)
        removed_at = self._now_ms()
        now = removed_at if now_ms is None else now_ms
        state = self.refresh()
        for _attempt in range(MAX_COMMIT_ATTEMPTS):
            chunks = state.chunks
            drop = 0
            if max_age_ms is not None:
                while drop < len(chunks) - 1 and chunks[drop].info.max_timestamp < now - max_age_ms:
                    drop += 1
            if max_bytes is not None:
                total = sum(c.info.size for c in chunks)
                while drop < len(chunks) - 1 and total - sum(c.info.size for c in chunks[:drop]) > max_bytes:
                    drop += 1
            report = RetentionReport(deleted_segments=tuple(f"{self.url}/{c.name}" for c in chunks[:drop]),
                                     bytes_freed=sum(c.info.size for c in chunks[:drop]))
            if not drop or dry_run:
                return report
            stamps = self._stamps(state)
            stamps["removed"] = (*stamps["removed"], *(Removed(c.name, removed_at) for c in chunks[:drop]))
            candidate = state.successor(chunks=chunks[drop:], log_start_seq=chunks[drop].base_seq,
                                        retained_at_ms=removed_at, **stamps)
            if self._commit(candidate):
                self._adopt(candidate)
                return report
            state = self._know(self.versions.latest(state))
        raise CommitConflictError(f"{self.url}: retention lost {MAX_COMMIT_ATTEMPTS} versions in a row")

    def _maybe_collect(self) -> None:
        if time.monotonic() - self._collected_at >= self.tuning.collect_interval_s:
            self.collect()

    def collect(self, now_ms: int | None = None) -> int:
        """Delete what no reader can need any more: chunks removed more than the grace period
        ago, chunks no version names that are older than it (a writer died before committing),
        and versions beyond the newest ``keep_versions`` whose successor is older than it
        (writers read the newest again before then: ``state``). Returns the chunks deleted."""
        self._collected_at = time.monotonic()
        now = self._now_ms() if now_ms is None else now_ms
        grace_ms = int(self.tuning.grace_s * 1000)
        state = self.refresh()
        doomed = self.unlisted(state).collectable(now, grace_ms)
        if doomed:
            self.client.delete([info.key for info in doomed])
        if state.number > self.tuning.keep_versions:
            self.versions.delete_older_than(state.number - self.tuning.keep_versions + 1,
                                            superseded_before_ms=now - grace_ms)
        return len(doomed)

    def unlisted(self, state: ShardVersion, listing: list[ObjectInfo] | None = None) -> Unlisted:
        """The chunk objects `state` does not list (one LIST, unless `listing` is given: list
        before reading the version, and a chunk committed meanwhile is not taken for an orphan)."""
        if listing is None:
            listing = self.client.list(f"{self.prefix}/{CHUNKS_DIR}/")
        listed = {ref.name for ref in state.chunks}
        removed_at = {r.name: r.at_ms for r in state.removed}
        removed, orphans = [], []
        for info in listing:
            name = info.key[len(self.prefix) + 1 :]
            if name in listed:
                continue
            if name in removed_at:
                removed.append((info, removed_at[name]))
            else:
                orphans.append(info)
        return Unlisted(tuple(removed), tuple(orphans))


@dataclass(frozen=True)
class Unlisted:
    """The chunk objects of a shard that its newest version does not list: those a version
    removed (compaction, retention), with when, and orphans no version names (a writer died
    between its chunk and its commit, or is between them now)."""

    removed: tuple[tuple[ObjectInfo, int], ...]
    orphans: tuple[ObjectInfo, ...]

    def collectable(self, now_ms: int, grace_ms: int) -> list[ObjectInfo]:
        """What may be deleted at `now_ms`: removed more than `grace_ms` ago (a reader of the
        version before has finished), or an orphan written more than `grace_ms` ago (its writer
        is not about to commit it)."""
        cutoff = now_ms - grace_ms
        return [info for info, at_ms in self.removed if at_ms <= cutoff and info.last_modified_ms < cutoff] + [
            info for info in self.orphans if info.last_modified_ms < cutoff]
