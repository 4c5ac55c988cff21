"""What a store, or one shard, holds on disk, by kind of file: the bytes per record of each kind
that ``msgindex inspect`` prints and the benchmarks compare with a Parquet copy of the same rows.

Two sizes per kind, because they differ on purpose in places: *apparent* bytes (the files'
lengths: what a copy, a backup or an upload moves) and *allocated* bytes (the filesystem's blocks:
what the disk gives up, ``du``). A hash index file grows in bounded steps ahead of its writer
(``index_file``), so the two stay within a step of each other; a file written by RocketMQ's broker
is sparse (long, few blocks).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from msgindex.storage import hot_keys
from msgindex.storage.hash_index import hash_run
from msgindex.storage.hash_index.index_file import parse_index_file_name
from msgindex.storage.log.segment import INDEX_SUFFIX, LOG_SUFFIX, SUMMARY_SUFFIX, TIME_INDEX_SUFFIX
from msgindex.storage.manifest import SHARD_DIR_PREFIX

# Kinds, in the order reports list them, with what each is for (README "How it stores").
KINDS = {
    "log": "metadata-log segments: every record (the data every answer is read from)",
    "sparse_indexes": "Kafka-style offset and time indexes of the log segments (derived)",
    "segment_summaries": "summaries of sealed log segments (derived)",
    "hash_index_files": "RocketMQ IndexFiles: header, slot table, one 20-byte entry per (record, key)",
    "hash_runs": "hash runs: the entries of keys sharing hot keys' slots, sorted by hash (derived)",
    "hot_key_copies": "hot-key copies: hot keys' rows, rendered and sorted (derived)",
    "other": "checkpoints, manifest, locks, the indexing job's files",
}


@dataclass
class KindUsage:
    """Files of one kind: how many, their lengths and their allocated blocks, in bytes."""

    files: int = 0
    apparent: int = 0
    allocated: int = 0


@dataclass
class DiskUsage:
    """Bytes on disk by kind (``KINDS``) of everything under one directory."""

    kinds: dict[str, KindUsage] = field(default_factory=lambda: {kind: KindUsage() for kind in KINDS})

    @property
    def apparent(self) -> int:
        return sum(usage.apparent for usage in self.kinds.values())

    @property
    def allocated(self) -> int:
        return sum(usage.allocated for usage in self.kinds.values())

    def add(self, other: DiskUsage) -> None:
        for kind, usage in other.kinds.items():
            mine = self.kinds[kind]
            mine.files += usage.files
            mine.apparent += usage.apparent
            mine.allocated += usage.allocated

    def report(self, records: int) -> dict[str, dict[str, float | int | None]]:
        """JSON-able: per kind (and ``total``) files, bytes and bytes per record (the larger of
        apparent and allocated: what the kind costs whichever way it is counted)."""
        rows = {kind: (usage.files, usage.apparent, usage.allocated) for kind, usage in self.kinds.items()}
        rows["total"] = (sum(r[0] for r in rows.values()), self.apparent, self.allocated)
        return {kind: {"files": files, "apparent_bytes": apparent, "allocated_bytes": allocated,
                       "bytes_per_record": round(max(apparent, allocated) / records, 2) if records else None}
                for kind, (files, apparent, allocated) in rows.items()}


def kind_of(path: Path) -> str:
    """The kind (``KINDS``) of a file inside a store, by its name and folder."""
    name, folder = path.name, path.parent.name
    if folder == "log":
        if path.suffix == LOG_SUFFIX:
            return "log"
        if path.suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            return "sparse_indexes"
        if path.suffix == SUMMARY_SUFFIX:
            return "segment_summaries"
    if folder == "index":
        if name.endswith(hash_run.SUFFIX):
            return "hash_runs"
        if parse_index_file_name(name) is not None:
            return "hash_index_files"
    if folder == hot_keys.DIRECTORY and hot_keys.parse_copy_name(name) is not None:
        return "hot_key_copies"
    return "other"


def disk_usage(directory: Path) -> DiskUsage:
    """Bytes of every file under `directory` (a store root or one ``broker=<name>`` shard), by kind."""
    usage = DiskUsage()
    for folder, _dirs, files in os.walk(directory):
        for name in files:
            path = Path(folder, name)
            try:
                info = path.lstat()
            except FileNotFoundError:  # removed while we looked (a writer's temporary file)
                continue
            kind = usage.kinds[kind_of(path) if _in_shard(path, Path(directory)) else "other"]
            kind.files += 1
            kind.apparent += info.st_size
            kind.allocated += info.st_blocks * 512
    return usage


def _in_shard(path: Path, top: Path) -> bool:
    return any(part.startswith(SHARD_DIR_PREFIX) for part in path.relative_to(top).parts[:-1]) or \
        top.name.startswith(SHARD_DIR_PREFIX)
