"""What is in a msgindex file, shard or store: the operator's tool (like Kafka's DumpLogSegments).

`inspect_path(path)` recognises a store (has msgindex.json), a shard (a ``broker=<name>``
directory or one holding a checkpoint), a metadata-log segment (``.log``; its ``.index`` /
``.timeindex`` lead to it) and otherwise treats the file as a RocketMQ index file. It returns a
JSON-able dict; `format_report` renders it for people.
"""

from __future__ import annotations

import json
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from msgindex.errors import CorruptFileError, InvalidOptionError
from msgindex.storage.checkpoint import CHECKPOINT_FILE, read_checkpoint
from msgindex.storage.index_file import (
    DEFAULT_HASH_SLOT_NUM,
    DEFAULT_INDEX_NUM,
    FIRST_INDEX,
    TIME_DIFF_UNIT_MS,
    IndexFile,
    check_sizing,
)
from msgindex.storage.log.batch_format import BATCH_VERSION
from msgindex.storage.log.metadata_log import LogPosition, MetadataLog, SegmentInfo
from msgindex.storage.shard import INDEX_DIR, LOG_DIR, SHARD_DIR_PREFIX, ShardReader, open_log
from msgindex.storage.settings import StoreSettings
from msgindex.storage.store import MANIFEST_FILE, open_store

LOG_SUFFIX = ".log"
SPARSE_INDEX_SUFFIXES = (".index", ".timeindex")
# chain-length histogram buckets (upper bounds, inclusive); the last bucket is open-ended
CHAIN_BUCKETS = (1, 2, 3, 4, 8, 16, 64)
LISTED_ENTRIES = 40  # sparse index entries shown per index of a segment


def inspect_path(path: str | os.PathLike, *, hash_slot_num: int | None = None, index_num: int | None = None) -> dict[str, Any]:
    """A summary of whatever `path` is (see the module docstring)."""
    path = Path(path)
    if not path.exists():
        raise InvalidOptionError(f"{path}: no such file or directory")
    if path.is_dir():
        if (path / MANIFEST_FILE).is_file():
            return inspect_store(path)
        if path.name.startswith(SHARD_DIR_PREFIX) or (path / CHECKPOINT_FILE).is_file():
            return inspect_shard(path, _settings_near(path))
        raise InvalidOptionError(f"{path}: a directory that is neither a msgindex store nor a shard")
    if path.suffix == LOG_SUFFIX or path.suffix in SPARSE_INDEX_SUFFIXES:
        return inspect_segment(path.with_suffix(LOG_SUFFIX), _settings_near(path))
    settings = _settings_near(path)
    if hash_slot_num is None:
        hash_slot_num = settings.hash_slot_num if settings else DEFAULT_HASH_SLOT_NUM
    if index_num is None:
        index_num = settings.index_num if settings else DEFAULT_INDEX_NUM
    return inspect_index_file(path, hash_slot_num=hash_slot_num, index_num=index_num)


# --- one RocketMQ index file ---------------------------------------------------------------------
def inspect_index_file(path: Path, *, hash_slot_num: int = DEFAULT_HASH_SLOT_NUM, index_num: int = DEFAULT_INDEX_NUM) -> dict[str, Any]:
    """Header, fill and hash-chain statistics of one index file."""
    path = Path(path)
    check_sizing(path, hash_slot_num, index_num)
    expected = IndexFile.file_size(hash_slot_num, index_num)
    actual = path.stat().st_size
    if actual != expected:
        raise CorruptFileError(
            f"{path}: {actual} bytes, but an index file with {hash_slot_num} slots and {index_num} entries "
            f"is {expected} bytes; pass the file's real sizing (--hash-slots, --index-num) or the file is damaged"
        )
    with IndexFile.open(path, hash_slot_num, index_num, read_only=True) as index_file:
        header = index_file.header
        slots = index_file.slot_array()
        entries = index_file.entry_array()[FIRST_INDEX:]
        used_slots = int(np.count_nonzero((slots > 0) & (slots < header.index_count)))
        chain_lengths = np.bincount(entries["key_hash"].astype(np.int64) % hash_slot_num, minlength=0)
        chain_lengths = chain_lengths[chain_lengths > 0]
        entry_times = header.begin_timestamp + entries["time_diff"].astype(np.int64) * TIME_DIFF_UNIT_MS
        report = {
            "kind": "index_file",
            "path": str(path),
            "hash_slot_num": hash_slot_num,
            "index_num": index_num,
            "file_bytes": actual,
            "header": {name: getattr(header, name) for name in header.__dataclass_fields__},
            "entries": int(entries.size),
            "capacity": index_num - FIRST_INDEX,
            "full": index_file.is_full,
            "fill_ratio": entries.size / (index_num - FIRST_INDEX),
            # entries keep whole seconds since beginTimestamp: this range is second-granular
            "approx_time_range": _time_range(
                int(entry_times.min()) if entries.size else None, int(entry_times.max()) if entries.size else None
            ),
            "phy_offset_range": [int(entries["phy_offset"].min()), int(entries["phy_offset"].max())]
            if entries.size
            else None,
            "slots_used": used_slots,
            "slot_fill_ratio": used_slots / hash_slot_num,
            "chain_length": _chain_stats(chain_lengths),
        }
        del slots, entries
    return report


def _chain_stats(lengths: np.ndarray) -> dict[str, Any]:
    if lengths.size == 0:
        return {"chains": 0}
    histogram: dict[str, int] = {}
    low = 1
    for high in CHAIN_BUCKETS:
        label = str(high) if low == high else f"{low}-{high}"
        histogram[label] = int(np.count_nonzero((lengths >= low) & (lengths <= high)))
        low = high + 1
    histogram[f">{CHAIN_BUCKETS[-1]}"] = int(np.count_nonzero(lengths > CHAIN_BUCKETS[-1]))
    return {
        "chains": int(lengths.size),
        "min": int(lengths.min()),
        "mean": float(lengths.mean()),
        "p50": float(np.percentile(lengths, 50)),
        "p99": float(np.percentile(lengths, 99)),
        "max": int(lengths.max()),
        "histogram": histogram,
    }


# --- one metadata-log segment --------------------------------------------------------------------
def inspect_segment(path: Path, settings: StoreSettings | None) -> dict[str, Any]:
    """Records, time range and sparse index entries of one metadata-log segment."""
    path = Path(path)
    if not path.is_file():
        raise InvalidOptionError(f"{path}: no such log segment")
    if path.parent.name != LOG_DIR:
        raise InvalidOptionError(f"{path}: a log segment must sit in a shard's {LOG_DIR}/ directory")
    log = open_log(path.parent.parent, settings or StoreSettings(), writable=False, committed=_committed(path))
    try:
        for info in log.segments():
            if info.path.name == path.name:
                return {"kind": "log_segment", "path": str(path), **_segment_summary(log, info, entries=True)}
    finally:
        log.close()
    raise InvalidOptionError(f"{path}: not a committed segment of the log in {path.parent}")


def _committed(segment_path: Path) -> LogPosition | None:
    """The committed log position of the shard a segment belongs to (None: recover from files)."""
    checkpoint = read_checkpoint(segment_path.parent.parent / CHECKPOINT_FILE)
    if checkpoint is None or checkpoint.log_position is None:
        return None
    return LogPosition.from_dict(checkpoint.log_position)


def _segment_summary(log: MetadataLog, info: SegmentInfo, *, entries: bool = False) -> dict[str, Any]:
    # MetadataLog lists segments but does not expose their sparse indexes: reach for its segments
    segment = log.segment(info.base_seq)
    batches = segment.batches()
    records = info.next_seq - info.base_seq
    summary = {
        "file": info.path.name,
        "log_format": BATCH_VERSION,
        "base_seq": info.base_seq,
        "next_seq": info.next_seq,
        "records": records,
        "batches": len(batches),
        "log_bytes": info.size_bytes,
        "bytes_per_record": round(info.size_bytes / records, 2) if records else None,
        "active": info.active,
        "time_range": _time_range(info.min_timestamp, info.max_timestamp),
        "offset_index_entries": segment.offset_index.entries,
        "time_index_entries": segment.time_index.entries,
    }
    if entries:
        # one line per batch: position, base seq, records, bytes, min and max timestamp (ms)
        summary["batch_list"] = _listed([
            [int(batches.positions[i]), int(batches.base_seqs[i]), int(batches.counts[i]), int(batches.lengths[i]),
             int(batches.min_timestamps[i]), int(batches.max_timestamps[i])] for i in range(len(batches))])
        annotation = log.last_annotation() if info.active else b""
        if annotation:
            summary["last_annotation"] = annotation.decode("utf-8", "backslashreplace")
        summary["offset_index"] = _listed([list(segment.offset_index.entry(n)) for n in range(segment.offset_index.entries)])
        summary["time_index"] = _listed([list(segment.time_index.entry(n)) for n in range(segment.time_index.entries)])
    return summary


def _listed(items: list[Any]) -> list[Any]:
    """All entries when few, else the first and last LISTED_ENTRIES // 2 around a marker."""
    if len(items) <= LISTED_ENTRIES:
        return items
    half = LISTED_ENTRIES // 2
    return [*items[:half], f"... {len(items) - 2 * half} more ...", *items[-half:]]


# --- a shard and a store -------------------------------------------------------------------------
def inspect_shard(directory: Path, settings: StoreSettings | None) -> dict[str, Any]:
    """The committed state of one shard: checkpoint, log segments, index files."""
    directory = Path(directory)
    settings = settings or StoreSettings()
    checkpoint = read_checkpoint(directory / CHECKPOINT_FILE)
    broker = directory.name[len(SHARD_DIR_PREFIX) :] if directory.name.startswith(SHARD_DIR_PREFIX) else directory.name
    if checkpoint is None:
        return {"kind": "shard", "path": str(directory), "broker": broker, "source_ranges": None, "note": "no checkpoint: nothing committed"}
    with ShardReader(directory, broker, settings) as reader:
        log = reader.log
        segments = [_segment_summary(log, info) for info in log.segments()] if log else []
    index_files = []
    for state in checkpoint.index_files:
        index_files.append(
            {
                "name": state.name,
                "entries": state.index_count - FIRST_INDEX,
                "time_range": _time_range(state.min_timestamp_ms, state.max_timestamp_ms),
                "header": state.header,
            }
        )
    return {
        "kind": "shard",
        "path": str(directory),
        "broker": broker,
        "source_ranges": None if checkpoint.source_ranges is None else checkpoint.source_ranges.to_json(),
        "records": checkpoint.record_count - checkpoint.log_start_seq,
        "log_start_seq": checkpoint.log_start_seq,
        "next_seq": checkpoint.record_count,
        "topics": list(checkpoint.topics),
        "segments": segments,
        "index_files": index_files,
        "bytes": sum(_tree_bytes(directory / sub) for sub in (LOG_DIR, INDEX_DIR)),
    }


def inspect_store(root: Path) -> dict[str, Any]:
    """The store's settings and a summary of every shard."""
    with open_store(root) as store:
        shards = [inspect_shard(root / f"{SHARD_DIR_PREFIX}{broker}", store.settings) for broker in store.brokers()]
        return {
            "kind": "store",
            "path": str(root),
            "settings": store.settings.to_dict(),
            "brokers": store.brokers(),
            "records": sum(shard.get("records", 0) for shard in shards),
            "bytes": sum(shard.get("bytes", 0) for shard in shards),
            "shards": shards,
        }


def _settings_near(path: Path) -> StoreSettings | None:
    """The settings of the store `path` lies in (file, log/, index/, shard dir), if any."""
    for parent in [path, *path.parents][:4]:
        if (parent / MANIFEST_FILE).is_file():
            return open_store(parent).settings
    return None


def _tree_bytes(directory: Path) -> int:
    if not directory.is_dir():
        return 0
    return sum(entry.stat().st_size for entry in directory.iterdir() if entry.is_file())


def _time_range(low_ms: int | None, high_ms: int | None) -> dict[str, Any] | None:
    if low_ms is None or high_ms is None:
        return None
    return {"min_ms": low_ms, "max_ms": high_ms, "min": _iso(low_ms), "max": _iso(high_ms)}


def _iso(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms (out of calendar range)"


# --- rendering -----------------------------------------------------------------------------------
def format_report(report: dict[str, Any]) -> str:
    """`report` as indented `key: value` lines for people (nested dicts and lists indented)."""
    lines: list[str] = []
    _render(report, lines, 0)
    return "\n".join(lines)


def format_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=False, default=str)


def _render(value: Any, lines: list[str], depth: int) -> None:
    pad = "  " * depth
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, list) and item and not _nested(item):
                lines.append(f"{pad}{key}: {', '.join(map(_scalar, item))}")
            elif isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:")
                _render(item, lines, depth + 1)
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
    elif isinstance(value, list):
        for number, item in enumerate(value):
            if isinstance(item, list) and not _nested(item):  # e.g. a sparse index entry
                lines.append(f"{pad}- {', '.join(map(_scalar, item))}")
            elif isinstance(item, (dict, list)):
                lines.append(f"{pad}- [{number}]")
                _render(item, lines, depth + 1)
            else:
                lines.append(f"{pad}- {_scalar(item)}")


def _nested(items: list[Any]) -> bool:
    return any(isinstance(item, (dict, list)) for item in items)


def _scalar(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if value == [] or value == {}:
        return "(none)"
    return str(value)
