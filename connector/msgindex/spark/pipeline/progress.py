"""Progress of the indexing query: msgindex's batch log, and Spark's own view of each trigger.

* ``<index root>/_batches.jsonl``: one JSON object per micro-batch (what sink.BatchStats.to_json
  says: records, new, already committed, keys, quarantined, shards, seconds), appended by the
  batch function itself, so that a client that does not see the driver's output (Spark Connect)
  reads the counts with ``read_batch_log`` or ``spark.read.json``. Informational: not fsynced.
  On an object store (which cannot append) each batch is an object of its own,
  ``<index root>/_batches/<20-digit batch id>-<job id>.json``.
* ``SparkProgressListener``: one line per Spark progress event: how long each phase of the
  trigger took and the input/processing rates (the sink prints msgindex's own line per batch).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql.streaming import StreamingQueryListener

from msgindex.storage.location import parse_location
from msgindex.storage.root_files import root_files

if TYPE_CHECKING:
    from pyspark.sql.streaming.listener import StreamingQueryProgress

BATCH_LOG_FILE = "_batches.jsonl"
BATCH_LOG_DIR = "_batches"  # object stores: one object per batch


def say(line: str) -> None:
    """One progress line of the job on stdout (the driver's; on Spark Connect, the server's)."""
    print(f"[msgindex {time.strftime('%H:%M:%S')}] {line}", flush=True)


def append_batch_log(root: str | os.PathLike[str], entry: dict, storage_options: Mapping[str, str] | None = None) -> None:
    """Append one batch's counts (with the wall-clock time) to the index's batch log."""
    record = {"time_ms": int(time.time() * 1000), **entry}
    line = json.dumps(record, separators=(",", ":")) + "\n"
    location = parse_location(root, storage_options)
    if not location.is_local:
        name = f"{BATCH_LOG_DIR}/{int(entry.get('batch_id', 0)):020d}-{entry.get('job_id') or 'job'}.json"
        root_files(location).replace(name, line.encode("utf-8"))
        return
    with open(Path(location.local_path) / BATCH_LOG_FILE, "a", encoding="utf-8") as log:
        log.write(line)  # one write of a short line: concurrent appenders do not interleave


def read_batch_log(root: str | os.PathLike[str], storage_options: Mapping[str, str] | None = None) -> list[dict]:
    """Every batch entry the index's batch log holds, oldest first."""
    location = parse_location(root, storage_options)
    if not location.is_local:
        files = root_files(location)
        entries = [json.loads(files.read(f"{BATCH_LOG_DIR}/{name}") or b"{}") for name in files.names(BATCH_LOG_DIR)]
        return sorted((e for e in entries if e), key=lambda e: (e.get("time_ms", 0), e.get("batch_id", 0)))
    try:
        with open(Path(location.local_path) / BATCH_LOG_FILE, encoding="utf-8") as log:
            return [json.loads(line) for line in log if line.endswith("\n")]
    except FileNotFoundError:
        return []


_PHASES = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets")


def progress_line(progress: StreamingQueryProgress) -> str:
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
