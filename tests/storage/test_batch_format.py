"""The metadata-log record batch (log format 2: batch versions 2, 3 and 4): round trips, the stored
form, the vectorized reader against the scalar oracle (``record_oracle``), the writer's sparse
indexes against Kafka's rule applied batch by batch, torn and corrupt bytes, bad input."""

from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgindex.errors import CorruptFileError, InvalidAppendError
from msgindex.storage.log import batch_format as bf
from msgindex.storage.log.columns import LogColumns, records_from_table
from msgindex.storage.log.metadata_log import MetadataLog
from msgindex.storage.message import APPEND_SCHEMA, ROW_SCHEMA, MessageRecord, arrow_text
from msgindex.storage.query import rows_from_records
from tests.storage.record_oracle import index_files, read_batches, read_log

any_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=12)  # lone surrogates too
utf8_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)  # what Arrow strings can hold


def record_strategy(texts):
    return st.builds(
        MessageRecord,
        topic=texts,
        partition=st.integers(-(2**31), 2**31 - 1),
        offset=st.integers(-(2**63), 2**63 - 1),
        timestamp_ms=st.integers(-(2**40), 2**45) | st.integers(-3, 3),
        key=st.none() | texts,
        keys=st.lists(texts, max_size=4).map(tuple) | texts.map(lambda k: (k, "x")),
        commit_log_offset=st.integers(-1, 2**62),
        size=st.integers(-1, 2**31 - 1),
    )


@st.composite
def sourced_records(draw, texts, min_size: int = 1, max_size: int = 40) -> list[MessageRecord]:
    """Records as a shard holds them: a few topics and partitions interleaved, each partition's
    offsets rising from a base of its own (partitions of different ages, near int64's ends too),
    mostly by 1: what the stored form's SOURCE_IN_TOPIC and OFFSETS_AS_STEPS rewrite."""
    topics = draw(st.lists(texts, min_size=2, max_size=5, unique=True))
    partitions = draw(st.sampled_from([st.integers(0, 7), st.integers(0, 7), st.integers(0, 300),
                                       st.integers(-(2**31), 2**31 - 1)]))
    sources = draw(st.lists(st.tuples(st.sampled_from(topics), partitions), min_size=1, max_size=12, unique=True))
    next_offset = {source: draw(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 10**6)) for source in sources}
    records = []
    for source in draw(st.lists(st.sampled_from(sources), min_size=min_size, max_size=max_size)):
        topic, partition = source
        offset = next_offset[source]
        next_offset[source] = max(-(2**63), min(offset + draw(st.sampled_from([1, 1, 1, 2, -5])), 2**63 - 1))
        key = draw(st.none() | texts)
        records.append(MessageRecord(topic, partition, offset, draw(st.integers(0, 2**41)), key,
                                     (key,) if key is not None else (), -1, -1))
    return records


def batches(texts, min_size: int = 1, max_size: int = 40):
    """Lists of records: any values (record_strategy), or as a shard holds them (sourced_records)."""
    return st.lists(record_strategy(texts), min_size=min_size, max_size=max_size) | sourced_records(
        texts, min_size, max_size)


def lead_keys(records: list[MessageRecord]) -> list[MessageRecord]:
    """Records whose keys start with their key, the usual shape (stored once)."""
    return [MessageRecord(r.topic, r.partition, r.offset, r.timestamp_ms, r.key,
                          ((r.key,) + r.keys) if r.key is not None else r.keys, r.commit_log_offset, r.size)
            for r in records]


def as_table(records: list[MessageRecord], chunks: int = 1) -> pa.Table:
    rows = [{"topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp_ms": r.timestamp_ms,
             "key": r.key, "keys": list(r.keys), "commit_log_offset": r.commit_log_offset, "size": r.size}
            for r in records]
    cut = len(rows) // max(chunks, 1)
    pieces = [rows[:cut], rows[cut:]] if chunks > 1 else [rows]
    return pa.concat_tables([pa.Table.from_pylist(p, schema=APPEND_SCHEMA) for p in pieces])


def expected_row(seq: int, record: MessageRecord, broker: str) -> dict:
    return {
        "broker": broker, "topic": arrow_text(record.topic), "partition": record.partition, "offset": record.offset,
        "key": None if record.key is None else arrow_text(record.key), "keys": [arrow_text(k) for k in record.keys],
        "timestamp_us": record.timestamp_ms * 1000,
        "commit_log_offset": None if record.commit_log_offset == -1 else record.commit_log_offset,
        "size": None if record.size == -1 else record.size, "seq": seq,
    }


def decompressed_all(data: bytes, starts: np.ndarray, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The blocks through ``decompress_all`` (compiled where built)."""
    raw_lengths = blocks["raw_length"].astype(np.int64)
    compressed = bf.CompressedBlocks(memoryview(data), starts, blocks["length"].astype(np.int64), raw_lengths,
                                     blocks["crc"].astype(np.int64), np.zeros(len(starts), np.int64))
    return np.frombuffer(bf.decompress_all(compressed, "mem"), np.uint8), raw_lengths


def decode(data: bytes) -> bf.DecodedRows:
    """Every record of one encoded batch, through the reader's own block decoding."""
    head = bf.checked_batch(data, len(data), "mem", 0).header
    blocks = bf.check_head(data, 0, len(data)).blocks
    starts = head.blocks_offset + np.concatenate(([0], np.cumsum(blocks["length"].astype(np.int64))[:-1]))
    raws = [bf.decompress_block(memoryview(data)[start : start + int(entry["length"])], int(entry["raw_length"]),
                                int(entry["crc"]), "mem", 0) for start, entry in zip(starts.tolist(), blocks)]
    out, raw_lengths = decompressed_all(data, starts, blocks)  # compiled where built
    assert out.tobytes() == b"".join(raws)
    counts = blocks["records"].astype(np.int64)
    block_set = bf.BlockSet(out, raw_lengths, head.base_seq + np.cumsum(counts) - counts, counts,
                            [bf.check_head(data, 0, len(data)).topics], np.zeros(len(raws), np.int64), "mem",
                            np.zeros(len(raws), np.int64))
    return block_set.select(*block_set.all_rows()).rows()


@settings(max_examples=150, deadline=None)
@given(batches(any_text, max_size=12), st.integers(0, 2**40), st.booleans())
def test_round_trip_against_the_oracle(batch, first_seq, lead):
    batch = lead_keys(batch) if lead else batch
    data = bf.encode_batch(first_seq, LogColumns.of(batch), annotation=b"note")
    (oracle,) = read_batches(data)  # the scalar reader
    assert oracle["records"] == batch and oracle["base_seq"] == first_seq and oracle["annotation"] == b"note"
    decoded = decode(data)
    assert bf.records(decoded) == batch
    rows = bf.rows(decoded, "broker-1")
    assert rows.schema.equals(ROW_SCHEMA, check_metadata=True)
    rows.validate(full=True)  # valid UTF-8 everywhere, even for surrogate-bearing keys
    rows = rows.set_column(6, "timestamp_us", rows.column("timestamp").cast(pa.int64())).to_pylist()
    assert rows == [expected_row(first_seq + i, r, "broker-1") for i, r in enumerate(batch)]
    take = np.array([len(batch) - 1, 0])
    assert bf.records(decoded, take) == [batch[-1], batch[0]]


@settings(max_examples=150, deadline=None)
@given(batches(any_text), st.integers(1, 8), st.sampled_from([3, 4]))
def test_the_stored_form_reads_as_the_version_2_block(batch, block_records, version):
    """Versions 3 and 4 write blocks in their stored form; once restored (Python and compiled)
    each is the block version 2 writes, byte for byte, and the older batches still read."""
    columns = LogColumns.of(batch)
    old, new = (bf.encode_batch(5, columns, block_records=block_records, version=v) for v in (2, version))
    assert bf.read_header(old).version == 2 and bf.read_header(new).version == version
    (_, old_raws, old_head), (_, new_raws, new_head) = _blocks_and_raws(old), _blocks_and_raws(new)
    assert new_raws == old_raws
    assert (old_head.blocks["raw_length"] == new_head.blocks["raw_length"]).all()
    assert decompressed_all(new, *_blocks_of(new))[0].tobytes() == b"".join(old_raws)  # compiled where built
    assert bf.records(decode(old)) == bf.records(decode(new)) == batch
    assert [r["records"] for r in read_batches(old)] == [r["records"] for r in read_batches(new)] == [batch]


def test_the_stored_form_takes_fewer_bytes():
    """What the stored form is for: on keys drawn Zipf-like, one per record, a tenth fewer bytes."""
    rng = np.random.default_rng(3)
    keys = [f"acct:{k:07d}:v2" for k in rng.zipf(1.2, 20_000) % 300_000]
    batch = [MessageRecord(f"topic-{i % 4}", int(rng.integers(8)), i, 1_700_000_000_000 + i, key, (key,), -1, -1)
             for i, key in enumerate(keys)]
    old, new = (len(bf.encode_batch(0, LogColumns.of(batch), version=v)) for v in (2, 3))
    assert new < 0.93 * old, (new, old)


@pytest.mark.parametrize("aged", [False, True])
def test_sources_and_offsets_as_steps_take_fewer_bytes(aged):
    """What version 4 adds: records of 4 topics x 8 partitions interleaved, each partition's
    offsets rising by 1 (from bases of their own when `aged`, as a real broker's partitions are),
    in a tenth fewer bytes; its blocks carry both rewrites."""
    rng = np.random.default_rng(5)
    sources = rng.integers(0, 32, 20_000)
    bases = rng.integers(0, 2**40, 32) if aged else np.zeros(32, np.int64)
    offsets = bases[sources] + _ranks(sources)
    keys = [f"acct:{k:07d}:v2" for k in rng.zipf(1.2, len(sources)) % 300_000]
    batch = [MessageRecord(f"topic-{s // 8}", int(s % 8), int(offsets[i]), 1_700_000_000_000 + i, key, (key,), -1, -1)
             for i, (s, key) in enumerate(zip(sources.tolist(), keys))]
    old, new = (bf.encode_batch(0, LogColumns.of(batch), version=v) for v in (3, 4))
    assert len(new) < (0.8 if aged else 0.92) * len(old), (len(new), len(old))
    compressed, _, _ = _blocks_and_raws(new)
    forms = {_stored_form(c, int(r))[bf.STORED_FORM_AT]
             for c, r in zip(compressed, bf.check_head(new, 0, len(new)).blocks["raw_length"])}
    assert forms == {bf.ENDS_AS_STEPS | bf.SOURCE_IN_TOPIC | bf.OFFSETS_AS_STEPS}
    assert bf.records(decode(new)) == batch


def _ranks(sources: np.ndarray) -> np.ndarray:
    """Each record's count of earlier records of its source."""
    order = np.argsort(sources, kind="stable")
    ranks = np.empty(len(sources), np.int64)
    ordered = sources[order]
    starts = np.r_[0, np.flatnonzero(ordered[1:] != ordered[:-1]) + 1]
    ranks[order] = np.arange(len(sources)) - np.repeat(starts, np.diff(np.r_[starts, len(sources)]))
    return ranks


@settings(max_examples=300, deadline=None)
@given(batches(any_text), st.data())
def test_a_damaged_stored_form_reads_as_python_reads_it(batch, data):
    """Bytes of a block's stored form changed (its header's stored-form bytes, widths, steps),
    compressed again with a checksum that matches: restoring it never reads or writes past a
    buffer, and the compiled path answers as Python does (the same bytes, or the same error)."""
    encoded = bytearray(bf.encode_batch(0, LogColumns.of(batch), block_records=4))
    starts, blocks = _blocks_of(bytes(encoded))
    b = data.draw(st.integers(0, len(starts) - 1))
    start, length, read_length = int(starts[b]), int(blocks["length"][b]), int(blocks["raw_length"][b])
    stored = bytearray(_stored_form(bytes(encoded[start : start + length]), read_length))
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.integers(bf.STORED_FORM_AT - len(bf.SECTIONS), bf.STORED_FORM_AT + 2)
                          | st.integers(0, len(stored) - 1))
        stored[where] = data.draw(st.integers(0, 255))
    recompressed = bf.LZ4.compress(bytes(stored), asbytes=True)
    damaged = bytes(encoded[:start]) + recompressed + bytes(encoded[start + length :])
    blocks = blocks.copy()
    blocks["length"][b], blocks["crc"][b] = len(recompressed), zlib.crc32(recompressed)
    starts = starts + np.where(np.arange(len(starts)) > b, len(recompressed) - length, 0)
    assert _outcome(_into_or_error(damaged, starts, blocks)) == _outcome(_python_or_error(damaged, starts, blocks))


VALID_EMPTY_FORMS = [bytes([bf.ENDS_AS_STEPS, 0, 0]), bytes([bf.ENDS_AS_STEPS | bf.OFFSETS_AS_STEPS, 0, 0]),
                     bytes([bf.OFFSETS_AS_STEPS, 0, 0])]


@pytest.mark.parametrize("records, texts", [(1, 2**32 - 1), (2**32 - 1, 2**32 - 1), (2**32 - 1, 0)])
@pytest.mark.parametrize("form", [*VALID_EMPTY_FORMS,
                                  bytes([bf.SOURCE_IN_TOPIC, 0, 0]),  # its widths must be 1
                                  bytes([bf.ENDS_AS_STEPS, 3, 0]),  # a partition span without SOURCE_IN_TOPIC
                                  bytes([bf.ENDS_AS_STEPS, 0, 1]), bytes([8, 0, 0])])  # no such byte, no such form
def test_a_stored_form_of_billions_in_no_bytes_or_of_no_known_kind(records, texts, form):
    """A damaged header (its checksum made to match): billions of records and texts in width 0
    restore at once (no step to sum, no source to split), and a stored form there is none of does
    not decode; both paths alike."""
    stored = bytearray(bf.BLOCK_HEADER_STRUCT.pack(records, texts, 0, *[0] * len(bf.SECTIONS), *[0] * len(bf.SECTIONS)))
    stored[bf.STORED_FORM_AT : bf.STORED_FORM_AT + 3] = form
    compressed = bf.LZ4.compress(bytes(stored), asbytes=True)
    blocks = np.array([(records, len(compressed), len(stored), zlib.crc32(compressed))], dtype=bf.BLOCK_ENTRY_DTYPE)
    starts = np.zeros(1, dtype=np.int64)
    python, compiled = _python_or_error(compressed, starts, blocks), _into_or_error(compressed, starts, blocks)
    assert _outcome(python) == _outcome(compiled)
    if form in VALID_EMPTY_FORMS:
        assert python == bytes(stored[: bf.STORED_FORM_AT]) + bytes(3) + bytes(stored[bf.STORED_FORM_AT + 3 :])
    else:
        assert python.endswith("a block does not decode (its stored form)")


def test_a_source_in_topic_needs_one_byte_of_each():
    """SOURCE_IN_TOPIC with a topic or partition section of another width is no stored form (a
    damaged header, its checksum made right): both paths refuse it alike."""
    batch = [MessageRecord("t", p, 10 + i, 5, "k", ("k",), -1, -1) for i, p in enumerate([0, 3, 1, 3])]
    compressed, raws, head = _blocks_and_raws(bf.encode_batch(0, LogColumns.of(batch), block_records=4))
    stored = bytearray(_stored_form(compressed[0], len(raws[0])))
    assert stored[bf.STORED_FORM_AT] & bf.OFFSETS_AS_STEPS and not stored[bf.STORED_FORM_AT] & bf.SOURCE_IN_TOPIC
    stored[bf.STORED_FORM_AT] |= bf.SOURCE_IN_TOPIC  # one topic: width 0
    again = bf.LZ4.compress(bytes(stored), asbytes=True)
    blocks = np.array([(4, len(again), len(stored), zlib.crc32(again))], dtype=bf.BLOCK_ENTRY_DTYPE)
    starts = np.zeros(1, dtype=np.int64)
    python, compiled = _python_or_error(again, starts, blocks), _into_or_error(again, starts, blocks)
    assert _outcome(python) == _outcome(compiled) and python.endswith("a block does not decode (its stored form)")


def test_edge_keys_empty_huge_unicode():
    huge = "k" * (1 << 20)
    record = MessageRecord("t", 0, 1, 2, "", ("", huge, "😀\u0000é", "\udc80raw"), 5, 6)
    decoded = decode(bf.encode_batch(9, LogColumns.of([record])))
    assert bf.records(decoded) == [record]
    row = bf.rows(decoded, "b").to_pylist()[0]
    assert row["key"] == "" and row["keys"][1] == huge and row["keys"][2] == "😀\u0000é"
    assert row["keys"][3] == "\\x80raw"  # arrow_text rendering of a non-UTF-8 byte


def test_key_absent_differs_from_empty_key():
    records = [MessageRecord("t", 0, 0, 0, None, ()), MessageRecord("t", 0, 1, 0, "", ("",))]
    assert bf.rows(decode(bf.encode_batch(0, LogColumns.of(records))), "b").column("key").to_pylist() == [None, ""]


def test_every_truncation_is_torn_and_every_flipped_byte_detected():
    # three blocks and an annotation: every region of a batch has its own checksum
    records = [MessageRecord(f"topic{i % 2}", 1, i, 3 + i, f"key{i}", (f"key{i}", "b")) for i in range(5)]
    data = bf.encode_batch(3, LogColumns.of(records), annotation=b"note", block_records=2)
    assert isinstance(bf.check_batch(data, 0, len(data), 3), bf.BatchHead)
    assert len(bf.check_head(data, 0, len(data)).blocks) == 3
    for cut in range(len(data)):
        problem = bf.check_batch(data[:cut], 0, cut, 3)
        assert isinstance(problem, bf.BatchProblem) and problem.torn and problem.position == 0, cut
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x41
        assert isinstance(bf.check_batch(bytes(bad), 0, len(bad), 3), bf.BatchProblem), i
    problem = bf.check_batch(data, 0, len(data), expected_seq=4)
    assert isinstance(problem, bf.BatchProblem) and "base sequence 3" in problem.reason


def test_a_batch_of_a_newer_version_is_refused_by_its_number():
    """What an older msgindex does with batches a newer one wrote (README, "Upgrading"): a version
    it does not read, its head checksum right, is refused naming the version, never read as
    damage to repair nor as a torn tail to cut."""
    data = bytearray(bf.encode_batch(3, LogColumns.of([MessageRecord("t", 0, 1, 2, "k", ("k",))])))
    newer = max(bf.READ_VERSIONS) + 1
    data[12] = newer
    head_length = bf.read_header(data).head_length
    data[4:8] = zlib.crc32(bytes(data[bf.CRC_START:head_length])).to_bytes(4, "little")
    problem = bf.check_batch(bytes(data), 0, len(data), 3)
    assert isinstance(problem, bf.BatchProblem) and not problem.torn
    assert problem.reason == f"unknown batch version {newer}"


batch_sizes = st.lists(st.integers(1, 40), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(record_strategy(utf8_text), min_size=1, max_size=160), batch_sizes,
       st.sampled_from([0, 1, 150, 500, 4096]), st.sampled_from([100, 300, 2_000, 20_000, 1 << 30]),
       st.sampled_from([24, 48, 96, 4096]), st.sampled_from([1, 7, 4096]), st.booleans())
def test_log_files_match_the_oracle(tmp_path_factory, records, sizes, interval, segment_bytes, index_bytes,
                                    batch_records, arrow):
    appends, start = [], 0
    while start < len(records):
        size = sizes[len(appends) % len(sizes)]
        appends.append(records[start : start + size])
        start += size
    directory = tmp_path_factory.mktemp("log")
    with MetadataLog.open(directory, segment_bytes=segment_bytes, index_interval_bytes=interval,
                          max_index_bytes=index_bytes, writable=True, batch_records=batch_records) as log:
        for append in appends:
            log.append(as_table(append) if arrow else append)
        assert log.read_many(range(len(records))) == records  # the vectorized reader
        assert log.read_few(range(len(records))) == records  # the record-by-record reader
    assert read_log(directory) == records  # the scalar oracle
    written = {p.name: p.read_bytes() for p in directory.iterdir() if not p.name.endswith(".summary")}
    logs = sorted(p for p in directory.glob("*.log"))
    for i, path in enumerate(logs):
        index, timeindex = index_files(path.read_bytes(), int(path.stem), interval, sealed=i < len(logs) - 1)
        assert written[path.stem + ".index"] == index and written[path.stem + ".timeindex"] == timeindex, path

    for path in directory.glob("*index"):  # a rebuild (same state machine, whole segment) agrees too
        path.unlink()
    with MetadataLog.open(directory, segment_bytes=segment_bytes, index_interval_bytes=interval,
                          max_index_bytes=index_bytes, writable=True):
        pass
    assert {p.name: p.read_bytes() for p in directory.iterdir() if not p.name.endswith(".summary")} == written


def test_a_log_of_older_batches_takes_new_ones(tmp_path, monkeypatch):
    """A store written before batch version 4 (its batches version 2 and 3), then appended to by
    this version: every record reads back through both readers and the oracle, each batch in the
    version it was written in."""
    rng = np.random.default_rng(9)
    records = [MessageRecord(f"t{int(rng.integers(3))}", int(rng.integers(8)), i, 1_700_000_000_000 + i, f"k{i % 37}",
                             (f"k{i % 37}",)) for i in range(3_000)]
    encode = bf.encode_batch
    options = dict(segment_bytes=1 << 20, index_interval_bytes=4096, writable=True, batch_records=400)
    for version, part in zip((2, 3, None), (records[:1_000], records[1_000:2_000], records[2_000:])):
        monkeypatch.setattr(bf, "encode_batch", encode if version is None else
                            lambda *args, version=version, **kwargs: encode(*args, **kwargs, version=version))
        with MetadataLog.open(tmp_path, **options) as log:
            log.append(part)
    with MetadataLog.open(tmp_path, **options) as log:
        assert log.read_many(range(len(records))) == records
        assert log.read_few(range(0, len(records), 7)) == records[::7]
    assert read_log(tmp_path) == records
    data = b"".join(path.read_bytes() for path in sorted(tmp_path.glob("*.log")))
    versions, at = [], 0
    while at < len(data):
        header = bf.read_header(data, at)
        versions.append(header.version)
        at += header.batch_length
    assert versions == [2] * 3 + [3] * 3 + [bf.BATCH_VERSION] * 3


def test_annotations_ride_on_the_last_batch_of_an_append(tmp_path):
    records = [MessageRecord("t", 0, i, 10 + i, f"k{i}", (f"k{i}",)) for i in range(25)]
    with MetadataLog.open(tmp_path, segment_bytes=1 << 20, index_interval_bytes=100, writable=True,
                          batch_records=10) as log:
        assert log.last_annotation() == b""
        log.append(records[:12], annotation=b'{"offsets": 1}')
        log.append(records[12:20])
        log.append(records[20:], annotation=b"second")
        assert log.last_annotation() == b"second"
        assert list(log.annotations()) == [(10, b'{"offsets": 1}'), (20, b"second")]
        with pytest.raises(InvalidAppendError, match="annotation"):
            log.append([], annotation=b"x")
        log.flush()
        committed = log.position()
    with MetadataLog.open(tmp_path, segment_bytes=1 << 20, index_interval_bytes=100, writable=False,
                          committed=committed) as reader:
        assert reader.last_annotation() == b"second" and len(list(reader.annotations())) == 2


# ---- bad input -----------------------------------------------------------------------------------
GOOD = [MessageRecord("t", 0, i, 10, f"k{i}", (f"k{i}", "x"), 1, 2) for i in range(5)]


def with_column(table: pa.Table, name: str, array: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, array)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.drop_columns(["size"]), r"lacks column\(s\) \['size'\]"),
        (lambda t: with_column(t, "topic", pa.array(["t", "t", None, "t", "t"])),
         "record 2 of the batch: topic must be str"),
        (lambda t: with_column(t, "partition", pa.array([0, 0, 0, 2**31, 0], pa.int64())),
         "record 3 of the batch: partition=2147483648"),
        (lambda t: with_column(t, "offset", pa.array([0, None, 0, 0, 0], pa.int64())), "record 1 of the batch: offset"),
        (lambda t: with_column(t, "timestamp_ms", pa.array([0.5] * 5)), "'timestamp_ms' has type double"),
        (lambda t: with_column(t, "keys", pa.array([["a"], ["b"], ["c"], None, []], pa.list_(pa.string()))),
         "record 3 of the batch: keys must be"),
        (lambda t: with_column(t, "keys", pa.array([["a"], ["b"], [], [], ["c", None]], pa.list_(pa.string()))),
         "record 4 of the batch: keys item must be str"),
        (lambda t: with_column(t, "key", pa.array([b"a"] * 5)), "type binary, expected string"),
        (lambda t: with_column(t, "topic", pa.StringArray.from_buffers(
            5, pa.py_buffer(np.array([0, 1, 2, 3, 4, 5], np.int32)), pa.py_buffer(b"tt\xfftt"))), "invalid UTF-8"),
    ],
)
def test_bad_arrow_input_is_named(mutate, message):
    with pytest.raises(InvalidAppendError, match=message):
        LogColumns.of(mutate(as_table(GOOD)))


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (MessageRecord("t", 2**31, 0, 0, None, ()), "record 5 of the batch: partition=2147483648"),
        (MessageRecord("t", 0, 0, 1.5, None, ()), "timestamp_ms=1.5"),
        (MessageRecord(b"t", 0, 0, 0, None, ()), "topic must be str"),
        (MessageRecord("t", 0, 0, 0, 5, ()), "key must be str"),
        (MessageRecord("t", 0, 0, 0, None, "abc"), "keys must be a sequence of str"),
        (MessageRecord("t", 0, 0, 0, None, ("a", None)), "keys item must be str"),
        (MessageRecord("t" * 70000, 0, 0, 0, None, ()), "record 5 of the batch: topic is 70000 bytes"),
        (MessageRecord("t", 0, 0, 0, None, (), size=2**31), "size="),
        (MessageRecord("t", True, 0, 0, None, ()), "partition=True"),
        (MessageRecord("t", 0, 2**63, 0, None, ()), "offset=9223372036854775808"),
        ("not a record", "record 5 of the batch is a str"),
    ],
)
def test_bad_records_are_named_and_leave_the_log_untouched(tmp_path, record, message):
    with MetadataLog.open(tmp_path, segment_bytes=1 << 20, index_interval_bytes=100, writable=True) as log:
        with pytest.raises(InvalidAppendError, match=message):
            log.append([*GOOD, record])
        assert log.next_seq == 0 and log.position().segment_bytes == 0


def test_numpy_integers_str_subclasses_and_schemaless_arrow_encode_like_plain_values():
    class Name(str):
        pass

    plain = MessageRecord("t", 3, 4, 5, "k", ("a", "b"), 6, 7)
    unusual = MessageRecord(Name("t"), np.int32(3), np.int64(4), np.int64(5), Name("k"), [Name("a"), "b"],
                            np.int64(6), np.int16(7))
    assert bf.records(decode(bf.encode_batch(9, LogColumns.of([plain, unusual])))) == [plain, plain]
    records = [MessageRecord("orders", p, p, 10 + p, None, (), -1, -1) for p in range(3)]
    inferred = pa.Table.from_pylist([{"topic": r.topic, "partition": r.partition, "offset": r.offset,
                                      "timestamp_ms": r.timestamp_ms, "key": None, "keys": [],
                                      "commit_log_offset": -1, "size": -1, "extra": "ignored"} for r in records])
    assert bf.records(decode(bf.encode_batch(4, LogColumns.of(inferred)))) == records
    dictionary = with_column(as_table(GOOD), "topic", pa.array(["t"] * 5).dictionary_encode())
    assert bf.records(decode(bf.encode_batch(0, LogColumns.of(dictionary)))) == GOOD


@settings(max_examples=40, deadline=None)
@given(st.lists(record_strategy(utf8_text), max_size=20), st.integers(0, 3), st.integers(1, 2))
def test_records_from_table_round_trips(records, skip, chunks):
    table = as_table(records, chunks).slice(min(skip, len(records)))
    assert records_from_table(table) == records[min(skip, len(records)):]
    if table.num_rows:  # and a sliced, chunked table encodes what its rows are
        assert bf.records(decode(bf.encode_batch(0, LogColumns.of(table)))) == records[min(skip, len(records)):]


def _blocks_of(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    head = bf.checked_batch(data, len(data), "mem", 0).header
    blocks = bf.check_head(data, 0, len(data)).blocks
    return head.blocks_offset + np.concatenate(([0], np.cumsum(blocks["length"].astype(np.int64))[:-1])), blocks


def _python_or_error(data: bytes, starts: np.ndarray, blocks: np.ndarray) -> bytes | str:
    try:
        return b"".join(bf.decompress_blocks(memoryview(data), starts.tolist(), blocks["length"].tolist(),
                                             blocks["raw_length"].tolist(), blocks["crc"].tolist(), "mem",
                                             [0] * len(starts)))
    except CorruptFileError as error:
        return str(error)


def _into_or_error(data: bytes, starts: np.ndarray, blocks: np.ndarray) -> bytes | str:
    try:
        return decompressed_all(data, starts, blocks)[0].tobytes()
    except CorruptFileError as error:
        return str(error)


@settings(max_examples=300, deadline=None)
@given(st.lists(record_strategy(any_text), min_size=1, max_size=40), st.data())
def test_compiled_blocks_answer_as_python_on_damaged_blocks(batch, data):
    """Bytes changed in a block, its checksum recomputed or not (a scribble the checksum misses
    must still never be read or written past): the compiled path raises where the Python one
    does, with the same message, and otherwise decompresses the same bytes."""
    encoded = bytearray(bf.encode_batch(0, LogColumns.of(batch), block_records=4))
    starts, blocks = _blocks_of(bytes(encoded))
    b = data.draw(st.integers(0, len(starts) - 1))
    start, length = int(starts[b]), int(blocks["length"][b])
    for _ in range(data.draw(st.integers(1, 4))):
        at = start + data.draw(st.integers(0, length - 1))
        encoded[at] = data.draw(st.integers(0, 255))
    checksum_fixed = data.draw(st.booleans())
    if checksum_fixed:
        blocks = blocks.copy()
        blocks["crc"][b] = zlib.crc32(encoded[start : start + length])
    damaged = bytes(encoded)
    python = _python_or_error(damaged, starts, blocks)
    compiled = _into_or_error(damaged, starts, blocks)
    if checksum_fixed and isinstance(python, bytes) and isinstance(compiled, str):
        # Stricter than Arrow's codec, which returns a block that decodes short padded to the
        # stated length: a damage only a rewrite with a matching checksum can carry
        assert compiled.endswith("a block does not decode")
    else:
        assert _outcome(compiled) == _outcome(python)


def _outcome(result: bytes | str) -> bytes | str:
    """Decompressed bytes, or the error without Arrow's wording of why a block does not decode."""
    return result.split(" (")[0] if isinstance(result, str) else result


def _point_reads_agree(tmp_path, data: bytes, rows: list[int]) -> bf.RawRecords:
    """`rows` of the first block of batch `data` through the compiled point reader and its Python
    oracle (``python_read_records``): the same records; the compiled ones."""
    path = tmp_path / "batch"
    path.write_bytes(data)
    starts, blocks = _blocks_of(data)
    head = bf.check_head(data, 0, len(data))
    locations = bf.BlockLocations(starts[:1], blocks["length"][:1].astype(np.int64),
                                  blocks["raw_length"][:1].astype(np.int64), blocks["crc"][:1].astype(np.int64),
                                  np.zeros(1, np.int64), [head.topics])
    wanted, firsts = np.array(rows, dtype=np.int64), np.array([0, len(rows)], dtype=np.int64)
    with open(path, "rb") as f:
        compiled = bf.read_raw_records(f.fileno(), "file", locations, firsts, wanted, _short_read)
        python = bf.python_read_records(f.fileno(), "file", locations, firsts, wanted, _short_read)
    assert compiled == python
    return compiled


def test_every_source_byte_and_span_restores(tmp_path):
    """SOURCE_IN_TOPIC over every byte a block can hold, for every partition span a writer writes
    (the compiled reader splits the byte by a multiplication: exact for each of them), through both
    readers and both decompressions."""
    for span in range(1, 129):
        topics = 256 // span
        batch = [MessageRecord(f"t{t}", p, 100 * t + p, 5, "k", ("k",), -1, -1)
                 for t in range(topics) for p in range(span)]
        data = bf.encode_batch(0, LogColumns.of(batch), block_records=len(batch))
        compressed, _, _ = _blocks_and_raws(data)
        form = _stored_form(compressed[0], int(bf.check_head(data, 0, len(data)).blocks["raw_length"][0]))
        assert bool(form[bf.STORED_FORM_AT] & bf.SOURCE_IN_TOPIC) == (span > 1 and topics > 1), span
        assert bf.records(decode(data)) == batch  # compiled and Python decompression agree (decode)
        rows = sorted({0, len(batch) // 2, len(batch) - 1})
        assert [tuple(r[1:4]) for r in _point_reads_agree(tmp_path, data, rows).ints] == \
            [(int(batch[r].topic[1:]), batch[r].partition, batch[r].offset) for r in rows]


def test_a_block_of_thousands_of_sources(tmp_path):
    """A block of 3,000 records from 1,500 partitions of int32 ids: its offsets' chains need a
    table larger than the one on the stack. Both decompressions agree, and so do point reads of
    rows in any order (the compiled reader restores up to the largest)."""
    rng = np.random.default_rng(4)
    ids = rng.integers(-(2**31), 2**31 - 1, 1_500)
    sources = rng.integers(0, len(ids), 3_000)
    bases = rng.integers(0, 2**40, len(ids))
    batch = [MessageRecord(f"t{s % 3}", int(ids[s]), int(bases[s] + rank), 7, f"k{i}", (f"k{i}",), -1, -1)
             for i, (s, rank) in enumerate(zip(sources.tolist(), _ranks(sources).tolist()))]
    data = bf.encode_batch(0, LogColumns.of(batch), block_records=len(batch))
    compressed, _, _ = _blocks_and_raws(data)
    form = _stored_form(compressed[0], int(bf.check_head(data, 0, len(data)).blocks["raw_length"][0]))
    assert form[bf.STORED_FORM_AT] == bf.ENDS_AS_STEPS | bf.OFFSETS_AS_STEPS  # partitions of 4 bytes
    assert bf.records(decode(data)) == batch
    for rows in ([2_999, 5, 1_400, 17, 2_000, 3, 9, 11, 12, 2_500], [2_999, 0], list(range(0, 3_000, 97))):
        got = _point_reads_agree(tmp_path, data, rows)
        assert [tuple(r[2:4]) for r in got.ints] == [(batch[r].partition, batch[r].offset) for r in rows]


def test_compiled_blocks_are_built_where_a_compiler_is() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: msgindex installs without its compiled block reader")
    if ctypes.util.find_library("lz4") is None:
        pytest.skip("no LZ4 shared library on this machine: the compiled block reader does not import")
    assert bf.compiled_blocks is not None, "msgindex.storage.log._blocks was not built: `make setup`"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=70_000), st.integers(0, 64))
def test_the_compiled_checksum_is_zlibs_crc32(data, skip):
    """Blocks are checked with zlib's CRC-32 whichever library computes it (libdeflate's where the
    system has it): any length, any alignment of the buffer."""
    if bf.compiled_blocks is None:
        pytest.skip("msgindex.storage.log._blocks was not built (no C compiler at install): zlib checks blocks")
    view = memoryview(data)[min(skip, len(data)):]
    assert bf.compiled_blocks.checksum(view) == zlib.crc32(view), bf.compiled_blocks.CHECKSUM_LIBRARY


def _blocks_and_raws(batch: bytes) -> tuple[list[bytes], list[bytes], bf.BatchHead]:
    """One encoded batch's blocks: compressed, and decompressed in their read form (the layout
    decoders read, what a damage to a decoded field is made in)."""
    head = bf.check_head(batch, 0, len(batch))
    compressed, at = [], head.header.blocks_offset
    for length in head.blocks["length"].tolist():
        compressed.append(batch[at : at + length])
        at += length
    raws = [bf.read_form(pa.Codec("lz4_raw").decompress(c, int(r), asbytes=True))
            for c, r in zip(compressed, head.blocks["raw_length"])]
    return compressed, raws, head


def _stored_form(compressed: bytes, length: int) -> bytes:
    """A block's bytes as stored (its stored form is as long as its read form)."""
    return pa.Codec("lz4_raw").decompress(compressed, length, asbytes=True)


def _read_or_error(read, *args) -> list[MessageRecord] | str:
    try:
        return read(*args)
    except CorruptFileError as error:
        return str(error)
    except UnicodeDecodeError:  # a text rewritten, checksums made right, into bytes no writer stores
        return "UnicodeDecodeError"


def _short_read(read: int, wanted: int, position: int) -> None:
    if read != wanted:
        raise CorruptFileError(f"file: {read} bytes at byte {position} where {wanted} were committed")


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches(any_text), st.sampled_from(["none", "scribble", "raw", "section", "stored", "truncate"]), st.data())
def test_compiled_record_reader_answers_as_python(tmp_path_factory, batch, damage, data):
    """read_records through the compiled reader (_blocks.read_records) and its oracle
    (python_read_records, BlockRecords): the same records for any rows of any blocks, the same
    error on any damage: bytes of a block changed (its checksum catches them), its decompressed
    bytes changed and its checksum made right (the decoders' own checks must catch widths, counts,
    ends, texts, topics; "stored": bytes of its stored form, which restoring it must catch or
    hand on), the file cut short. Blocks of 4 records and of more (where more than DIRECT_ROWS
    rows of one block are read: their offsets are restored in place, not chained row by row)."""
    if bf.compiled_blocks is None:
        pytest.skip("msgindex.storage.log._blocks was not built (no C compiler at install): the Python reader runs")
    block_records = data.draw(st.sampled_from([4, 4, 40]))
    compressed, raws, head = _blocks_and_raws(bf.encode_batch(0, LogColumns.of(batch), block_records=block_records))
    crcs = [zlib.crc32(c) for c in compressed]
    victim = data.draw(st.integers(0, len(compressed) - 1))
    if damage == "scribble":
        damaged = bytearray(compressed[victim])
        damaged[data.draw(st.integers(0, len(damaged) - 1))] ^= data.draw(st.integers(1, 255))
        compressed[victim] = bytes(damaged)
    elif damage in ("raw", "section"):
        damaged = bytearray(raws[victim])
        fields = bf.BLOCK_HEADER_STRUCT.unpack_from(damaged, 0)
        records, texts, widths = fields[0], fields[1], fields[3 : 3 + len(bf.SECTIONS)]
        at, sections = bf.BLOCK_HEADER_SIZE, [(0, 12)]  # (first byte, bytes): the counts, then each section
        for n, width in enumerate(widths):
            size = width * (texts if n == len(bf.COLUMNS) else records)
            sections.append((at, size))
            at += size
        for _ in range(data.draw(st.integers(1, 3))):
            if damage == "raw":
                where = data.draw(st.integers(0, len(damaged) - 1))
            else:  # a byte of a counted field or a column: what the decoders' checks are for
                first, size = data.draw(st.sampled_from([s for s in sections if s[1]]))
                where = first + data.draw(st.integers(0, size - 1))
            damaged[where] = data.draw(st.integers(0, 255))
        raws[victim] = bytes(damaged)
        compressed[victim] = bf.LZ4.compress(raws[victim], asbytes=True)
        crcs[victim] = zlib.crc32(compressed[victim])
    elif damage == "stored":
        damaged = bytearray(_stored_form(compressed[victim], len(raws[victim])))
        for _ in range(data.draw(st.integers(1, 3))):  # the stored form's bytes, then any
            where = data.draw(st.sampled_from([bf.STORED_FORM_AT, bf.STORED_FORM_AT + 1, bf.STORED_FORM_AT + 2])
                               | st.integers(0, len(damaged) - 1))
            damaged[where] = data.draw(st.integers(0, 255))
        compressed[victim] = bf.LZ4.compress(bytes(damaged), asbytes=True)
        crcs[victim] = zlib.crc32(compressed[victim])
    path = tmp_path_factory.mktemp("blocks") / "file"
    content = b"".join(compressed)
    if damage == "truncate":
        content = content[: data.draw(st.integers(0, len(content) - 1))]
    path.write_bytes(content)
    starts = np.cumsum([0] + [len(c) for c in compressed[:-1]])
    counts = head.blocks["records"].astype(np.int64)
    chosen = sorted(data.draw(st.sets(st.integers(0, len(compressed) - 1), min_size=1)))
    rows_of = [sorted(data.draw(st.sets(st.integers(0, int(counts[b]) - 1), min_size=1))) for b in chosen]
    blocks = bf.BlockLocations(starts[chosen], np.array([len(compressed[b]) for b in chosen]),
                               np.array([len(raws[b]) for b in chosen]), np.array([crcs[b] for b in chosen]),
                               np.array(chosen) * 1000, [head.topics] * len(chosen))
    firsts = np.cumsum([0] + [len(rows) for rows in rows_of])
    rows = np.array([row for rows in rows_of for row in rows], dtype=np.int64)
    seqs = np.arange(len(rows), dtype=np.int64) * 3 + 7
    with open(path, "rb") as f:
        compiled_raw = _read_or_error(bf.read_raw_records, f.fileno(), "file", blocks, firsts, rows, _short_read)
        python_raw = _read_or_error(bf.python_read_records, f.fileno(), "file", blocks, firsts, rows, _short_read)
        compiled = _read_or_error(bf.read_records, f.fileno(), "file", blocks, firsts, rows, _short_read)
        columns = _read_or_error(bf.read_record_columns, f.fileno(), "file", blocks, firsts, rows, seqs, _short_read)
    # before they are MessageRecords: the same integers, texts (str where all are ASCII) and flags
    assert compiled_raw == (python_raw.split(" (")[0] if isinstance(python_raw, str) else python_raw)
    python = python_raw if isinstance(python_raw, str) else _read_or_error(python_raw.messages)
    if damage == "none":
        base = np.cumsum([0, *counts.tolist()])
        assert compiled == [batch[int(base[b]) + row] for b, rows in zip(chosen, rows_of) for row in rows]
    assert compiled == (python.split(" (")[0] if isinstance(python, str) else python)
    # the same records as columns (bf.RecordColumns), rendered, in any order and any subset of them
    if isinstance(columns, str) or isinstance(python, str):
        assert columns == compiled or python == "UnicodeDecodeError"  # (columns keep texts as bytes)
        return
    if damage != "none":  # damage no decoder check sees (a partition beyond int32): nothing to render
        return
    kept = np.array(sorted(data.draw(st.sets(st.integers(0, len(rows) - 1)))), dtype=np.int64)
    order = np.array(data.draw(st.permutations(range(len(kept)))), dtype=np.int64)
    expected = rows_from_records("b", seqs[kept][order].tolist(), [python[i] for i in kept[order].tolist()])
    assert pa.Table.from_batches([bf.rows(columns.rows(kept, order), "b")], schema=ROW_SCHEMA).equals(expected)


def _records_of_lengths(shape: str, count: int, rng: np.random.Generator) -> list[MessageRecord]:
    """`count` records whose keys' lengths are `shape`: "even" (10-40 bytes), "long first" (each
    block's first records' keys 2-3 kB: their rows' heap lies far past their share of it), "long
    last" (the same at each block's end), or "one huge" (a 40 kB key now and then)."""
    found = []
    for n in range(count):
        at = n % bf.DEFAULT_BLOCK_RECORDS
        length = int(rng.integers(10, 40))
        if (shape == "long first" and at < 8) or (shape == "long last" and at >= bf.DEFAULT_BLOCK_RECORDS - 8):
            length = int(rng.integers(2000, 3000))
        elif shape == "one huge" and rng.random() < 0.002:
            length = 40_000
        key = f"k{n}-" + "x" * length
        keys = (key, f"extra-{n}") if rng.random() < 0.2 else (key,)
        found.append(MessageRecord(f"topic-{n % 3}", n % 7, 1000 + n, 1_700_000_000_000 + n, key, keys, -1, -1))
    return found


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["even", "long first", "long last", "one huge"]), st.integers(0, 2**32 - 1), st.data())
def test_a_point_read_decompresses_what_its_rows_need_and_reads_nothing_past_it(tmp_path_factory, shape, seed,
                                                                                  data):
    """The compiled reader decompresses a block of many records only as far as its wanted rows
    need (LZ4's partial decoding, as far as the block header's estimate; the whole block when a
    wanted text lies past it): any rows of blocks of 512 records with keys of even lengths, long
    at each block's start (the estimate falls short), long at its end, or a huge one now and then,
    are the records written and python_read_records' records. The blocks are read in one call, so
    a byte read past a block's decoded front would be the previous block's."""
    if bf.compiled_blocks is None:
        pytest.skip("msgindex.storage.log._blocks was not built (no C compiler at install): the Python reader runs")
    batch = _records_of_lengths(shape, 3 * bf.DEFAULT_BLOCK_RECORDS + 100, np.random.default_rng(seed))
    compressed, raws, head = _blocks_and_raws(bf.encode_batch(0, LogColumns.of(batch)))
    path = tmp_path_factory.mktemp("blocks") / "file"
    path.write_bytes(b"".join(compressed))
    starts = np.cumsum([0] + [len(c) for c in compressed[:-1]])
    counts = head.blocks["records"].astype(np.int64)
    chosen = sorted(data.draw(st.sets(st.integers(0, len(compressed) - 1), min_size=1)))
    rows_of = [sorted(data.draw(st.sets(st.integers(0, int(counts[b]) - 1), min_size=1, max_size=6))) for b in chosen]
    blocks = bf.BlockLocations(starts[chosen], np.array([len(compressed[b]) for b in chosen]),
                               np.array([len(raws[b]) for b in chosen]),
                               np.array([zlib.crc32(compressed[b]) for b in chosen]), np.array(chosen) * 1000,
                               [head.topics] * len(chosen))
    firsts = np.cumsum([0] + [len(rows) for rows in rows_of])
    rows = np.array([row for rows in rows_of for row in rows], dtype=np.int64)
    with open(path, "rb") as f:
        compiled = bf.read_records(f.fileno(), "file", blocks, firsts, rows, _short_read)
        python = bf.python_read_records(f.fileno(), "file", blocks, firsts, rows, _short_read).messages()
    base = np.cumsum([0, *counts.tolist()])
    assert compiled == python == [batch[int(base[b]) + row] for b, rows in zip(chosen, rows_of) for row in rows]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**32 - 1), st.sampled_from(["none", "one", "two", "truncate"]), st.data())
def test_a_read_of_many_blocks_shared_with_helper_threads_is_the_single_pass(tmp_path_factory, seed, damage, data):
    """A read of many blocks (PARALLEL_MIN_BLOCKS and more) is shared by the caller's thread and
    the read pool's helpers, block by block: any rows of up to 300 blocks give python_read_records'
    records in block order, and with one or two blocks damaged (their checksums) or the file cut
    short, the error of the first one, as a single pass in block order gives. Two Python threads
    read at once as well (one shares its read, the other reads alone)."""
    if bf.compiled_blocks is None:
        pytest.skip("msgindex.storage.log._blocks was not built (no C compiler at install): the Python reader runs")
    rng = np.random.default_rng(seed)
    batch = _records_of_lengths("even", int(rng.integers(20, 301)) * 4, rng)
    compressed, raws, head = _blocks_and_raws(bf.encode_batch(0, LogColumns.of(batch), block_records=4))
    crcs = [zlib.crc32(c) for c in compressed]
    victims = sorted(rng.choice(len(compressed), {"none": 0, "one": 1, "two": 2, "truncate": 0}[damage], replace=False))
    for victim in victims:
        damaged = bytearray(compressed[victim])
        damaged[int(rng.integers(0, len(damaged)))] ^= 0x5A
        compressed[victim] = bytes(damaged)
    content = b"".join(compressed)
    if damage == "truncate":
        content = content[: int(rng.integers(len(content) // 4, len(content)))]
    path = tmp_path_factory.mktemp("blocks") / "file"
    path.write_bytes(content)
    starts = np.cumsum([0] + [len(c) for c in compressed[:-1]])
    counts = head.blocks["records"].astype(np.int64)
    chosen = sorted(data.draw(st.sets(st.integers(0, len(compressed) - 1), min_size=bf.compiled_blocks.PARALLEL_MIN_BLOCKS,
                                  max_size=300)))
    rows_of = [sorted(rng.choice(int(counts[b]), int(rng.integers(1, int(counts[b]) + 1)), replace=False).tolist())
               for b in chosen]
    blocks = bf.BlockLocations(starts[chosen], np.array([len(compressed[b]) for b in chosen]),
                               np.array([len(raws[b]) for b in chosen]), np.array([crcs[b] for b in chosen]),
                               np.array(chosen) * 1000, [head.topics] * len(chosen))
    firsts = np.cumsum([0] + [len(rows) for rows in rows_of])
    rows = np.array([row for rows in rows_of for row in rows], dtype=np.int64)
    with open(path, "rb") as f:
        python = _read_or_error(lambda *a: bf.python_read_records(*a).messages(), f.fileno(), "file", blocks, firsts,
                                rows, _short_read)
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: _read_or_error(bf.read_records, f.fileno(), "file", blocks, firsts, rows,
                                                             _short_read), range(4)))
    assert answers == [python] * 4
    if not victims and damage == "none":
        base = np.cumsum([0, *counts.tolist()])
        assert python == [batch[int(base[b]) + row] for b, rows in zip(chosen, rows_of) for row in rows]


_READ_UNDER_A_MEMORY_LIMIT = """
import resource, sys
import numpy as np
from msgindex.errors import CorruptFileError
from msgindex.storage.log import batch_format as bf
saved = np.load(sys.argv[1], allow_pickle=True)
blocks = bf.BlockLocations(*(saved[name] for name in ("positions", "lengths", "raw_lengths", "crcs", "seqs")),
                           [tuple(saved["topics"])] * len(saved["positions"]))
# room for what the read needs but a block of 3 GB: the address space in use now, and 1 GB more
limit = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize() + (1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
answers = set()
with open(sys.argv[2], "rb") as f:
    for _ in range(100):
        try:
            bf.read_records(f.fileno(), "file", blocks, saved["firsts"], saved["rows"], lambda *a: None)
            answers.add("records")
        except CorruptFileError as error:
            answers.add(str(error))
        except MemoryError:
            answers.add("MemoryError")
print(sorted(answers))
"""


def test_a_damaged_block_is_named_before_blocks_past_it_that_do_not_fit_in_memory(tmp_path):
    """A single pass stops at the first block it cannot read: a damaged block comes before a later
    block whose buffers cannot be allocated, whichever thread takes that later block first (a
    process whose address space is limited, blocks past the damaged one 3 GB once decompressed;
    a helper that took one of those first once made the answer a MemoryError)."""
    if bf.compiled_blocks is None:
        pytest.skip("msgindex.storage.log._blocks was not built (no C compiler at install): the Python reader runs")
    batch = _records_of_lengths("even", 4 * 64, np.random.default_rng(5))
    compressed, raws, head = _blocks_and_raws(bf.encode_batch(0, LogColumns.of(batch), block_records=4))
    crcs = [zlib.crc32(c) for c in compressed]
    compressed[20] = compressed[20][:-1] + bytes([compressed[20][-1] ^ 1])
    path = tmp_path / "file"
    path.write_bytes(b"".join(compressed))
    raw_lengths = np.array([len(r) for r in raws])
    raw_lengths[21:] = 3_000_000_000
    np.savez(tmp_path / "blocks.npz", positions=np.cumsum([0] + [len(c) for c in compressed[:-1]]),
             lengths=np.array([len(c) for c in compressed]), raw_lengths=raw_lengths, crcs=np.array(crcs),
             seqs=np.arange(len(compressed)) * 1000, topics=np.array(head.topics, dtype=object),
             firsts=np.arange(len(compressed) + 1), rows=np.zeros(len(compressed), dtype=np.int64))
    if not Path("/proc/self/statm").exists():
        pytest.skip("no /proc/self/statm here (not Linux): the address-space limit is set from it")
    done = subprocess.run([sys.executable, "-c", _READ_UNDER_A_MEMORY_LIMIT, str(tmp_path / "blocks.npz"), str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    # (block 20's batch position as BlockLocations gives it: 20 x 1000)
    assert done.stdout.strip() == str(["file: invalid batch at byte 20000: checksum mismatch"]), done.stdout


def _first_records_of_400_blocks(tmp_path: Path, seed: int) -> tuple:
    """A file of 400 blocks of 4 records each, and what read_records takes to read the first record
    of each: (the batch's records, the file, BlockLocations, firsts, rows)."""
    batch = _records_of_lengths("even", 4 * 400, np.random.default_rng(seed))
    compressed, raws, head = _blocks_and_raws(bf.encode_batch(0, LogColumns.of(batch), block_records=4))
    path = tmp_path / "file"
    path.write_bytes(b"".join(compressed))
    starts = np.cumsum([0] + [len(c) for c in compressed[:-1]])
    blocks = bf.BlockLocations(starts, np.array([len(c) for c in compressed]), np.array([len(r) for r in raws]),
                               np.array([zlib.crc32(c) for c in compressed]), np.arange(len(compressed)) * 1000,
                               [head.topics] * len(compressed))
    return (batch, path, blocks, np.arange(len(compressed) + 1, dtype=np.int64),
            np.zeros(len(compressed), dtype=np.int64))


def test_helper_threads_take_part_in_reads_of_many_blocks(tmp_path):
    """Where the process may use more than one CPU, the read pool's helpers decode some blocks of a
    read of hundreds (the test above is then a test of the shared read, not of the caller alone)."""
    if bf.compiled_blocks is None:
        pytest.skip("msgindex.storage.log._blocks was not built (no C compiler at install): the Python reader runs")
    if bf.compiled_blocks.READ_HELPERS == 0:
        pytest.skip("this process may use one CPU only: read_records has no helper threads to share with")
    batch, path, blocks, firsts, rows = _first_records_of_400_blocks(tmp_path, seed=3)
    before = bf.compiled_blocks.helper_blocks()
    with open(path, "rb") as f:
        # (a helper wakes in ~30-100 us and never preempts a busy thread: on a busy machine, reads
        # until one got a CPU; the caller alone needs ~1 ms for these)
        deadline = time.monotonic() + 30
        while bf.compiled_blocks.helper_blocks() == before and time.monotonic() < deadline:
            assert bf.read_records(f.fileno(), "file", blocks, firsts, rows, _short_read) == batch[::4]
        assert bf.compiled_blocks.helper_blocks() > before
        helpers = _read_helpers()
        assert 1 <= len(helpers) <= bf.compiled_blocks.READ_HELPERS
        # they run at SCHED_BATCH (_blocks.c, "How helpers wait"): beside the caller, never in its place
        assert {os.sched_getscheduler(tid) for tid in helpers} == {os.SCHED_BATCH}
        bf.compiled_blocks.wake_helpers()  # woken ahead of a read: the read is the same
        assert bf.read_records(f.fileno(), "file", blocks, firsts, rows, _short_read) == batch[::4]
        # a process forked now (as PySpark's daemon forks its workers) has no helpers: it starts
        # its own, and its reads neither wait for the parent's nor differ
        child = os.fork()
        if child == 0:
            same = False
            try:
                same = bf.read_records(f.fileno(), "file", blocks, firsts, rows, _short_read) == batch[::4]
            finally:
                os._exit(0 if same else 1)
        deadline = time.monotonic() + 60
        while (waited := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if waited[0] == 0:
            os.kill(child, 9)
        assert waited[0] == child and os.waitstatus_to_exitcode(waited[1]) == 0, "the forked reader hung or differed"


def _read_helpers() -> list[int]:
    """The thread ids of this process's read-pool helpers (named "msgindex-read" by _blocks.c)."""
    tids = []
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == "msgindex-read":
                tids.append(int(task.name))
        except OSError:  # (a thread that ended meanwhile)
            pass
    return tids


def test_shared_reads_finish_and_agree_while_every_cpu_is_busy(tmp_path):
    """With a normal-priority busy loop on every CPU, a SCHED_BATCH helper that took a block may wait
    behind one: the caller then sleeps until it leaves (a CPU is free for it then), and every read
    gives the records of a read alone, in seconds at most."""
    if bf.compiled_blocks is None:
        pytest.skip("msgindex.storage.log._blocks was not built (no C compiler at install): the Python reader runs")
    if bf.compiled_blocks.READ_HELPERS == 0:
        pytest.skip("this process may use one CPU only: read_records has no helper threads to share with")
    batch, path, blocks, firsts, rows = _first_records_of_400_blocks(tmp_path, seed=5)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(len(os.sched_getaffinity(0)))]
    try:
        with open(path, "rb") as f:
            started = time.monotonic()
            for _ in range(40):
                bf.expect_scattered_reads(len(rows))
                assert bf.read_records(f.fileno(), "file", blocks, firsts, rows, _short_read) == batch[::4]
            assert time.monotonic() - started < 30
    finally:
        for process in busy:
            process.kill()
            process.wait()


def test_record_texts_refuses_what_does_not_cut_its_heap():
    """_blocks.record_texts (read_records' heap cut into each record's texts) takes int64 lengths
    and counts that cut exactly its heap, else a ValueError: never a read past either buffer."""
    if bf.compiled_blocks is None:
        pytest.skip("msgindex.storage.log._blocks was not built (no C compiler at install): the Python reader runs")
    cut = bf.compiled_blocks.record_texts
    assert cut(b"abcde", np.array([3, 0, 2]), np.array([2, 0, 1])) == ([["abc", ""], [], ["de"]], True, False)
    assert cut(b"a\\\xff", np.array([2, 1]), np.array([1, 1])) == ([[b"a\\"], [b"\xff"]], False, True)
    for lengths, counts in (([3, 3], [2]), ([3, 1], [2]), ([6, -1], [2]), ([5], [2]), ([5], [1, -1]), ([5], [0])):
        with pytest.raises(ValueError, match="do not cut the heap"):
            cut(b"abcde", np.array(lengths), np.array(counts))
    for lengths, counts in ((np.array([3, 2], np.int32), np.array([2])), (np.array([5]), np.array([1, 0], np.int32)),
                            (np.frombuffer(b"x" + np.array([5]).tobytes(), np.int64, offset=1), np.array([1]))):
        with pytest.raises(ValueError, match="aligned contiguous int64"):
            cut(b"abcde", lengths, counts)


def test_a_point_read_of_a_blocks_front_trusts_its_checksum_for_the_rest(tmp_path):
    """A point read decodes a block only as far as its rows, so a block whose checksum matches but
    whose LZ4 stream is cut short (only a rewrite with a matching checksum makes one) still gives
    its front rows, the writer's records, where a read of the whole block refuses it (the
    Python reader, decompress_all, `msgindex inspect`)."""
    if bf.compiled_blocks is None:
        pytest.skip("msgindex.storage.log._blocks was not built (no C compiler at install): the Python reader runs")
    batch = [MessageRecord("t", 0, i, 1_700_000_000_000 + i, f"key-{i:05d}-" + "x" * 30, (f"key-{i:05d}-" + "x" * 30,))
             for i in range(bf.DEFAULT_BLOCK_RECORDS)]
    compressed, raws, head = _blocks_and_raws(bf.encode_batch(0, LogColumns.of(batch)))
    cut = compressed[0][:-200]
    (tmp_path / "file").write_bytes(cut)
    blocks = bf.BlockLocations(np.array([0]), np.array([len(cut)]), np.array([len(raws[0])]), np.array([zlib.crc32(cut)]),
                               np.array([0]), [head.topics])
    with open(tmp_path / "file", "rb") as f:
        front = bf.read_records(f.fileno(), "file", blocks, np.array([0, 1]), np.array([3]), _short_read)
        assert front == [batch[3]]
        for read, row in ((bf.read_records, len(batch) - 1), (bf.python_read_records, 3)):
            with pytest.raises(CorruptFileError, match="a block does not decode"):
                read(f.fileno(), "file", blocks, np.array([0, 1]), np.array([row]), _short_read)


@given(st.lists(st.lists(st.sampled_from([b"a", b"b", b"c", b"d", b""]), max_size=4, unique=True).map(tuple),
                max_size=30))
def test_numbered_topics_number_each_topic_once_in_order_of_appearance(tables):
    topics, starts, topic_map = bf.numbered_topics(tables)
    in_order = list(dict.fromkeys(topic for table in tables for topic in table))
    assert list(topics) == in_order and list(topics.values()) == list(range(len(in_order)))
    assert len(starts) == len(tables)
    for table, start in zip(tables, starts.tolist()):
        assert [in_order[number] for number in topic_map[start : start + len(table)].tolist()] == list(table)
