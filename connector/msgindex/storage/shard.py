"""A shard: one broker's metadata log, hash index files and checkpoint, in ``broker=<name>/``.

```
broker=<name>/lock          flock'ed by the one writer while it is open
broker=<name>/checkpoint    the commit point (checkpoint.py)
broker=<name>/log/          metadata log segments + sparse offset/time indexes (log/)
broker=<name>/index/        RocketMQ IndexFiles, named yyyyMMddHHmmssSSS (+ their hash runs)
broker=<name>/hotkeys/      hot-key copies of committed stretches of the log (derived: hot_keys.py)
```

Crash safety rests on one rule: nothing past the checkpoint is real. A writer appends the batch to
the log and the active hash index file (rolling to new files when full), syncs all of it, and only
then replaces the checkpoint. The next writer rolls back whatever lies past the checkpoint; readers
simply ignore it. An index entry's phyOffset is the record's sequence number in the log, which
lets every lookup verify the real topic, key and millisecond timestamp.

Hash index file names come from the data (the store timestamp of the first key put in the file,
made strictly greater than the previous file's), not from the wall clock: a batch written again
after a crash then produces byte-identical files under the same names.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import (
    CorruptFileError,
    InvalidAppendError,
    InvalidArgumentError,
    InvalidOptionError,
    LegacyCheckpointError,
    ShardLockedError,
)
from msgindex.storage import fields, hot_keys, verify
from msgindex.storage.append_columns import AppendColumns, IndexEntries, IndexKeys
from msgindex.storage.checkpoint import (
    CHECKPOINT_FILE,
    Checkpoint,
    IndexFileState,
    decode_checkpoint,
    encode_checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from msgindex.storage.durable import fsync_directory, is_temporary, parse_versioned_json, write_atomically
from msgindex.storage.fields import FieldDefinition
from msgindex.storage.fields import check_carried as check_carried_fields
from msgindex.storage.fields import extra_after_append as fields_extra_after_append
from msgindex.storage.file_lock import try_lock, unlock, wait_for_lock
from msgindex.storage.hash_index import entry_sums, hash_run
from msgindex.storage.hash_index.index_file import ENTRY_SIZE as INDEX_ENTRY_SIZE
from msgindex.storage.hash_index.index_file import FIRST_INDEX, IndexFile, index_file_name, parse_index_file_name
from msgindex.storage.hash_index.index_file import HEADER_SIZE as INDEX_HEADER_SIZE
from msgindex.storage.hash_index.index_file import SLOT_SIZE as INDEX_SLOT_SIZE
from msgindex.storage.hash_index.java_hash import index_hash
from msgindex.storage.log import batch_format as bf
from msgindex.storage.log.columns import LogColumns, ranges_owner
from msgindex.storage.log.metadata_log import DEFAULT_MAX_INDEX_BYTES, LogPosition, MetadataLog
from msgindex.storage.log.segment import LOG_SUFFIX
from msgindex.storage.manifest import MANIFEST_FILE, SHARD_DIR_PREFIX, load_manifest, register_shard
from msgindex.storage.message import (
    MAX_TIMESTAMP_MS,
    MIN_TIMESTAMP_MS,
    MessageRecord,
    arrow_text,
    decode_text,
    stored_window,
    timestamp_problem,
)
from msgindex.storage.query import (
    KeysArg,
    Query,
    as_query,
    empty_rows,
)
from msgindex.storage.result_order import in_result_order
from msgindex.storage.settings import StoreSettings
from msgindex.storage.source_ranges import SourceRanges, SourceRows, appended_ranges, merge_intervals
from msgindex.storage.verified_reads import VerifiedReads, WantedKeys, compiled_rows

logger = logging.getLogger(__name__)

LOCK_FILE = "lock"
# A shard rebuilt beside itself (backfill.py) and swapped in: the marker holds the new checkpoint
BACKFILL_MARKER = "backfill"
BACKFILL_MARKER_FORMAT = "msgindex-shard-backfill"
BACKFILL_NEW_DIR = "backfill.new"
BACKFILL_OLD_DIR = "backfill.old"
LOG_DIR = "log"
INDEX_DIR = "index"
# Kafka's sparse index entries are 8 (offset) and 12 (time) bytes; a segment gets at most one
# entry per index_interval_bytes (and per record), plus the roll entry.
TIME_INDEX_ENTRY_BYTES = 12
# index file names are yyyyMMddHHmmssSSS: keep the name's timestamp inside years 1970..9999
MIN_NAME_MS = 0
MAX_NAME_MS = 253_402_300_799_999
SCAN_BATCH_ROWS = 65_536
# Up to this many hash candidates a lookup reads and checks them record by record, against ~0.5 ms
# of numpy and Arrow calls on the vectorized path plus what reading costs there: ~24 us a record read
# in Python (the two cross at 70-110 candidates on 1M and 10M stores). With the compiled reader the
# vectorized path reads a few thousand records as columns (metadata_log.COMPILED_COLUMNS_RECORDS),
# and the record-by-record path reads, verifies and renders them with no Python object per record
# (bf.read_raw_records, VerifiedReads._plain_few): a lookup of keys of 150-250 records, record by
# record / columns, 2.0 / 3.4 ms (long keys, 5M records), 2.0 / 2.7 (long keys, 500k), 1.4 / 1.7
# (bench_vs_parquet's project workload, 500k); they cross at 250-400 (BENCHMARKS.md). Where the
# rows are built in C too (verified_reads.compiled_rows, every segment's records in one table),
# record by record stays ahead up to ~1,000: keys of 300-500 records 2.1 / 2.5 ms, of 1,000-2,000
# 5.9 / 5.9 (long keys, 5M records, one segment); 200-300, 1.7 / 4.7 (2M in six segments).
FEW_CANDIDATES = 64 if bf.compiled_blocks is None else 256 if compiled_rows is None else 1024
# A reader whose snapshot's files vanish under retention retries with the newer checkpoint for as
# long as the writer keeps committing, up to this long: a writer that appends and applies retention
# in a tight loop can win the race several times in a row (CI saw three), so a fixed count of
# attempts turned a healthy shard into a CorruptFileError.
OPEN_RETRY_S = 10.0
SWAP_POLL_S = 0.005  # how often a reader that met a backfill's swap looks for its commit
CHECK_INTERVAL_S = 0.01  # ShardReader.check_unchanged runs at most this often per reader
# What a writer found when it took the lock (ShardWriter.last_revalidation)
REVALIDATION_UNCHANGED = "unchanged"  # its view still is the shard: appended at once
REVALIDATION_ADOPTED = "adopted"  # another writer had committed: its state was reloaded
REVALIDATION_ROLLED_BACK = "rolled back"  # bytes past the checkpoint (a writer died mid-append)
REVALIDATION_RECOVERED = "recovered"  # a cold writer: full recovery


def shard_directory(root: Path, broker: str) -> Path:
    return Path(root) / f"{SHARD_DIR_PREFIX}{broker}"


def checkpoint_path(directory: Path) -> Path:
    return Path(directory) / CHECKPOINT_FILE


def read_committed(directory: Path, broker: str) -> Checkpoint | None:
    """The shard's checkpoint (None: there is none). An unreadable one is a CorruptFileError
    that says how to get the shard back (``msgindex repair``)."""
    try:
        return read_checkpoint(checkpoint_path(directory))
    except CorruptFileError as bad:
        hint = _repair_hint(directory, broker)
        if checkpoint_path(directory).is_dir():  # not msgindex's to remove: the operator moves it first
            hint = f"move that directory elsewhere first; then {hint.split(': ', 1)[1]}"
        raise CorruptFileError(f"{bad}; {hint}") from None


def has_data(directory: Path) -> bool:
    """True when a shard directory holds records or hash index entries: a log segment with
    bytes, or a hash index file (a shard gets its first checkpoint before its first append, so
    such files without a checkpoint mean the checkpoint was lost, not that nothing was committed)."""
    log_dir, index_dir = Path(directory) / LOG_DIR, Path(directory) / INDEX_DIR
    try:
        if any(p.suffix == LOG_SUFFIX and p.stat().st_size > 0 for p in log_dir.iterdir()):
            return True
    except (FileNotFoundError, NotADirectoryError):
        pass
    try:
        return any(parse_index_file_name(p.name) is not None for p in index_dir.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return False


def _repair_hint(directory: Path, broker: str) -> str:
    root = Path(directory).parent
    return (f"the shard's data is left untouched: run `msgindex repair {root} --broker {broker}` to rebuild the "
            f"checkpoint from its files (or restore the checkpoint from a backup)")


def missing_checkpoint_error(directory: Path, broker: str, registered: bool) -> CorruptFileError:
    """The error of a shard without its checkpoint, saying what the shard still holds and what to do."""
    if has_data(directory):
        return CorruptFileError(f"{checkpoint_path(directory)}: shard checkpoint is missing but the shard holds "
                                f"committed data; {_repair_hint(directory, broker)}")
    return CorruptFileError(
        f"{checkpoint_path(directory)}: shard checkpoint is missing and the shard holds no data, but the store "
        f"manifest lists shard {broker!r}: its files were deleted; restore them from a backup, or run `msgindex "
        f"repair {Path(directory).parent} --forget-missing` to accept the loss")


# A broker name becomes its shard's directory name (shard_directory): the rule, stated once (the
# pipeline checks incoming events with it too, to set a bad one aside with the reason).
RESERVED_BROKER_NAMES = (".", "..")
BROKER_NAME_FORBIDDEN_CHARACTERS = ("/", "\0")
BROKER_NAME_RULE = "no '/', NUL, '.', '..'"


def validate_broker_name(broker: str) -> None:
    """A broker name becomes a directory name: no separators, no NUL, not empty or dot-only."""
    if (not isinstance(broker, str) or not broker or broker in RESERVED_BROKER_NAMES
            or any(c in broker for c in BROKER_NAME_FORBIDDEN_CHARACTERS)):
        raise InvalidOptionError(f"invalid broker name {broker!r} (it names a directory: {BROKER_NAME_RULE})")


def max_sparse_index_bytes(settings: StoreSettings) -> int:
    """Maximum size of a segment's sparse indexes: room for every entry a full segment can
    get, at most Kafka's default segment.index.bytes (the log rolls early if an index fills)."""
    interval = max(settings.index_interval_bytes, bf.HEADER_SIZE)
    return min(TIME_INDEX_ENTRY_BYTES * (settings.segment_bytes // interval + 3), DEFAULT_MAX_INDEX_BYTES)


def open_log(directory: Path, settings: StoreSettings, *, writable: bool, committed: LogPosition | None,
             log_dir: str = LOG_DIR, retained_from: int = 0) -> MetadataLog:
    return MetadataLog.open(
        directory / log_dir,
        retained_from=retained_from,
        segment_bytes=settings.segment_bytes,
        index_interval_bytes=settings.index_interval_bytes,
        max_index_bytes=max_sparse_index_bytes(settings),
        writable=writable,
        committed=committed,
    )


@dataclass(frozen=True)
class AppendResult:
    """What ShardWriter.append did with its input rows: `appended` were written and committed
    by this call, `already_committed` were dropped before writing because their source offsets
    were committed before (a replay, a retried or speculative task, a new Spark checkpoint) or
    repeat an earlier row of the same input."""

    appended: int
    already_committed: int
    keys_indexed: int

    @property
    def records(self) -> int:
        """Input rows the shard now holds (both kinds): what the caller's batch contributed."""
        return self.appended + self.already_committed


BeforeCommit = Callable[[AppendResult], None]
"""What an append calls, with what it is about to commit, just before its commit point: whatever
the callback records happens-before the records become visible, so a second writer that finds
them committed can rely on it (the pipeline counts a batch's new records this way whichever
attempt of a task committed them, spark/pipeline/attempt_counts.py). Not called when nothing is
new; a failure in it fails the append, which commits nothing. An object-store append that loses
its version calls it again with what is still new: with 0 appended when the winner took it all."""


class _Committed(ABC):
    """What writer and reader both expose of the checkpoint they hold; both are context managers."""

    _checkpoint: Checkpoint
    _coverage: tuple | None = None  # (the checkpoint, its field coverage): fields.cached_coverage

    @abstractmethod
    def close(self) -> None:
        """Release the shard's files (a writer also its lock)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def checkpoint(self) -> Checkpoint:
        return self._checkpoint

    @property
    def committed_ranges(self) -> SourceRanges | None:
        """The source offsets the shard holds (None: a version-1 shard, not yet upgraded)."""
        return self._checkpoint.source_ranges

    @property
    def field_coverage(self) -> fields.FieldCoverage:
        """The fields the shard indexes and the source offsets each covers (storage/fields.py)."""
        self._coverage = fields.cached_coverage(self._coverage, self._checkpoint, self._checkpoint.extra,
                                                source=checkpoint_path(self.directory))
        return self._coverage[1]


class ShardWriter(_Committed):
    """The one writer of a shard at a time: only the holder of the shard's OS file lock writes.

    Two ways to hold the lock:
    * ``ShardWriter(...)`` (``hold_lock=True``): locked from construction to ``close`` (tools,
      retention, tests). Opening it rolls the shard back to its checkpoint.
    * ``hold_lock=False``: the writer stays open between appends without the lock; each append
      runs inside ``with writer.locked(timeout):``, which takes the lock and revalidates the
      writer's view first (``_revalidate``): unchanged and nothing past the checkpoint -> append
      at once; another writer committed -> reload the committed state; bytes past the checkpoint
      (a writer died mid-append) -> roll back. The pipeline's per-worker writers work this way,
      because Spark may run the next task of a shard on any worker, and a lock parked in an idle
      worker would block it.

    `append` drops every row whose source offsets are already committed and commits the rest,
    with their source ranges, atomically.
    """

    def __init__(self, directory: Path, broker: str, settings: StoreSettings, *, hold_lock: bool = True,
                 store_root: Path | None = None) -> None:
        self.broker = broker
        self.directory = Path(directory)
        self.settings = settings
        self._store_root = None if store_root is None else Path(store_root)  # its manifest lists the shard
        self._lock_fd: int | None = None
        self._log: MetadataLog | None = None
        self._files: list[IndexFile] = []  # same order as the checkpoint's index_files
        self._states: list[IndexFileState] = []
        self._checkpoint = Checkpoint()
        self._seen: bytes | None = None  # the checkpoint file's bytes as this writer last read or wrote them
        self._loaded = False  # whether _log/_files/_states reflect a checkpoint (else: cold)
        self.last_revalidation = ""  # what the last lock acquisition found: REVALIDATION_* (tests, benchmarks)
        (self.directory / INDEX_DIR).mkdir(parents=True, exist_ok=True)
        if hold_lock:
            self._lock()
            try:
                self._revalidate()
            except BaseException:
                self.close()
                raise

    # --- locking -------------------------------------------------------------------------------

    @contextmanager
    def locked(self, timeout_s: float) -> Iterator[Self]:
        """Hold the shard lock for the block (waiting up to `timeout_s` for another holder), with
        this writer's view revalidated against the files first."""
        if self._lock_fd is not None:
            raise InvalidAppendError(f"shard {self.broker!r}: this writer already holds the lock")
        self._lock_fd = wait_for_lock(self.directory / LOCK_FILE, timeout_s)
        if self._lock_fd is None:
            raise ShardLockedError(f"{self.directory / LOCK_FILE}: shard {self.broker!r} lock still held after "
                                   f"waiting {timeout_s:g} s")
        try:
            self._revalidate()
            yield self
        finally:
            self._unlock()

    def _lock(self) -> None:
        self._lock_fd = try_lock(self.directory / LOCK_FILE)
        if self._lock_fd is None:
            raise ShardLockedError(f"{self.directory / LOCK_FILE}: shard {self.broker!r} already has a writer (lock held)")

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            unlock(self._lock_fd)
            self._lock_fd = None

    def _require_locked(self) -> None:
        if self._lock_fd is None or not self._loaded:
            raise InvalidAppendError(f"shard {self.broker!r}: write only while holding the lock (writer.locked())")

    # --- public ---------------------------------------------------------------------------------

    def append(self, records: pa.Table | Sequence[MessageRecord], sources: SourceRows | None = None,
               fields: Sequence[FieldDefinition] = (), before_commit: BeforeCommit | None = None,
               settled: SourceRanges | None = None) -> AppendResult:
        """Append the rows whose source offsets the shard does not hold yet and commit them with
        their source ranges. Crash-safe at every point.

        `sources`: each row's source coordinates and slice (default: the records' own topic,
        partition and offset, all rows of a partition one slice). The caller guarantees the
        invariant of ``source_ranges``: the rows of each slice are every record of that slice's
        offset range (of their source partition) that belongs to this shard. `fields`: the fields
        whose values the records carry were evaluated for (their coverage grows by the offsets
        this append commits; a field redefined is an InvalidOptionError, before anything is
        written).

        `before_commit`: called with what this call is about to commit, after the records are
        written and before the commit point (``BeforeCommit``). `settled`: source offsets whose
        every record that belongs to this shard is committed (completed micro-batches), committed
        too (``source_ranges.appended_ranges``)."""
        self._require_locked()
        if self._checkpoint.source_ranges is None:
            raise LegacyCheckpointError(
                f"{checkpoint_path(self.directory)}: shard {self.broker!r} has a version-1 checkpoint (it "
                f"recorded Spark batch ids, not Kafka offsets); it cannot skip replayed records until its "
                f"offsets are rebuilt: `ShardWriter.adopt_log_offsets()` when the log's topic/partition/offset "
                f"are the source's (--input records), otherwise re-index into a new path"
            )
        if not isinstance(records, (pa.Table, pa.RecordBatch)):
            records = list(records)
        check_carried_fields(records, fields, f"shard {self.broker!r}")
        if sources is None:
            sources = own_coordinates(records)
        elif len(sources) != len(records):
            raise InvalidAppendError(f"shard {self.broker!r}: {len(sources)} source coordinates for {len(records)} records")
        committed = self._checkpoint.source_ranges
        fresh = sources.first_occurrences()
        fresh = fresh[~committed.covered(sources.take(fresh))] if len(fresh) else fresh
        appended = appended_ranges(sources, committed, settled)
        ranges = committed.union(appended)
        extra = fields_extra_after_append(self._checkpoint.extra, fields, committed, appended,
                                          source=checkpoint_path(self.directory))
        skipped = len(records) - len(fresh)
        if not len(fresh):
            if ranges != committed or extra != self._checkpoint.extra:
                self._commit(set(), [], ranges, extra)  # gaps of this slice become committed too
            return AppendResult(0, skipped, 0)
        if len(fresh) < len(records):
            records = records.take(pa.array(fresh)) if isinstance(records, (pa.Table, pa.RecordBatch)) \
                else [records[i] for i in fresh.tolist()]
        try:
            columns = LogColumns.of(records)  # validated once; encoded by the log, keyed by the index
            refuse_out_of_range_timestamps(columns)
            refuse_unindexed_keys(columns)
            seqs = self._append_to_log(columns, ranges)
        except InvalidAppendError as bad:
            raise InvalidAppendError(f"shard {self.broker!r}: {bad}") from None
        try:
            batch = AppendColumns.from_log_columns(columns)
            keys, phy_offsets, timestamps = batch.index_entries(seqs.start)
            first_touched = max(len(self._files) - 1, 0)
            self._put_keys(keys, phy_offsets, timestamps)
            result = AppendResult(len(seqs), skipped, len(keys))
            if before_commit is not None:
                before_commit(result)
            self._commit(batch.topics(), self._files[first_touched:], ranges, extra)
        except BaseException:
            self._reload()  # e.g. disk full: forget the half-written batch, as a crash would
            raise
        return result

    def append_rewritten(self, columns: LogColumns | None, ranges: SourceRanges, extra: dict) -> None:
        """Append records that are not new source offsets but a rewrite of a shard's committed
        ones (``backfill``: with more terms, in a new shard directory), and commit with `ranges`
        and `extra` as given; None: commit them alone. No exactly-once check: the caller's."""
        self._require_locked()
        if columns is None or not len(columns):
            self._commit(set(), [], ranges, extra)
            return
        try:
            seqs = self._append_to_log(columns, ranges)
            batch = AppendColumns.from_log_columns(columns)
            keys, phy_offsets, timestamps = batch.index_entries(seqs.start)
            first_touched = max(len(self._files) - 1, 0)
            self._put_keys(keys, phy_offsets, timestamps)
            self._commit(batch.topics(), self._files[first_touched:], ranges, extra)
        except BaseException:
            self._reload()
            raise

    def _append_to_log(self, columns: LogColumns, ranges: SourceRanges) -> range:
        """The log append of `columns`, carrying the shard's cumulative committed source ranges
        after this append as the log's annotation (compact JSON): a lost checkpoint can then be
        rebuilt from the log alone."""
        return self._log.append(columns, annotation=_ranges_annotation(ranges))

    def adopt_log_offsets(self) -> SourceRanges:
        """Upgrade a version-1 shard (batch ids) whose records' own topic/partition/offset are the
        source coordinates (input ``records``): commit, as its source ranges, exactly the offsets
        its log holds (runs of consecutive offsets). Refused when retention already deleted
        records, whose offsets the log can no longer tell."""
        self._require_locked()
        if self._checkpoint.source_ranges is not None:
            return self._checkpoint.source_ranges
        if self._checkpoint.log_start_seq > 0:
            raise LegacyCheckpointError(
                f"{checkpoint_path(self.directory)}: shard {self.broker!r} has a version-1 checkpoint and retention "
                f"deleted its oldest records, so its committed offsets cannot be rebuilt; re-index into a new path"
            )
        found: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for batch in self._log.scan_range(0, self._log.next_seq, self.broker):
            rows = SourceRows.of(batch.column("topic"), batch.column("partition"), batch.column("offset"))
            for source, where in rows.groups():
                offsets = np.unique(rows.offset[where])
                runs = np.split(offsets, np.flatnonzero(np.diff(offsets) != 1) + 1)
                found.setdefault(source, []).extend((int(run[0]), int(run[-1]) + 1) for run in runs)
        ranges = SourceRanges({source: merge_intervals(runs) for source, runs in found.items()})
        self._commit(set(), [], ranges)
        return ranges

    def close(self) -> None:
        """Release the files and the lock. A writer that does not hold the lock only forgets its
        view: another process may be writing these files right now."""
        if self._lock_fd is not None:
            self._close_files()
        else:
            self._release_files()
        self._unlock()

    # --- used by retention ----------------------------------------------------------------------
    @property
    def log(self) -> MetadataLog:
        self._require_locked()
        return self._log

    def data_directories(self) -> list[Path]:
        return [self.directory / LOG_DIR, self.directory / INDEX_DIR]

    def index_file_paths(self) -> list[Path]:
        return [self.directory / INDEX_DIR / state.name for state in self._states]

    def drop_oldest(self, index_files: int, log_start_seq: int) -> None:
        """Commit the removal of the `index_files` oldest hash index files and of the log
        segments below `log_start_seq`, then delete them. The checkpoint is written first: a
        crash in between leaves files that the next open deletes."""
        self._require_locked()
        if index_files >= len(self._states) and index_files:
            raise InvalidOptionError(f"shard {self.broker!r}: the active index file cannot be deleted")
        doomed = self._files[:index_files]
        self._files = self._files[index_files:]
        self._states = self._states[index_files:]
        self._checkpoint = dataclasses.replace(
            self._checkpoint,
            index_files=tuple(self._states),
            log_start_seq=max(self._checkpoint.log_start_seq, log_start_seq),
        )
        self._write_checkpoint(self._checkpoint)
        for index_file in doomed:
            index_file.close()
            Path(index_file.path).unlink(missing_ok=True)
            hash_run.remove_runs(index_file.path)
            entry_sums.remove(index_file.path)
        self._delete_segments_below(self._checkpoint.log_start_seq)
        hot_keys.remove_copies(self.directory / hot_keys.DIRECTORY, below=self._checkpoint.log_start_seq)
        fsync_directory(self.directory / INDEX_DIR)

    # --- revalidation and recovery --------------------------------------------------------------
    def _revalidate(self) -> None:
        """Bring this writer's view to the shard's committed state (the lock is held)."""
        if any((self.directory / name).exists() for name in (BACKFILL_MARKER, BACKFILL_NEW_DIR, BACKFILL_OLD_DIR)):
            # a backfill died: swapping in its rebuilt shard (finished now), or before (its build deleted)
            self._release_files()
            finish_interrupted_swap(self.directory)
        path = checkpoint_path(self.directory)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raw = None
        except OSError as error:  # e.g. a directory in its place
            raise CorruptFileError(f"{path}: cannot read the checkpoint ({error.strerror}); "
                                   f"{_repair_hint(self.directory, self.broker)}") from None
        if self._loaded and raw is not None and raw == self._seen:
            if self._tail_is_clean():
                self.last_revalidation = REVALIDATION_UNCHANGED  # nobody wrote since our last commit or look
                return
            self._reload()  # a writer died mid-append after our commit: roll its bytes back
            self.last_revalidation = REVALIDATION_ROLLED_BACK
        elif self._loaded and raw is not None:
            try:
                checkpoint = decode_checkpoint(raw, source=path)
            except CorruptFileError as bad:
                raise CorruptFileError(f"{bad}; {_repair_hint(self.directory, self.broker)}") from None
            self._adopt(checkpoint, raw)  # another writer committed
            self.last_revalidation = REVALIDATION_ADOPTED
        else:
            self._reload()
            self.last_revalidation = REVALIDATION_RECOVERED

    def _tail_is_clean(self) -> bool:
        """Nothing lies past the checkpoint this writer holds: no log bytes or segments, no hash
        index entries or files (a writer that died mid-append leaves some)."""
        position = self._checkpoint.log_position
        if not self._log.unchanged_on_disk(position):
            return False
        names = {state.name for state in self._states}
        on_disk = {entry.name for entry in os.scandir(self.directory / INDEX_DIR)
                   if not hash_run.is_sidecar_of(entry.name, names) and not entry_sums.is_sums_of(entry.name, names)}
        if on_disk != names:  # (a file of an uncommitted roll; sidecars of listed files are derived)
            return False
        return not self._files or not _written_past(self._files[-1], self._states[-1])

    def _reload(self) -> None:
        """Full recovery: forget this view and roll the shard back to its checkpoint on disk."""
        self._release_files()
        self._checkpoint = self._recover()
        self._seen = checkpoint_path(self.directory).read_bytes()
        self._loaded = True

    def _adopt(self, checkpoint: Checkpoint, raw: bytes) -> None:
        """Another writer committed `checkpoint`: reopen the log at it (cutting whatever a writer
        that died since left past it) and the hash index files that changed, keep the rest."""
        self._log.release()
        self._log = None
        kept = dict(zip((s.name for s in self._states), zip(self._states, self._files)))
        self._files, self._states = [], []
        self._checkpoint = checkpoint
        try:
            self._open_committed(checkpoint, kept)
        except BaseException:
            for _, index_file in kept.values():
                index_file.close()
            self._release_files()
            self._loaded = False
            raise
        for _, index_file in kept.values():
            index_file.close()  # files retention removed
        self._seen = raw

    def _close_files(self) -> None:
        for index_file in self._files:
            index_file.close()
        self._files, self._states = [], []
        if self._log is not None:
            self._log.close()
            self._log = None
        self._loaded = False

    def _release_files(self) -> None:
        """Forget the view without writing anything (see MetadataLog.release)."""
        for index_file in self._files:
            index_file.close()  # hash index files are never resized: unmapping is harmless
        self._files, self._states = [], []
        if self._log is not None:
            self._log.release()
            self._log = None
        self._loaded = False

    def _recover(self) -> Checkpoint:
        """Roll the shard back to its checkpoint; a shard that never committed starts empty. A
        missing checkpoint with data present is refused, never taken for an empty shard: the data
        stays untouched for ``msgindex repair``."""
        checkpoint = read_committed(self.directory, self.broker)
        for entry in self.directory.iterdir():
            if is_temporary(entry.name, CHECKPOINT_FILE):
                _remove(entry)  # a commit torn before its rename: never real
        if checkpoint is None:
            registered = self._store_root is not None and self.broker in (
                load_manifest(self._store_root / MANIFEST_FILE).shards or ())
            if registered or has_data(self.directory):
                raise missing_checkpoint_error(self.directory, self.broker, registered)
            # A new shard (or one whose creation died before its first checkpoint: empty files).
            shutil.rmtree(self.directory / LOG_DIR, ignore_errors=True)
            for stray in (self.directory / INDEX_DIR).iterdir():
                _remove(stray)
            shutil.rmtree(self.directory / hot_keys.DIRECTORY, ignore_errors=True)
            self._log = open_log(self.directory, self.settings, writable=True, committed=None)
            checkpoint = Checkpoint(log_position=self._log.position())
            self._write_checkpoint(checkpoint)
        else:
            self._checkpoint = checkpoint
            self._open_committed(checkpoint, {})
            # copies past the commit (a repaired, shorter shard) and interrupted writes of copies
            hot_keys.remove_copies(self.directory / hot_keys.DIRECTORY, beyond=checkpoint.record_count)
        if self._store_root is not None:
            register_shard(self._store_root, self.broker)  # after its first checkpoint (manifest.py)
        return checkpoint

    def _open_committed(self, checkpoint: Checkpoint, kept: dict[str, tuple[IndexFileState, IndexFile]]) -> None:
        """Open the log and hash index files at `checkpoint`, rolling back anything past it.
        `kept`: files this writer still has open; one whose committed state is unchanged is
        reused (popped), the others are reopened (another host's writes are then seen, NFS)."""
        position = checkpoint.log_position
        # opening at the committed position cuts whatever lies past it (no close-and-trim cycle)
        self._log = open_log(self.directory, self.settings, writable=True, committed=position)
        verify.check_log_covers(self._log, checkpoint)
        self._delete_segments_below(checkpoint.log_start_seq)
        self._delete_unlisted_index_files(checkpoint)
        last = len(checkpoint.index_files) - 1
        for n, state in enumerate(checkpoint.index_files):
            reuse = kept.get(state.name)
            if reuse is not None and reuse[0] == state and n < last:
                del kept[state.name]
                self._files.append(reuse[1])
            else:
                self._files.append(self._open_rolled_back(state, active=n == last))
                # a writer that died between its checkpoint and the files' entry checksums left them behind
                entry_sums.extend(self._files[-1], state.index_count,
                                  self._entries_checker(self._files[-1], checkpoint.log_start_seq))
            self._states.append(state)

    def _open_rolled_back(self, state: IndexFileState, *, active: bool) -> IndexFile:
        """The committed file `state` names, rolled back to it, checked against it (``verify``):
        damage is refused before anything is written into the file."""
        path = self.directory / INDEX_DIR / state.name
        if not path.is_file():
            raise CorruptFileError(f"{path}: hash index file listed by the shard checkpoint is missing")
        index_file = IndexFile.open(path, self.settings.hash_slot_num, self.settings.index_num)
        try:
            if _written_past(index_file, state):  # the slot-table scan of a rollback only when needed
                verify.check_index_file(index_file, state, active=active)
                verify.check_rollback_bounds(index_file, state)
                index_file.rollback_to(state.index_count, state.header)
            verify.check_index_file(index_file, state, active=active, exclusive=True)
        except BaseException:
            index_file.close()
            raise
        return index_file

    def _delete_unlisted_index_files(self, checkpoint: Checkpoint) -> None:
        listed = {state.name for state in checkpoint.index_files}
        removed = False
        for entry in (self.directory / INDEX_DIR).iterdir():
            if entry.name not in listed and not hash_run.is_sidecar_of(entry.name, listed) \
                    and not entry_sums.is_sums_of(entry.name, listed):
                _remove(entry)  # created by a batch that never committed (or retention's leftovers)
                removed = True
        if removed:
            fsync_directory(self.directory / INDEX_DIR)

    def _delete_segments_below(self, log_start_seq: int) -> None:
        segments = self._log.segments()
        # a segment holds [its base, the next one's base); the last (active) one is never deleted
        for segment, following in zip(segments, segments[1:]):
            if following.base_seq <= log_start_seq:
                self._log.delete_segment(segment.base_seq)

    # --- appending ------------------------------------------------------------------------------
    def _put_keys(self, keys: IndexKeys, phy_offsets: np.ndarray, timestamps: np.ndarray) -> None:
        timestamps = np.asarray(timestamps, dtype=np.int64)
        done = 0
        while done < len(keys):
            if not self._files or self._files[-1].is_full:
                self._roll(int(timestamps[done]))
            active = self._files[-1]
            written = active.put_keys(keys[done:], phy_offsets[done:], timestamps[done:])
            if written:
                window = timestamps[done : done + written]
                self._states[-1] = self._grown_state(self._states[-1], active, int(window.min()), int(window.max()))
            elif not active.is_full:
                raise InvalidAppendError(f"{active.path}: put_keys wrote nothing into a file that is not full")
            done += written

    def _roll(self, first_timestamp_ms: int) -> None:
        """Create the next hash index file. Like RocketMQ, it inherits the end offset and time of
        the full file before it; its name is data-derived and strictly increasing (see module doc)."""
        name_ms = min(max(first_timestamp_ms, MIN_NAME_MS), MAX_NAME_MS)
        end_phy_offset = end_timestamp = 0
        if self._files:
            previous = self._files[-1]
            name_ms = max(name_ms, _name_ms(self._states[-1].name) + 1)
            end_phy_offset, end_timestamp = previous.end_phy_offset, previous.end_timestamp
        path = self.directory / INDEX_DIR / index_file_name(name_ms, utc=True)
        _remove(path)  # a leftover of a crashed batch that the rollback did not know about
        entry_sums.remove(path)
        index_file = IndexFile.create(
            path,
            self.settings.hash_slot_num,
            self.settings.index_num,
            end_phy_offset=end_phy_offset,
            end_timestamp=end_timestamp,
        )
        self._files.append(index_file)
        self._states.append(IndexFileState(path.name, index_file.header, 0, 0))

    @staticmethod
    def _grown_state(state: IndexFileState, index_file: IndexFile, low: int, high: int) -> IndexFileState:
        if state.index_count > 1:  # the file already had entries: widen its range
            low, high = min(low, state.min_timestamp_ms), max(high, state.max_timestamp_ms)
        return IndexFileState(state.name, index_file.header, low, high)

    def _commit(self, topics: set[str], touched: list[IndexFile], ranges: SourceRanges,
                extra: dict | None = None) -> None:
        committed_before = {state.name: state.index_count for state in self._checkpoint.index_files}
        if touched or self._log.next_seq != self._checkpoint.record_count:
            self._log.flush()
            for index_file in touched:
                index_file.flush()
            fsync_directory(self.directory / INDEX_DIR)
        self._write_checkpoint(Checkpoint(
            log_position=self._log.position(),
            log_start_seq=self._checkpoint.log_start_seq,
            index_files=tuple(self._states),
            topics=tuple(sorted(set(self._checkpoint.topics) | topics)),
            record_count=self._log.next_seq,
            source_ranges=ranges,
            extra=self._checkpoint.extra if extra is None else extra,
        ))
        # entry checksums over what this commit added to each file (entry_sums: after the checkpoint)
        counts = {state.name: state.index_count for state in self._states}
        for index_file in touched:
            name = Path(index_file.path).name
            entry_sums.extend(index_file, counts[name], self._entries_checker(index_file, self._checkpoint.log_start_seq),
                              put_from=committed_before.get(name, 1))
        # hash runs (derived, never required) over the committed entries of the files this commit
        # wrote: the keys sharing a hot key's slot then skip its chain (hash_run)
        hash_run.seal_committed(touched, counts)
        self._seal_hot_keys()

    def _entries_checker(self, index_file: IndexFile, log_start_seq: int):
        """``entry_sums.extend``'s check of committed entries this writer did not put."""
        return lambda first, end: verify.check_entries_point_at_keys(index_file, first, end, self._log, log_start_seq)

    def _seal_hot_keys(self) -> None:
        """Copy the hot keys of committed stretches that have no copy yet (``hot_keys``). A copy
        is derived: one that cannot be written (a full disk) leaves the commit as it is."""
        try:
            hot_keys.seal_committed(self.directory / hot_keys.DIRECTORY, self._log, self._checkpoint.log_start_seq,
                                    self._checkpoint.record_count)
        except OSError as error:  # StorageFullError is one
            logger.warning("%s: no hot-key copy written (%s); lookups of hot keys read the log", self.directory, error)

    def _write_checkpoint(self, checkpoint: Checkpoint) -> None:
        raw = encode_checkpoint(checkpoint)
        write_atomically(checkpoint_path(self.directory), raw)
        self._checkpoint, self._seen = checkpoint, raw


class ShardReader(_Committed, VerifiedReads):
    """A consistent read-only view of a shard's last commit, taken when it is opened. It never
    blocks (or is blocked by) the writer: it ignores records past its committed log position,
    hash entries past each file's committed count, and files the checkpoint does not list."""

    def __init__(self, directory: Path, broker: str, settings: StoreSettings, *, registered: bool = False) -> None:
        """`registered`: the store manifest lists the shard, so it has committed (a missing
        checkpoint is then damage even when no data is left)."""
        self.broker = broker
        self.directory = Path(directory)
        self.settings = settings
        self._log: MetadataLog | None = None
        self._files: list[tuple[IndexFileState, IndexFile]] = []
        self._mapped: dict[str, _FileIdentity] = {}  # see check_unchanged
        self._checked_at = 0.0
        self._copies: list[hot_keys.HotKeyCopy] | None = None  # see _hot_key_copies
        self._held: set[bytes] | None = None  # see _copied_keys
        self._copy_fitness: dict[Path, bool] = {}
        deadline = time.monotonic() + OPEN_RETRY_S
        checkpoint = read_committed(self.directory, broker)
        while True:
            if checkpoint is None and (registered or has_data(self.directory)):
                raise missing_checkpoint_error(self.directory, broker, registered)
            self._checkpoint = checkpoint if checkpoint is not None else Checkpoint()
            try:
                self._open_files()
                self._mapped, self._checked_at = self._mapped_files(), time.monotonic()
                return
            except CorruptFileError as damaged:
                self.close()
                # Retention commits before it deletes, so files of the snapshot just read that
                # are gone mean a newer checkpoint exists: retry with it. A backfill swaps its
                # rebuilt files in first and commits after (its marker stands until then): wait
                # for its commit. An unchanged checkpoint otherwise means the shard is damaged.
                # (the marker first: it stands from before the swap's renames until after its commit,
                # so seen before a read of the old checkpoint it means the swap is not committed yet)
                marked = (self.directory / BACKFILL_MARKER).is_file()
                newer = read_committed(self.directory, broker)
                swapping = newer == checkpoint and marked
                if (newer == checkpoint and not swapping) or time.monotonic() > deadline:
                    if swapping:
                        raise CorruptFileError(
                            f"{self.directory / BACKFILL_MARKER}: a backfill of shard {broker!r} stopped while "
                            f"swapping its rebuilt files in; the shard's next writer (the indexing job, or "
                            f"`msgindex repair`) finishes it") from damaged
                    raise
                if swapping:
                    time.sleep(SWAP_POLL_S)
                checkpoint = newer
            except BaseException:
                self.close()
                raise

    def _open_files(self) -> None:
        """Open the committed files, checked against the checkpoint (``verify``: cheap checks,
        the slot-table count cached per file and process)."""
        if self._checkpoint.log_position is not None:
            position = self._checkpoint.log_position
            self._log = open_log(self.directory, self.settings, writable=False, committed=position,
                                 retained_from=self._checkpoint.log_start_seq)
            verify.check_log_covers(self._log, self._checkpoint)
        last = len(self._checkpoint.index_files) - 1
        for n, state in enumerate(self._checkpoint.index_files):
            path = self.directory / INDEX_DIR / state.name
            if not path.is_file():
                raise CorruptFileError(f"{path}: hash index file listed by the shard checkpoint is missing")
            index_file = IndexFile.open(path, self.settings.hash_slot_num, self.settings.index_num, read_only=True)
            index_file.guard_entries()
            self._files.append((state, index_file))
            verify.check_index_file(index_file, state, active=n == last, log=self._log,
                                    log_start_seq=self._checkpoint.log_start_seq)

    def check_unchanged(self) -> None:
        """Before a long-lived reader answers again (``Store`` keeps one per shard until the
        next commit): its hash index files and hash runs are memory-mapped, and one changed in
        place since (truncated, zeroed, overwritten) would make lookups miss entries silently
        or, past the file's new end, kill the process with SIGBUS. One stat per file of the
        shard's ``index/`` directory: a committed index file of the same inode that shrank is a
        CorruptFileError (writers only ever grow one), one whose mtime changed is checked against the commit
        again (``verify.check_index_file``: header, slot count); a hash run that changed is
        dropped, and reloaded (and verified) at its next use. A file replaced by a rename is
        harmless: the mapping keeps the old inode. It runs at most every CHECK_INTERVAL_S (a
        1-key lookup is ~0.25 ms, the check ~10 us + 2 us per file), and a change within the
        filesystem's mtime granularity of the file's last write goes unnoticed (a few ms): the
        window left is that small, never closed (a mapping cannot be checked and read atomically)."""
        moment = time.monotonic()
        if moment - self._checked_at < CHECK_INTERVAL_S:
            return
        self._checked_at = moment
        now = self._mapped_files()
        if now == self._mapped:
            return
        last = len(self._files) - 1
        for n, (state, index_file) in enumerate(self._files):
            before, after = self._mapped.get(state.name), now.get(state.name)
            if before is None or after is None or before.inode != after.inode:
                continue
            if after.size < before.size:  # (a writer grows a file ahead of its entries: never shrinks it)
                raise CorruptFileError(
                    f"{index_file.path}: hash index file shrank under an open reader ({before.size} -> "
                    f"{after.size} bytes): it was truncated or rewritten in place")
            if after.mtime_ns != before.mtime_ns:
                index_file.guard_entries()  # its entries may have changed too: check them anew
                verify.check_index_file(index_file, state, active=n == last, log=self._log,
                                        log_start_seq=self._checkpoint.log_start_seq)
        changed_runs = {name.split(".", 1)[0] for name in set(now) ^ set(self._mapped) | {
            name for name in set(now) & set(self._mapped) if now[name] != self._mapped[name]}
            if name.endswith(hash_run.SUFFIX)}
        for state, index_file in self._files:
            if state.name in changed_runs:
                index_file.forget_hash_runs()
        self._mapped = now

    def _mapped_files(self) -> dict[str, _FileIdentity]:
        """Every file in the shard's index/ directory (index files and hash runs) as it is now."""
        found = {}
        try:
            with os.scandir(self.directory / INDEX_DIR) as entries:
                for entry in entries:
                    try:
                        info = entry.stat()
                    except FileNotFoundError:
                        continue
                    found[entry.name] = _FileIdentity((info.st_dev, info.st_ino), info.st_size, info.st_mtime_ns)
        except (FileNotFoundError, NotADirectoryError):
            pass
        return found

    # --- snapshot facts -------------------------------------------------------------------------

    @property
    def record_count(self) -> int:
        """Committed records still retained (retention may have dropped the oldest segments)."""
        return self._checkpoint.record_count - self._checkpoint.log_start_seq

    @property
    def topics(self) -> tuple[str, ...]:
        return self._checkpoint.topics

    @property
    def log(self) -> MetadataLog | None:
        """The committed metadata log (None when the shard has never committed)."""
        return self._log

    def index_files(self) -> list[tuple[IndexFileState, IndexFile]]:
        """The committed hash index files, oldest first, with their committed state."""
        return list(self._files)

    # --- queries --------------------------------------------------------------------------------
    def lookup(
        self,
        keys: KeysArg | Query,
        *,
        topic: str | None = None,
        begin_ms: int | None = None,
        end_ms: int | None = None,
        max_results: int | None = None,
        partitions: Iterable[int] | None = None,
    ) -> pa.Table:
        """Committed messages indexed under any of `keys` (in `topic`, or any topic), whose
        timestamp is in [begin_ms, end_ms]; each verified against the log record (exact topic,
        key and ms timestamp). ROW_SCHEMA, ordered by timestamp then topic/partition/offset.
        A ``Query`` may stand for all the arguments (its ``brokers`` are the store's business)."""
        query = as_query(keys, topic=topic, begin_ms=begin_ms, end_ms=end_ms, max_results=max_results,
                         partitions=partitions)
        if query.keys is None:
            raise InvalidArgumentError("a lookup needs keys (a Query without keys is a scan: scan_range)")
        return self._with_field_columns(self._lookup_rows(query), query)

    def _lookup_rows(self, query: Query) -> pa.Table:
        """``lookup``'s rows in ROW_SCHEMA."""
        topics = query.topics_among(self._checkpoint.topics)
        window = query.stored_window()  # what the window means for timestamps stored before the rule
        field_pairs = self._field_pairs(query)
        if self._log is None or query.looks_up_nothing or not topics or window is None:
            return empty_rows()
        begin_ms, end_ms = window
        wanted = WantedKeys.of(topics, list(query.keys), field_pairs)
        # Hot-key copies (hot_keys.py) answer the keys they hold; a key's hash entries below what
        # they hold of it are not even read (_floor_entry): of 1,000 keys, a copied one's chain
        # may hold more entries than all the others'.
        copied = self._copied_rows(wanted)
        from_seqs = copied.covered_below(len(wanted.hashes)) if copied is not None else None
        seqs, who = self._candidates(wanted, begin_ms, end_ms, from_seqs)
        bf.expect_scattered_reads(len(seqs))
        if len(seqs) <= FEW_CANDIDATES and (from_seqs is None or from_seqs.max() <= self._checkpoint.log_start_seq):
            return self._verified_few(seqs, who, wanted, begin_ms, end_ms, query.partitions, query.max_results)
        parts = []
        if copied is not None:
            wanted_partitions = None if query.partitions is None else np.array(sorted(set(query.partitions)), np.int64)
            shown = {topic: arrow_text(topic) for topic in topics}  # per topic, not per (topic, key) pair
            parts = copied.parts(self.broker, [shown[topic] for topic, _ in wanted.texts], begin_ms, end_ms,
                                 wanted_partitions)
            seqs, who = copied.left_for_log(seqs, who)
        found = self._verified(seqs, who, wanted, begin_ms, end_ms, query.partitions) + parts
        if not found:
            return empty_rows()
        # parts nearly in time order: only where they meet are rows ordered again
        found.sort(key=lambda part: (int(part.order.timestamp_ms[0]), int(part.order.seqs[0])))
        return in_result_order(found, query.max_results)

    def _field_pairs(self, query: Query) -> tuple[tuple[str, str], ...]:
        """The query's field values with their names as this shard indexed them, after a
        FieldCoverageWarning for each field that does not cover what the shard holds."""
        if not query.fields:
            return ()
        coverage = self.field_coverage
        pairs = tuple((coverage.spelled(name), value) for name, value in query.fields)
        held = self._checkpoint.source_ranges
        if held is not None:
            fields.warn_uncovered(f"shard {self.broker!r}", held, coverage, (name for name, _ in pairs),
                                  topics=query.topics, partitions=query.partitions)
        return pairs

    def scan_ranges(self, begin_ms: int | None = None, end_ms: int | None = None) -> list[tuple[int, int]]:
        """[start_seq, end_seq) pieces of the committed log that a scan of the time window must
        read (found with the sparse time indexes): the natural partitions of a parallel scan."""
        window = stored_window(begin_ms, end_ms)
        if self._log is None or window is None:
            return []
        begin_ms, end_ms = window
        low, high = self._checkpoint.log_start_seq, self._checkpoint.record_count
        pieces = []
        for start, end in self._log.scan_ranges(begin_ms, end_ms):
            start, end = max(start, low), min(end, high)
            if start < end:
                pieces.append((start, end))
        return pieces

    def scan_range(
        self,
        start_seq: int,
        end_seq: int,
        query: Query | None = None,
        *,
        begin_ms: int | None = None,
        end_ms: int | None = None,
        topics: Iterable[str] | None = None,
        partitions: Iterable[int] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """The committed records with start_seq <= seq < end_seq in the time window (inclusive,
        ms), optionally only some topics/partitions, as ROW_SCHEMA batches in log order. A
        ``Query`` (its keys ignored: a scan reads every record) may stand for the restrictions."""
        query = as_query(query, begin_ms=begin_ms, end_ms=end_ms, topics=topics, partitions=partitions)
        window = query.stored_window()
        if self._log is None or window is None:
            return
        begin_ms, end_ms = window
        start = max(start_seq, self._checkpoint.log_start_seq)
        end = min(end_seq, self._checkpoint.record_count)
        if start >= end:
            return
        yield from self._log.scan_range(
            start, end, self.broker, begin_ms, end_ms, SCAN_BATCH_ROWS, topics=query.topics, partitions=query.partitions,
            fields=self._rendered_fields(query))

    def close(self) -> None:
        for _, index_file in self._files:
            index_file.close()
        self._files = []
        if self._log is not None:
            self._log.close()
            self._log = None

    # --- lookup internals -----------------------------------------------------------------------
    def _candidates(self, wanted: WantedKeys, begin_ms: int | None, end_ms: int | None,
                    from_seqs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(seq, wanted-key number) of every committed hash-matching entry, from every committed
        file whose true time range meets the window: flat arrays, all keys of the call at once.
        Entries point into the log by seq. `from_seqs`: per wanted number, only entries at or
        past it (a few distinct values: the keys are walked in one group per value)."""
        if from_seqs is None:
            return self._candidates_from(wanted.hashes, begin_ms, end_ms, 0)
        seqs, whos = [], []
        floors, group = np.unique(from_seqs, return_inverse=True)
        for at, from_seq in enumerate(floors.tolist()):
            numbers = np.flatnonzero(group == at)
            found, who = self._candidates_from(wanted.hashes[numbers], begin_ms, end_ms, from_seq)
            seqs.append(found)
            whos.append(numbers[who])
        return np.concatenate(seqs), np.concatenate(whos)

    def _candidates_from(self, hashes: np.ndarray, begin_ms: int | None, end_ms: int | None,
                         from_seq: int) -> tuple[np.ndarray, np.ndarray]:
        """``_candidates`` of key `hashes` (who: positions in it), entries at or past `from_seq`."""
        low, high = max(self._checkpoint.log_start_seq, from_seq), self._checkpoint.record_count
        seqs, whos = [], []
        for state, index_file in reversed(self._files):
            if not state.overlaps(begin_ms, end_ms):
                continue
            if state.index_count > 1 and state.header.end_phy_offset < from_seq:
                continue  # every entry of the file points below from_seq (phyOffsets only grow)
            floor = self._floor_entry(index_file, state, from_seq) if from_seq > self._checkpoint.log_start_seq \
                else FIRST_INDEX
            who, _entries, phy_offsets, _approx_ms = index_file.candidate_arrays(
                hashes, limit_index_count=state.index_count, floor_entry=floor)
            inside = (phy_offsets >= low) & (phy_offsets < high)
            if not inside.all():
                _check_entry_targets(index_file, phy_offsets[~inside], high)
            seqs.append(phy_offsets[inside])
            whos.append(who[inside])
        if not seqs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(seqs), np.concatenate(whos)

    def _floor_entry(self, index_file: IndexFile, state: IndexFileState, from_seq: int) -> int:
        """The first committed entry of `index_file` pointing at or past `from_seq`: walks end
        below it (a hot key's chain below its copies is never read). Its search can only be
        misled by a damaged entry into ending just past that entry (``first_entry_from``), so the
        entry before it must be what it says: an entry of a retained record below `from_seq`
        that carries a key of its hash. Otherwise every entry is walked (and checked as usual)."""
        floor = index_file.first_entry_from(from_seq, state.index_count)
        if floor <= FIRST_INDEX:
            return FIRST_INDEX
        _index, key_hash, seq, _diff, _prev = index_file.entry(floor - 1)
        if not self._checkpoint.log_start_seq <= seq < from_seq:
            return FIRST_INDEX
        record = self._log.read_few([seq])[0]
        if key_hash not in {index_hash(string) for string in record.index_strings()}:
            return FIRST_INDEX
        return floor

    def _copied_rows(self, wanted: WantedKeys) -> hot_keys.CopiedRows | None:
        """What the hot-key copies hold of the wanted keys (None: nothing, the usual case)."""
        copies = self._hot_key_copies()
        if not copies:
            return None
        # each copied wanted key's (topic, key) numbers: of 1,000 wanted keys, few are copied
        if len(wanted.texts) <= _FEW_WANTED:
            held, terms, per_topic = self._copied_keys(), wanted.term_bytes, wanted.keys_per_topic
            numbers = [n for n in range(len(wanted.texts)) if terms[n % per_topic] in held]
            if not numbers:
                return None
            pair_terms = [terms[n % per_topic] for n in numbers]
        else:
            copied = pa.array(sorted(self._copied_keys()), bf.TEXT)
            found = np.flatnonzero(pc.is_in(wanted.keys, copied).to_numpy(zero_copy_only=False))
            if not len(found):
                return None
            numbers, pair_terms = found.tolist(), wanted.keys.take(pa.array(found)).to_pylist()
        key_numbers: dict[bytes, list[int]] = {}
        for number, key in zip(numbers, pair_terms):
            key_numbers.setdefault(key, []).append(number)
        # the distinct wanted keys: a Query's keys are duplicate-free (query.normalize_keys)
        return hot_keys.read_copies(copies, self._copy_fits, key_numbers, len(wanted.hashes),
                                    self._checkpoint.log_start_seq, wanted.keys_per_topic)

    def _copied_keys(self) -> set[bytes]:
        """The keys some hot-key copy of the shard holds (encode_text bytes)."""
        if self._held is None:
            self._held = set().union(*(copy.groups for copy in self._hot_key_copies()))
        return self._held

    def _hot_key_copies(self) -> list[hot_keys.HotKeyCopy]:
        """The shard's hot-key copies of committed, retained stretches (read once per reader;
        a damaged one is left out with a warning: the log answers for it)."""
        if self._copies is None:
            self._copies = []
            for start, end, path in hot_keys.stretches(self.directory / hot_keys.DIRECTORY):
                if end > self._checkpoint.record_count or start < self._checkpoint.log_start_seq:
                    continue  # (retention cut into it: its fingerprint cannot match the retained log)
                if self._copies and start < self._copies[-1].end_seq:
                    used = self._copies[-1]
                    if not hot_keys.inside_another(start, end, used.start_seq, used.end_seq):
                        logger.warning("%s: hot-key copy overlaps %s: ignored", path, used.path)
                    continue
                try:
                    self._copies.append(hot_keys.HotKeyCopy.open(path))
                except CorruptFileError as error:
                    hot_keys.unreadable(path, error)
        return self._copies

    def _copy_fits(self, copy: hot_keys.HotKeyCopy) -> bool:
        if copy.path not in self._copy_fitness:
            fits = copy.fits(self._log)
            if not fits:
                logger.warning("%s: hot-key copy was not made from this log (its block checksums differ): answering "
                            "from the log", copy.path)
            self._copy_fitness[copy.path] = fits
        return self._copy_fitness[copy.path]

    def _file_pointing_at(self, key_hash: int, seq: int) -> Path:
        """The committed hash index file with an entry of `key_hash` pointing at `seq`, to name
        in an error (the shard's index directory when none is found)."""
        for state, index_file in self._files:
            _who, _entries, phys, _ms = index_file.candidate_arrays(
                np.array([key_hash], dtype=np.int64), limit_index_count=state.index_count)
            if (phys == seq).any():
                return Path(index_file.path)
        return self.directory / INDEX_DIR



def _check_entry_targets(index_file: IndexFile, outside: np.ndarray, high: int) -> None:
    """Committed entries pointing outside the retained log: below it they point into segments
    retention dropped (normal); at or past the committed record count, or negative, no commit
    ever wrote them, so the file is damaged: an error, not a silently missed message."""
    bad = outside[(outside >= high) | (outside < 0)]
    if len(bad):
        raise CorruptFileError(
            f"{index_file.path}: a committed hash entry points at seq {int(bad[0])}, outside the {high} records "
            f"the shard committed: the file is damaged (`msgindex inspect` lists every bad entry; `msgindex repair` "
            f"cannot rebuild hash index files: restore the file from a backup)")


class _FileIdentity(NamedTuple):
    """What ``ShardReader.check_unchanged`` compares (os.stat_result's equality would compare
    whole seconds)."""

    inode: tuple[int, int]  # (st_dev, st_ino)
    size: int
    mtime_ns: int


_FEW_WANTED = 16  # (topic, key) pairs checked against the copies' keys in Python, not with an Arrow kernel


def index_entries(records: pa.Table | pa.RecordBatch | Sequence[MessageRecord], seqs: range) -> IndexEntries:
    """(index keys, phyOffsets, timestamps) of a batch appended at `seqs`: one entry per key of
    each record, in record order, a key repeated within one record indexed once (first place)."""
    return AppendColumns.of(records).index_entries(seqs.start)


def refuse_out_of_range_timestamps(columns: LogColumns) -> None:
    """InvalidAppendError naming the first record whose timestamp breaks the timestamp rule
    (``message.timestamp_problem``): the pipeline sets such records aside before appending."""
    stamps = columns.timestamps
    if not len(stamps) or (int(stamps.min()) >= MIN_TIMESTAMP_MS and int(stamps.max()) <= MAX_TIMESTAMP_MS):
        return
    i = int(np.argmax((stamps < MIN_TIMESTAMP_MS) | (stamps > MAX_TIMESTAMP_MS)))
    raise InvalidAppendError(f"{_record_place(columns, i)}: {timestamp_problem(int(stamps[i]))}")


def refuse_unindexed_keys(columns: LogColumns) -> None:
    """InvalidAppendError naming the first record whose non-empty key is not among its keys: a
    shard indexes a message under its own key (an empty key under none: the pipeline logs such
    a record unkeyed), which a lookup of the key, the data source's ``key = ...`` among them,
    relies on to find every record showing it."""
    has_key = pc.fill_null(pc.greater(pc.binary_length(columns.key), 0), False).to_numpy(zero_copy_only=False)
    if not has_key.any():
        return
    owner, within = ranges_owner(np.diff(columns.list_offsets))
    items = columns.items.take(pa.array(columns.list_offsets[:-1][owner] + within))
    same = pc.equal(items.cast(pa.large_binary()), columns.key.cast(pa.large_binary()).take(pa.array(owner)))
    carried = np.zeros(len(columns), dtype=bool)
    carried[owner[same.fill_null(False).to_numpy(zero_copy_only=False)]] = True
    missing = has_key & ~carried
    if missing.any():
        i = int(np.argmax(missing))
        raise InvalidAppendError(f"{_record_place(columns, i)}: its key {decode_text(columns.key[i].as_py())!r} is not "
                                 f"among its keys: a message is indexed under its own key, so keys must hold it")


def _record_place(columns: LogColumns, i: int) -> str:
    """Record `i` of an appended batch, named for an error: its place and topic-partition-offset."""
    topic = decode_text(columns.topic[i].as_py())
    return f"record {i} of the batch ({topic}-{int(columns.ints['partition'][i])} offset {int(columns.ints['offset'][i])})"


def _ranges_annotation(ranges: SourceRanges) -> bytes:
    """Committed source ranges as the log annotation: compact canonical JSON. InvalidAppendError
    saying why when they outgrow what a batch carries (nothing is written then)."""
    annotation = json.dumps(ranges.to_json(), sort_keys=True, separators=(",", ":")).encode("ascii")
    if len(annotation) > bf.MAX_ANNOTATION_BYTES:
        raise InvalidAppendError(
            f"its committed source offsets ({len(ranges.ranges):,} topic-partitions in {ranges.interval_count():,} "
            f"ranges) take {len(annotation):,} bytes, more than the {bf.MAX_ANNOTATION_BYTES:,} a log batch carries "
            f"with them: index fewer topic-partitions into one shard (several indexes, by topic), or offsets "
            f"appended out of order left gaps no micro-batch closes (`msgindex inspect` lists the ranges)")
    return annotation


def own_coordinates(records: pa.Table | pa.RecordBatch | list[MessageRecord]) -> SourceRows:
    """The records' own (topic, partition, offset) as their source coordinates, one slice."""
    if isinstance(records, (pa.Table, pa.RecordBatch)):
        return SourceRows.of(records.column("topic"), records.column("partition"), records.column("offset"))
    for number, record in enumerate(records):
        if not isinstance(record, MessageRecord):
            raise InvalidAppendError(
                f"record {number} is a {type(record).__name__}, not a MessageRecord (no topic/partition/offset)")
    return SourceRows.of([r.topic for r in records], [r.partition for r in records], [r.offset for r in records])


def _written_past(index_file: IndexFile, state: IndexFileState) -> bool:
    """Whether a writer wrote into `index_file` past its committed `state` (and died). A put
    writes entry, then slot, then header, so look at all three: the header, the first entry past
    the committed count, and slot 0 (the slot of an entry that can be all zeros: key hash 0)."""
    if index_file.header != state.header:
        return True
    count = state.index_count
    if count < index_file.index_num:
        fd = os.open(index_file.path, os.O_RDONLY)
        try:
            entries_at = INDEX_HEADER_SIZE + index_file.hash_slot_num * INDEX_SLOT_SIZE
            entry = os.pread(fd, INDEX_ENTRY_SIZE, entries_at + count * INDEX_ENTRY_SIZE)
        finally:
            os.close(fd)
        if any(entry):
            return True
    return int(index_file.slot_array()[0]) >= count


def _name_ms(name: str) -> int:
    """The time in an index file name (UTC: local-time names are not monotonic across DST)."""
    parsed = parse_index_file_name(name, utc=True)
    if parsed is None:
        raise CorruptFileError(f"{name}: not a hash index file name (yyyyMMddHHmmssSSS)")
    return parsed


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def swapped_in_directories() -> tuple[str, ...]:
    """The directories of a shard a rebuilt one replaces (everything else in it stays)."""
    return (LOG_DIR, INDEX_DIR, hot_keys.DIRECTORY)


def finish_interrupted_swap(directory: Path) -> bool:
    """Step 4 of backfill.py's module docstring when a marker says the rebuilt shard is complete
    (each step safe to repeat after a crash); without a marker, delete what an interrupted build
    left. The caller holds the shard's lock. True when a swap was finished."""
    directory = Path(directory)
    marker = directory / BACKFILL_MARKER
    new, old = directory / BACKFILL_NEW_DIR, directory / BACKFILL_OLD_DIR
    if not marker.is_file():
        for leftover in (new, old):
            if leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
        return False
    _, body = parse_versioned_json(marker.read_bytes(), source=marker, what="backfill marker",
                                   format_name=BACKFILL_MARKER_FORMAT, versions=(1,))
    try:
        checkpoint = Checkpoint.from_dict(body["checkpoint"], source=marker)
        present = set(body["present"])
    except (KeyError, TypeError) as bad:
        raise CorruptFileError(f"{marker}: backfill marker is malformed ({bad!r})") from None
    old.mkdir(exist_ok=True)
    for name in swapped_in_directories():
        if name in present and not (new / name).exists():
            continue  # swapped in before a crash
        if (directory / name).exists():
            if (old / name).exists():
                shutil.rmtree(directory / name)  # an empty one a repair or writer made meanwhile
            else:
                os.rename(directory / name, old / name)
        if name in present:
            os.rename(new / name, directory / name)
    fsync_directory(directory)
    write_checkpoint(checkpoint_path(directory), checkpoint)
    marker.unlink()
    fsync_directory(directory)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(new, ignore_errors=True)
    return True
