"""Where malformed input goes: a directory of JSON-lines files, exactly once by source offsets.

``<quarantine>/src-<start 20 digits>-<end 20 digits>-<partition>-<topic>.jsonl`` holds the
malformed events of source partition ``topic-partition`` from one slice, one JSON object per
line::

    {"batch_id": 7, "reason": "missing brokerName",
     "source": {"topic": "rmq-dispatch", "partition": 0, "offset": 1234, "timestamp_ms": 1700000000000},
     "value": "<the record value as text, or null when it is not UTF-8>",
     "value_base64": "<the exact value bytes, or null when the value is null>"}

Exactly once, like a shard (``storage/source_ranges.py``): the file names ARE the committed
source offset ranges ([start, end) of the slice the file's events came from: every malformed
event of the partition inside it is in some file). A writer holds ``<quarantine>/.lock``, reads
the ranges off the names, sets aside only events outside them, and writes each new file
atomically: a replay, a retried or speculative task, or a new Spark checkpoint that starts again
from ``earliest`` never writes an event twice. (A topic name too long for a file name is
replaced by ``sha1-<hex>``; its files' lines still carry it.) ``batch-<id>-<tag>.jsonl`` files of
older msgindex versions are read, and their events count as set aside.

On an object store the directory is a prefix: no lock, each file is created only if absent
(put-if-absent). A retried or speculative task computes the same file for the same slice, so it
changes nothing; two jobs that split a partition differently and quarantine the same events at
the same moment could each write a file for them (the index itself is exact either way).

Users read the events back with ``read_quarantine(path)`` (a pyarrow Table), with
``spark.read.json(path)``, or with any JSON-lines tool.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from msgindex.errors import ShardLockedError
from msgindex.storage.durable import is_temporary
from msgindex.storage.file_lock import unlock, wait_for_lock
from msgindex.storage.location import parse_location
from msgindex.storage.root_files import RootFiles, root_files
from msgindex.storage.source_ranges import SourceRanges, SourceRows, merge_intervals

FILE_PREFIX = "src-"
LEGACY_FILE_PREFIX = "batch-"
FILE_SUFFIX = ".jsonl"
LOCK_FILE = ".lock"
OFFSET_DIGITS = 20
MAX_FILE_NAME = 255
HASHED_TOPIC_PREFIX = "sha1-"

# The columns a task hands to `write_quarantine` (see task_writer.py).
SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, SOURCE_TIMESTAMP = "src_topic", "src_partition", "src_offset", "src_timestamp_ms"
RAW_VALUE, REASON = "raw_value", "reason"


@dataclass(frozen=True)
class QuarantineResult:
    """Malformed events set aside by one call, and those found set aside already."""

    written: int
    already: int


def quarantine_file_name(topic: str, partition: int, start: int, end: int) -> str:
    """The name of the file holding the malformed events of `topic`-`partition` from the slice [start, end)."""
    name = f"{FILE_PREFIX}{start:0{OFFSET_DIGITS}d}-{end:0{OFFSET_DIGITS}d}-{partition}-{topic}{FILE_SUFFIX}"
    if len(name.encode("utf-8")) > MAX_FILE_NAME or "/" in topic or topic.startswith("."):
        hashed = HASHED_TOPIC_PREFIX + hashlib.sha1(topic.encode("utf-8", "surrogatepass")).hexdigest()
        name = f"{FILE_PREFIX}{start:0{OFFSET_DIGITS}d}-{end:0{OFFSET_DIGITS}d}-{partition}-{hashed}{FILE_SUFFIX}"
    return name


def quarantine_file(directory: str | os.PathLike[str], topic: str, partition: int, start: int, end: int) -> Path:
    """The local file holding the malformed events of `topic`-`partition` from the slice [start, end)."""
    return Path(directory) / quarantine_file_name(topic, partition, start, end)


def _value_text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _lines(batch_id: int, table: pa.Table, reasons: list[str]) -> Iterator[str]:
    names = (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, SOURCE_TIMESTAMP, RAW_VALUE)
    columns = [table.column(name).to_pylist() for name in names]
    for (topic, partition, offset, timestamp_ms, raw), reason in zip(zip(*columns), reasons):
        yield json.dumps(
            {
                "batch_id": batch_id,
                "reason": reason,
                "source": {"topic": topic, "partition": partition, "offset": offset, "timestamp_ms": timestamp_ms},
                "value": _value_text(raw),
                "value_base64": None if raw is None else base64.b64encode(raw).decode("ascii"),
            },
            ensure_ascii=False,
        )


def write_quarantine(directory: str | os.PathLike[str], batch_id: int, table: pa.Table, reasons: list[str],
                     slices: np.ndarray | None = None, *, lock_timeout_s: float = 120.0,
                     storage_options: Mapping[str, str] | None = None) -> QuarantineResult:
    """Set aside `table`'s rows (columns named above) with one reason each, except those whose
    source offsets are set aside already. `slices`: each row's source slice (see SourceRows)."""
    files = root_files(parse_location(directory, storage_options))
    sources = SourceRows.of(table.column(SOURCE_TOPIC), table.column(SOURCE_PARTITION), table.column(SOURCE_OFFSET), slices)
    with _locked(files, lock_timeout_s):
        done = _committed(files)
        fresh = sources.first_occurrences()
        fresh = fresh[~done.covered(sources.take(fresh))] if len(fresh) else fresh
        if len(fresh):
            kept = sources.take(fresh)
            for (topic, partition), where in kept.groups():
                rows = fresh[where]
                slice_ids = kept.slice_id[where] if kept.slice_id is not None else np.zeros(len(where), np.int64)
                for slice_id in np.unique(slice_ids):
                    part = rows[slice_ids == slice_id]
                    offsets = sources.offset[part]
                    order = part[np.argsort(offsets, kind="stable")]
                    name = quarantine_file_name(topic, partition, int(offsets.min()), int(offsets.max()) + 1)
                    lines = _lines(batch_id, table.take(pa.array(order)), [reasons[i] for i in order.tolist()])
                    text = "".join(line + "\n" for line in lines).encode("utf-8")
                    if files.location.is_local:
                        files.replace(name, text)  # under the lock: a file of these offsets is this one
                    else:
                        files.create(name, text)  # a retry or speculative copy writes the same file: kept once
    return QuarantineResult(written=len(fresh), already=len(table) - len(fresh))


def committed_ranges(directory: str | os.PathLike[str], storage_options: Mapping[str, str] | None = None) -> SourceRanges:
    """The source offsets whose malformed events are in the quarantine (read off the file names;
    hashed topic names and legacy batch files are opened)."""
    return _committed(root_files(parse_location(directory, storage_options)))


def _committed(files: RootFiles) -> SourceRanges:
    found: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for name in files.names(""):
        if is_temporary(name) or not name.endswith(FILE_SUFFIX):
            continue
        if name.startswith(FILE_PREFIX):
            start, end, partition, topic = name[len(FILE_PREFIX):-len(FILE_SUFFIX)].split("-", 3)
            if topic.startswith(HASHED_TOPIC_PREFIX):
                topic = _first_source(files, name)[0]
            found.setdefault((topic, int(partition)), []).append((int(start), int(end)))
        elif name.startswith(LEGACY_FILE_PREFIX):
            for topic, partition, offset in _legacy_sources(files, name):
                found.setdefault((topic, partition), []).append((offset, offset + 1))
    return SourceRanges({source: merge_intervals(intervals) for source, intervals in found.items()})


def _entries(files: RootFiles, name: str) -> list[dict]:
    return [json.loads(line) for line in (files.read(name) or b"").decode("utf-8").splitlines() if line]


def _first_source(files: RootFiles, name: str) -> tuple[str, int]:
    source = _entries(files, name)[0]["source"]
    return source["topic"], int(source["partition"])


def _legacy_sources(files: RootFiles, name: str) -> Iterator[tuple[str, int, int]]:
    for entry in _entries(files, name):
        source = entry["source"]
        yield source["topic"], int(source["partition"]), int(source["offset"])


class _locked:
    """The quarantine directory's writer lock, waited for (bounded); none on an object store."""

    def __init__(self, files: RootFiles, timeout_s: float) -> None:
        self.path = Path(files.location.local_path) / LOCK_FILE if files.location.is_local else None
        self.timeout_s = timeout_s
        self.fd: int | None = None

    def __enter__(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = wait_for_lock(self.path, self.timeout_s)
        if self.fd is None:
            raise ShardLockedError(f"{self.path}: quarantine lock still held after {self.timeout_s:g} s")

    def __exit__(self, *exc_info: object) -> None:
        if self.fd is not None:
            unlock(self.fd)
            self.fd = None


def read_quarantine(directory: str | os.PathLike[str], storage_options: Mapping[str, str] | None = None) -> pa.Table:
    """Every quarantined event under `directory`, in source order, as a table with columns
    batch_id, reason, topic, partition, offset, timestamp_ms, value, value_base64."""
    names = ("batch_id", "reason", "topic", "partition", "offset", "timestamp_ms", "value", "value_base64")
    rows: dict[str, list] = {name: [] for name in names}
    files = root_files(parse_location(directory, storage_options))
    entries = []
    for name in files.names(""):
        if name.endswith(FILE_SUFFIX) and name.startswith((FILE_PREFIX, LEGACY_FILE_PREFIX)):
            entries.extend(_entries(files, name))
    entries.sort(key=lambda e: (e["source"]["topic"], e["source"]["partition"], e["source"]["offset"]))
    for entry in entries:
        source = entry["source"]
        rows["batch_id"].append(entry["batch_id"])
        rows["reason"].append(entry["reason"])
        rows["topic"].append(source["topic"])
        rows["partition"].append(source["partition"])
        rows["offset"].append(source["offset"])
        rows["timestamp_ms"].append(source["timestamp_ms"])
        rows["value"].append(entry["value"])
        rows["value_base64"].append(entry["value_base64"])
    schema = pa.schema([("batch_id", pa.int64()), ("reason", pa.string()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp_ms", pa.int64()),
                        ("value", pa.string()), ("value_base64", pa.string())])
    return pa.table(rows, schema=schema)
