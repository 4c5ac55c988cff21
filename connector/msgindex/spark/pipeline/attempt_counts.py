"""A micro-batch's new records, counted once whichever attempt of a task committed them.

A task's retry or speculative copy finds the rows its other attempt committed already, and Spark
keeps the result of whichever attempt finishes first -- the loser's, when finding everything
committed was quicker than the winner's retention pass or slow executor. Counts taken from the
accepted results alone then say "0 new, N already committed" for records this very batch
committed; attempts that interleave chunk by chunk split them between two results of which Spark
keeps one. So each append that commits records first records what it is about to commit, in a
marker beside the shards, written before its commit point (storage ``BeforeCommit``):

    <root>/_attempts/<run>/<task>-<chunk>-<broker>.json    {"appended": n, "keys_indexed": k}

* ``run``: one execution of one batch's stage on the driver (a fresh id per execution: a replay
  after a restart, or a batch re-run around unreadable records, counts afresh);
* ``task``: Spark's partition id, the same for every attempt of a task;
* ``chunk``: the task's append number (``task_writer.APPEND_ROWS``; every attempt reads the same
  rows in the same order and cuts the same chunks).

An attempt that commits a chunk another attempt wrote a marker for but died before committing
writes the same name again with what it commits; one that finds a chunk committed writes
nothing. After the stage the driver sums the run's markers per (task, shard) -- the records
committed under this run, whoever committed them -- and deletes them. Every accepted result
still gives the task's record total (new or not): the rest is what was committed before.

Known limit: an attempt that wrote its marker and died before its commit, whose rows a SECOND
job then committed, leaves those rows counted as new in both jobs' lines (exactly once of the
records themselves is unaffected).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from msgindex.storage.location import parse_location
from msgindex.storage.root_files import RootFiles, root_files
from msgindex.storage.shard import AppendResult

ATTEMPTS_DIR = "_attempts"
_SUFFIX = ".json"
_READERS = 8


@dataclass(frozen=True)
class CommittedCounts:
    """What the appends of one task to one shard committed during one run (all attempts)."""

    appended: int = 0
    keys_indexed: int = 0


class AttemptMarkers:
    """The markers of one run of one batch (module docstring): written by executors, summed and
    cleared by the driver. Picklable (it holds names, not clients)."""

    def __init__(self, root: str, run: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.root = root
        self.run = run
        self.storage_options = dict(storage_options) if storage_options else None
        self._files: RootFiles | None = None
        self.requests = 0  # object-store requests `record` sent in this process (the batch line counts them)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_files": None}

    @property
    def files(self) -> RootFiles:
        if self._files is None:
            self._files = root_files(parse_location(self.root, self.storage_options))
        return self._files

    @property
    def directory(self) -> str:
        return f"{ATTEMPTS_DIR}/{self.run}"

    def record(self, task: int, chunk: int, broker: str, result: AppendResult) -> None:
        """Before a commit of `result.appended` records of (task, chunk) to `broker`'s shard."""
        data = json.dumps({"appended": result.appended, "keys_indexed": result.keys_indexed}).encode()
        self.files.replace(f"{self.directory}/{task}-{chunk}-{broker}{_SUFFIX}", data)
        self.requests += not self.files.location.is_local

    def committed(self) -> dict[tuple[int, str], CommittedCounts]:
        """Per (task, broker): what the run's attempts committed (after the stage ended)."""
        totals: dict[tuple[int, str], CommittedCounts] = {}
        names = [name for name in self.files.names(self.directory) if name.endswith(_SUFFIX)]
        with ThreadPoolExecutor(max_workers=max(1, min(len(names), _READERS))) as pool:  # one request each on a bucket
            contents = list(pool.map(lambda name: self.files.read(f"{self.directory}/{name}"), names))
        for name, content in zip(names, contents, strict=True):
            task, _chunk, broker = name[: -len(_SUFFIX)].split("-", 2)
            counts = json.loads(content or b"{}")
            have = totals.get((int(task), broker), CommittedCounts())
            totals[(int(task), broker)] = CommittedCounts(have.appended + int(counts.get("appended", 0)),
                                                          have.keys_indexed + int(counts.get("keys_indexed", 0)))
        return totals

    def clear(self) -> None:
        """Delete the run's markers (counted already)."""
        self.files.delete_directory(self.directory)
