"""The metadata-log record batch (format version 2): many messages' metadata, columnar, compressed,
checksummed. A segment file is a sequence of batches, back to back, as Kafka's v2 log is.

Header layout (little-endian, so that numpy reads header fields without byte swapping)::

    offset size  field
    0      4     magic             b"MXB2"
    4      4     crc               u32  zlib.crc32 of bytes [8, batch_length): the rest of the
                                        header, the annotation and the body
    8      4     batch_length      u32  bytes of the whole batch, this header included
    12     1     version           u8   BATCH_VERSION
    13     1     attributes        u8   bit 0: body is zstd-compressed
    14     2     reserved          u16  0
    16     8     base_seq          i64  sequence number of the batch's first record
    24     4     record_count      i32  >= 1
    28     4     annotation_length u32  bytes of the annotation that follows the header
    32     8     min_timestamp     i64  ms, over the batch's records
    40     8     max_timestamp     i64
    48     4     body_length       u32  bytes of the (compressed) body
    52     4     raw_length        u32  bytes of the body once decompressed
    56     ...   annotation | body

The annotation is opaque to the log (a writer's commit note, e.g. the source offsets committed so
far: ``MetadataLog.append(..., annotation=...)``); it is checksummed with the rest.

The body is an Arrow IPC stream of one record batch (STORED columns below), compressed as ONE
zstd frame. Why one frame rather than Arrow's per-buffer compression: Arrow's codec pays a fixed
cost per buffer (~15 us each, ~25 buffers), which made decoding one 1,024-row batch cost 350 us
against 80 us for one frame; bytes are the same (measurements in BENCHMARKS.md). Stored columns:

    topic        dictionary<int8|int32, binary> encode_text bytes
    partition    uint8|uint16|uint32|int64     partition - base
    offset       uint8|uint16|uint32|int64     offset - base
    timestamp    uint8|uint16|uint32|int64     timestamp_ms - min_timestamp (header)
    key          dictionary<int32, binary>     null: the message has no key
    keys_lead    bool                          keys[0] is the key itself (stored once)
    keys_rest    list<binary>                  the keys after the lead one (all when no lead)
    commit_log_offset uint8|...|int64          commit_log_offset - base (-1: the source has none)
    size         uint8|...|int64               size - base (-1: the source has none)

Integers are stored as deltas from the batch's minimum (``base``, in the schema metadata under
the column's name; the header's min_timestamp for timestamps) in the narrowest unsigned type
that holds them: fewer bytes to decompress on every read, and zstd compresses them better.

Dictionary-encoded topics and keys, integer deltas and the key stored once bring a batch to the
size of a zstd Parquet file of the same rows (FACTS.md). Texts stay bytes: a key decoded from
non-UTF-8 Kafka bytes holds lone surrogates, which Arrow strings cannot carry.

The checksum is zlib's CRC-32, not Kafka's CRC-32C: CRC-32C at C speed needs a compiled extension,
and the pipeline's executors must need nothing beyond pyspark's own Arrow dependencies and the
standard library. Both detect the torn writes and bit flips this guards against equally well.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from msgindex.errors import CorruptFileError, InvalidAppendError
from msgindex.storage.log.columns import LogColumns
from msgindex.storage.message import NO_VALUE, ROW_SCHEMA, MessageRecord, arrow_text, decode_text, shown_timestamps

BATCH_MAGIC = b"MXB2"
BATCH_VERSION = 2
ATTR_ZSTD = 0x01
CRC_START = 8  # the checksum covers bytes [CRC_START, batch_length)
HEADER_SIZE = 56
MAX_BATCH_BYTES = 0x7FFF_FFFF  # positions in the sparse offset index are i32
MAX_ANNOTATION_BYTES = 1 << 20
INT64_MAX = (1 << 63) - 1
CODEC = "zstd"

HEADER_STRUCT = struct.Struct("<4sIIBBHqiIqqII")
HEADER_DTYPE = np.dtype(
    [
        ("magic", "S4"),
        ("crc", "<u4"),
        ("batch_length", "<u4"),
        ("version", "u1"),
        ("attributes", "u1"),
        ("reserved", "<u2"),
        ("base_seq", "<i8"),
        ("record_count", "<i4"),
        ("annotation_length", "<u4"),
        ("min_timestamp", "<i8"),
        ("max_timestamp", "<i8"),
        ("body_length", "<u4"),
        ("raw_length", "<u4"),
    ]
)
assert HEADER_STRUCT.size == HEADER_DTYPE.itemsize == HEADER_SIZE

TEXT = pa.binary()
ITEMS = pa.list_(pa.field("item", TEXT, nullable=False))


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed header of one batch (see the module docstring)."""

    crc: int
    batch_length: int
    version: int
    attributes: int
    base_seq: int
    record_count: int
    annotation_length: int
    min_timestamp: int
    max_timestamp: int
    body_length: int
    raw_length: int

    @property
    def next_seq(self) -> int:
        return self.base_seq + self.record_count

    @property
    def last_seq(self) -> int:
        return self.base_seq + self.record_count - 1


@dataclass(frozen=True, slots=True)
class BatchProblem:
    """Why the bytes at `position` are not a valid batch: a torn tail or corruption."""

    position: int
    reason: str
    torn: bool  # True: the batch runs past the end of the bytes (a write that never finished)


def read_header(buf, position: int) -> BatchHeader:
    """The header at `position`, unchecked (for hops over batches already validated)."""
    fields = HEADER_STRUCT.unpack_from(buf, position)
    return BatchHeader(*fields[1:5], *fields[6:])


def check_batch(buf, position: int, end: int, expected_seq: int | None = None, *,
                verify_crc: bool = True) -> BatchHeader | BatchProblem:
    """Validate the batch at `position` in `buf[:end]`: its header, or the problem found."""
    left = end - position
    if left < HEADER_SIZE:
        return BatchProblem(position, f"{left} bytes left, too few for a batch header", True)
    fields = HEADER_STRUCT.unpack_from(buf, position)
    if fields[0] != BATCH_MAGIC:
        return BatchProblem(position, f"no batch magic (found {fields[0]!r})", False)
    header = BatchHeader(*fields[1:5], *fields[6:])
    total = header.batch_length
    if total != HEADER_SIZE + header.annotation_length + header.body_length or total > MAX_BATCH_BYTES:
        return BatchProblem(position, f"batch length {total} does not add up", False)
    if total > left:
        return BatchProblem(position, f"batch of {total} bytes runs past the end ({end})", True)
    if verify_crc and zlib.crc32(memoryview(buf)[position + CRC_START : position + total]) != header.crc:
        return BatchProblem(position, "checksum mismatch", False)
    if header.version != BATCH_VERSION:
        return BatchProblem(position, f"unknown batch version {header.version}", False)
    if header.record_count < 1 or header.min_timestamp > header.max_timestamp:
        return BatchProblem(position, "impossible record count or time range", False)
    if expected_seq is not None and header.base_seq != expected_seq:
        return BatchProblem(position, f"base sequence {header.base_seq} where {expected_seq} was expected", False)
    return header


def checked_batch(data: bytes, end: int, name: object, origin: int, expected_seq: int | None = None) -> BatchHeader:
    """``check_batch`` of a batch copied from byte `origin` of file `name` into `data`; a problem
    is a CorruptFileError naming the file and the batch's position in it."""
    checked = check_batch(data, 0, end, expected_seq)
    if isinstance(checked, BatchProblem):
        raise CorruptFileError(f"{name}: invalid batch at byte {origin}: {checked.reason}")
    return checked


# ---- encoding ----------------------------------------------------------------------------------
def encode_batch(base_seq: int, columns: LogColumns, annotation: bytes = b"") -> bytes:
    """The bytes of one batch holding all of `columns` from `base_seq` on."""
    n = len(columns)
    if n < 1:
        raise InvalidAppendError("a batch holds at least one record")
    if len(annotation) > MAX_ANNOTATION_BYTES:
        raise InvalidAppendError(f"annotation of {len(annotation)} bytes; at most {MAX_ANNOTATION_BYTES} allowed")
    timestamps = columns.ints["timestamp_ms"]
    low, high = int(timestamps.min()), int(timestamps.max())
    stored = _stored_batch(columns, low)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, stored.schema) as writer:
        writer.write_batch(stored)
    raw = sink.getvalue()
    body = pa.compress(raw, CODEC, asbytes=True)
    total = HEADER_SIZE + len(annotation) + len(body)
    if total > MAX_BATCH_BYTES or raw.size > 0xFFFF_FFFF:
        raise InvalidAppendError(f"a batch of {n} records would be {total} bytes; split the append")
    rest = HEADER_STRUCT.pack(BATCH_MAGIC, 0, total, BATCH_VERSION, ATTR_ZSTD, 0, base_seq, n, len(annotation),
                              low, high, len(body), raw.size)[CRC_START:]
    crc = zlib.crc32(body, zlib.crc32(annotation, zlib.crc32(rest)))
    return b"".join((BATCH_MAGIC, struct.pack("<I", crc), rest, annotation, body))


def _narrow(values: np.ndarray) -> tuple[pa.Array, int]:
    """(values - base, base) with base the minimum, in the narrowest unsigned type that holds the
    deltas. A range wider than int64 keeps int64 deltas that wrap: adding the base back in int64
    arithmetic (which wraps too) restores every value exactly."""
    values = values.astype(np.int64, copy=False)
    base = int(values.min())
    delta = values - np.int64(base)
    top = int(values.max()) - base
    for dtype in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(dtype).max:
            return pa.array(delta.astype(dtype)), base
    return pa.array(delta), base


def _ints(stored: pa.RecordBatch, index: int, base: int) -> np.ndarray:
    return stored.column(index).to_numpy().astype(np.int64) + base


def _bases(stored: pa.RecordBatch) -> dict[str, int]:
    metadata = stored.schema.metadata or {}
    return {name: int(metadata.get(name.encode(), b"0")) for name in ("partition", "offset", "commit_log_offset",
                                                                       "size")}


def _stored_batch(c: LogColumns, min_timestamp: int) -> pa.RecordBatch:
    n = len(c)
    key = c.key.cast(TEXT)
    first_item = int(c.list_offsets[0])
    items = c.items.slice(first_item, int(c.list_offsets[-1]) - first_item).cast(TEXT)
    list_offsets = c.list_offsets - first_item
    starts, ends = list_offsets[:-1], list_offsets[1:]
    counts = ends - starts
    lead = np.zeros(n, dtype=bool)
    has_items = counts > 0
    if has_items.any():
        first_items = items.take(pa.array(np.where(has_items, starts, 0)))
        same = pc.equal(first_items, key).fill_null(False).to_numpy(zero_copy_only=False)
        lead = has_items & same
    keep = np.ones(len(items), dtype=bool)
    keep[starts[lead]] = False
    rest_items = items.filter(pa.array(keep))
    rest_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts - lead, out=rest_offsets[1:])
    topic = c.topic.cast(TEXT).dictionary_encode()
    if len(topic.dictionary) <= 127:  # one byte per record for the few topics a shard has
        topic = pa.DictionaryArray.from_arrays(topic.indices.cast(pa.int8()), topic.dictionary)
    partition, partition_base = _narrow(c.ints["partition"])
    offset, offset_base = _narrow(c.ints["offset"])
    timestamp, _ = _narrow(c.ints["timestamp_ms"])  # its base is the header's min_timestamp
    commit_log_offset, commit_log_offset_base = _narrow(c.ints["commit_log_offset"])
    size, size_base = _narrow(c.ints["size"])
    arrays = [topic, partition, offset, timestamp, key.dictionary_encode(), pa.array(lead),
              pa.ListArray.from_arrays(pa.array(rest_offsets), rest_items, type=ITEMS), commit_log_offset, size]
    bases = {"partition": partition_base, "offset": offset_base, "commit_log_offset": commit_log_offset_base,
             "size": size_base}
    schema = pa.schema([pa.field(name, array.type) for name, array in zip(STORED_NAMES, arrays)],
                       metadata={name.encode(): str(base).encode() for name, base in bases.items()})
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


STORED_NAMES = ("topic", "partition", "offset", "timestamp", "key", "keys_lead", "keys_rest",
                "commit_log_offset", "size")


# ---- decoding ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodedBatch:
    """Records of one batch (all, or some rows) as Arrow/numpy columns (texts as encode_text
    bytes), ready to be filtered, verified and rendered without Python code per record."""

    seqs: np.ndarray  # int64
    topic: pa.Array  # binary (dictionary-decoded)
    partition: np.ndarray  # int32
    offset: np.ndarray  # int64
    timestamp_ms: np.ndarray  # int64
    key: pa.Array  # binary, null where the message has no key
    keys: pa.ListArray  # list<binary>: the full keys, lead key restored
    commit_log_offset: np.ndarray  # int64
    size: np.ndarray  # int32

    def __len__(self) -> int:
        return len(self.seqs)


@dataclass(frozen=True)
class StoredBatch:
    """A batch's body as stored (decompressed, zero-copy IPC columns). A point read selects the
    few rows it wants BEFORE the texts and keys are rebuilt, so its cost is the decompression and
    not the batch's row count; a scan decodes all rows."""

    header: BatchHeader
    stored: pa.RecordBatch

    @property
    def base_seq(self) -> int:
        return self.header.base_seq

    def __len__(self) -> int:
        return self.stored.num_rows

    def timestamps(self) -> np.ndarray:
        return self.stored.column(3).to_numpy().astype(np.int64) + self.header.min_timestamp

    def all(self) -> DecodedBatch:
        return _decoded(self.header, self.stored, np.arange(self.base_seq, self.base_seq + len(self), dtype=np.int64))

    def select(self, rows: np.ndarray) -> DecodedBatch:
        """Rows `rows` (positions in the batch, in that order)."""
        rows = np.asarray(rows, dtype=np.int64)
        return _decoded(self.header, self.stored.take(pa.array(rows)), self.base_seq + rows)


def decode_body(data: bytes, header: BatchHeader, name: object, origin: int) -> StoredBatch:
    """The body of the (already checked) batch copied from byte `origin` of `name` into `data`."""
    start = HEADER_SIZE + header.annotation_length
    position = origin
    try:
        compressed = pa.py_buffer(memoryview(data)[start : start + header.body_length])
        raw = pa.decompress(compressed, header.raw_length, CODEC, asbytes=False) if header.attributes & ATTR_ZSTD \
            else compressed
        stored = ipc.open_stream(raw).read_next_batch()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise CorruptFileError(f"{name}: invalid batch at byte {position}: body does not decode ({e})") from None
    if stored.num_rows != header.record_count or tuple(stored.schema.names) != STORED_NAMES:
        raise CorruptFileError(f"{name}: invalid batch at byte {position}: body does not match its header")
    return StoredBatch(header, stored)


def gather(parts: list[tuple[StoredBatch, np.ndarray]]) -> DecodedBatch:
    """The rows `rows` of each (stored batch, rows), concatenated into one DecodedBatch in that
    order. Per batch only a take and a few zero-copy conversions run; the keys are rebuilt and
    everything is checked and rendered once for all batches (a lookup touching hundreds of
    batches pays the per-call overhead of Arrow once, not hundreds of times)."""
    if not parts:
        empty = pa.array([], TEXT)
        return DecodedBatch(np.zeros(0, np.int64), empty, np.zeros(0, np.int32), np.zeros(0, np.int64),
                            np.zeros(0, np.int64), empty, pa.array([], ITEMS), np.zeros(0, np.int64),
                            np.zeros(0, np.int32))
    columns: list[list] = [[] for _ in range(10)]
    for stored, rows in parts:
        rows = np.asarray(rows, dtype=np.int64)
        taken = stored.stored.take(pa.array(rows))
        bases = _bases(stored.stored)
        for column, value in zip(columns, (
            stored.base_seq + rows,
            plain(taken.column(0)),
            _ints(taken, 1, bases["partition"]),
            _ints(taken, 2, bases["offset"]),
            _ints(taken, 3, stored.header.min_timestamp),
            plain(taken.column(4)),
            taken.column(5).to_numpy(zero_copy_only=False),
            taken.column(6),
            _ints(taken, 7, bases["commit_log_offset"]),
            _ints(taken, 8, bases["size"]),
        )):
            column.append(value)
    seqs, topic, partition, offset, stamps, key, lead, rest, commit_log_offset, size = (
        np.concatenate(c) if isinstance(c[0], np.ndarray) else pa.concat_arrays(c) for c in columns)
    return DecodedBatch(seqs, topic, partition, offset, stamps, key,
                        _with_lead(key, lead, rest) if lead.any() else rest, commit_log_offset, size)


def plain(array: pa.Array) -> pa.Array:
    """A stored column without its dictionary encoding."""
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array


def _decoded(header: BatchHeader, stored: pa.RecordBatch, seqs: np.ndarray) -> DecodedBatch:
    bases = _bases(stored)
    key = plain(stored.column(4))
    lead = stored.column(5).to_numpy(zero_copy_only=False)
    rest = stored.column(6)
    return DecodedBatch(
        seqs,
        plain(stored.column(0)),
        _ints(stored, 1, bases["partition"]),
        _ints(stored, 2, bases["offset"]),
        _ints(stored, 3, header.min_timestamp),
        key,
        _with_lead(key, lead, rest) if lead.any() else rest,
        _ints(stored, 7, bases["commit_log_offset"]),
        _ints(stored, 8, bases["size"]),
    )


def _with_lead(key: pa.Array, lead: np.ndarray, rest: pa.ListArray) -> pa.ListArray:
    """keys = [key] + rest where `lead`, else rest: one take over key values and rest items."""
    n = len(lead)
    rest_offsets = rest.offsets.to_numpy().astype(np.int64)
    rest_counts = np.diff(rest_offsets)
    counts = rest_counts + lead
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    # Source indexes into concat(key, rest items): a lead item is key[i]; the rest follow in order.
    take = np.empty(int(offsets[-1]), dtype=np.int64)
    lead_rows = np.flatnonzero(lead)
    take[offsets[lead_rows]] = lead_rows
    is_rest = np.ones(len(take), dtype=bool)
    is_rest[offsets[lead_rows]] = False
    take[is_rest] = n + rest_offsets[0] + np.arange(int(rest_counts.sum()), dtype=np.int64)
    values = pa.concat_arrays([key.fill_null(b""), rest.values]).take(pa.array(take))
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values, type=ITEMS)


# ---- rendering ---------------------------------------------------------------------------------
def _string_array(array: pa.Array) -> pa.Array:
    """encode_text bytes as Arrow strings; texts that are not valid UTF-8 (lone surrogates) go
    through ``arrow_text`` one by one, the rest stay zero-copy."""
    try:
        return array.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if raw is None else arrow_text(decode_text(raw)) for raw in array.to_pylist()],
                        pa.string())


def rows(batch: DecodedBatch, broker: str, take: np.ndarray | None = None) -> pa.RecordBatch:
    """ROW_SCHEMA rows of `batch` (of its rows `take`, in that order, when given). Timestamps a
    store holds from before the timestamp rule show as the nearest bound (``shown_timestamps``)."""
    def pick(values):
        return values if take is None else values[take]

    def pick_arrow(array: pa.Array) -> pa.Array:
        return array if take is None else array.take(pa.array(take))

    count = len(batch) if take is None else len(take)
    if count == 0:
        return pa.RecordBatch.from_pylist([], schema=ROW_SCHEMA)
    keys = pick_arrow(batch.keys)
    offsets = keys.offsets.to_numpy()
    values = keys.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    keys_column = pa.ListArray.from_arrays(pa.array((offsets - offsets[0]).astype(np.int32)),
                                           _string_array(values), type=ROW_SCHEMA.field("keys").type)
    commit_log_offset, size = pick(batch.commit_log_offset), pick(batch.size)
    columns = [
        pa.repeat(pa.scalar(arrow_text(broker), pa.string()), count),
        _string_array(pick_arrow(batch.topic)),
        pa.array(pick(batch.partition), pa.int32()),
        pa.array(pick(batch.offset), pa.int64()),
        _string_array(pick_arrow(batch.key)),
        keys_column,
        pa.array(shown_timestamps(pick(batch.timestamp_ms)) * 1000, pa.int64()).cast(ROW_SCHEMA.field("timestamp").type),
        pa.array(commit_log_offset, pa.int64(), mask=commit_log_offset == NO_VALUE),
        pa.array(size, pa.int32(), mask=size == NO_VALUE),
        pa.array(pick(batch.seqs), pa.int64()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ROW_SCHEMA)


def records(batch: DecodedBatch, take: np.ndarray | None = None) -> list[MessageRecord]:
    """MessageRecords of `batch` (its rows `take` when given): exact texts, for tools and tests."""
    index = np.arange(len(batch)) if take is None else np.asarray(take)
    topics = batch.topic.take(pa.array(index)).to_pylist()
    keys = batch.key.take(pa.array(index)).to_pylist()
    key_lists = batch.keys.take(pa.array(index)).to_pylist()
    out = []
    for i, row in enumerate(index.tolist()):
        out.append(MessageRecord(
            decode_text(topics[i]), int(batch.partition[row]), int(batch.offset[row]), int(batch.timestamp_ms[row]),
            None if keys[i] is None else decode_text(keys[i]), tuple(decode_text(k) for k in key_lists[i]),
            int(batch.commit_log_offset[row]), int(batch.size[row]),
        ))
    return out
