"""The metadata-log record format: round trips, the batch decoder, torn and corrupt bytes."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msgindex.errors import CorruptFileError, InvalidAppendError
from msgindex.storage.log import record_format as rf
from msgindex.storage.log.record_encoder import encode_records
from msgindex.storage.message import ROW_SCHEMA, MessageRecord, arrow_text

texts = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=20)  # lone surrogates too
records = st.builds(
    MessageRecord,
    topic=texts,
    partition=st.integers(-(2**31), 2**31 - 1),
    offset=st.integers(-(2**63), 2**63 - 1),
    timestamp_ms=st.integers(-(2**40), 2**45),
    key=st.none() | texts,
    keys=st.lists(texts, max_size=4).map(tuple),
    commit_log_offset=st.integers(-1, 2**62),
    size=st.integers(-1, 2**31 - 1),
)


def _expected_row(seq: int, record: MessageRecord, broker: str) -> dict:
    return {
        "broker": broker,
        "topic": arrow_text(record.topic),
        "partition": record.partition,
        "offset": record.offset,
        "key": None if record.key is None else arrow_text(record.key),
        "keys": [arrow_text(k) for k in record.keys],
        "timestamp_us": record.timestamp_ms * 1000,
        "commit_log_offset": None if record.commit_log_offset == -1 else record.commit_log_offset,
        "size": None if record.size == -1 else record.size,
        "seq": seq,
    }


def _rows(batch: pa.RecordBatch) -> list[dict]:
    batch = batch.set_column(6, "timestamp_us", batch.column("timestamp").cast(pa.int64()))
    return batch.to_pylist()


@settings(max_examples=150, deadline=None)
@given(st.lists(records, min_size=1, max_size=12), st.integers(0, 2**40))
def test_round_trip_single_and_batch(batch, first_seq):
    data = encode_records(first_seq, batch)
    positions = rf.walk_records(data, 0, len(data), verify=True, name="mem", first_seq=first_seq)
    assert len(positions) == len(batch)
    for i, position in enumerate(positions):
        assert rf.decode_record(data, position, len(data), "mem") == (first_seq + i, batch[i])
    decoded = rf.decode_batch(data, positions, "broker-1")
    assert decoded.schema.equals(ROW_SCHEMA, check_metadata=True)
    decoded.validate(full=True)  # valid UTF-8 everywhere, even for surrogate-bearing keys
    assert _rows(decoded) == [_expected_row(first_seq + i, r, "broker-1") for i, r in enumerate(batch)]


def test_edge_keys_empty_huge_unicode():
    huge = "k" * (1 << 20)
    record = MessageRecord("t", 0, 1, 2, "", ("", huge, "😀\u0000é", "\udc80raw"), 5, 6)
    data = encode_records(9, [record])
    assert rf.decode_record(data, 0, len(data), "mem") == (9, record)
    row = rf.decode_batch(data, [0], "b").to_pylist()[0]
    assert row["key"] == "" and row["keys"][1] == huge and row["keys"][2] == "😀\u0000é"
    assert row["keys"][3] == "\\x80raw"  # arrow_text rendering of a non-UTF-8 byte


def test_key_absent_differs_from_empty_key():
    data = encode_records(0, [MessageRecord("t", 0, 0, 0, None, ()), MessageRecord("t", 0, 1, 0, "", ())])
    positions = rf.walk_records(data, 0, len(data), verify=True, name="mem")
    assert rf.decode_batch(data, positions, "b").column("key").to_pylist() == [None, ""]


def test_every_truncation_is_a_torn_record():
    data = encode_records(3, [MessageRecord("topic", 1, 2, 3, "key", ("a", "b"))])
    assert rf.check_record(data, 0, len(data), 3) == len(data)
    for cut in range(len(data)):
        problem = rf.check_record(data[:cut], 0, cut, 3)
        assert isinstance(problem, rf.RecordProblem) and problem.torn and problem.position == 0, cut


def test_every_flipped_byte_is_detected():
    data = encode_records(3, [MessageRecord("topic", 1, 2, 3, "key", ("a", "b"))])
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x41
        assert isinstance(rf.check_record(bytes(bad), 0, len(bad), 3), rf.RecordProblem), i


def test_record_in_the_wrong_place_is_detected():
    data = encode_records(3, [MessageRecord("topic", 1, 2, 3, "key", ())])
    problem = rf.check_record(data, 0, len(data), expected_seq=4)
    assert isinstance(problem, rf.RecordProblem) and "sequence number 3" in problem.reason


def test_walk_names_the_file_and_byte():
    data = encode_records(0, [MessageRecord("t", 0, 0, 0, None, ())]) + b"\x07garbage-garbage"
    with pytest.raises(CorruptFileError, match=r"seg\.log: invalid record at byte 65"):
        rf.walk_records(data, 0, len(data), verify=True, name="seg.log")


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (MessageRecord("t", 2**31, 0, 0, None, ()), "record 7 of the batch: partition=2147483648"),
        (MessageRecord("t", 0, 0, 1.5, None, ()), "timestamp_ms=1.5"),
        (MessageRecord(b"t", 0, 0, 0, None, ()), "topic must be str"),
        (MessageRecord("t", 0, 0, 0, 5, ()), "key must be str"),
        (MessageRecord("t", 0, 0, 0, None, "abc"), "keys must be a sequence of str"),
        (MessageRecord("t", 0, 0, 0, None, ("a", None)), "keys item must be str"),
        (MessageRecord("t" * 70000, 0, 0, 0, None, ()), "topic is 70000 bytes"),
        (MessageRecord("t", 0, 0, 0, None, (), size=2**31), "size="),
        (MessageRecord("t", True, 0, 0, None, ()), "partition=True"),
        (MessageRecord("t", 0, 2**63, 0, None, ()), "offset=9223372036854775808"),
    ],
)
def test_invalid_fields_name_the_record(record, message):
    good = [MessageRecord("t", 0, i, 0, None, ()) for i in range(7)]
    with pytest.raises(InvalidAppendError, match=message):
        encode_records(0, [*good, record])
    with pytest.raises(InvalidAppendError, match="record 7 of the batch"):
        encode_records(0, [*good, record])
