"""The batch encoder and the vectorized index rule write exactly what the per-record oracle
(``record_oracle``: the original one-record-at-a-time writer) writes, and reject bad input."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgindex.errors import InvalidAppendError
from msgindex.storage.log import record_encoder
from msgindex.storage.log.metadata_log import MetadataLog
from msgindex.storage.log.record_encoder import encode_batch, encode_records, records_from_table
from msgindex.storage.message import APPEND_SCHEMA, MessageRecord
from tests.storage.record_oracle import encode_record, oracle_log_files

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
        keys=st.lists(texts, max_size=4).map(tuple),
        commit_log_offset=st.integers(-1, 2**62),
        size=st.integers(-1, 2**31 - 1),
    )


def oracle_bytes(first_seq: int, records: list[MessageRecord]) -> bytes:
    return b"".join(encode_record(first_seq + i, r) for i, r in enumerate(records))


def as_table(records: list[MessageRecord], chunks: int = 1) -> pa.Table:
    rows = [{"topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp_ms": r.timestamp_ms,
             "key": r.key, "keys": list(r.keys), "commit_log_offset": r.commit_log_offset, "size": r.size}
            for r in records]
    cut = len(rows) // max(chunks, 1)
    pieces = [rows[:cut], rows[cut:]] if chunks > 1 else [rows]
    return pa.concat_tables([pa.Table.from_pylist(p, schema=APPEND_SCHEMA) for p in pieces])


@settings(max_examples=120, deadline=None)
@given(st.lists(record_strategy(any_text), max_size=30), st.integers(0, 2**40))
def test_batch_encoder_matches_the_per_record_oracle(records, first_seq):
    encoded = encode_batch(first_seq, records)
    assert encoded.payload().tobytes() == oracle_bytes(first_seq, records)
    assert encoded.sizes.tolist() == [len(encode_record(first_seq + i, r)) for i, r in enumerate(records)]
    assert encoded.timestamps.tolist() == [r.timestamp_ms for r in records]


@settings(max_examples=80, deadline=None)
@given(st.lists(record_strategy(utf8_text), min_size=1, max_size=30), st.integers(0, 2**40),
       st.integers(0, 5), st.integers(1, 2))
def test_arrow_input_matches_the_oracle_sliced_and_chunked(records, first_seq, skip, chunks):
    table = as_table(records, chunks).slice(min(skip, len(records)))
    expected = oracle_bytes(first_seq, records[min(skip, len(records)):])
    assert encode_records(first_seq, []) == b""
    assert encode_batch(first_seq, table).payload().tobytes() == expected
    assert encode_batch(first_seq, table.combine_chunks().to_batches()[0] if table.num_rows else table
                        ).payload().tobytes() == expected


def test_numpy_integers_and_str_subclasses_encode_like_plain_values():
    class Name(str):
        pass

    plain = MessageRecord("t", 3, 4, 5, "k", ("a", "b"), 6, 7)
    unusual = MessageRecord(Name("t"), np.int32(3), np.int64(4), np.int64(5), Name("k"), [Name("a"), "b"],
                            np.int64(6), np.int16(7))
    assert encode_records(9, [plain, unusual]) == oracle_bytes(9, [plain, plain])


batch_sizes = st.lists(st.integers(1, 40), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(record_strategy(utf8_text), min_size=1, max_size=160), batch_sizes,
       st.sampled_from([0, 1, 150, 500, 4096]), st.sampled_from([100, 300, 2_000, 20_000, 1 << 30]),
       st.sampled_from([24, 48, 96, 4096]), st.booleans())
def test_log_files_match_the_oracle(tmp_path_factory, records, sizes, interval, segment_bytes, index_bytes,
                                    arrow):
    batches, start = [], 0
    while start < len(records):
        size = sizes[len(batches) % len(sizes)]
        batches.append(records[start : start + size])
        start += size
    directory = tmp_path_factory.mktemp("log")
    with MetadataLog.open(directory, segment_bytes=segment_bytes, index_interval_bytes=interval,
                          max_index_bytes=index_bytes, writable=True) as log:
        for batch in batches:
            log.append(as_table(batch) if arrow else batch)
    written = {p.name: p.read_bytes() for p in directory.iterdir() if not p.name.endswith(".summary")}
    expected = oracle_log_files(batches, segment_bytes=segment_bytes, index_interval_bytes=interval,
                                max_index_bytes=index_bytes)
    assert sorted(written) == sorted(expected)
    for name in expected:
        assert written[name] == expected[name], name

    for path in directory.glob("*index"):  # a rebuild (same state machine, whole segment) agrees too
        path.unlink()
    with MetadataLog.open(directory, segment_bytes=segment_bytes, index_interval_bytes=interval,
                          max_index_bytes=index_bytes, writable=True):
        pass
    rebuilt = {p.name: p.read_bytes() for p in directory.iterdir() if not p.name.endswith(".summary")}
    assert rebuilt == expected


def test_negative_and_equal_timestamps_never_enter_the_time_index(tmp_path):
    # Kafka's running maximum starts at NO_TIMESTAMP (-1): older-than-epoch stamps never raise it.
    stamps = [-5, -1, -1, 0, 0, 7, 3, 7, 9] * 8
    records = [MessageRecord("t", 0, i, ts, None, ("k" * 40,)) for i, ts in enumerate(stamps)]
    with MetadataLog.open(tmp_path, segment_bytes=1 << 20, index_interval_bytes=100, writable=True) as log:
        log.append(records[:5])
        log.append(records[5:])
    expected = oracle_log_files([records[:5], records[5:]], segment_bytes=1 << 20, index_interval_bytes=100,
                                max_index_bytes=10 * 1024 * 1024)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == expected


# ---- bad Arrow input ------------------------------------------------------------------------
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
        encode_batch(0, mutate(as_table(GOOD)))


def test_bad_record_leaves_nothing_encoded_and_names_it(tmp_path):
    bad = [*GOOD, "not a record"]
    with MetadataLog.open(tmp_path, segment_bytes=1 << 20, index_interval_bytes=100, writable=True) as log:
        with pytest.raises(InvalidAppendError, match="record 5 of the batch is a str"):
            log.append(bad)
        with pytest.raises(InvalidAppendError, match="record 1 of the batch: topic is 70000 bytes"):
            log.append([GOOD[0], MessageRecord("t" * 70_000, 0, 0, 0, None, ())])
        assert log.next_seq == 0 and log.position().segment_bytes == 0


def test_arrow_input_without_a_schema_dictionary_topics_and_integer_widths():
    # from_pylist infers null (all keys None), list<null> (all key lists empty) and int64 columns.
    records = [MessageRecord("orders", p, p, 10 + p, None, (), -1, -1) for p in range(3)]
    inferred = pa.Table.from_pylist([{"topic": r.topic, "partition": r.partition, "offset": r.offset,
                                      "timestamp_ms": r.timestamp_ms, "key": None, "keys": [],
                                      "commit_log_offset": -1, "size": -1, "extra": "ignored"} for r in records])
    assert inferred.schema.field("key").type == pa.null()
    assert encode_batch(4, inferred).payload().tobytes() == oracle_bytes(4, records)
    dictionary = with_column(as_table(GOOD), "topic", pa.array(["t"] * 5).dictionary_encode())
    assert encode_batch(0, dictionary).payload().tobytes() == oracle_bytes(0, GOOD)


def test_huge_batches_are_encoded_in_chunks_with_the_same_bytes(monkeypatch, tmp_path):
    monkeypatch.setattr(record_encoder, "CHUNK_RECORDS", 7)
    records = [MessageRecord(f"t{i % 3}", i % 5, i, 1000 + 37 * (i % 11), None if i % 4 == 0 else f"k{i}",
                             tuple(f"x{j}" for j in range(i % 4)), i, i % 9 - 1) for i in range(250)]
    for batch in (records, as_table(records).slice(3)):
        expected = records if batch is records else records[3:]
        encoded = encode_batch(11, batch)
        assert encoded.payload().tobytes() == oracle_bytes(11, expected)
        assert encoded.sizes.tolist() == [len(encode_record(11 + i, r)) for i, r in enumerate(expected)]
    with pytest.raises(InvalidAppendError, match="record 23 of the batch: topic is 70000 bytes"):
        encode_batch(0, [*records[:23], MessageRecord("t" * 70_000, 0, 0, 0, None, ())])
    with MetadataLog.open(tmp_path, segment_bytes=3000, index_interval_bytes=200, writable=True) as log:
        log.append(records)
    expected_files = oracle_log_files([records], segment_bytes=3000, index_interval_bytes=200,
                                      max_index_bytes=10 * 1024 * 1024)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.suffix != ".summary"} == expected_files


@settings(max_examples=40, deadline=None)
@given(st.lists(record_strategy(utf8_text), max_size=20), st.integers(0, 3), st.integers(1, 2))
def test_records_from_table_round_trips(records, skip, chunks):
    table = as_table(records, chunks).slice(min(skip, len(records)))
    assert records_from_table(table) == records[min(skip, len(records)):]


def test_records_from_table_passes_nulls_through_to_the_append_check():
    table = with_column(as_table(GOOD), "offset", pa.array([0, None, 0, 0, 0], pa.int64()))
    table = with_column(table, "keys", pa.array([["a"], None, [], ["b", "c"], []], pa.list_(pa.string())))
    rows = records_from_table(table)
    assert rows[1].offset is None and rows[1].keys is None and rows[3].keys == ("b", "c")
    with pytest.raises(InvalidAppendError, match="record 1 of the batch: keys must be"):
        encode_batch(0, rows)
