"""Test oracle: a scalar, reference-faithful reader of the metadata log (format 2: batches of
versions 2, 3 and 4, the stored form of blocks included), written straight from ``batch_format``'s
layout table, one batch and one record at a time, plus Kafka's
LogSegment.append index rule applied batch by batch. The vectorized reader (batch directory,
searchsorted, Arrow kernels) and the writer's index files must agree with it exactly.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pyarrow as pa

from msgindex.storage.message import MessageRecord

HEADER = struct.Struct("<4sIIBBHqiIqqIIII")
BLOCK_ENTRY = struct.Struct("<IIII")
BLOCK_HEADER = struct.Struct("<III9B3B9q")  # ..., widths, stored form, partition span - 1, a spare byte, bases
ENDS_AS_STEPS, SOURCE_IN_TOPIC, OFFSETS_AS_STEPS = 1, 2, 4
COLUMNS = ("flags", "topic", "partition", "offset", "timestamp", "commit_log_offset", "size", "text_end")
OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")
NO_TIMESTAMP = -1


def wrap64(value: int) -> int:
    """Two's-complement int64 arithmetic: a delta stored as int64 may have wrapped."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogatepass")


def read_block(raw: bytes, topics: list[str]) -> list[MessageRecord]:
    """The records of one decompressed block, one field of one record at a time."""
    fields = BLOCK_HEADER.unpack_from(raw, 0)
    count, texts, heap_bytes = fields[:3]
    widths = dict(zip((*COLUMNS, "byte_end"), fields[3:12]))
    stored_form, span_less_one, spare = fields[12:15]
    bases = dict(zip((*COLUMNS, "byte_end"), fields[15:24]))
    assert stored_form & ~7 == 0 and spare == 0 and (span_less_one == 0 or stored_form & SOURCE_IN_TOPIC)
    ends_as_steps = bool(stored_form & ENDS_AS_STEPS)
    at = BLOCK_HEADER.size

    def deltas(name: str, n: int) -> list[int]:
        """A section's n stored deltas: `width` byte planes (plane i: byte i of every value, little endian)."""
        nonlocal at
        width = widths[name]
        out = [int.from_bytes(bytes(raw[at + plane * n + i] for plane in range(width)), "little") for i in range(n)]
        at += width * n
        return out

    def values(name: str, stored: list[int]) -> list[int]:
        width = widths[name]
        signed = [d - (1 << 64) if width == 8 and d >= 1 << 63 else d for d in stored]
        return [wrap64(bases[name] + d) for d in signed]

    def summed(name: str, steps: list[int]) -> list[int]:
        """Each delta its step from the one before (the stored form), mod 2^(8 width)."""
        out, delta = [], 0
        for step in steps:
            delta = (delta + step) % (1 << (8 * widths[name]))
            out.append(delta)
        return out

    stored = {name: deltas(name, count) for name in COLUMNS}
    if stored_form & SOURCE_IN_TOPIC:  # the topic's byte holds topic x span + partition
        assert widths["topic"] == widths["partition"] == 1
        span = span_less_one + 1
        stored["topic"], stored["partition"] = [c // span for c in stored["topic"]], [c % span for c in stored["topic"]]
    if stored_form & OFFSETS_AS_STEPS:  # each offset's step from the one before of its topic and partition
        assert widths["topic"] <= 4 and widths["partition"] <= 4
        last: dict[tuple[int, int], int] = {}
        for i, step in enumerate(stored["offset"]):
            source = (stored["topic"][i], stored["partition"][i])
            stored["offset"][i] = (last[source] + step) % (1 << (8 * widths["offset"])) if source in last else step
            last[source] = stored["offset"][i]
    if ends_as_steps:
        stored["text_end"] = summed("text_end", stored["text_end"])
    column = {name: values(name, stored[name]) for name in COLUMNS}
    byte_ends = values("byte_end", summed("byte_end", deltas("byte_end", texts)) if ends_as_steps
                       else deltas("byte_end", texts))
    heap = raw[at : at + heap_bytes]
    assert at + heap_bytes == len(raw)
    assert (byte_ends[-1] if texts else 0) == heap_bytes
    items = [text(heap[start:end]) for start, end in zip([0, *byte_ends], byte_ends)]
    records = []
    for i in range(count):
        flags, start, end = column["flags"][i], column["text_end"][i - 1] if i else 0, column["text_end"][i]
        key = items[start] if flags & 1 else None
        rest = tuple(items[start + (flags & 1) : end])
        records.append(MessageRecord(
            topics[column["topic"][i]], column["partition"][i], column["offset"][i], column["timestamp"][i], key,
            ((key,) + rest) if flags & 2 else rest, column["commit_log_offset"][i], column["size"][i],
        ))
    assert (column["text_end"][-1] if count else 0) == texts
    return records


def read_batches(data: bytes) -> list[dict]:
    """Every batch of a segment's bytes: header fields, annotation and records (MessageRecords)."""
    batches, position = [], 0
    while position < len(data):
        (magic, head_crc, length, version, codec, block_count, base_seq, count, annotation_length, low, high,
         body_length, raw_length, annotation_crc, topics_length) = HEADER.unpack_from(data, position)
        assert magic == b"MXB2" and version in (2, 3, 4) and codec == 1, position
        head_length = HEADER.size + BLOCK_ENTRY.size * block_count + topics_length
        assert length == head_length + annotation_length + body_length
        assert zlib.crc32(data[position + 8 : position + head_length]) == head_crc
        at = position + HEADER.size
        blocks = [BLOCK_ENTRY.unpack_from(data, at + BLOCK_ENTRY.size * i) for i in range(block_count)]
        at += BLOCK_ENTRY.size * block_count
        (topic_count,) = struct.unpack_from("<I", data, at)
        at += 4
        topics = []
        for _ in range(topic_count):
            (topic_length,) = struct.unpack_from("<H", data, at)
            topics.append(text(data[at + 2 : at + 2 + topic_length]))
            at += 2 + topic_length
        assert at == position + head_length
        annotation = data[at : at + annotation_length]
        assert zlib.crc32(annotation) == annotation_crc
        at += annotation_length
        records = []
        for block_records, block_length, block_raw_length, crc in blocks:
            compressed = data[at : at + block_length]
            assert zlib.crc32(compressed) == crc
            raw = pa.Codec("lz4_raw").decompress(compressed, block_raw_length, asbytes=True)
            assert raw[21] in (0, 1) if version == 3 else raw[21] == 0 if version == 2 else True  # forms by version
            block = read_block(raw, topics)
            assert len(block) == block_records
            records += block
            at += block_length
        assert at == position + length and sum(b[2] for b in blocks) == raw_length
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
