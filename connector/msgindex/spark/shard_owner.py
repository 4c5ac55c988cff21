"""The executor side of the pipeline: who writes a shard, and how a batch lands in it exactly once.

A ``ShardOwner`` is cached per Python worker process (Spark reuses workers between tasks, so the
cache lives across micro-batches) and keeps the store handle open. It takes the shard's OS lock
only while it writes one group and releases it at the end of the task. Why not keep the lock
between batches: with ``local[2]`` (or any executor with several cores) Spark runs one Python
worker per concurrent task, and the next batch's group of the same shard may be scheduled on a
different worker; a lock parked in an idle worker would then block it forever. Taking the lock
per task costs one writer open (lock file, checkpoint read, map of the active files: a few ms,
noise next to a micro-batch) and makes waiting bounded: a second attempt of the same task
(retry or speculative copy) waits for the first to finish (``lock_timeout_s``), then sees the
batch id committed and skips it.
"""

from __future__ import annotations

import time

from typing import TYPE_CHECKING

from msgindex.errors import ShardLockedError

if TYPE_CHECKING:
    from msgindex.storage.store import AppendResult, Store

LOCK_POLL_FIRST_S = 0.01
LOCK_POLL_MAX_S = 0.5


class ShardOwner:
    """Appends micro-batches to one shard of one store, from whichever worker runs the task."""

    def __init__(self, store: "Store", broker: str, lock_timeout_s: float) -> None:
        self.store = store
        self.broker = broker
        self.lock_timeout_s = lock_timeout_s

    def append(self, batch_id: int, records) -> "AppendResult":
        """Append `records` as batch `batch_id` (a no-op when the shard already committed it)."""
        writer = self._acquire()
        try:
            return writer.append(batch_id, records)
        finally:
            writer.close()

    def _acquire(self):
        deadline = time.monotonic() + self.lock_timeout_s
        pause = LOCK_POLL_FIRST_S
        while True:
            try:
                return self.store.writer(self.broker)
            except ShardLockedError as locked:
                if time.monotonic() + pause > deadline:
                    raise ShardLockedError(
                        f"{locked} -- still held after waiting {self.lock_timeout_s:g} s "
                        f"(another indexing job writing the same index?)"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, LOCK_POLL_MAX_S)


_STORES: dict[str, "Store"] = {}  # per Python worker: index root -> open store


def shard_owner(root: str, broker: str, lock_timeout_s: float) -> ShardOwner:
    """The owner of `broker`'s shard of the store at `root`, on a cached store handle."""
    from msgindex.storage.store import open_store

    store = _STORES.get(root)
    if store is None:
        store = _STORES[root] = open_store(root)
    return ShardOwner(store, broker, lock_timeout_s)
