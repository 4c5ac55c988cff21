"""Test oracle: a scalar, reference-faithful reader of the metadata log (format 2), written straight
from ``batch_format``'s layout table, one batch and one record at a time, plus Kafka's
LogSegment.append index rule applied batch by batch. The vectorized reader (batch directory,
searchsorted, Arrow kernels) and the writer's index files must agree with it exactly.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from msgindex.storage.message import MessageRecord

HEADER = struct.Struct("<4sIIBBHqiIqqII")
OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")
NO_TIMESTAMP = -1


def wrap64(value: int) -> int:
    """Two's-complement int64 arithmetic: a delta stored as int64 may have wrapped."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def read_batches(data: bytes) -> list[dict]:
    """Every batch of a segment's bytes: header fields, annotation and records (MessageRecords)."""
    batches, position = [], 0
    while position < len(data):
        (magic, crc, length, version, attributes, _reserved, base_seq, count, annotation_length,
         low, high, body_length, raw_length) = HEADER.unpack_from(data, position)
        assert magic == b"MXB2" and version == 2, position
        assert length == HEADER.size + annotation_length + body_length
        assert zlib.crc32(data[position + 8 : position + length]) == crc
        annotation = data[position + HEADER.size : position + HEADER.size + annotation_length]
        body = data[position + HEADER.size + annotation_length : position + length]
        raw = pa.decompress(body, raw_length, "zstd") if attributes & 1 else body
        stored = ipc.open_stream(pa.py_buffer(raw)).read_all().to_pylist()
        metadata = ipc.open_stream(pa.py_buffer(raw)).schema.metadata
        base = {name: int(metadata[name.encode()]) for name in ("partition", "offset", "commit_log_offset", "size")}
        base["timestamp"] = low
        records = []
        for row in stored:
            text = lambda raw_text: raw_text.decode("utf-8", "surrogatepass")  # noqa: E731
            key = None if row["key"] is None else text(row["key"])
            rest = tuple(text(k) for k in row["keys_rest"])
            value = {name: wrap64(row[name] + base[name]) for name in base}  # deltas from the batch minimum
            records.append(MessageRecord(
                text(row["topic"]), value["partition"], value["offset"], value["timestamp"],
                key, ((key,) + rest) if row["keys_lead"] else rest, value["commit_log_offset"], value["size"],
            ))
        assert len(records) == count and min(r.timestamp_ms for r in records) == low
        assert max(r.timestamp_ms for r in records) == high
        batches.append({"position": position, "length": length, "base_seq": base_seq, "count": count,
                        "annotation": annotation, "records": records, "max_timestamp": high})
        position += length
    return batches


def read_log(directory: Path) -> list[MessageRecord]:
    """Every record of a log directory, segment by segment, checking that seqs are consecutive."""
    records: list[MessageRecord] = []
    for path in sorted(Path(directory).glob("*.log")):
        assert int(path.stem) == len(records) or not records, path
        expected = int(path.stem)
        for batch in read_batches(path.read_bytes()):
            assert batch["base_seq"] == expected
            expected += batch["count"]
            records.extend(batch["records"])
    return records


def index_files(data: bytes, base_seq: int, index_interval_bytes: int, sealed: bool) -> tuple[bytes, bytes]:
    """The .index and .timeindex bytes Kafka's rule gives for a segment's bytes (trimmed)."""
    offsets, times = [], []
    since, max_so_far, max_seq = 0, NO_TIMESTAMP, base_seq
    for batch in read_batches(data):
        last_seq = batch["base_seq"] + batch["count"] - 1
        if batch["max_timestamp"] > max_so_far:
            max_so_far, max_seq = batch["max_timestamp"], last_seq
        if since > index_interval_bytes:
            offsets.append((last_seq - base_seq, batch["position"]))
            if max_so_far > (times[-1][0] if times else NO_TIMESTAMP):
                times.append((max_so_far, max_seq - base_seq))
            since = 0
        since += batch["length"]
    if sealed and max_so_far > (times[-1][0] if times else NO_TIMESTAMP):
        times.append((max_so_far, max_seq - base_seq))
    return (b"".join(OFFSET_ENTRY.pack(*e) for e in offsets), b"".join(TIME_ENTRY.pack(*e) for e in times))
