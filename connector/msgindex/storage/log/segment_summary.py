"""The ``.summary`` file of a sealed (rolled) log segment: its record range and time range.

Time scans skip whole segments by their min/max timestamp. Kafka can read a segment's max from
its time index's last entry, but nothing in Kafka's files gives the min, and computing either by
reading a 1 GiB segment on every open is too slow, so the writer records both when it seals a
segment (the active segment's are in the LogPosition a checkpoint stores). The file is written
once, atomically (``durable.write_atomically``), and trusted only while it matches the segment's
size; when it is missing, corrupt or stale it is recomputed from the records.

Layout, little-endian, SUMMARY_STRUCT: magic ``MXSS`` | version u32 | base_seq i64 |
next_seq i64 | size_bytes i64 | min_timestamp i64 | max_timestamp i64 | crc32 u32 of the bytes
before it. An empty segment is never sealed, so min/max always exist.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from msgindex.errors import CorruptFileError
from msgindex.storage.durable import write_atomically

SUMMARY_MAGIC = b"MXSS"
SUMMARY_VERSION = 1
SUMMARY_STRUCT = struct.Struct("<4sIqqqqqI")


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """What a sealed segment holds: records [base_seq, next_seq), its byte size, its time range."""

    base_seq: int
    next_seq: int
    size_bytes: int
    min_timestamp: int
    max_timestamp: int

    def encode(self) -> bytes:
        body = SUMMARY_STRUCT.pack(
            SUMMARY_MAGIC, SUMMARY_VERSION, self.base_seq, self.next_seq, self.size_bytes,
            self.min_timestamp, self.max_timestamp, 0,
        )[:-4]
        return body + struct.pack("<I", zlib.crc32(body))

    @classmethod
    def read(cls, path: Path) -> SegmentSummary | None:
        """The summary at `path`, or None when it is missing or does not validate (the caller
        then recomputes it from the segment)."""
        try:
            raw = Path(path).read_bytes()
        except FileNotFoundError:
            return None
        except OSError:  # e.g. a directory in its place: derived, so recomputed by the caller
            return None
        if len(raw) != SUMMARY_STRUCT.size:
            return None
        magic, version, base, next_seq, size, lo, hi, crc = SUMMARY_STRUCT.unpack(raw)
        if magic != SUMMARY_MAGIC or version != SUMMARY_VERSION or crc != zlib.crc32(raw[:-4]):
            return None
        return cls(base, next_seq, size, lo, hi)

    def write(self, path: Path) -> None:
        """Write atomically and durably."""
        if Path(path).is_dir():
            raise CorruptFileError(f"{path}: a directory where the segment's summary belongs; remove it (the "
                                   f"summary is recomputed from the segment, nothing is lost)")
        write_atomically(path, self.encode())
