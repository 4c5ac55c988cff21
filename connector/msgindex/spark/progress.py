"""Spark's own view of the indexing query, one line per progress event (a StreamingQueryListener).

The sink prints msgindex's line per batch (records/s, keys, shards, lag, quarantined); this adds
what only Spark knows: how long each phase of the trigger took and the input/processing rates.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from pyspark.sql.streaming import StreamingQueryListener

_PHASES = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets")


def progress_line(progress) -> str:
    """One readable line of a StreamingQueryProgress."""
    durations = progress.durationMs or {}
    phases = ", ".join(f"{name} {durations[name] / 1000:.2f} s" for name in _PHASES if durations.get(name))
    total = durations.get("triggerExecution", 0) / 1000
    return (
        f"spark batch {progress.batchId}: {progress.numInputRows:,} input rows, "
        f"{progress.inputRowsPerSecond or 0:,.0f} rows/s in, {progress.processedRowsPerSecond or 0:,.0f} rows/s processed, "
        f"trigger {total:.2f} s ({phases})"
    )


class SparkProgressListener(StreamingQueryListener):
    """Prints Spark's progress of the queries it is registered for (by query id)."""

    def __init__(self, emit: Callable[[str], None], query_name: str | None = None) -> None:
        self.emit = emit
        self.query_name = query_name
        self.last_batch_id = -1
        self._seen = threading.Condition()

    def wait_for(self, batch_id: int, timeout_s: float = 5.0) -> bool:
        """Wait until the progress of `batch_id` was delivered (events arrive asynchronously: a
        job that exits at once would lose its last line)."""
        deadline = time.monotonic() + timeout_s
        with self._seen:
            while self.last_batch_id < batch_id:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._seen.wait(left)
        return True

    def _mine(self, event) -> bool:
        return self.query_name is None or getattr(event, "name", None) == self.query_name

    def onQueryStarted(self, event) -> None:
        if self._mine(event):
            self.emit(f"spark query {event.name or event.id} started (run {event.runId})")

    def onQueryProgress(self, event) -> None:
        if not self._mine(event.progress):
            return
        if event.progress.numInputRows:
            self.emit(progress_line(event.progress))
        with self._seen:
            self.last_batch_id = max(self.last_batch_id, event.progress.batchId)
            self._seen.notify_all()

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        detail = f": {event.exception.splitlines()[0]}" if event.exception else ""
        self.emit(f"spark query {event.id} terminated{detail}")
