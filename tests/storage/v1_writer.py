"""Test fixture: the format-1 (row-per-record) metadata-log writer, one record at a time, kept only
to make stores as the old code wrote them, for the tests of ``msgindex upgrade``. Deliberately
plain: struct packing per record and the old index rule applied record by record.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from msgindex.storage.log import v1_records as rf
from msgindex.storage.message import MessageRecord, encode_text

_LENGTH_CRC = struct.Struct("<II")
_HEADER_AFTER_CRC = struct.Struct("<BBHiqqqqiIII")
OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")
NO_TIMESTAMP = -1


def encode_record(seq: int, record: MessageRecord) -> bytes:
    """The bytes of one record (the original per-record encoder)."""
    topic = encode_text(record.topic)
    key = b"" if record.key is None else encode_text(record.key)
    texts = [encode_text(k) for k in record.keys]
    keys_bytes = sum(map(len, texts))
    length = rf.HEADER_REST + len(topic) + len(key) + rf.KEY_LENGTH_SIZE * len(texts) + keys_bytes
    rest = b"".join([
        _HEADER_AFTER_CRC.pack(
            rf.RECORD_MAGIC, rf.ATTR_HAS_KEY if record.key is not None else 0, len(topic), record.partition, seq,
            record.timestamp_ms, record.offset, record.commit_log_offset, record.size,
            len(key), len(texts), keys_bytes,
        ),
        topic, key, struct.pack(f"<{len(texts)}I", *map(len, texts)), *texts,
    ])
    return _LENGTH_CRC.pack(length, zlib.crc32(rest)) + rest


@dataclass
class OracleSegment:
    """One segment as the original writer built it: record by record."""

    base_seq: int
    index_interval_bytes: int
    log: bytearray = field(default_factory=bytearray)
    offset_entries: list[tuple[int, int]] = field(default_factory=list)
    time_entries: list[tuple[int, int]] = field(default_factory=list)
    bytes_since_entry: int = 0
    max_so_far: int = NO_TIMESTAMP
    max_so_far_seq: int = 0

    def __post_init__(self) -> None:
        self.max_so_far_seq = self.base_seq
        self.next_seq = self.base_seq

    def maybe_append_time(self, timestamp: int, seq: int) -> None:
        if timestamp > (self.time_entries[-1][0] if self.time_entries else NO_TIMESTAMP):
            self.time_entries.append((timestamp, seq - self.base_seq))

    def append(self, data: bytes, timestamp: int) -> None:
        seq = self.next_seq
        if timestamp > self.max_so_far:
            self.max_so_far, self.max_so_far_seq = timestamp, seq
        if self.bytes_since_entry > self.index_interval_bytes:
            self.offset_entries.append((seq - self.base_seq, len(self.log)))
            self.maybe_append_time(self.max_so_far, self.max_so_far_seq)
            self.bytes_since_entry = 0
        self.bytes_since_entry += len(data)
        self.log += data
        self.next_seq += 1

    def files(self, sealed: bool) -> dict[str, bytes]:
        """The segment's files after close (indexes trimmed; a sealed one has its roll entry)."""
        if sealed:
            self.maybe_append_time(self.max_so_far, self.max_so_far_seq)
        name = f"{self.base_seq:020d}"
        return {
            f"{name}.log": bytes(self.log),
            f"{name}.index": b"".join(OFFSET_ENTRY.pack(*e) for e in self.offset_entries),
            f"{name}.timeindex": b"".join(TIME_ENTRY.pack(*e) for e in self.time_entries),
        }


def oracle_log_files(batches: list[list[MessageRecord]], *, segment_bytes: int, index_interval_bytes: int,
                     max_index_bytes: int) -> dict[str, bytes]:
    """The .log/.index/.timeindex files of a log that got `batches` appended and was closed,
    with the original roll rule: a record goes to a new segment when it would overflow a
    non-empty segment or when either sparse index might overflow."""
    max_offset_entries = max_index_bytes // OFFSET_ENTRY.size
    max_time_entries = max_index_bytes // TIME_ENTRY.size
    segments = [OracleSegment(0, index_interval_bytes)]
    seq = 0
    for batch in batches:
        for record in batch:
            data = encode_record(seq, record)
            active = segments[-1]
            # The original checks room per batch part: at most one entry per record in each index.
            full = (len(active.offset_entries) >= max_offset_entries
                    or len(active.time_entries) >= max_time_entries - 1)
            if active.log and (len(active.log) + len(data) > segment_bytes or full):
                segments.append(OracleSegment(seq, index_interval_bytes))
                active = segments[-1]
            active.append(data, record.timestamp_ms)
            seq += 1
    files: dict[str, bytes] = {}
    for i, segment in enumerate(segments):
        files.update(segment.files(sealed=i < len(segments) - 1))
    return files
