"""Where malformed input goes: a directory of JSON-lines files, one per (batch id, group).

``<quarantine>/batch-<20-digit batch id>-<tag>.jsonl``, one JSON object per set-aside record::

    {"batch_id": 7, "reason": "missing brokerName",
     "source": {"topic": "rmq-dispatch", "partition": 0, "offset": 1234, "timestamp_ms": 1700000000000},
     "value": "<the record value as text, or null when it is not UTF-8>",
     "value_base64": "<the exact value bytes, or null when the value is null>"}

Exactly once per batch id: a file is written under a temporary name, fsynced and renamed into
place, and a replay of the batch (same rows, by the source's replay guarantee) finds the file and
writes nothing. Users read it back with ``read_quarantine(path)`` (a pyarrow Table), with
``spark.read.json(path)``, or with any JSON-lines tool.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from msgindex.storage.durable import write_atomically

FILE_PREFIX = "batch-"
FILE_SUFFIX = ".jsonl"
BATCH_ID_DIGITS = 20

# The columns a group function hands to `write_quarantine` (see sink.py).
SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, SOURCE_TIMESTAMP = "src_topic", "src_partition", "src_offset", "src_timestamp_ms"
RAW_VALUE, REASON = "raw_value", "reason"


def quarantine_file(directory: str | os.PathLike[str], batch_id: int, tag: str) -> Path:
    """The file holding batch `batch_id`'s records set aside by group `tag`."""
    return Path(directory) / f"{FILE_PREFIX}{batch_id:0{BATCH_ID_DIGITS}d}-{tag}{FILE_SUFFIX}"


def _value_text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _lines(batch_id: int, table: pa.Table, reasons: list[str]) -> Iterator[str]:
    columns = [table.column(name).to_pylist() for name in (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, SOURCE_TIMESTAMP, RAW_VALUE)]
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


def write_quarantine(directory: str | os.PathLike[str], batch_id: int, tag: str, table: pa.Table,
                     reasons: list[str]) -> bool:
    """Set aside `table`'s rows (columns named above) with one reason each; False when a previous
    attempt of this batch already wrote the file (nothing is written twice)."""
    target = quarantine_file(directory, batch_id, tag)
    if target.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, "".join(line + "\n" for line in _lines(batch_id, table, reasons)).encode("utf-8"))
    return True


def read_quarantine(directory: str | os.PathLike[str]) -> pa.Table:
    """Every quarantined record under `directory`, in batch order, as a table with columns
    batch_id, reason, topic, partition, offset, timestamp_ms, value, value_base64."""
    rows: dict[str, list] = {name: [] for name in ("batch_id", "reason", "topic", "partition", "offset", "timestamp_ms", "value", "value_base64")}
    folder = Path(directory)
    files = sorted(folder.glob(f"{FILE_PREFIX}*{FILE_SUFFIX}")) if folder.is_dir() else []
    for path in files:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                entry = json.loads(line)
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
