"""The chunk object: one append's (or one compaction's) records and their hash index, immutable.

An object-store shard is a list of chunks, each named by the shard version that lists it
(``versions.py``). One object holds both the records and their index, so an append is one PUT
of data plus one PUT of the version, and a lookup reads at most two dependent ranges of a chunk
(its hash items, then its log blocks) once its footer is cached.

Layout (little-endian, like the batch format)::

    batches     the records as metadata-log record batches (batch_format), sequence numbers
                relative to the chunk (its first record is 0): the shard version that lists the
                chunk gives its base, so a chunk is independent of the version it lands in
    hash items  hash_entries x 8 bytes, sorted by (key_hash, rel_seq): one per distinct index
                key of each record (RocketMQ's ``topic#key``), its RocketMQ index hash (>= 0)
                and the record's relative sequence number
    footer      FOOTER (64 bytes), then
                  batch positions   u64 x batches: where each batch starts in the object
                  batch heads       each batch's head (header, block table, topics), back to back,
                                    each covered by its own head checksum
                  fences            u32 x pages: the key_hash of the first item of each page of
                                    PAGE_ITEMS items
                  bloom filter      u64 x bloom_words over the distinct key hashes
                  page checksums    u32 x pages: zlib CRC-32 of each page of hash items
    trailer     TRAILER (16 bytes): footer_length u32, footer_crc u32 (zlib CRC-32 of the
                footer), magic b"MXC1", zero u32

FOOTER::

    offset size  field
    0      4     magic          b"MXF1"
    4      1     version        FORMAT_VERSION
    5      1     bloom_probes   bits set per key hash
    6      2     (zero)
    8      4     records        u32 >= 1
    12     4     batches        u32 >= 1
    16     4     hash_entries   u32
    20     4     pages          u32 = ceil(hash_entries / PAGE_ITEMS)
    24     4     bloom_words    u32
    28     4     heads_length   u32 bytes of the batch heads
    32     8     hash_offset    u64 where the hash items start (= the batches' end)
    40     8     min_timestamp  i64 ms, over the records
    48     8     max_timestamp  i64
    56     8     (zero)

Why this shape: RocketMQ's IndexFile is a chain walk, one dependent read per hop — on an object
store, one request per hop. RocketMQ 5's tiered store compacts an index file for upload into a
slot table and contiguous items (2 ranged reads per file, FACTS.md); a sorted run of items with a
small fence index does the same in one read once the fences are cached, and the bloom filter
(10 bits per distinct hash, ~1% false positives) lets a lookup skip the chunks that do not hold a
key at all: warm lookups cost a request per chunk that holds the key, not per chunk. The footer's
position and length are in the shard version too, so a reader fetches it with one ranged GET;
the trailer lets tools find it from the object alone.

Every byte is covered by a checksum: the batches by their own (head, annotation, blocks), the
footer by the trailer's (also recorded in the shard version, which is how readers check the
footer they fetch by range), each page of hash items by its page checksum in the footer, checked
whenever a reader reads the page. A damaged item therefore never becomes a silent miss.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from msgindex.errors import CorruptFileError, InvalidAppendError
from msgindex.storage.append_columns import AppendColumns
from msgindex.storage.checksum import crc32
from msgindex.storage.hash_index.java_hash import index_hashes
from msgindex.storage.log import batch_format as bf
from msgindex.storage.log.columns import LogColumns
from msgindex.storage.log.metadata_log import DEFAULT_BATCH_RECORDS
from msgindex.storage.log.segment import BatchDirectory

FORMAT_VERSION = 1
FOOTER_MAGIC = b"MXF1"
TRAILER_MAGIC = b"MXC1"
FOOTER_STRUCT = struct.Struct("<4sBBHIIIIIIQqq8x")
FOOTER_DTYPE = np.dtype([
    ("magic", "S4"), ("version", "u1"), ("bloom_probes", "u1"), ("pad", "<u2"), ("records", "<u4"),
    ("batches", "<u4"), ("hash_entries", "<u4"), ("pages", "<u4"), ("bloom_words", "<u4"), ("heads_length", "<u4"),
    ("hash_offset", "<u8"), ("min_timestamp", "<i8"), ("max_timestamp", "<i8"), ("pad2", "V8"),
])
FOOTER_SIZE = 64
assert FOOTER_STRUCT.size == FOOTER_DTYPE.itemsize == FOOTER_SIZE
TRAILER_STRUCT = struct.Struct("<II4sI")  # footer_length, footer_crc, magic, page-CRC table length
TRAILER_SIZE = 16
assert TRAILER_STRUCT.size == TRAILER_SIZE

HASH_ITEM_DTYPE = np.dtype([("key_hash", "<u4"), ("rel_seq", "<u4")])
HASH_ITEM_SIZE = 8
assert HASH_ITEM_DTYPE.itemsize == HASH_ITEM_SIZE
# Items per page: the unit a lookup reads (4 kB: one small ranged GET) and the fence index's
# step (4 bytes of footer per 512 items). Each page has a CRC in the footer (after the bloom
# filter), checked when the page is read.
PAGE_ITEMS = 512
PAGE_BYTES = PAGE_ITEMS * HASH_ITEM_SIZE
BLOOM_BITS_PER_KEY = 10
BLOOM_PROBES = 7
MAX_CHUNK_RECORDS = (1 << 32) - 1  # relative sequence numbers are u32
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class ChunkInfo:
    """What a shard version records of a chunk besides its name (``versions.ChunkRef``)."""

    records: int
    size: int
    footer_offset: int
    footer_length: int
    min_timestamp: int
    max_timestamp: int
    hash_entries: int
    footer_crc: int


@dataclass(frozen=True)
class EncodedChunk:
    """A chunk's bytes (as parts to write back to back) and its facts."""

    parts: tuple[bytes, ...]
    info: ChunkInfo

    def data(self) -> bytes:
        return b"".join(self.parts)


@dataclass(frozen=True)
class ChunkFooter:
    """A chunk's footer, checked: its batch directory (relative seqs, positions in the object),
    the fence index and bloom filter of its hash items, and their page checksums."""

    records: int
    min_timestamp: int
    max_timestamp: int
    hash_offset: int
    hash_entries: int
    directory: BatchDirectory
    fences: np.ndarray  # uint32 per page
    bloom: np.ndarray  # uint64 words
    bloom_probes: int
    page_crcs: np.ndarray  # uint32 per page

    @property
    def pages(self) -> int:
        return len(self.fences)

    def nbytes(self) -> int:
        """Memory held (for the readers' footer cache)."""
        d = self.directory
        arrays = (d.positions, d.base_seqs, d.block_base_seqs, d.block_positions, self.fences, self.bloom, self.page_crcs)
        return int(sum(a.nbytes for a in arrays) * 2 + 64 * len(d))

    def may_hold(self, key_hashes: np.ndarray) -> np.ndarray:
        """Per key hash: False when the chunk certainly holds no item of it (bloom filter)."""
        if not self.hash_entries:
            return np.zeros(len(key_hashes), dtype=bool)
        bits = bloom_bits(np.asarray(key_hashes, dtype=np.uint64), len(self.bloom) * 64, self.bloom_probes)
        words, shifts = bits >> np.uint64(6), bits & np.uint64(63)
        set_bits = (self.bloom[words.astype(np.int64)] >> shifts) & np.uint64(1)
        return set_bits.all(axis=1)

    def page_spans(self, key_hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[first, last] pages that may hold items of each of the sorted `key_hashes` (first >
        last: none), as two arrays (sorted by first page)."""
        firsts = np.maximum(np.searchsorted(self.fences, key_hashes, side="left") - 1, 0)
        lasts = np.searchsorted(self.fences, key_hashes, side="right") - 1
        return firsts, lasts

    def page_range(self, first: int, last: int) -> tuple[int, int]:
        """(position, length) in the object of pages [first, last]."""
        start = first * PAGE_ITEMS
        end = min((last + 1) * PAGE_ITEMS, self.hash_entries)
        return self.hash_offset + start * HASH_ITEM_SIZE, (end - start) * HASH_ITEM_SIZE

    def checked_items(self, data: memoryview, first_page: int, name: object) -> np.ndarray:
        """The items of the pages read into `data` from page `first_page` on, their page
        checksums verified (CorruptFileError naming the chunk)."""
        pages = -(-len(data) // PAGE_BYTES)
        for page in range(pages):
            piece = data[page * PAGE_BYTES : (page + 1) * PAGE_BYTES]
            if crc32(piece) != int(self.page_crcs[first_page + page]):
                raise CorruptFileError(f"{name}: hash items of page {first_page + page} fail their checksum "
                                       f"(the chunk object is damaged)")
        return np.frombuffer(data, HASH_ITEM_DTYPE)


def bloom_bits(key_hashes: np.ndarray, bits: int, probes: int) -> np.ndarray:
    """The bit positions (n x probes, uint64) of each key hash: double hashing of a 64-bit mix."""
    x = key_hashes.astype(np.uint64) * _GOLDEN
    x ^= x >> np.uint64(31)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(29)
    low, high = x & np.uint64(0xFFFFFFFF), (x >> np.uint64(32)) | np.uint64(1)
    steps = np.arange(probes, dtype=np.uint64)
    return (low[:, None] + steps[None, :] * high[:, None]) % np.uint64(bits)


def _bloom(distinct_hashes: np.ndarray) -> np.ndarray:
    words = max(1, -(-len(distinct_hashes) * BLOOM_BITS_PER_KEY // 64))
    bloom = np.zeros(words, dtype=np.uint64)
    if len(distinct_hashes):
        bits = bloom_bits(distinct_hashes, words * 64, BLOOM_PROBES).ravel()
        np.bitwise_or.at(bloom, (bits >> np.uint64(6)).astype(np.int64), np.uint64(1) << (bits & np.uint64(63)))
    return bloom


def hash_items(columns: LogColumns) -> np.ndarray:
    """The sorted hash items of a chunk's records (relative seqs from 0)."""
    keys, rel_seqs, _ = AppendColumns.from_log_columns(columns).index_entries(0)
    hashes = index_hashes(keys).astype(np.uint32) if len(rel_seqs) else np.zeros(0, np.uint32)
    return sorted_items(hashes, np.asarray(rel_seqs, dtype=np.uint32))


def sorted_items(hashes: np.ndarray, rel_seqs: np.ndarray) -> np.ndarray:
    """Hash items of (key hash, relative seq) pairs, in the order a chunk stores them."""
    order = np.lexsort((rel_seqs, hashes))
    items = np.empty(len(order), dtype=HASH_ITEM_DTYPE)
    items["key_hash"] = hashes[order]
    items["rel_seq"] = rel_seqs[order]
    return items


def encode_chunk(columns: LogColumns, *, batch_records: int = DEFAULT_BATCH_RECORDS,
                 block_records: int = bf.DEFAULT_BLOCK_RECORDS) -> EncodedChunk:
    """The chunk of `columns` (validated records, at least one)."""
    n = len(columns)
    if not 1 <= n <= MAX_CHUNK_RECORDS:
        raise InvalidAppendError(f"a chunk holds 1..{MAX_CHUNK_RECORDS} records, not {n}")
    batches = [bf.encode_batch(start, columns.slice(start, min(start + batch_records, n)), b"", block_records)
               for start in range(0, n, batch_records)]
    return _assemble(batches, hash_items(columns))


def merge_chunks(chunks: list[tuple[bytes | memoryview, ChunkFooter]]) -> EncodedChunk:
    """One chunk holding the records of `chunks` (whole objects with their footers, in seq
    order) back to back: batches copied with their base seqs moved (heads re-checksummed, blocks
    untouched), hash items merged."""
    batches, items, offset = [], [], 0
    for data, footer in chunks:
        directory = footer.directory
        for position, length, base in zip(directory.positions.tolist(), directory.lengths.tolist(),
                                           directory.base_seqs.tolist()):
            batches.append(bf.rebased_batch(data[position : position + length], base + offset))
        held = np.frombuffer(data, HASH_ITEM_DTYPE, footer.hash_entries, footer.hash_offset)
        items.append((held["key_hash"], held["rel_seq"].astype(np.int64) + offset))
        offset += footer.records
    if offset > MAX_CHUNK_RECORDS:
        raise InvalidAppendError(f"merged chunk of {offset} records is over {MAX_CHUNK_RECORDS}")
    hashes = np.concatenate([h for h, _ in items]) if items else np.zeros(0, np.uint32)
    seqs = np.concatenate([s for _, s in items]).astype(np.uint32) if items else np.zeros(0, np.uint32)
    return _assemble(batches, sorted_items(hashes, seqs))


def _assemble(batches: list[bytes], items: np.ndarray) -> EncodedChunk:
    positions, heads, at = [], [], 0
    min_ts = max_ts = None
    records = 0
    for data in batches:
        header = bf.read_header(data)
        positions.append(at)
        heads.append(bytes(data[: header.head_length]))
        at += len(data)
        records += header.record_count
        min_ts = header.min_timestamp if min_ts is None else min(min_ts, header.min_timestamp)
        max_ts = header.max_timestamp if max_ts is None else max(max_ts, header.max_timestamp)
    hash_offset = at
    item_bytes = items.tobytes()
    pages = -(-len(items) // PAGE_ITEMS)
    fences = items["key_hash"][::PAGE_ITEMS].astype("<u4")
    page_crcs = np.array([zlib.crc32(item_bytes[p * PAGE_BYTES : (p + 1) * PAGE_BYTES]) for p in range(pages)],
                         dtype="<u4")
    bloom = _bloom(np.unique(items["key_hash"]).astype(np.uint64)).astype("<u8")
    heads_bytes = b"".join(heads)
    header = FOOTER_STRUCT.pack(FOOTER_MAGIC, FORMAT_VERSION, BLOOM_PROBES, 0, records, len(batches), len(items),
                                pages, len(bloom), len(heads_bytes), hash_offset, min_ts, max_ts)
    footer = b"".join((header, np.array(positions, dtype="<u8").tobytes(), heads_bytes, fences.tobytes(),
                       bloom.tobytes(), page_crcs.tobytes()))
    trailer = TRAILER_STRUCT.pack(len(footer), zlib.crc32(footer), TRAILER_MAGIC, 0)
    footer_offset = hash_offset + len(item_bytes)
    info = ChunkInfo(records, footer_offset + len(footer) + TRAILER_SIZE, footer_offset, len(footer), min_ts, max_ts,
                     len(items), zlib.crc32(footer))
    return EncodedChunk((*batches, item_bytes, footer, trailer), info)


def decode_footer(data: bytes | memoryview, crc: int | None, name: object) -> ChunkFooter:
    """The checked footer whose bytes are `data` (`crc`: the trailer's footer checksum, when
    known; the shard version's footer length bounds it). CorruptFileError naming `name`."""
    view = memoryview(data)
    if len(view) < FOOTER_SIZE:
        raise CorruptFileError(f"{name}: chunk footer of {len(view)} bytes is too short")
    if crc is not None and zlib.crc32(view) != crc:
        raise CorruptFileError(f"{name}: chunk footer fails its checksum (the object is damaged)")
    (magic, version, probes, _, records, batches, entries, pages, bloom_words, heads_length, hash_offset,
     min_ts, max_ts) = FOOTER_STRUCT.unpack_from(view, 0)
    if magic != FOOTER_MAGIC or version != FORMAT_VERSION:
        raise CorruptFileError(f"{name}: not a msgindex chunk footer (magic {magic!r}, version {version})")
    expected = FOOTER_SIZE + 8 * batches + heads_length + 4 * pages + 8 * bloom_words + 4 * pages
    if len(view) != expected or pages != -(-entries // PAGE_ITEMS) or not records or not batches:
        raise CorruptFileError(f"{name}: chunk footer sizes do not add up")
    at = FOOTER_SIZE
    positions = np.frombuffer(view, "<u8", batches, at).astype(np.int64)
    at += 8 * batches
    heads_view = view[at : at + heads_length]
    at += heads_length
    heads, head_at, expected_seq = [], 0, 0
    for position in positions.tolist():
        if head_at + bf.HEADER_SIZE > heads_length:
            raise CorruptFileError(f"{name}: chunk footer's batch heads are truncated")
        header = bf.read_header(heads_view, head_at)
        head = bf.check_head(heads_view, head_at, head_at + header.batch_length, expected_seq)
        if isinstance(head, bf.BatchProblem):
            raise CorruptFileError(f"{name}: batch head at byte {position} in the chunk footer: {head.reason}")
        heads.append((position, head))
        head_at += header.head_length
        expected_seq = header.next_seq
    ends = [p + h.header.batch_length for p, h in heads]
    if head_at != heads_length or expected_seq != records or positions[0] != 0 or ends[-1] != hash_offset or any(
            a != b for a, b in zip(ends, positions[1:].tolist())):
        raise CorruptFileError(f"{name}: chunk footer's batches do not tile the object")
    fences = np.frombuffer(view, "<u4", pages, at).astype(np.uint32)
    at += 4 * pages
    bloom = np.frombuffer(view, "<u8", bloom_words, at).astype(np.uint64)
    at += 8 * bloom_words
    page_crcs = np.frombuffer(view, "<u4", pages, at).astype(np.int64)
    return ChunkFooter(records, min_ts, max_ts, hash_offset, entries, BatchDirectory.of(heads), fences, bloom, probes,
                       page_crcs)


def read_trailer(data: bytes | memoryview, name: object) -> tuple[int, int]:
    """(footer length, footer crc) from a chunk's last TRAILER_SIZE bytes."""
    if len(data) < TRAILER_SIZE:
        raise CorruptFileError(f"{name}: too short for a msgindex chunk")
    length, crc, magic, _ = TRAILER_STRUCT.unpack_from(data, len(data) - TRAILER_SIZE)
    if magic != TRAILER_MAGIC:
        raise CorruptFileError(f"{name}: not a msgindex chunk (no trailer magic)")
    return length, crc
