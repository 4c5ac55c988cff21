"""Format 1 of the metadata log (before record batches): one message's metadata per record,
length-prefixed and checksummed. Kept read-only, for `msgindex upgrade` (storage/maintenance/upgrade.py) to
convert old stores; nothing writes it any more.

Layout (little-endian, so that numpy reads header fields without byte swapping)::

    offset size  field
    0      4     length            u32  bytes after this field (header rest + variable part)
    4      4     crc               u32  zlib.crc32 of bytes [8, 4 + length)
    8      1     magic             u8   format version, RECORD_MAGIC
    9      1     attributes        u8   bit 0: the message has a key
    10     2     topic_len         u16
    12     4     partition         i32
    16     8     seq               i64  the record's sequence number in the log
    24     8     timestamp_ms      i64
    32     8     offset            i64  the message's offset in its source partition
    40     8     commit_log_offset i64  -1 when the source has none
    48     4     size              i32  -1 when the source has none
    52     4     key_len           u32  0 when there is no key (see attributes)
    56     4     keys_count        u32
    60     4     keys_bytes        u32  total length of the keys' texts
    64     ...   topic | key | keys_count x u32 key lengths | keys' texts

Texts are ``message.encode_text`` bytes. The checksum covers everything after itself, the
sequence number included, so a record copied to the wrong place or a torn tail never decodes.
The fixed 64-byte header is what the batch decoder reads with one numpy structured dtype; the
variable parts are gathered with index arithmetic, never one Python call per field.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from msgindex.errors import CorruptFileError
from msgindex.storage.int_limits import INT32_MAX, INT32_MIN
from msgindex.storage.log.columns import LogColumns

RECORD_MAGIC = 1
ATTR_HAS_KEY = 0x01
LENGTH_SIZE = 4  # the length prefix itself
CRC_START = 8  # the checksum covers bytes [CRC_START, LENGTH_SIZE + length)
HEADER_SIZE = 64
HEADER_REST = HEADER_SIZE - LENGTH_SIZE  # smallest legal value of `length`
KEY_LENGTH_SIZE = 4
MAX_TOPIC_BYTES = 0xFFFF
MAX_LENGTH = INT32_MAX  # positions in the sparse offset index are i32

HEADER_STRUCT = struct.Struct("<IIBBHiqqqqiIII")
LENGTH_STRUCT = struct.Struct("<I")
SEQ_TS_STRUCT = struct.Struct("<qq")  # seq, timestamp_ms: read together when hopping over records
SEQ_FIELD = 16
HEADER_DTYPE = np.dtype(
    [
        ("length", "<u4"),
        ("crc", "<u4"),
        ("magic", "u1"),
        ("attributes", "u1"),
        ("topic_len", "<u2"),
        ("partition", "<i4"),
        ("seq", "<i8"),
        ("timestamp_ms", "<i8"),
        ("offset", "<i8"),
        ("commit_log_offset", "<i8"),
        ("size", "<i4"),
        ("key_len", "<u4"),
        ("keys_count", "<u4"),
        ("keys_bytes", "<u4"),
    ]
)
assert HEADER_STRUCT.size == HEADER_DTYPE.itemsize == HEADER_SIZE

INT32 = (INT32_MIN, INT32_MAX)
INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True, slots=True)
class RecordProblem:
    """Why the bytes at `position` are not a valid record: a torn tail or corruption."""

    position: int
    reason: str
    torn: bool  # True: the record runs past the end of the bytes (a write that never finished)


def check_record(buf: bytes | bytearray | memoryview, position: int, end: int,
                 expected_seq: int | None = None) -> int | RecordProblem:
    """Validate the record at `position` in `buf[:end]`; its total size, or the problem found."""
    if end - position < LENGTH_SIZE:
        return RecordProblem(position, f"{end - position} bytes left, too few for a length prefix", True)
    (length,) = LENGTH_STRUCT.unpack_from(buf, position)
    total = LENGTH_SIZE + length
    if length < HEADER_REST or length > MAX_LENGTH:
        return RecordProblem(position, f"record length {length} is impossible", False)
    if position + total > end:
        return RecordProblem(position, f"record of {total} bytes runs past the end ({end})", True)
    header = HEADER_STRUCT.unpack_from(buf, position)
    if zlib.crc32(memoryview(buf)[position + CRC_START : position + total]) != header[1]:
        return RecordProblem(position, "checksum mismatch", False)
    if header[2] != RECORD_MAGIC:
        return RecordProblem(position, f"unknown record magic {header[2]}", False)
    variable = header[4] + header[11] + KEY_LENGTH_SIZE * header[12] + header[13]
    if HEADER_REST + variable != length:
        return RecordProblem(position, "field lengths do not add up to the record length", False)
    if expected_seq is not None and header[6] != expected_seq:
        return RecordProblem(position, f"sequence number {header[6]} where {expected_seq} was expected", False)
    return total


def walk_records(buf: bytes | bytearray | memoryview, start: int, end: int, *, verify: bool, name: object,
                 first_seq: int | None = None, limit: int | None = None) -> list[int]:
    """Start positions of the consecutive records from `start`: all of them up to `end` (which
    they must fill exactly), or the first `limit`.

    Record boundaries can only be found by hopping over length prefixes (one cheap call per
    record); with `verify`, each record's checksum and sequence number are checked too.
    """
    positions: list[int] = []
    append = positions.append
    unpack = LENGTH_STRUCT.unpack_from
    limit = -1 if limit is None else limit
    position = start
    if verify:
        seq = first_seq
        while position < end and len(positions) != limit:
            checked = check_record(buf, position, end, seq)
            if isinstance(checked, RecordProblem):
                raise CorruptFileError(f"{name}: invalid record at byte {position}: {checked.reason}")
            append(position)
            position += checked
            seq = None if seq is None else seq + 1
    else:
        while position < end and len(positions) != limit:
            append(position)
            position += LENGTH_SIZE + unpack(buf, position)[0]
    if position > end:
        raise CorruptFileError(f"{name}: invalid record at byte {positions[-1]}: runs past byte {end}")
    return positions


def _gather(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate `data[starts[i] : starts[i] + lengths[i]]` for all i: (bytes, int32 offsets)."""
    lengths = lengths.astype(np.int64, copy=False)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return np.zeros(0, dtype=np.uint8), offsets.astype(np.int32)
    index = np.repeat(starts.astype(np.int64) - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
    return data[index], offsets


def header_columns(buf: bytes | bytearray | memoryview, positions: Sequence[int] | np.ndarray) -> np.ndarray:
    """The fixed headers of the records at `positions` as a numpy structured array."""
    windows = np.lib.stride_tricks.sliding_window_view(np.frombuffer(buf, dtype=np.uint8), HEADER_SIZE)
    return windows[np.asarray(positions, dtype=np.int64)].view(HEADER_DTYPE).reshape(len(positions))


def log_columns(buf: bytes | bytearray | memoryview, positions: np.ndarray, headers: np.ndarray) -> LogColumns:
    """The (already validated) records at `positions` as the format-2 writer's LogColumns, texts
    kept as their exact on-disk bytes (no decoding, so lone surrogates survive the upgrade)."""
    starts = np.asarray(positions, dtype=np.int64)
    data = np.frombuffer(buf, dtype=np.uint8)
    topic_len = headers["topic_len"].astype(np.int64)
    key_len = headers["key_len"].astype(np.int64)
    keys_count = headers["keys_count"].astype(np.int64)
    topic_at = starts + HEADER_SIZE
    key_at = topic_at + topic_len
    lengths_at = key_at + key_len
    texts_at = lengths_at + KEY_LENGTH_SIZE * keys_count

    def binary(values: np.ndarray, offsets: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
        mask = None if valid is None else pa.array(valid).buffers()[1]
        return pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), len(offsets) - 1,
            [mask, pa.py_buffer(offsets.astype(np.int64)), pa.py_buffer(np.ascontiguousarray(values))])

    topic = binary(*_gather(data, topic_at, topic_len))
    has_key = (headers["attributes"] & ATTR_HAS_KEY).astype(bool)
    key = binary(*_gather(data, key_at, key_len), valid=has_key if not has_key.all() else None)
    raw_lengths, _ = _gather(data, lengths_at, KEY_LENGTH_SIZE * keys_count)
    item_lengths = raw_lengths.view("<u4").astype(np.int64)
    rows = len(starts)
    record_of_item = np.repeat(np.arange(rows), keys_count)
    list_offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(keys_count, out=list_offsets[1:])
    item_offsets = np.zeros(len(item_lengths) + 1, dtype=np.int64)
    np.cumsum(item_lengths, out=item_offsets[1:])
    first_item_offset = item_offsets[list_offsets[:-1]]
    item_at = texts_at[record_of_item] + (item_offsets[:-1] - first_item_offset[record_of_item])
    items = binary(*_gather(data, item_at, item_lengths))
    ints = {name: np.ascontiguousarray(headers[name]).astype(dtype) for name, dtype in (
        ("partition", np.int32), ("offset", np.int64), ("timestamp_ms", np.int64),
        ("commit_log_offset", np.int64), ("size", np.int32))}
    return LogColumns(topic, key, list_offsets, items, ints)
