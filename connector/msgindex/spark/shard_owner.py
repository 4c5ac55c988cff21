"""The shards' writers inside one Python worker: opened once, kept open between tasks.

Spark reuses a Python worker for many tasks (one worker per concurrently running task), so a
module-level cache lives across micro-batches. A cached ``ShardWriter`` holds no lock while
idle: Spark may run the next task that touches the same shard on another worker or executor,
and a lock parked here would block it. Each append takes the shard lock (waiting, bounded, for
another attempt or task that holds it) and revalidates the writer's view on acquisition, which
is cheap when nothing changed and only rolls back when a writer died mid-append (see
``ShardWriter``). The owner of a shard is whichever task holds its lock, on any executor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgindex.errors import ShardLockedError

if TYPE_CHECKING:
    import pyarrow as pa

    from msgindex.storage.shard import AppendResult, ShardWriter
    from msgindex.storage.source_ranges import SourceRows
    from msgindex.storage.store import Store

_STORES: dict[str, "Store"] = {}  # per Python worker: index root -> open store
_WRITERS: dict[tuple[str, str], "ShardWriter"] = {}  # (index root, broker) -> writer kept open


def _writer(root: str, broker: str) -> "ShardWriter":
    from msgindex.storage.store import open_store

    writer = _WRITERS.get((root, broker))
    if writer is None:
        store = _STORES.get(root)
        if store is None:
            store = _STORES[root] = open_store(root)
        writer = _WRITERS[(root, broker)] = store.writer(broker, hold_lock=False)
    return writer


def append_to_shard(root: str, broker: str, records: "pa.Table | list", sources: "SourceRows", *,
                    lock_timeout_s: float, adopt_legacy_offsets: bool) -> "AppendResult":
    """Append `records` (with their source coordinates) to `broker`'s shard of the index at
    `root` under the shard lock; rows whose source offsets the shard holds are skipped.

    `adopt_legacy_offsets`: a version-1 shard (batch-id checkpoint) is upgraded from its log's own
    offsets first; only right when the log's topic/partition/offset are the source's (--input
    records)."""
    writer = _writer(root, broker)
    try:
        with writer.locked(lock_timeout_s):
            if writer.committed_ranges is None and adopt_legacy_offsets:
                writer.adopt_log_offsets()
            return writer.append(records, sources)
    except ShardLockedError as locked:
        raise ShardLockedError(f"{locked} (a stuck task of this job, or another job writing the same index?)") from None
    except BaseException:
        # Whatever went wrong, the next task here starts from a cold writer (full recovery).
        _WRITERS.pop((root, broker), None)
        writer.close()
        raise


def forget_writers() -> None:
    """Close every cached writer and store of this process (tests, benchmarks)."""
    for writer in _WRITERS.values():
        writer.close()
    _WRITERS.clear()
    for store in _STORES.values():
        store.close()
    _STORES.clear()
