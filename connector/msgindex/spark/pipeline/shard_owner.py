"""The shards' writers inside one Python worker: opened once, kept open between tasks.

Spark reuses a Python worker for many tasks (one worker per concurrently running task), so a
module-level cache lives across micro-batches. A cached ``ShardWriter`` holds no lock while
idle: Spark may run the next task that touches the same shard on another worker or executor,
and a lock parked here would block it. Each append takes the shard lock (waiting, bounded, for
another attempt or task that holds it) and revalidates the writer's view on acquisition, which
is cheap when nothing changed and only rolls back when a writer died mid-append (see
``ShardWriter``). The owner of a shard is whichever task holds its lock, on any executor.

Retention runs here too: after an append, still under the lock, the owner applies the job's
``RetentionPolicy`` (storage/retention.py: the log decides, the index follows), at most once per
shard per interval in each Python worker so that appends stay fast. Readers are never blocked:
retention commits the shard's new start through its checkpoint first, then deletes files.

A full disk is reported as ``StorageFullError`` naming the shard and the file (``disk_full``).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from msgindex.errors import ShardLockedError, StorageFullError
from msgindex.storage.retention import RetentionReport, apply_shard_retention

if TYPE_CHECKING:
    import pyarrow as pa

    from msgindex.storage.fields import FieldDefinition
    from msgindex.storage.shard import AppendResult, BeforeCommit, ShardWriter
    from msgindex.storage.source_ranges import SourceRanges, SourceRows
    from msgindex.storage.store import Store

DEFAULT_RETENTION_INTERVAL_S = 60.0
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)

_STORES: dict[str, Store] = {}  # per Python worker: index root -> open store
_WRITERS: dict[tuple[str, str], ShardWriter] = {}  # (index root, broker) -> writer kept open
_RETENTION_RUNS: dict[tuple[str, str], float] = {}  # (index root, broker) -> monotonic time of the last pass here


@dataclass(frozen=True)
class RetentionPolicy:
    """What a shard's lock holder deletes between appends: log segments whose newest record is
    older than `max_age_ms`, then the oldest segments until the shard is at most `max_bytes`
    (None: no limit of that kind), checked at most once per `interval_s` per shard in each
    Python worker. `age_from_topics`: the topics whose longest ``retention.ms`` the age limit is
    (the default without --retention-ms); empty when the age limit was given or there is none."""

    max_age_ms: int | None = None
    max_bytes: int | None = None
    interval_s: float = DEFAULT_RETENTION_INTERVAL_S
    age_from_topics: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return self.max_age_ms is not None or self.max_bytes is not None

    @property
    def age_text(self) -> str:
        """The age limit as progress lines say it."""
        if self.max_age_ms is None:
            return "no age limit"
        for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
            if self.max_age_ms >= size and self.max_age_ms % size == 0:
                return f"segments older than {self.max_age_ms // size} {unit}"
        return f"segments older than {self.max_age_ms} ms"

    @property
    def follows_topics(self) -> bool:
        """Whether topics indexed later may lengthen the age limit (see ``widened``)."""
        return bool(self.age_from_topics) and self.max_age_ms is not None

    def widened(self, retention_ms: dict[str, int]) -> RetentionPolicy:
        """This policy once topics of `retention_ms` ({topic: retention.ms}) are indexed too: a
        shard holds many topics, so the age limit is the longest of them all (-1: no limit)."""
        if not self.follows_topics:
            return self
        topics = tuple(sorted({*self.age_from_topics, *retention_ms}))
        _, longest = longest_retention(retention_ms)
        max_age = None if longest == KEEP_FOREVER_MS else max(self.max_age_ms, longest)
        return dataclasses.replace(self, max_age_ms=max_age, age_from_topics=topics)


KEEP_FOREVER_MS = -1  # Kafka's retention.ms for "no deletion by age"


def longest_retention(retention_ms: dict[str, int]) -> tuple[str, int]:
    """(topic, retention.ms) of the topic that keeps its records longest (-1, forever, first)."""
    return max(retention_ms.items(), key=lambda item: (item[1] == KEEP_FOREVER_MS, item[1]))


@dataclass(frozen=True)
class ShardAppend:
    """One append of a task to one shard, and what the retention pass after it deleted."""

    result: AppendResult
    retention: RetentionReport
    requests: int = 0  # object stores: requests sent by the append and the retention pass


def _writer(root: str, broker: str, storage_options: Mapping[str, str] | None = None) -> ShardWriter:
    from msgindex.storage.store import open_store

    writer = _WRITERS.get((root, broker))
    if writer is None:
        store = _STORES.get(root)
        if store is None:
            store = _STORES[root] = open_store(root, storage_options=storage_options)
        writer = _WRITERS[(root, broker)] = store.writer(broker, hold_lock=False)
    return writer


def append_to_shard(root: str, broker: str, records: pa.Table | list, sources: SourceRows, *,
                    lock_timeout_s: float, adopt_legacy_offsets: bool,
                    retention: RetentionPolicy = RetentionPolicy(),
                    storage_options: Mapping[str, str] | None = None,
                    fields: Sequence[FieldDefinition] = (),
                    before_commit: BeforeCommit | None = None,
                    settled: SourceRanges | None = None) -> ShardAppend:
    """Append `records` (with their source coordinates) to `broker`'s shard of the index at
    `root` under the shard lock; rows whose source offsets the shard holds are skipped. Then,
    when due, apply `retention` under the same lock.

    `adopt_legacy_offsets`: a version-1 shard (batch-id checkpoint) is upgraded from its log's own
    offsets first; only right when the log's topic/partition/offset are the source's (--input
    records). `fields`: the fields the records' values were evaluated for (storage/fields.py).
    `before_commit`, `settled`: as ``ShardWriter.append``'s.

    On an object store the writer takes no lock (``locked`` only brings its view up to date:
    commits settle races, ``storage/objects/shard.py``) and compacts the shard by itself after
    its commits."""
    writer = _writer(root, broker, storage_options)
    client = getattr(writer, "client", None)  # an object store's: its requests are counted
    before = client.request_count() if client is not None else 0
    try:
        with writer.locked(lock_timeout_s):
            if writer.committed_ranges is None and adopt_legacy_offsets:
                writer.adopt_log_offsets()
            result = writer.append(records, sources, fields, before_commit, settled)
            report = _retention_pass(root, broker, writer, retention)
            return ShardAppend(result, report, client.request_count() - before if client is not None else 0)
    except ShardLockedError as locked:
        raise ShardLockedError(f"{locked} (a stuck task of this job, or another job writing the same index?)") from None
    except BaseException as error:
        # Whatever went wrong, the next task here starts from a cold writer (full recovery).
        _WRITERS.pop((root, broker), None)
        writer.close()
        full = disk_full(error, f"shard {broker!r}", getattr(writer, "directory", root))
        if full is not None:
            raise full from None
        raise


def _retention_pass(root: str, broker: str, writer: ShardWriter, policy: RetentionPolicy) -> RetentionReport:
    if not policy.active:
        return RetentionReport()
    now = time.monotonic()
    last = _RETENTION_RUNS.get((root, broker))
    if last is not None and now - last < policy.interval_s:
        return RetentionReport()
    _RETENTION_RUNS[(root, broker)] = now
    if hasattr(writer, "apply_retention"):  # an object-store shard: whole chunks, by a version
        return writer.apply_retention(max_age_ms=policy.max_age_ms, max_bytes=policy.max_bytes)
    return apply_shard_retention(writer, max_age_ms=policy.max_age_ms, max_bytes=policy.max_bytes)


def disk_full(error: BaseException, what: str, where: str | os.PathLike[str]) -> StorageFullError | None:
    """`error` as one line saying the disk is full and naming the file (`where` when the error
    does not name one) and what was being written, when it is a full disk or quota; else None."""
    if isinstance(error, StorageFullError):
        detail = str(error)  # names its file already
    elif isinstance(error, OSError) and (error.errno in _FULL_ERRNOS or "short write" in str(error)):
        file = error.filename or where
        detail = f"{file}: {error.strerror or error}"
    else:
        return None
    return StorageFullError(f"disk full writing {what}: {detail}; free some space (or grow the filesystem of "
                            f"{Path(where)}) and start the job again: it resumes exactly where the index's "
                            f"checkpoints are")


def forget_writers() -> None:
    """Close every cached writer and store of this process (tests, benchmarks)."""
    for writer in _WRITERS.values():
        writer.close()
    _WRITERS.clear()
    for store in _STORES.values():
        store.close()
    _STORES.clear()
    _RETENTION_RUNS.clear()
