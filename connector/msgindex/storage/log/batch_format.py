"""The metadata-log record batch (format version 2): many messages' metadata, columnar, compressed,
checksummed. A segment file is a sequence of batches, back to back, as Kafka's v2 log is.

Layout (little-endian, so that numpy reads every field without byte swapping)::

    header (64 bytes) | block table | topic table | annotation | blocks

Header::

    offset size  field
    0      4     magic             b"MXB2"
    4      4     head_crc          u32  zlib.crc32 of bytes [8, head_length): the rest of the header,
                                        the block table and the topic table
    8      4     batch_length      u32  bytes of the whole batch, this header included
    12     1     version           u8   BATCH_VERSION (4); READ_VERSIONS are read (2: no stored form)
    13     1     codec             u8   CODEC_LZ4: every block is one LZ4 block (raw, no frame;
                                        written by LZ4HC, LZ4_WRITER)
    14     2     block_count       u16  >= 1
    16     8     base_seq          i64  sequence number of the batch's first record
    24     4     record_count      i32  >= 1
    28     4     annotation_length u32  bytes of the annotation
    32     8     min_timestamp     i64  ms, over the batch's records
    40     8     max_timestamp     i64
    48     4     body_length       u32  bytes of the blocks (compressed)
    52     4     raw_length        u32  bytes of the blocks once decompressed
    56     4     annotation_crc    u32  zlib.crc32 of the annotation
    60     4     topics_length     u32  bytes of the topic table

``head_length`` = 64 + 16 x block_count + topics_length. Block table, one 16-byte entry per block
(the blocks hold the batch's records in order, back to back after the annotation)::

    0      4     records           u32  >= 1
    4      4     length            u32  compressed bytes
    8      4     raw_length        u32  bytes once decompressed
    12     4     crc               u32  zlib.crc32 of the compressed bytes

Topic table: u32 count, then per topic u16 length + its encode_text bytes (the batch's distinct
topics; records name theirs by number). The annotation is opaque to the log (a writer's commit note,
``MetadataLog.append(..., annotation=...)``).

Every byte of a batch is covered by exactly one checksum: the head's, the annotation's or its
block's. A reader checks the head whenever it hops over a batch (``check_head``) and a block's
checksum whenever it decompresses that block, so a point read checks and decompresses one block
of ~BLOCK_RECORDS records, not the whole batch; recovery checks everything (``check_batch``).

A block, once decompressed: a 96-byte block header, then one section per column::

    block header: records u32, texts u32, heap_bytes u32, one u8 width per column (COLUMNS order,
                  then "byte_end"), 3 zero bytes (the stored form's, below), one i64 base per
                  column (same order)
    sections:     per record, each of COLUMNS:   records x its width bytes
                  per text, "byte_end":          texts x its width bytes
                  heap:                          heap_bytes bytes

    flags              bit 0: the record has a key; bit 1: its first key is that key (stored once)
    topic              the record's topic, as its number in the batch's topic table
    partition offset timestamp commit_log_offset size    the record's values (-1: the source has none)
    text_end           where the record's texts end (the next record's start): its key when it has
                       one, then its other keys (keys[1:] when bit 1, else all keys), then its
                       field terms (``message.field_term``: 0xFF, name, NUL, value; never a key)
    byte_end           where each text's bytes end in the heap (the next text's start)
    heap               the texts, encode_text bytes, back to back

A column stores value - base in `width` bytes (1, 2, 4 or 8; 0: every value is the base), base
being its minimum in the block: the narrowest unsigned deltas, few bytes to decompress on every
read. A column of width w is stored as w byte planes (plane i holds byte i of every value, little
endian): the high bytes of slowly growing values (ends, offsets, timestamps) form runs that LZ4
compresses. Deltas of a range wider than int64 wrap, and adding the base back in int64 arithmetic
(which wraps too) restores every value exactly. Texts stay bytes: a key decoded from non-UTF-8
Kafka bytes holds lone surrogates, which Arrow strings cannot carry.

**Stored form** (batch versions 3 and 4). Readers want values (any record's fields, texts and
bytes at once, without summing what comes before); compression wants what repeats. So a block is
compressed in its *stored form*: the layout above, of the same length, but for up to three of its
sections, each rewritten as below. Readers restore them, in place, right after decompressing the
block (``read_form``, and ``restore_block`` in ``_blocks.c``), before anything else reads it:
nothing past decompression knows the stored form exists. Header byte ``STORED_FORM_AT`` (21) holds
which rewrites a block has (zero in the read form, and left zero by version-2 writers), byte 22
the partition span of SOURCE_IN_TOPIC less one, byte 23 is zero:

    ENDS_AS_STEPS     (version 3 on) each delta of the two ends sections (end - base, in its width)
                      is its *step* from the delta before (the first as is), modulo 2^(8 x width):
                      a record's text count (1, mostly) and a key's length repeat, where the low
                      byte of an end is new on every record.
    OFFSETS_AS_STEPS  (version 4) each offset delta is its step from the delta of the record before
                      it *of the same source* (topic and partition) in the block, modulo 2^(8 x
                      width); a source's first record holds its delta as is. A shard holds every
                      record of a partition, in order, so the steps are 1: one repeated byte where
                      offset - base is a spread of partitions' offsets (and 4 random bytes when
                      partitions are of different ages, as a real broker's are). Only where the
                      topic and partition widths are <= 4 (a source is then one 64-bit key).
    SOURCE_IN_TOPIC   (version 4) where topic and partition both take one byte and (topic deltas)
                      x (partition span) <= 256: the topic section holds topic delta x span +
                      partition delta, span being byte 22 + 1, and the partition section zeros
                      (restoring overwrites them). One byte of ~5 random bits for LZ4 instead of two.

Restoring any of them restores the deltas exactly (sums modulo the width), so the read form is the
block a version-2 writer would have written, byte for byte. Damage is the block checksum's to catch;
a stored block rewritten with a checksum made to match gives damaged values exactly as a rewritten
read form does (the decoders' checks catch ends and topics out of range), and restoring never fails
on a section's contents, only on a header that gives no form there is or widths a rewrite does not
take (and, in C, on memory for the chains of a block of thousands of sources: a MemoryError). A
reader restores any block whose header gives a stored form, whatever its batch's version. On
bench_vs_parquet.py's four shapes (100,000 records each) version 3 took 0.9-1.5 B/record off 11-17
(8-12% of the log), and version 4 takes 1.3-1.5 more (11-13%: long keys 11.82 -> 10.33 B/record,
project 9.70 -> 8.22), 3.9-4.1 more with partitions of different ages (27-32%: 14.83 -> 10.76).
Restoring costs running sums over the block's records and texts, each offset's through a table of
its source's: checked, decompressed and restored, a block of 512 long-keys records takes 5.6-6.4 us
in version 4 against 5.4 in version 3 (``decompress_all`` of 200,000 records), which a read of every
block pays (a hot key from the log, a window); a point read restores only as far as the rows it
wants, and the offsets of a few rows of a block by summing their sources' steps alone
(``read_records``).

Why this shape (measurements in BENCHMARKS.md): LZ4 decompresses ~5-10x faster than zstd for
~20% more bytes (the log stays well under the size of a zstd Parquet file of the same rows);
blocks of DEFAULT_BLOCK_RECORDS records let a point read decompress 1/8 of a batch; a fixed
header per block and stored ends let any rows of many blocks be decoded together by a few numpy
operations (``BlockSet``), so a read touching thousands of blocks pays per block only for its
checksum and its decompression, and per row only for the rows it wants. That per-block loop is
compiled where a C compiler was at install (``_blocks.c``, ``decompress_all``): it holds no GIL,
so a large read is decompressed by two threads. Tens to thousands of records scattered over as
many blocks are read by one compiled call instead (``read_records``, ``read_record_columns``),
which keeps only the wanted rows of each block it decompresses, and decompresses each only as
far as those rows need (LZ4's partial decoding: the heap, most of a block of long keys, is read up to
the last of them).

The checksum is zlib's CRC-32, not Kafka's CRC-32C: CRC-32C at C speed needs a compiled extension,
and the pipeline's executors must need nothing beyond pyspark's own Arrow dependencies and the
standard library. Both detect the torn writes and bit flips this guards against equally well.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import CorruptFileError, InvalidAppendError
from msgindex.storage.fields import SHAPE_ARRAY, SHAPE_SINGLE
from msgindex.storage.int_limits import INT32_MAX
from msgindex.storage.log.columns import LogColumns, ranges_owner
from msgindex.storage.message import (
    FIELD_NAME_END,
    FIELD_TERM_MARKER,
    NO_VALUE,
    ROW_SCHEMA,
    MessageRecord,
    arrow_text,
    decode_text,
    encode_text,
    shown_timestamps,
    split_terms,
)
from msgindex.storage.sorted_runs import run_starts

try:  # optional (setup.py): absent without a C compiler at install, and where msgindex arrives as a zip
    from msgindex.storage.log import _blocks as compiled_blocks
except ImportError:
    compiled_blocks = None

BATCH_MAGIC = b"MXB2"
BATCH_VERSION = 4  # what writers write: blocks in their stored form, every rewrite of it
READ_VERSIONS = (2, 3, 4)
# The log's format, recorded with its committed position (LogPosition.log_format): batches of any of
# READ_VERSIONS. Format 1 (row-per-record segments) is read only by `msgindex upgrade`.
LOG_FORMAT = 2
CODEC_LZ4 = 1
CRC_START = 8  # the head checksum covers bytes [CRC_START, head_length)
HEADER_SIZE = 64
MAX_BATCH_BYTES = INT32_MAX  # positions in the sparse offset index are i32
MAX_BLOCKS = 0xFFFF
MAX_ANNOTATION_BYTES = 1 << 20
INT64_MAX = (1 << 63) - 1
# Records per block: a point read checks and decompresses one block. 512 keeps that near 10 us
# while LZ4 still compresses a block as well as a whole batch (BENCHMARKS.md).
DEFAULT_BLOCK_RECORDS = 512

HEADER_STRUCT = struct.Struct("<4sIIBBHqiIqqIIII")
HEADER_DTYPE = np.dtype(
    [
        ("magic", "S4"),
        ("head_crc", "<u4"),
        ("batch_length", "<u4"),
        ("version", "u1"),
        ("codec", "u1"),
        ("block_count", "<u2"),
        ("base_seq", "<i8"),
        ("record_count", "<i4"),
        ("annotation_length", "<u4"),
        ("min_timestamp", "<i8"),
        ("max_timestamp", "<i8"),
        ("body_length", "<u4"),
        ("raw_length", "<u4"),
        ("annotation_crc", "<u4"),
        ("topics_length", "<u4"),
    ]
)
assert HEADER_STRUCT.size == HEADER_DTYPE.itemsize == HEADER_SIZE

BLOCK_ENTRY_STRUCT = struct.Struct("<IIII")
BLOCK_ENTRY_DTYPE = np.dtype([("records", "<u4"), ("length", "<u4"), ("raw_length", "<u4"), ("crc", "<u4")])
assert BLOCK_ENTRY_STRUCT.size == BLOCK_ENTRY_DTYPE.itemsize == 16

TOPIC_COUNT_STRUCT = struct.Struct("<I")
TOPIC_LENGTH_STRUCT = struct.Struct("<H")

# The per-record columns of a block, in section order; "byte_end" (per text) follows them.
COLUMNS = ("flags", "topic", "partition", "offset", "timestamp", "commit_log_offset", "size", "text_end")
SECTIONS = (*COLUMNS, "byte_end")
FLAG_KEY = 0x01
FLAG_LEAD = 0x02
BLOCK_HEADER_STRUCT = struct.Struct("<III" + "B" * len(SECTIONS) + "3x" + "q" * len(SECTIONS))
BLOCK_HEADER_DTYPE = np.dtype(
    [("records", "<u4"), ("texts", "<u4"), ("heap_bytes", "<u4")]
    + [(f"{name}_width", "u1") for name in SECTIONS]
    + [("pad", "V3")]
    + [(f"{name}_base", "<i8") for name in SECTIONS]
)
BLOCK_HEADER_SIZE = 96
# The stored form (module docstring): the first of the 3 bytes BLOCK_HEADER_STRUCT skips.
STORED_FORM_AT = 12 + len(SECTIONS)
PARTITION_SPAN_AT = STORED_FORM_AT + 1
ENDS_AS_STEPS = 0x01
SOURCE_IN_TOPIC = 0x02
OFFSETS_AS_STEPS = 0x04
STORED_FORMS = ENDS_AS_STEPS | SOURCE_IN_TOPIC | OFFSETS_AS_STEPS
TEXT_END, BYTE_END = SECTIONS.index("text_end"), SECTIONS.index("byte_end")
TOPIC, PARTITION, OFFSET = SECTIONS.index("topic"), SECTIONS.index("partition"), SECTIONS.index("offset")
assert BLOCK_HEADER_STRUCT.size == BLOCK_HEADER_DTYPE.itemsize == BLOCK_HEADER_SIZE
assert STORED_FORM_AT == BLOCK_HEADER_DTYPE.fields["pad"][1] and TEXT_END + 1 == BYTE_END == len(COLUMNS)
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # a section's values by width

TEXT = pa.large_binary()
ITEMS = pa.large_list(pa.field("item", TEXT, nullable=False))
LZ4 = pa.Codec("lz4_raw")
# Writers compress blocks with LZ4HC: the same LZ4 block format, decoded by the same code as fast.
# Level 3 (its lowest) took 6-12% off LZ4's fast mode on bench/bench_vs_parquet.py's four workload
# shapes (200,000-record batches: long keys 14.86 -> 13.48 B/record, project 11.90 -> 10.84) for
# 0.3-0.5 us more CPU a record in encode_batch (0.6-0.8 -> 1.05-1.2 us). On blocks in their stored
# form, level 6 takes 1.6-2.2% more off level 3 (long keys 12.13 -> 11.87 B/record, project 9.95
# -> 9.79) for 0.04-0.09 us a record, within the noise of a 500k-record store's writing (1.0-1.2 s
# either way); level 9 gains 0.3% more at 2x level 6's compression time.
LZ4_WRITE_LEVEL = 6
LZ4_WRITER = pa.Codec("lz4_raw", compression_level=LZ4_WRITE_LEVEL)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed header of one batch (see the module docstring)."""

    head_crc: int
    batch_length: int
    version: int
    codec: int
    block_count: int
    base_seq: int
    record_count: int
    annotation_length: int
    min_timestamp: int
    max_timestamp: int
    body_length: int
    raw_length: int
    annotation_crc: int
    topics_length: int

    @property
    def head_length(self) -> int:
        return HEADER_SIZE + BLOCK_ENTRY_STRUCT.size * self.block_count + self.topics_length

    @property
    def blocks_offset(self) -> int:
        """Where the first block starts, from the batch's start."""
        return self.head_length + self.annotation_length

    @property
    def next_seq(self) -> int:
        return self.base_seq + self.record_count

    @property
    def last_seq(self) -> int:
        return self.base_seq + self.record_count - 1


@dataclass(frozen=True)
class BatchHead:
    """A batch's header, block table and topics: what a reader keeps of each batch in a
    segment's batch directory, checked against the head checksum."""

    header: BatchHeader
    table: bytes  # the block table as stored (BLOCK_ENTRY_STRUCT entries)
    topics: tuple[bytes, ...]

    @property
    def blocks(self) -> np.ndarray:
        """The block table as a BLOCK_ENTRY_DTYPE array."""
        return np.frombuffer(self.table, BLOCK_ENTRY_DTYPE)


@dataclass(frozen=True, slots=True)
class BatchProblem:
    """Why the bytes at `position` are not a valid batch: a torn tail or corruption."""

    position: int
    reason: str
    torn: bool  # True: the batch runs past the end of the bytes (a write that never finished)


def read_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """The header at `position`, unchecked."""
    fields = HEADER_STRUCT.unpack_from(buf, position)
    return BatchHeader(*fields[1:])


def head_length_at(buf: bytes | bytearray | memoryview, position: int = 0) -> int:
    """The head length the (unchecked) header at `position` announces."""
    return read_header(buf, position).head_length


def check_head(buf: bytes | bytearray | memoryview, position: int, end: int,
               expected_seq: int | None = None) -> BatchHead | BatchProblem:
    """Validate the head of the batch at `position` in `buf[:end]` (`buf` must hold its head: up
    to `end` or head_length bytes): header fields, head checksum, block table, topic table."""
    left = end - position
    if left < HEADER_SIZE:
        return BatchProblem(position, f"{left} bytes left, too few for a batch header", True)
    fields = HEADER_STRUCT.unpack_from(buf, position)
    if fields[0] != BATCH_MAGIC:
        return BatchProblem(position, f"no batch magic (found {fields[0]!r})", False)
    header = BatchHeader(*fields[1:])
    total = header.batch_length
    if total != header.head_length + header.annotation_length + header.body_length or total > MAX_BATCH_BYTES:
        return BatchProblem(position, f"batch length {total} does not add up", False)
    if total > left:
        return BatchProblem(position, f"batch of {total} bytes runs past the end ({end})", True)
    head_end = position + header.head_length
    if len(buf) < head_end:
        return BatchProblem(position, f"only {len(buf) - position} bytes of a {header.head_length}-byte head", False)
    if zlib.crc32(memoryview(buf)[position + CRC_START : head_end]) != header.head_crc:
        return BatchProblem(position, "checksum mismatch", False)
    if header.version not in READ_VERSIONS:
        return BatchProblem(position, f"unknown batch version {header.version}", False)
    if header.codec != CODEC_LZ4:
        return BatchProblem(position, f"unknown codec {header.codec}", False)
    if header.record_count < 1 or header.block_count < 1 or header.min_timestamp > header.max_timestamp:
        return BatchProblem(position, "impossible record count, block count or time range", False)
    if expected_seq is not None and header.base_seq != expected_seq:
        return BatchProblem(position, f"base sequence {header.base_seq} where {expected_seq} was expected", False)
    table_start = position + HEADER_SIZE
    table = bytes(buf[table_start : table_start + BLOCK_ENTRY_STRUCT.size * header.block_count])
    # struct, not numpy: a reader checks every batch's head when it first walks a segment
    records, lengths, raw_lengths, _ = zip(*BLOCK_ENTRY_STRUCT.iter_unpack(table))
    if min(records) < 1 or sum(records) != header.record_count or sum(lengths) != header.body_length or (
        sum(raw_lengths) != header.raw_length or min(raw_lengths) < BLOCK_HEADER_SIZE
    ):
        return BatchProblem(position, "block table does not match the header", False)
    topics = _parse_topics(buf, table_start + len(table), head_end)
    if topics is None:
        return BatchProblem(position, "malformed topic table", False)
    return BatchHead(header, table, topics)


def _parse_topics(buf, start: int, end: int) -> tuple[bytes, ...] | None:
    if end - start < TOPIC_COUNT_STRUCT.size:
        return None
    (count,) = TOPIC_COUNT_STRUCT.unpack_from(buf, start)
    at, topics = start + TOPIC_COUNT_STRUCT.size, []
    for _ in range(count):
        if at + TOPIC_LENGTH_STRUCT.size > end:
            return None
        (length,) = TOPIC_LENGTH_STRUCT.unpack_from(buf, at)
        at += TOPIC_LENGTH_STRUCT.size
        if at + length > end:
            return None
        topics.append(bytes(buf[at : at + length]))
        at += length
    return tuple(topics) if at == end and topics else None


def check_batch(buf: bytes | bytearray | memoryview, position: int, end: int,
                expected_seq: int | None = None) -> BatchHead | BatchProblem:
    """Validate the whole batch at `position` in `buf[:end]`: its head (``check_head``) and the
    checksums of its annotation and of every block."""
    head = check_head(buf, position, end, expected_seq)
    if isinstance(head, BatchProblem):
        return head
    header = head.header
    view = memoryview(buf)
    at = position + header.head_length
    if zlib.crc32(view[at : at + header.annotation_length]) != header.annotation_crc:
        return BatchProblem(position, "checksum mismatch", False)
    at += header.annotation_length
    for _, length, _, crc in BLOCK_ENTRY_STRUCT.iter_unpack(head.table):
        if zlib.crc32(view[at : at + length]) != crc:
            return BatchProblem(position, "checksum mismatch", False)
        at += length
    return head


def checked_batch(data: bytes, end: int, name: object, origin: int, expected_seq: int | None = None) -> BatchHead:
    """``check_batch`` of a batch copied from byte `origin` of file `name` into `data`; a problem
    is a CorruptFileError naming the file and the batch's position in it."""
    checked = check_batch(data, 0, end, expected_seq)
    if isinstance(checked, BatchProblem):
        raise CorruptFileError(f"{name}: invalid batch at byte {origin}: {checked.reason}")
    return checked


def rebased_batch(data: bytes | memoryview, base_seq: int) -> bytes:
    """The batch `data` (checked by its reader) with its first record at `base_seq`: only the
    header's base_seq and the head checksum change, the blocks are copied as they are (their
    records' seqs are the base plus their place). Object-store compaction merges chunks so."""
    header = read_header(data)
    if not 0 <= base_seq <= INT64_MAX - header.record_count:
        raise InvalidAppendError(f"a batch of {header.record_count} records cannot start at seq {base_seq}")
    head = bytearray(data[: header.head_length])
    struct.pack_into("<q", head, HEADER_DTYPE.fields["base_seq"][1], base_seq)
    struct.pack_into("<I", head, HEADER_DTYPE.fields["head_crc"][1], zlib.crc32(memoryview(head)[CRC_START:]))
    return bytes(head) + bytes(data[header.head_length :])


def annotation_of(data: bytes, head: BatchHead) -> bytes:
    """The annotation of a checked batch held whole in `data`."""
    start = head.header.head_length
    return bytes(data[start : start + head.header.annotation_length])


# ---- encoding ----------------------------------------------------------------------------------
def encode_batch(base_seq: int, columns: LogColumns, annotation: bytes = b"",
                 block_records: int = DEFAULT_BLOCK_RECORDS, version: int = BATCH_VERSION) -> bytes:
    """The bytes of one batch holding all of `columns` from `base_seq` on, in blocks of at most
    `block_records` records; `version` 2 writes blocks without their stored form, 3 with their
    ends as steps only (what stores written before version 3 or 4 hold: the tests read them)."""
    if version not in READ_VERSIONS:
        raise ValueError(f"batch version {version}: writers write one of {READ_VERSIONS}")
    n = len(columns)
    if n < 1:
        raise InvalidAppendError("a batch holds at least one record")
    if len(annotation) > MAX_ANNOTATION_BYTES:
        raise InvalidAppendError(f"annotation of {len(annotation)} bytes; at most {MAX_ANNOTATION_BYTES} allowed")
    if -(-n // block_records) > MAX_BLOCKS:
        raise InvalidAppendError(f"a batch of {n} records would need more than {MAX_BLOCKS} blocks")
    record = _RecordColumns.of(columns)
    timestamps = columns.ints["timestamp_ms"]
    blocks, entries = [], []
    for start in range(0, n, block_records):
        stored = record.block(start, min(start + block_records, n), version)
        compressed = LZ4_WRITER.compress(stored, asbytes=True)
        blocks.append(compressed)
        entries.append(BLOCK_ENTRY_STRUCT.pack(min(block_records, n - start), len(compressed), len(stored),
                                               zlib.crc32(compressed)))
    topics = b"".join([TOPIC_COUNT_STRUCT.pack(len(record.topics))]
                      + [TOPIC_LENGTH_STRUCT.pack(len(t)) + t for t in record.topics])
    body_length = sum(map(len, blocks))
    raw_length = sum(BLOCK_ENTRY_STRUCT.unpack(e)[2] for e in entries)
    head_length = HEADER_SIZE + BLOCK_ENTRY_STRUCT.size * len(entries) + len(topics)
    total = head_length + len(annotation) + body_length
    if total > MAX_BATCH_BYTES or raw_length > 0xFFFF_FFFF:
        raise InvalidAppendError(f"a batch of {n} records would be {total} bytes; split the append")
    rest = HEADER_STRUCT.pack(BATCH_MAGIC, 0, total, version, CODEC_LZ4, len(entries), base_seq, n,
                              len(annotation), int(timestamps.min()), int(timestamps.max()), body_length,
                              raw_length, zlib.crc32(annotation), len(topics))[CRC_START:]
    table = b"".join(entries)
    crc = zlib.crc32(topics, zlib.crc32(table, zlib.crc32(rest)))
    return b"".join((BATCH_MAGIC, struct.pack("<I", crc), rest, table, topics, annotation, *blocks))


@dataclass(frozen=True)
class _RecordColumns:
    """A batch's records as the per-record columns and texts of the block layout."""

    per_record: dict[str, np.ndarray]  # COLUMNS -> int64 values
    text_starts: np.ndarray  # int64, records + 1: the texts of record i are [text_starts[i], text_starts[i + 1])
    text_offsets: np.ndarray  # int64, texts + 1: byte range of each text in `heap`
    heap: memoryview
    topics: tuple[bytes, ...]

    @classmethod
    def of(cls, c: LogColumns) -> _RecordColumns:
        n = len(c)
        key = c.key.cast(TEXT)
        first_item = int(c.list_offsets[0])
        items = c.items.slice(first_item, int(c.list_offsets[-1]) - first_item).cast(TEXT)
        starts = (c.list_offsets[:-1] - first_item).astype(np.int64)
        counts = (c.list_offsets[1:] - c.list_offsets[:-1]).astype(np.int64)
        has_key = key.is_valid().to_numpy(zero_copy_only=False)
        lead = np.zeros(n, dtype=bool)
        candidates = has_key & (counts > 0)
        if candidates.any():
            first_items = items.take(pa.array(np.where(candidates, starts, 0)))
            lead = candidates & pc.equal(first_items, key).fill_null(False).to_numpy(zero_copy_only=False)
        rest = counts - lead
        text_counts = has_key + rest
        text_starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(text_counts, out=text_starts[1:])
        # Texts in heap order as positions in concat(key, items): a key is key[i], rest keys follow.
        take = np.empty(int(text_starts[-1]), dtype=np.int64)
        take[text_starts[:-1][has_key]] = np.flatnonzero(has_key)
        owner, within = ranges_owner(rest)
        take[text_starts[owner] + has_key[owner] + within] = n + starts[owner] + lead[owner] + within
        texts = pa.concat_arrays([key.fill_null(b""), items]).take(pa.array(take))
        text_offsets = np.frombuffer(texts.buffers()[1], np.int64, len(texts) + 1, texts.offset * 8)
        data = texts.buffers()[2]
        heap = memoryview(data if data is not None else b"").cast("B")
        topic = c.topic.cast(TEXT).dictionary_encode()
        per_record = {
            "flags": has_key * FLAG_KEY + lead * FLAG_LEAD,
            "topic": topic.indices.to_numpy(zero_copy_only=False),
            "partition": c.ints["partition"],
            "offset": c.ints["offset"],
            "timestamp": c.ints["timestamp_ms"],
            "commit_log_offset": c.ints["commit_log_offset"],
            "size": c.ints["size"],
            "text_end": text_starts[1:],
        }
        return cls(per_record, text_starts, text_offsets, heap, tuple(topic.dictionary.to_pylist()))

    def block(self, start: int, stop: int, version: int = BATCH_VERSION) -> bytes:
        """The uncompressed bytes of the block of records [start, stop), in the stored form batch
        `version` writes (module docstring; version 2: the read form)."""
        first_text, end_text = int(self.text_starts[start]), int(self.text_starts[stop])
        offsets = self.text_offsets[first_text : end_text + 1]
        heap = self.heap[int(offsets[0]) : int(offsets[-1])]
        per_record = {name: self.per_record[name][start:stop] for name in COLUMNS}
        per_record["text_end"] = per_record["text_end"] - first_text  # ends within the block
        narrowed = [_narrow(values) for values in [*per_record.values(), offsets[1:] - offsets[0]]]
        widths, bases, deltas = [w for w, _, _ in narrowed], [b for _, b, _ in narrowed], [d for _, _, d in narrowed]
        form, span = 0, 0
        if version >= 3:
            form |= ENDS_AS_STEPS
            for section in (TEXT_END, BYTE_END):
                if widths[section]:
                    deltas[section] = np.diff(deltas[section], prepend=deltas[section].dtype.type(0))  # wrapping
        if version >= 4:
            records = stop - start
            topic, partition = (deltas[s] if widths[s] else np.zeros(records, np.uint8) for s in (TOPIC, PARTITION))
            if widths[OFFSET] and widths[TOPIC] <= 4 and widths[PARTITION] <= 4:
                form |= OFFSETS_AS_STEPS
                deltas[OFFSET] = _offset_steps(deltas[OFFSET], _sources(topic, partition))
            if widths[TOPIC] == widths[PARTITION] == 1:
                span = int(partition.max()) + 1
                if (int(topic.max()) + 1) * span <= 256:
                    form |= SOURCE_IN_TOPIC
                    deltas[TOPIC] = (topic.astype(np.uint16) * span + partition).astype(np.uint8)
                    deltas[PARTITION] = np.zeros_like(partition)
        header = bytearray(BLOCK_HEADER_STRUCT.pack(stop - start, end_text - first_text, len(heap), *widths, *bases))
        header[STORED_FORM_AT] = form
        if form & SOURCE_IN_TOPIC:
            header[PARTITION_SPAN_AT] = span - 1
        return b"".join((header, *(_planes(d) if w else b"" for w, d in zip(widths, deltas)), heap))


def _sources(topic: np.ndarray, partition: np.ndarray) -> np.ndarray:
    """Each record's source, (topic delta, partition delta) as one uint64 (both < 2^32: widths <= 4)."""
    return topic.astype(np.uint64) << np.uint64(32) | partition.astype(np.uint64)


def _source_runs(sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, first): the records in order of source, stably (each source's records in block
    order), and whether each of them, in that order, is its source's first."""
    order = np.argsort(sources, kind="stable")
    ordered = sources[order]
    return order, run_starts(ordered)


def _offset_steps(deltas: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """OFFSETS_AS_STEPS (module docstring): each delta less the one before it of its source,
    wrapping in the deltas' width; a source's first as is."""
    order, first = _source_runs(sources)
    ordered = deltas[order]
    steps = ordered.copy()
    steps[1:] -= ordered[:-1]  # (unsigned: wraps in the width)
    steps[first] = ordered[first]
    out = np.empty_like(deltas)
    out[order] = steps
    return out


def _offset_sums(steps: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """The deltas _offset_steps took `steps` from: each source's running sum, in the width."""
    order, first = _source_runs(sources)
    ordered = steps[order]
    sums = np.cumsum(ordered, dtype=steps.dtype)  # wraps in the width
    run_start = np.maximum.accumulate(np.where(first, np.arange(len(first)), 0))
    before = sums[run_start] - ordered[run_start]  # the sum of the runs before this one's
    out = np.empty_like(steps)
    out[order] = sums - before
    return out


def _narrow(values: np.ndarray) -> tuple[int, int, np.ndarray]:
    """(width, base, values - base) in the narrowest unsigned width that holds the deltas (0: every
    value is the base; the deltas are then empty)."""
    values = values.astype(np.int64, copy=False)
    if not len(values):
        return 0, 0, values[:0]
    base, top = int(values.min()), int(values.max())
    if top == base:
        return 0, base, values[:0]
    delta = values - np.int64(base)  # wraps for a range wider than int64: see the module docstring
    for width in (1, 2, 4, 8):
        if width == 8 or top - base <= (1 << (8 * width)) - 1:
            return width, base, delta.astype(_UNSIGNED[width])
    raise AssertionError("unreachable")


def _planes(values: np.ndarray) -> bytes:
    """`values` (a fixed-width integer array) as byte planes: byte i of every value, then byte i + 1."""
    return values.view(np.uint8).reshape(-1, values.itemsize).T.tobytes()


def read_form(raw: bytes) -> bytes | None:
    """A block as decompressed, in the layout readers read: itself unless its header gives a
    stored form (module docstring), else its rewrites undone; None when its header gives a form
    there is none of, or widths and counts its length does not hold, or widths a rewrite does not
    take. The oracle of ``restore_block`` in ``_blocks.c``."""
    if len(raw) < BLOCK_HEADER_SIZE or not any(raw[STORED_FORM_AT : STORED_FORM_AT + 3]):
        return raw
    form, span_less_one = raw[STORED_FORM_AT], raw[PARTITION_SPAN_AT]
    if (not form or form & ~STORED_FORMS or raw[STORED_FORM_AT + 2]
            or (span_less_one and not form & SOURCE_IN_TOPIC)):
        return None
    fields = BLOCK_HEADER_STRUCT.unpack_from(raw, 0)
    records, texts, heap_bytes, widths = fields[0], fields[1], fields[2], fields[3 : 3 + len(SECTIONS)]
    if any(w not in (0, 1, 2, 4, 8) for w in widths):
        return None
    if (form & SOURCE_IN_TOPIC and not widths[TOPIC] == widths[PARTITION] == 1) or (
            form & OFFSETS_AS_STEPS and max(widths[TOPIC], widths[PARTITION]) > 4):
        return None
    starts = np.cumsum([BLOCK_HEADER_SIZE] + [w * (texts if s == BYTE_END else records) for s, w in enumerate(widths)])
    if int(starts[-1]) + heap_bytes != len(raw):
        return None
    block = bytearray(raw)
    block[STORED_FORM_AT : STORED_FORM_AT + 2] = bytes(2)

    def section(s: int) -> np.ndarray:  # a view of section s's byte planes, (width, count)
        count = texts if s == BYTE_END else records
        return np.frombuffer(block, np.uint8, count * widths[s], int(starts[s])).reshape(widths[s], count)

    def values(s: int) -> np.ndarray:
        return np.ascontiguousarray(section(s).T).view(_UNSIGNED[widths[s]]).reshape(-1)

    if form & SOURCE_IN_TOPIC and records:
        combined = section(TOPIC)[0].astype(np.uint16)  # (a span of 256 is no uint8)
        section(TOPIC)[0] = combined // (span_less_one + 1)
        section(PARTITION)[0] = combined % (span_less_one + 1)
    if form & OFFSETS_AS_STEPS and records and widths[OFFSET]:
        topic, partition = (values(s) if widths[s] else np.zeros(records, np.uint8) for s in (TOPIC, PARTITION))
        sums = _offset_sums(values(OFFSET), _sources(topic, partition))
        section(OFFSET)[:] = sums.view(np.uint8).reshape(records, widths[OFFSET]).T
    if form & ENDS_AS_STEPS:
        for s in (TEXT_END, BYTE_END):
            if widths[s] and (texts if s == BYTE_END else records):
                sums = np.cumsum(values(s), dtype=_UNSIGNED[widths[s]])  # wraps in the width
                section(s)[:] = sums.view(np.uint8).reshape(-1, widths[s]).T
    return bytes(block)


def _ranges(firsts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The concatenation of range(first, first + count) for each pair."""
    owner, within = ranges_owner(counts)
    return firsts[owner] + within


# ---- decoding ----------------------------------------------------------------------------------
def decompress_block(compressed: memoryview, raw_length: int, crc: int, name: object, origin: int) -> bytes:
    """A block's `compressed` bytes (of the batch at byte `origin` of file `name`), checksum
    verified, decompressed."""
    return decompress_blocks(compressed, [0], [len(compressed)], [raw_length], [crc], name, [origin])[0]


def decompress_blocks(data: memoryview, starts: Iterable[int], lengths: Iterable[int], raw_lengths: Iterable[int],
                      crcs: Iterable[int], name: object, origins: Iterable[int]) -> list[bytes]:
    """The blocks at `starts` of `data` (each of the batch at byte `origin` of file `name`),
    checksum verified, decompressed: in Python, one loop for all (a Python call per block was a
    fifth of the cost of reading thousands), as ``bytes`` (Arrow's codec returns them in half the
    time of a ``pa.Buffer``). The oracle of the compiled path of ``decompress_all``."""
    raws = []
    checksum, decompress = zlib.crc32, LZ4.decompress
    for start, length, raw_length, crc, origin in zip(starts, lengths, raw_lengths, crcs, origins):
        compressed = data[start : start + length]
        if checksum(compressed) != crc:
            raise CorruptFileError(f"{name}: invalid batch at byte {origin}: checksum mismatch")
        try:
            raw = read_form(decompress(compressed, raw_length, asbytes=True))
        except (pa.ArrowException, OSError, ValueError) as e:
            raise CorruptFileError(f"{name}: invalid batch at byte {origin}: a block does not decode ({e})") from None
        if raw is None:
            raise CorruptFileError(f"{name}: invalid batch at byte {origin}: a block does not decode (its stored form)")
        raws.append(raw)
    return raws


class CompressedBlocks(NamedTuple):
    """Blocks read from a file: `data` holds them (and maybe gaps between them) and, one value a
    block (int64 arrays), where each lies in it, its compressed and raw lengths, its checksum and
    its batch's position (for errors)."""

    data: memoryview | np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    raw_lengths: np.ndarray
    crcs: np.ndarray
    origins: np.ndarray


def decompress_all(blocks: CompressedBlocks, name: object) -> bytes | np.ndarray:
    """The `blocks` (of file `name`), each checksum verified, decompressed back to back into one
    buffer. Compiled where it was built (``_blocks.c``): one call per thread for all blocks, no
    GIL held, so a large read is split between two threads; else ``decompress_blocks``, its oracle."""
    if compiled_blocks is None:
        raws = decompress_blocks(memoryview(blocks.data), blocks.starts.tolist(), blocks.lengths.tolist(),
                                 blocks.raw_lengths.tolist(), blocks.crcs.tolist(), name, blocks.origins.tolist())
        return raws[0] if len(raws) == 1 else b"".join(raws)
    arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in (blocks.starts, blocks.lengths, blocks.raw_lengths,
                                                                 blocks.crcs)]
    raw_lengths = arrays[2]
    total = int(raw_lengths.sum())
    arrays.append(np.cumsum(raw_lengths) - raw_lengths)  # where each goes
    # a fresh numpy array, not bytes: numpy asks for huge pages, and a page fault costs ~4 us here
    out = np.empty(total, dtype=np.uint8)
    count = len(raw_lengths)
    pieces = [(0, count)]
    if count > 1 and total >= PARALLEL_DECOMPRESS_BYTES and CPUS > 1:
        pieces = [(0, count // 2), (count // 2, count)]

    def decompress(piece: tuple[int, int]) -> tuple[int, int] | None:
        first, stop = piece
        starts, lengths, raws, crcs, at = (a[first:stop] for a in arrays)
        return compiled_blocks.decompress_blocks(blocks.data, starts, lengths, raws, crcs, out, at)

    others = [_decompress_pool().submit(decompress, piece) for piece in pieces[1:]]
    problems = [decompress(pieces[0]), *(other.result() for other in others)]
    for (first, _), problem in zip(pieces, problems):
        if problem is not None:
            block, reason = problem
            why = "checksum mismatch" if reason == _BAD_CHECKSUM else "a block does not decode"
            raise CorruptFileError(f"{name}: invalid batch at byte {int(blocks.origins[first + block])}: {why}")
    return out


# The compiled path splits a read between two threads from this many raw bytes (~120 blocks): a
# thread hand-off costs ~50 us, a block ~5 us.
PARALLEL_DECOMPRESS_BYTES = 1 << 20
CPUS = os.cpu_count() or 1
_BAD_CHECKSUM = 1  # _blocks.c's reasons; 2: a block does not decode
# Not the log's reading pool (metadata_log): its tasks call decompress_all and wait for this pool's,
# which on the same full pool would wait forever.
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _decompress_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=CPUS - 1, thread_name_prefix="msgindex-decompress")
        return _pool


@dataclass(frozen=True)
class DecodedRows:
    """Records as columns (texts as encode_text bytes), ready to be filtered, verified and
    rendered without Python code per record."""

    seqs: np.ndarray  # int64
    topics: tuple[bytes, ...]  # the distinct topics
    topic_ids: np.ndarray  # int64: each record's topic, as a position in `topics`
    partition: np.ndarray  # int32
    offset: np.ndarray  # int64
    timestamp_ms: np.ndarray  # int64
    key: pa.Array  # large_binary, null where the message has no key
    keys: pa.LargeListArray  # large_list<large_binary>
    commit_log_offset: np.ndarray  # int64
    size: np.ndarray  # int32

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def topic(self) -> pa.Array:
        """Each record's topic (large_binary)."""
        return pa.array(self.topics, TEXT).take(pa.array(self.topic_ids))

    def take(self, rows: np.ndarray) -> DecodedRows:
        picked = pa.array(rows)
        return DecodedRows(self.seqs[rows], self.topics, self.topic_ids[rows], self.partition[rows], self.offset[rows],
                           self.timestamp_ms[rows], self.key.take(picked), self.keys.take(picked),
                           self.commit_log_offset[rows], self.size[rows])


def empty_rows() -> DecodedRows:
    ints = np.zeros(0, np.int64)
    return DecodedRows(ints, (), ints, np.zeros(0, np.int32), ints, ints, pa.array([], TEXT), pa.array([], ITEMS),
                       ints, np.zeros(0, np.int32))


def unified_topics(parts: Sequence[DecodedRows | PackedRecords]) -> tuple[tuple[bytes, ...], np.ndarray]:
    """One table of the topics of `parts` (each numbering its own: the first part's in its order,
    then each topic the others add) and every part's records' topic numbers in it, one after
    another."""
    numbers: dict[bytes, int] = {}
    topic_ids = []
    for part in parts:
        renumbered = np.array([numbers.setdefault(topic, len(numbers)) for topic in part.topics], dtype=np.int64)
        topic_ids.append(renumbered[part.topic_ids] if len(part.topic_ids) else np.zeros(0, np.int64))
    return tuple(numbers), np.concatenate(topic_ids) if topic_ids else np.zeros(0, np.int64)


def concat_rows(parts: Sequence[DecodedRows]) -> DecodedRows:
    """The records of `parts`, in that order, as one DecodedRows (topic numbers unified)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return empty_rows()
    if len(parts) == 1:
        return parts[0]
    topics, topic_ids = unified_topics(parts)

    def joined(name: str) -> np.ndarray:
        return np.concatenate([getattr(part, name) for part in parts])

    return DecodedRows(joined("seqs"), topics, topic_ids, joined("partition"), joined("offset"),
                       joined("timestamp_ms"), pa.concat_arrays([p.key for p in parts]),
                       pa.concat_arrays([p.keys for p in parts]), joined("commit_log_offset"), joined("size"))


class BlockSet:
    """Decompressed blocks (of any batches of one file) read together: records are addressed
    as (block, row in the block) pairs, and each column is read for any of them with a few numpy
    operations whatever the number of blocks: the blocks' headers are read as one numpy array,
    and the records' fields are gathered from the blocks' bytes laid end to end.

    `data` holds the blocks' raw bytes back to back, `lengths` each one's length, `base_seqs`
    their first seqs, `records` their record counts (from the block table, checked against each
    block's header), `table_of_block` which of `topic_tables` (the batches' topic tables, each
    once) each block's batch has; `name` is the file and `positions` each block's batch
    position in it, for errors. (Nothing here is per block in Python: a read of many keys
    decodes thousands of blocks.)"""

    def __init__(self, data: bytes | np.ndarray, lengths: np.ndarray, base_seqs: np.ndarray, records: np.ndarray,
                 topic_tables: Sequence[tuple[bytes, ...]], table_of_block: np.ndarray, name: object,
                 positions: np.ndarray) -> None:
        self._name, self._positions = name, positions
        lengths = np.asarray(lengths, dtype=np.int64)
        self._data = data
        self._bytes = np.frombuffer(data, dtype=np.uint8)
        starts = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        head = self._bytes[starts[:, None] + np.arange(BLOCK_HEADER_SIZE)].reshape(-1).view(BLOCK_HEADER_DTYPE)
        self.count = np.asarray(head["records"], dtype=np.int64)
        self.texts = np.asarray(head["texts"], dtype=np.int64)
        self.heap_bytes = np.asarray(head["heap_bytes"], dtype=np.int64)
        self._widths = {name: np.asarray(head[f"{name}_width"], dtype=np.int64) for name in SECTIONS}
        self._bases = {name: np.asarray(head[f"{name}_base"], dtype=np.int64) for name in SECTIONS}
        self._offsets = {}
        at = starts + BLOCK_HEADER_SIZE
        for name in SECTIONS:
            self._offsets[name] = at
            at = at + self._widths[name] * (self.texts if name == "byte_end" else self.count)
        self._heap = at
        widths = np.stack(list(self._widths.values()))
        bad = ((widths & (widths - 1)) != 0).any(axis=0) | (widths > 8).any(axis=0)  # 0, 1, 2, 4 or 8
        bad |= (self.count != records) | (at + self.heap_bytes != starts + lengths)
        if bad.any():
            self._corrupt(int(np.argmax(bad)), "a block does not match its layout")
        self.base_seqs = np.asarray(base_seqs, dtype=np.int64)
        # every table's topics numbered in one flat map: block b's topic i is
        # _topic_map[_topic_map_start[b] + i]
        self._topics, table_starts, self._topic_map = numbered_topics(topic_tables)
        table_of_block = np.asarray(table_of_block, dtype=np.int64)
        self._topic_map_start = table_starts[table_of_block]
        self._topic_count = np.array([len(table) for table in topic_tables], dtype=np.int64)[table_of_block]
        self._present_widths: dict[str, list[int]] = {}

    def _corrupt(self, block: int, reason: str) -> None:
        raise CorruptFileError(f"{self._name}: invalid batch at byte {int(self._positions[block])}: {reason}")

    def column(self, name: str, block: np.ndarray, index: np.ndarray) -> np.ndarray:
        """Values (int64) of column `name` at (block, index in the block: a row, or a text for
        "byte_end")."""
        present = self._present_widths.get(name)
        if present is None:
            widths = self._widths[name]
            same = len(widths) and (widths == widths[0]).all()
            present = self._present_widths[name] = [int(widths[0])] if same else np.unique(widths).tolist()
        values = self._bases[name][block]
        if present == [0]:
            return values
        positions = self._offsets[name][block] + index
        planes = (self.texts if name == "byte_end" else self.count)[block]
        if len(present) == 1:
            values += self._deltas(positions, planes, present[0])
            return values
        widths = self._widths[name][block]
        for width in present:
            if width:
                picked = widths == width
                values[picked] += self._deltas(positions[picked], planes[picked], width)
        return values

    def _deltas(self, positions: np.ndarray, planes: np.ndarray, width: int) -> np.ndarray:
        """The unsigned `width`-byte deltas at `positions` of byte planes `planes` apart, in the
        unsigned type of that width (8-byte ones as int64: they wrap, as stored, so adding the
        int64 base restores the value). Planes are combined from the most significant one down,
        in the narrow type: a quarter of the memory traffic of combining in int64."""
        if width == 1:
            return self._bytes[positions]
        unsigned = np.dtype(f"<u{width}")
        top = positions + (width - 1) * planes
        deltas = self._bytes[top].astype(unsigned)
        for _ in range(width - 1):
            top -= planes
            deltas <<= 8
            deltas |= self._bytes[top]
        return deltas.view(np.int64) if width == 8 else deltas

    def _end_before(self, name: str, block: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The `name` end of the row/text before each index (0 for the first): where it starts."""
        first = index == 0
        before = self.column(name, block, np.where(first, 0, index - 1))
        before[first] = 0
        return before

    def topic_ids(self, block: np.ndarray, row: np.ndarray) -> np.ndarray:
        """Each record's topic as a position in ``topics``."""
        codes = self.column("topic", block, row)
        bad = (codes < 0) | (codes >= self._topic_count[block])
        if bad.any():
            self._corrupt(int(block[np.argmax(bad)]), "a record names a topic the batch does not have")
        return self._topic_map[self._topic_map_start[block] + codes]

    @property
    def topics(self) -> tuple[bytes, ...]:
        return tuple(self._topics)

    def all_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(block, row in the block) of every row of the set, in order."""
        return ranges_owner(self.count)

    def _texts(self, block: np.ndarray, first: np.ndarray, count: np.ndarray, order: np.ndarray) -> pa.Array:
        """The texts [first, first + count) of each (block, first, count) (sorted, as the rows
        they belong to), as one large_binary array, ranges in `order` (positions in them). A
        record's texts are contiguous in its block's heap, so the bytes of all ranges are copied
        by one Arrow take, in `order`, from a zero-copy array over the blocks' bytes."""
        if not len(order):
            return pa.array([], TEXT)
        owner, within = ranges_owner(count)
        text_block, text = block[owner], first[owner] + within
        end = self.column("byte_end", text_block, text)
        start = self._end_before("byte_end", block, first)  # where each range's first text starts
        range_end = start.copy()  # where each range's last text ends
        has_texts = count > 0
        text_of_range = np.cumsum(count) - count
        range_end[has_texts] = end[text_of_range[has_texts] + count[has_texts] - 1]
        text_start = np.empty(len(text), dtype=np.int64)
        text_start[1:] = end[:-1]
        text_start[text_of_range[has_texts]] = start[has_texts]  # the first of each range
        bad = (start < 0) | (start > range_end) | (range_end > self.heap_bytes[block])
        bad_texts = text_start > end
        if bad.any() or bad_texts.any():
            culprit = block[np.argmax(bad)] if bad.any() else text_block[np.argmax(bad_texts)]
            self._corrupt(int(culprit), "a text lies outside its block's heap")
        # the ranges as the even elements of an array over the blocks' bytes, the gaps between them odd
        bounds = np.empty(2 * len(block), dtype=np.int64)
        heap = self._heap[block]
        bounds[0::2] = heap + start
        bounds[1::2] = heap + range_end
        spans = pa.Array.from_buffers(TEXT, len(bounds) - 1, [None, pa.py_buffer(bounds), pa.py_buffer(self._data)])
        data = spans.take(pa.array(2 * order)).buffers()[2]
        lengths = end - text_start
        if len(text) != len(count) or (count != 1).any():  # some records have several texts, or none
            lengths = lengths[_ranges(text_of_range[order], count[order])]
        else:
            lengths = lengths[order]
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return pa.Array.from_buffers(TEXT, len(lengths), [None, pa.py_buffer(offsets), data])

    def select(self, block: np.ndarray, row: np.ndarray) -> Selection:
        """The records at (block, row in the block), sorted (see ``Selection``)."""
        return Selection(self, block, row)


class Selection:
    """Records of a BlockSet at sorted (block, row) positions: their integer fields decoded up
    front (a few numpy gathers), their texts only for the records a caller then picks, copied
    straight into the order it wants (``rows``). A caller filters and orders on the integers
    first and pays for texts only once, for what it keeps."""

    def __init__(self, blocks: BlockSet, block: np.ndarray, row: np.ndarray) -> None:
        self._blocks, self._block, self._row = blocks, block, row
        self.seqs = blocks.base_seqs[block] + row
        self.topics = blocks.topics
        self.topic_ids = blocks.topic_ids(block, row) if len(block) else np.zeros(0, np.int64)
        self.partition = blocks.column("partition", block, row).astype(np.int32)
        self.offset = blocks.column("offset", block, row)
        self.timestamp_ms = blocks.column("timestamp", block, row)
        self.commit_log_offset = blocks.column("commit_log_offset", block, row)
        self.size = blocks.column("size", block, row).astype(np.int32)

    def __len__(self) -> int:
        return len(self.seqs)

    def rows(self, kept: np.ndarray | None = None, order: np.ndarray | None = None) -> DecodedRows:
        """The records `kept` (sorted distinct positions in the selection; default: all), in
        `order` (positions in `kept`; default: as they are)."""
        kept, order = _kept_in_order(len(self.seqs), kept, order)
        if not len(order):
            return empty_rows()
        picked = kept[order]
        blocks, block, row = self._blocks, self._block[kept], self._row[kept]
        flags = blocks.column("flags", block, row)
        end = blocks.column("text_end", block, row)
        first = blocks._end_before("text_end", block, row)
        has_key = (flags & FLAG_KEY) > 0
        lead = (flags & FLAG_LEAD) > 0
        rest_first = first + has_key  # the keys stored after the key text
        bad = (flags > FLAG_KEY | FLAG_LEAD) | (lead & ~has_key) | (first < 0) | (end < rest_first)
        bad |= end > blocks.texts[block]
        if bad.any():
            blocks._corrupt(int(block[np.argmax(bad)]), "a record's texts do not match its block")
        # every text of the records at once, in answer order; the keys list and the key are cut from them
        texts = blocks._texts(block, first, end - first, order)
        key, keys = _key_and_keys(texts, has_key[order], lead[order], (end - first)[order])
        return DecodedRows(
            self.seqs[picked], self.topics, self.topic_ids[picked], self.partition[picked], self.offset[picked],
            self.timestamp_ms[picked], key, keys, self.commit_log_offset[picked], self.size[picked],
        )


def numbered_topics(topic_tables: Sequence[tuple[bytes, ...]]) -> tuple[dict[bytes, int], np.ndarray, np.ndarray]:
    """Every topic of `topic_tables` numbered once, in order of appearance, and one flat map of
    all tables: table t's topic i is number ``topic_map[table_starts[t] + i]`` (tables alike share
    their numbers: a segment's thousand batches hold a few tables, numbered in ~0.3 ms, not 1)."""
    topics: dict[bytes, int] = {}
    flat: list[int] = []
    start_of: dict[tuple[bytes, ...], int] = {}
    starts = []
    for table in topic_tables:
        start = start_of.get(table)
        if start is None:
            start = start_of[table] = len(flat)
            flat.extend(topics.setdefault(topic, len(topics)) for topic in table)
        starts.append(start)
    return topics, np.array(starts, dtype=np.int64), np.array(flat, dtype=np.int64)


def _kept_in_order(count: int, kept: np.ndarray | None, order: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """A ``rows`` call's `kept` and `order` of `count` records, defaults filled in (every record,
    as they are)."""
    kept = np.arange(count) if kept is None else kept
    return kept, np.arange(len(kept)) if order is None else order


def _key_and_keys(texts: pa.Array, has_key: np.ndarray, lead: np.ndarray, count: np.ndarray) -> tuple[pa.Array,
                                                                                                     pa.LargeListArray]:
    """The key column and the keys lists of records whose texts are `texts` (large_binary, the
    records' texts back to back: `count` each), given their FLAG_KEY and FLAG_LEAD bits (checked
    by whoever decoded them: a FLAG_LEAD implies a key, and a key implies a text)."""
    text_of_record = np.zeros(len(count) + 1, dtype=np.int64)
    np.cumsum(count, out=text_of_record[1:])
    skip = has_key & ~lead  # a key that is not also the first of the keys
    list_offsets = np.zeros(len(count) + 1, dtype=np.int64)
    np.cumsum(count - skip, out=list_offsets[1:])
    values = texts.take(pa.array(_ranges(text_of_record[:-1] + skip, count - skip))) if skip.any() else texts
    return (texts.take(pa.array(text_of_record[:-1], mask=~has_key)),
            pa.LargeListArray.from_arrays(pa.array(list_offsets), values, type=ITEMS))


class BlockRecords:
    """One decompressed block read a record at a time with struct and int arithmetic: what a
    lookup of a few records pays, without the per-call cost of the numpy and Arrow kernels
    BlockSet amortizes over many. Same layout (module docstring), exact texts."""

    def __init__(self, raw, topics: tuple[bytes, ...], name: object, origin: int) -> None:
        self._raw, self._topics = memoryview(raw).cast("B"), topics
        self._name, self._origin = name, origin
        fields = BLOCK_HEADER_STRUCT.unpack_from(self._raw, 0)
        self.count, texts, heap_bytes = fields[:3]
        widths, bases = fields[3 : 3 + len(SECTIONS)], fields[3 + len(SECTIONS) :]
        # per section: (width, first byte, planes' stride, base, signed)
        self._sections, at = [], BLOCK_HEADER_SIZE
        for section, (width, base) in enumerate(zip(widths, bases)):
            planes = texts if section == len(COLUMNS) else self.count
            self._sections.append((width, at, planes, base, width == 8))
            at += width * planes
        self._heap = at
        if at + heap_bytes != len(self._raw) or any(w not in (0, 1, 2, 4, 8) for w in widths):
            self._corrupt("a block does not match its layout")
        self._texts, self._heap_bytes = texts, heap_bytes

    def _corrupt(self, reason: str) -> None:
        raise CorruptFileError(f"{self._name}: invalid batch at byte {self._origin}: {reason}")

    def _value(self, section: int, index: int) -> int:
        width, first, planes, base, signed = self._sections[section]
        if not width:
            return base
        at = first + index
        delta = self._raw[at] if width == 1 else int.from_bytes(self._raw[at : at + width * planes : planes], "little",
                                                                signed=signed)
        value = base + delta
        return value if -(1 << 63) <= value < (1 << 63) else (value + (1 << 63)) % (1 << 64) - (1 << 63)  # int64 wraps

    def raw_record(self, row: int) -> tuple[tuple[int, ...], list[bytes]]:
        """The record at `row` of the block, every check made: its RECORD_INT_FIELDS columns
        (COLUMNS order but text_end) and its texts' bytes (``messages`` makes it a MessageRecord)."""
        if not 0 <= row < self.count:  # (the directory's count for the block says otherwise)
            self._corrupt("a block does not match its layout")
        value, text_end, byte_end = self._value, len(COLUMNS) - 1, len(COLUMNS)
        flags, topic = value(0, row), value(1, row)
        first, end = value(text_end, row - 1) if row else 0, value(text_end, row)
        has_key = flags & FLAG_KEY
        if not 0 <= flags <= FLAG_KEY | FLAG_LEAD or (flags & FLAG_LEAD and not has_key) or first < 0 \
                or first + has_key > end or end > self._texts or not 0 <= topic < len(self._topics):
            self._corrupt("a record does not match its block")
        texts, start = [], value(byte_end, first - 1) if first else 0
        for text in range(first, end):
            stop = value(byte_end, text)
            if not 0 <= start <= stop <= self._heap_bytes:
                self._corrupt("a text lies outside its block's heap")
            texts.append(bytes(self._raw[self._heap + start : self._heap + stop]))
            start = stop
        return (flags, topic, *(value(column, row) for column in range(2, RECORD_INT_FIELDS))), texts


class BlockLocations(NamedTuple):
    """Blocks of one file, one value each (in file order): where each is, its compressed and raw
    lengths, its checksum, its batch's position (for errors) and its batch's topic table."""

    positions: np.ndarray
    lengths: np.ndarray
    raw_lengths: np.ndarray
    crcs: np.ndarray
    origins: np.ndarray
    topic_tables: list[tuple[bytes, ...]]
    batches: np.ndarray | None = None  # each block's batch in its segment's directory (a log file's reads)
    topic_counts: np.ndarray | None = None  # len() of each block's topic table, int64 (None: taken from them)


class RawRecords(NamedTuple):
    """Records as the point readers decode them, before they become MessageRecords (``messages``):
    each one's RECORD_INT_FIELDS columns, its texts and its batch's topic table. `texts_are_keys`:
    the texts are str, each a key as given (the records' heap was ASCII: no field term is, and
    ASCII bytes are their own encode_text), else the stored bytes, keys and field terms;
    `backslash`: some text holds a backslash (results show it escaped, ``arrow_text``)."""

    ints: list[tuple[int, ...]] | list[list[int]]
    texts: list[list[str]] | list[list[bytes]]
    topic_tables: list[tuple[bytes, ...]]
    texts_are_keys: bool
    backslash: bool

    def messages(self) -> list[MessageRecord]:
        return messages(self.ints, self.texts, self.topic_tables, decoded=self.texts_are_keys)

    @staticmethod
    def concat(parts: Sequence[RawRecords]) -> RawRecords:
        """Records of `parts` (from several segments) in that order."""
        if len(parts) == 1:
            return parts[0]
        as_keys = all(part.texts_are_keys for part in parts)
        texts: list = []
        for part in parts:  # (a part of str keys among bytes ones: back to their ASCII bytes)
            texts += part.texts if as_keys or not part.texts_are_keys else \
                [[text.encode("ascii") for text in record] for record in part.texts]
        return RawRecords([ints for part in parts for ints in part.ints], texts,
                          [table for part in parts for table in part.topic_tables], as_keys,
                          any(part.backslash for part in parts))


def read_records(fd: int, name: object, blocks: BlockLocations, firsts: np.ndarray, rows: np.ndarray,
                 check_read: Callable[[int, int, int], None]) -> list[MessageRecord]:
    """The records `rows[firsts[b] : firsts[b + 1]]` (sorted rows in block b) of each of `blocks`
    of the open file `fd` (named `name` in errors), each block read once, checked and
    decompressed: ``read_raw_records`` as MessageRecords."""
    return read_raw_records(fd, name, blocks, firsts, rows, check_read).messages()


def expect_scattered_reads(records: int) -> None:
    """Says that a read of up to `records` scattered records comes next (a point read that has just
    found its candidates): where that is enough blocks for ``read_records`` to share them, its
    helper threads are woken now, so that their wake-up (30-100 us on a VM) overlaps the caller's
    work up to the read (``_blocks.c``, "How helpers wait")."""
    if compiled_blocks is not None and records >= compiled_blocks.PARALLEL_MIN_BLOCKS:
        compiled_blocks.wake_helpers()


def read_raw_records(fd: int, name: object, blocks: BlockLocations, firsts: np.ndarray, rows: np.ndarray,
                     check_read: Callable[[int, int, int], None]) -> RawRecords:
    """``read_records``' records before they are MessageRecords: in C where it was built
    (``_blocks.read_records``: one call, no GIL, ~5-8 us a scattered record, the blocks of a
    read of many shared with helper threads on the process's other CPUs; then
    ``_blocks.record_texts``), else ``python_read_records``, its oracle (~20 us). A short read
    goes to `check_read(read, wanted, position)`, which raises."""
    if compiled_blocks is None:
        return python_read_records(fd, name, blocks, firsts, rows, check_read)
    ints, text_counts, heap, text_lengths = _compiled_read(fd, name, blocks, firsts, rows, check_read)
    texts, ascii_heap, backslash = compiled_blocks.record_texts(heap, text_lengths, text_counts)
    return RawRecords(ints.tolist(), texts, _per_record(blocks, firsts), ascii_heap, backslash)


def _compiled_read(fd: int, name: object, blocks: BlockLocations, firsts: np.ndarray, rows: np.ndarray,
                   check_read: Callable[[int, int, int], None]) -> tuple[np.ndarray, np.ndarray, bytes, np.ndarray]:
    """``_blocks.read_records``'s one call (see ``read_records``): each record's RECORD_INT_FIELDS
    columns (int64, records x fields), its text count, and its texts' bytes back to back (the
    heap) with their lengths. The call has checked every record against its block (flags, topic
    number, text bounds): what is returned is well-formed."""
    ints = np.empty((len(rows), RECORD_INT_FIELDS), dtype=np.int64)
    text_counts = np.empty(len(rows), dtype=np.int64)
    problem, heap, text_lengths = compiled_blocks.read_records(
        fd, *(np.ascontiguousarray(column, dtype=np.int64) for column in blocks[:4]),
        np.array([len(table) for table in blocks.topic_tables], dtype=np.int64) if blocks.topic_counts is None
        else blocks.topic_counts,
        np.ascontiguousarray(firsts, dtype=np.int64), np.ascontiguousarray(rows, dtype=np.int64), ints, text_counts)
    if problem is not None:
        block, reason, read = problem
        if reason == _SHORT_READ:
            check_read(read, int(blocks.lengths[block]), int(blocks.positions[block]))
        raise CorruptFileError(f"{name}: invalid batch at byte {int(blocks.origins[block])}: {_RECORD_PROBLEMS[reason]}")
    lengths = np.frombuffer(text_lengths, dtype=np.int64)
    return ints, text_counts, heap, lengths if lengths.flags.aligned else lengths.copy()


def read_record_columns(fd: int, name: object, blocks: BlockLocations, firsts: np.ndarray, rows: np.ndarray,
                        seqs: np.ndarray, check_read: Callable[[int, int, int], None],
                        numbering: tuple[tuple[bytes, ...], np.ndarray, np.ndarray] | None = None) -> RecordColumns:
    """``read_records``'s records (at `seqs`) as columns: one compiled call, then a few numpy and
    Arrow kernels over all of them, none per record (`numbering`: as ``read_packed_records``').
    Needs the compiled reader."""
    packed = read_packed_records(fd, name, blocks, firsts, rows, check_read, numbering)
    return RecordColumns(np.asarray(seqs, dtype=np.int64), packed.topics, packed.topic_ids, packed.ints,
                         packed.text_counts, packed.heap, packed.text_lengths)


class PackedRecords(NamedTuple):
    """Records as the compiled reader gives them (``read_packed_records``), before anything per
    record is a Python object: each one's RECORD_INT_FIELDS columns (int64, records x fields, its
    batch's topic number among them), its text count, its texts back to back in `heap` with each
    one's length, and its topic as a number among `topics` (every topic of the records' batches,
    once). What ``_result_rows.plain_rows`` renders a lookup's rows from; ``raw`` cuts them into
    RawRecords for the Python paths."""

    ints: np.ndarray
    text_counts: np.ndarray
    heap: bytes
    text_lengths: np.ndarray
    topics: tuple[bytes, ...]
    topic_ids: np.ndarray

    @staticmethod
    def concat(parts: Sequence[PackedRecords]) -> PackedRecords:
        """`parts`' records one after another, numbered in one table of topics (``unified_topics``)."""
        if len(parts) == 1:
            return parts[0]
        topics, topic_ids = unified_topics(parts)
        return PackedRecords(np.concatenate([part.ints for part in parts]),
                             np.concatenate([part.text_counts for part in parts]),
                             b"".join(part.heap for part in parts),
                             np.concatenate([part.text_lengths for part in parts]), topics, topic_ids)

    def raw(self) -> RawRecords:
        """These records as ``read_raw_records`` gives them, each one's topic numbered in
        `topics` (one table for all of them) instead of its batch's table."""
        texts, ascii_heap, backslash = compiled_blocks.record_texts(self.heap, self.text_lengths, self.text_counts)
        ints = self.ints.copy()
        ints[:, _INT_AT["topic"]] = self.topic_ids
        return RawRecords(ints.tolist(), texts, [self.topics] * len(ints), ascii_heap, backslash)


def read_packed_records(fd: int, name: object, blocks: BlockLocations, firsts: np.ndarray, rows: np.ndarray,
                        check_read: Callable[[int, int, int], None],
                        numbering: tuple[tuple[bytes, ...], np.ndarray, np.ndarray] | None = None) -> PackedRecords:
    """``read_records``' records as the compiled reader gives them (PackedRecords): one call.
    `numbering`: the topics of every batch of the blocks' segment, numbered once
    (``BatchDirectory.topic_numbering``, with `blocks.batches`), else numbered here. Needs the
    compiled reader."""
    ints, text_counts, heap, text_lengths = _compiled_read(fd, name, blocks, firsts, rows, check_read)
    tables = blocks.topic_tables
    if all(table == tables[0] for table in tables):  # (every batch read saw the same topics in one order)
        return PackedRecords(ints, text_counts, heap, text_lengths, tables[0] if tables else (),
                             np.ascontiguousarray(ints[:, _INT_AT["topic"]]))
    if numbering is not None and blocks.batches is not None:
        topics, table_starts, topic_map = numbering
        block_table_start = table_starts[blocks.batches]
    else:
        numbers: dict[tuple[bytes, ...], int] = {}  # batches repeat the same topic tables
        table_of_block = np.array([numbers.setdefault(table, len(numbers)) for table in tables], np.int64)
        numbered, table_starts, topic_map = numbered_topics(list(numbers))
        topics, block_table_start = tuple(numbered), table_starts[table_of_block]
    topic_ids = topic_map[np.repeat(block_table_start, np.diff(firsts)) + ints[:, _INT_AT["topic"]]]
    return PackedRecords(ints, text_counts, heap, text_lengths, topics, topic_ids)


class RecordColumns:
    """Records read by the compiled reader (``read_record_columns``), as columns: what a
    ``Selection`` offers (the integers up front, texts for the records a caller picks, in its
    order), for a hundred to tens of thousands of scattered records, where building a BlockSet
    over their whole blocks costs more than the records, and Python per record (``messages``)
    more than a few kernels over all of them."""

    def __init__(self, seqs: np.ndarray, topics: tuple[bytes, ...], topic_ids: np.ndarray, ints: np.ndarray,
                 text_counts: np.ndarray, heap: bytes, text_lengths: np.ndarray) -> None:
        self.seqs, self.topics, self.topic_ids = seqs, topics, topic_ids
        self._flags = ints[:, _INT_AT["flags"]]
        self.partition = ints[:, _INT_AT["partition"]].astype(np.int32)
        self.offset = np.ascontiguousarray(ints[:, _INT_AT["offset"]])
        self.timestamp_ms = np.ascontiguousarray(ints[:, _INT_AT["timestamp"]])
        self.commit_log_offset = np.ascontiguousarray(ints[:, _INT_AT["commit_log_offset"]])
        self.size = ints[:, _INT_AT["size"]].astype(np.int32)
        self._text_counts = text_counts
        self._first_text = np.cumsum(text_counts) - text_counts
        offsets = np.zeros(len(text_lengths) + 1, dtype=np.int64)
        np.cumsum(text_lengths, out=offsets[1:])
        self._texts = pa.Array.from_buffers(TEXT, len(text_lengths), [None, pa.py_buffer(offsets), pa.py_buffer(heap)])

    def __len__(self) -> int:
        return len(self.seqs)

    def rows(self, kept: np.ndarray | None = None, order: np.ndarray | None = None) -> DecodedRows:
        """As ``Selection.rows``."""
        kept, order = _kept_in_order(len(self.seqs), kept, order)
        if not len(order):
            return empty_rows()
        picked = kept[order]
        count = self._text_counts[picked]
        texts = self._texts.take(pa.array(_ranges(self._first_text[picked], count)))
        flags = self._flags[picked]
        key, keys = _key_and_keys(texts, (flags & FLAG_KEY) > 0, (flags & FLAG_LEAD) > 0, count)
        return DecodedRows(self.seqs[picked], self.topics, self.topic_ids[picked], self.partition[picked],
                           self.offset[picked], self.timestamp_ms[picked], key, keys, self.commit_log_offset[picked],
                           self.size[picked])


# What a log's ``chunks`` hands its work: records with their integers decoded, texts on demand.
SelectedRecords = Selection | RecordColumns


def _per_record(blocks: BlockLocations, firsts: np.ndarray) -> list[tuple[bytes, ...]]:
    """Each record's batch topic table (the records of block b: [firsts[b], firsts[b + 1]))."""
    return [table for table, count in zip(blocks.topic_tables, np.diff(firsts).tolist()) for _ in range(count)]


def python_read_records(fd: int, name: object, blocks: BlockLocations, firsts: np.ndarray, rows: np.ndarray,
                        check_read: Callable[[int, int, int], None]) -> RawRecords:
    """``read_raw_records`` block by block in Python (``BlockRecords``): its oracle."""
    found: list[tuple[tuple[int, ...], list[bytes]]] = []
    rows, firsts = rows.tolist(), firsts.tolist()
    for b, (position, length, raw_length, crc, origin) in enumerate(zip(*(column.tolist() for column in blocks[:5]))):
        data = os.pread(fd, length, position)
        check_read(len(data), length, position)
        reader = BlockRecords(decompress_block(memoryview(data), raw_length, crc, name, origin), blocks.topic_tables[b],
                              name, origin)
        found += [reader.raw_record(row) for row in rows[firsts[b] : firsts[b + 1]]]
    return raw_records([list(fields) for fields, _ in found], [texts for _, texts in found],
                       _per_record(blocks, firsts))


def raw_records(ints: list[tuple[int, ...]] | list[list[int]], texts: list[list[bytes]],
                topic_tables: list[tuple[bytes, ...]]) -> RawRecords:
    """RawRecords of records decoded in Python (``BlockRecords.raw_record``), as the compiled
    reader gives them (``_blocks.record_texts``: str texts where every one is ASCII)."""
    ascii_heap = all(text.isascii() for record in texts for text in record)
    backslash = any(b"\\" in text for record in texts for text in record)
    if ascii_heap:
        texts = [[text.decode("ascii") for text in record] for record in texts]
    return RawRecords(ints, texts, topic_tables, ascii_heap, backslash)


# What _blocks.read_records returns a record with (every column but text_end, in COLUMNS order),
# and the reasons it gives for a damaged block, as BlockRecords words them.
RECORD_INT_FIELDS = len(COLUMNS) - 1
_INT_AT = {name: at for at, name in enumerate(COLUMNS[:RECORD_INT_FIELDS])}
_SHORT_READ = 3
_RECORD_PROBLEMS = {
    1: "checksum mismatch",
    2: "a block does not decode",
    4: "a block does not match its layout",
    5: "a record does not match its block",
    6: "a text lies outside its block's heap",
}


def messages(ints: list[tuple[int, ...]], texts: list[list[bytes]] | list[list[str]],
             topic_tables: list[tuple[bytes, ...]], *, decoded: bool = False) -> list[MessageRecord]:
    """MessageRecords of decoded records: each one's RECORD_INT_FIELDS columns, texts' bytes and
    batch topic table (a text no writer stores, bytes that are not encode_text's, fails here).
    `decoded`: the texts are keys already (str: no field term among them)."""
    # each record's topic decoded once per (table, number): not the whole table, and never hashed,
    # which a batch of thousands of topics made cost ~1 ms a record (an attack run)
    topics: dict[tuple[int, int], str] = {}
    found = []
    no_fields: tuple[tuple[str, str], ...] = ()
    for (flags, topic, partition, offset, timestamp, commit_log_offset, size), raw, table in zip(ints, texts,
                                                                                                   topic_tables):
        name = topics.get((id(table), topic))  # (the tables outlive the loop: ids stay theirs)
        if name is None:
            name = topics[(id(table), topic)] = decode_text(table[topic])
        if decoded:
            decoded_keys, fields = tuple(raw), no_fields
        else:
            decoded_keys, fields = split_terms(raw)
        has_key = flags & FLAG_KEY
        found.append(MessageRecord(name, partition, offset, timestamp, decoded_keys[0] if has_key else None,
                                   decoded_keys if flags & FLAG_LEAD else decoded_keys[has_key:], commit_log_offset,
                                   size, fields))
    return found


# ---- rendering ---------------------------------------------------------------------------------
def _string_array(array: pa.Array) -> pa.Array:
    """encode_text bytes as Arrow strings, shown as ``arrow_text`` shows them: texts that are not
    valid UTF-8 (lone surrogates) or hold an escape look-alike (a backslash, x, two hex digits) go
    through ``arrow_text`` one by one, the rest stay zero-copy."""
    try:
        shown = array.cast(pa.string())
    except pa.ArrowInvalid:
        shown = None
    if shown is not None and not (_holds_backslash(array) and pc.any(pc.match_substring(shown, "\\x")).as_py()):
        return shown
    return pa.array([None if raw is None else arrow_text(decode_text(raw)) for raw in array.to_pylist()],
                    pa.string())


def _holds_backslash(array: pa.Array) -> bool:
    """Whether any byte of the binary array's data is a backslash (a few ms per 10 MB: most
    stores hold none, and then no text needs looking at)."""
    data = array.buffers()[2]
    return data is not None and bool((np.frombuffer(data, np.uint8) == 0x5C).any())


def shown_keys(keys: pa.LargeListArray) -> tuple[np.ndarray, pa.Array]:
    """(list offsets from 0, items) of the stored terms lists `keys` without their field terms:
    the ``keys`` column shows keys only (a record's fields are found by a field lookup)."""
    offsets = keys.offsets.to_numpy()
    values = keys.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    offsets = offsets - offsets[0]
    data = values.buffers()[2]
    # a field term starts with 0xFF, a byte no key's UTF-8 holds: most stores hold none at all
    if data is None or not (np.frombuffer(data, np.uint8) == FIELD_TERM_MARKER[0]).any():
        return offsets, values
    is_term = pc.equal(pc.binary_slice(values, 0, 1), pa.scalar(FIELD_TERM_MARKER, values.type))
    kept = ~is_term.to_numpy(zero_copy_only=False)
    if kept.all():
        return offsets, values
    parents = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
    counts = np.bincount(parents[kept], minlength=len(offsets) - 1)
    new_offsets = np.zeros(len(offsets), dtype=np.int64)
    np.cumsum(counts, out=new_offsets[1:])
    return new_offsets, values.filter(pa.array(kept))


# A field's column (``field_columns``): a string for a field of shape "single", a list of strings
# for "array" (the item field as the ``keys`` column's).
FIELD_VALUE_TYPES = {SHAPE_SINGLE: pa.string(), SHAPE_ARRAY: ROW_SCHEMA.field("keys").type}


def field_schema(fields: Sequence[tuple[str, str, str]]) -> pa.Schema:
    """ROW_SCHEMA and the columns ``rows`` adds for `fields` ((column, name as stored, shape))."""
    return pa.schema([*ROW_SCHEMA, *(pa.field(column, FIELD_VALUE_TYPES[shape], nullable=True)
                                     for column, _, shape in fields)])


def field_columns(terms: pa.LargeListArray, fields: Sequence[tuple[str, str, str]]) -> list[pa.Array]:
    """Per (column, name as stored, shape) of `fields`, each record's values of that field from its
    stored terms `terms` (``message.field_term``), as rows show texts: a string (shape "single": at
    most one value a record, fields.py) or a list of strings in stored order ("array"); null where
    the record carries no value of it (none, or indexed before the field existed)."""
    count = len(terms)
    offsets = terms.offsets.to_numpy()
    values = terms.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    data = values.buffers()[2]
    if data is None or not (np.frombuffer(data, np.uint8) == FIELD_TERM_MARKER[0]).any():
        return [pa.nulls(count, FIELD_VALUE_TYPES[shape]) for _, _, shape in fields]
    parents = np.repeat(np.arange(count, dtype=np.int64), np.diff(offsets))
    columns = []
    for _, name, shape in fields:
        prefix = FIELD_TERM_MARKER + encode_text(name) + FIELD_NAME_END
        hit = pc.equal(pc.binary_slice(values, 0, len(prefix)), pa.scalar(prefix, values.type))
        hit = hit.to_numpy(zero_copy_only=False)
        # (binary_slice with only a start fails in Arrow 26 on some arrays: replace_slice does not)
        found = _string_array(pc.binary_replace_slice(values.filter(pa.array(hit)), 0, len(prefix), b""))
        owners = parents[hit]
        if shape == SHAPE_SINGLE:
            at = np.full(count, -1, dtype=np.int64)
            at[owners[::-1]] = np.arange(len(owners) - 1, -1, -1)  # (the first, were there several)
            columns.append(found.take(pa.array(at, mask=at < 0)))
            continue
        lengths = np.bincount(owners, minlength=count)
        list_offsets = np.zeros(count + 1, dtype=np.int32)
        np.cumsum(lengths, out=list_offsets[1:])
        columns.append(pa.ListArray.from_arrays(pa.array(list_offsets), found, type=FIELD_VALUE_TYPES[shape],
                                                mask=pa.array(lengths == 0)))
    return columns


def record_field_columns(records: Sequence[MessageRecord], fields: Sequence[tuple[str, str, str]]) -> list[pa.Array]:
    """``field_columns`` of `records`, one record at a time: what a lookup of a few records uses
    (``read_few``), and the oracle of the vectorized rendering."""
    columns = []
    for _, name, shape in fields:
        values = [[arrow_text(value) for named, value in record.fields if named == name] for record in records]
        if shape == SHAPE_SINGLE:
            columns.append(pa.array([found[0] if found else None for found in values], FIELD_VALUE_TYPES[shape]))
        else:
            columns.append(pa.array([found or None for found in values], FIELD_VALUE_TYPES[shape]))
    return columns


def rows(batch: DecodedRows, broker: str, take: np.ndarray | None = None,
         fields: Sequence[tuple[str, str, str]] = ()) -> pa.RecordBatch:
    """ROW_SCHEMA rows of `batch` (of its rows `take`, in that order, when given), and the columns
    of `fields` (``field_columns``) after them. Timestamps a store holds from before the timestamp
    rule show as the nearest bound (``shown_timestamps``)."""
    if take is not None:
        batch = batch.take(np.asarray(take, dtype=np.int64))
    if fields:
        plain = rows(batch, broker)
        return pa.RecordBatch.from_arrays([*plain.columns, *field_columns(batch.keys, fields)],
                                          schema=field_schema(fields))
    count = len(batch)
    if count == 0:
        return pa.RecordBatch.from_pylist([], schema=ROW_SCHEMA)
    offsets, values = shown_keys(batch.keys)
    keys_column = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), _string_array(values),
                                           type=ROW_SCHEMA.field("keys").type)
    topics = _string_array(pa.array(batch.topics, TEXT))
    columns = [
        pa.repeat(pa.scalar(arrow_text(broker), pa.string()), count),
        topics.take(pa.array(batch.topic_ids)),
        pa.array(batch.partition, pa.int32()),
        pa.array(batch.offset, pa.int64()),
        _string_array(batch.key),
        keys_column,
        pa.array(shown_timestamps(batch.timestamp_ms) * 1000, pa.int64()).cast(ROW_SCHEMA.field("timestamp").type),
        pa.array(batch.commit_log_offset, pa.int64(), mask=batch.commit_log_offset == NO_VALUE),
        pa.array(batch.size, pa.int32(), mask=batch.size == NO_VALUE),
        pa.array(batch.seqs, pa.int64()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ROW_SCHEMA)


def records(batch: DecodedRows, take: np.ndarray | None = None) -> list[MessageRecord]:
    """MessageRecords of `batch` (its rows `take` when given): exact texts, for tools and tests."""
    if take is not None:
        batch = batch.take(np.asarray(take, dtype=np.int64))
    topics = [decode_text(t) for t in batch.topics]
    keys = batch.key.to_pylist()
    key_lists = batch.keys.to_pylist()
    return [
        MessageRecord(topics[topic], partition, offset, timestamp, None if key is None else decode_text(key),
                      terms[0], commit_log_offset, size, terms[1])
        for topic, partition, offset, timestamp, key, terms, commit_log_offset, size in zip(
            batch.topic_ids.tolist(), batch.partition.tolist(), batch.offset.tolist(), batch.timestamp_ms.tolist(),
            keys, map(split_terms, key_lists), batch.commit_log_offset.tolist(), batch.size.tolist())
    ]
