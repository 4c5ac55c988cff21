"""The metadata log: rolls, lookups by seq and time, rollback, recovery, rebuilds, bad files."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgindex.errors import CorruptFileError, InvalidAppendError, InvalidOptionError
from msgindex.storage.log import batch_format as bf
from msgindex.storage.log.columns import LogColumns
from msgindex.storage.log.metadata_log import LogPosition, MetadataLog
from msgindex.storage.message import APPEND_SCHEMA, MessageRecord

SEGMENT = 3_000
INTERVAL = 500
INDEX = 4096
BATCH = 40  # records per batch: small, so that 3,000 records make many batches and segments


def make_records(count: int, seed: int = 0, start: int = 0) -> list[MessageRecord]:
    """Records whose timestamps jump around (many partitions' CreateTime on one broker)."""
    rng = random.Random(seed)
    return [
        MessageRecord(
            f"topic-{i % 3}", i % 5, i, 1_000_000 + 10 * i + rng.randint(-3000, 3000),
            None if i % 11 == 0 else f"key-{i}", (f"key-{i}", f"tag-{i % 7}") if i % 2 else (f"key-{i}",),
            i * 100 if i % 4 else -1, 50 + i % 9,
        )
        for i in range(start, start + count)
    ]


def open_log(path: Path, *, writable: bool = True, committed: LogPosition | None = None,
             segment_bytes: int = SEGMENT, max_index_bytes: int = INDEX, batch_records: int = BATCH) -> MetadataLog:
    return MetadataLog.open(path, segment_bytes=segment_bytes, index_interval_bytes=INTERVAL,
                            max_index_bytes=max_index_bytes, writable=writable, committed=committed,
                            batch_records=batch_records)


def encode_records(first_seq: int, records: list[MessageRecord]) -> bytes:
    return bf.encode_batch(first_seq, LogColumns.of(records))


def snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def write_log(path: Path, records: list[MessageRecord]) -> tuple[LogPosition, list]:
    """A log of `records`, flushed and closed: (its position, its segments)."""
    with open_log(path) as log:
        log.append(records)
        log.flush()
        return log.position(), log.segments()


def rows_of(log: MetadataLog, begin=None, end=None, **filters) -> list[dict]:
    rows = []
    for start, stop in log.scan_ranges(begin, end):
        for batch in log.scan_range(start, stop, "b0", begin, end, batch_rows=97, **filters):
            rows.extend(batch.to_pylist())
    return rows


@pytest.fixture
def records():
    return make_records(3000)


@pytest.fixture(params=["compiled", "python"])
def block_reader(request, monkeypatch) -> str:
    """Reads through the compiled block reader (storage/log/_blocks.c) or its Python oracle."""
    if request.param == "python":
        monkeypatch.setattr(bf, "compiled_blocks", None)
    elif bf.compiled_blocks is None:
        pytest.skip("msgindex.storage.log._blocks was not built (no C compiler at install): the Python reader runs")
    return request.param


@pytest.fixture
def full_log(tmp_path, records):
    with open_log(tmp_path / "log") as log:
        log.append(records[:1000])
        log.append(records[1000:])
        log.flush()
        yield log


def test_segments_roll_and_are_named_by_base_seq(full_log, records):
    infos = full_log.segments()
    assert len(infos) > 5
    assert [i.base_seq for i in infos[1:]] == [i.next_seq for i in infos[:-1]]
    assert infos[0].base_seq == 0 and infos[-1].next_seq == len(records) and infos[-1].active
    for info in infos:
        assert info.path.name == f"{info.base_seq:020d}.log"
        assert info.size_bytes <= SEGMENT and info.size_bytes == info.path.stat().st_size
        assert info.base_seq % BATCH == 0  # segments roll between batches
        expected = [r.timestamp_ms for r in records[info.base_seq : info.next_seq]]
        assert (info.min_timestamp, info.max_timestamp) == (min(expected), max(expected))
    names = {p.name for p in full_log.directory.iterdir()}
    for info in infos[:-1]:  # sealed: trimmed indexes and a summary
        stem = f"{info.base_seq:020d}"
        assert {stem + ".index", stem + ".timeindex", stem + ".summary"} <= names
        assert (full_log.directory / (stem + ".index")).stat().st_size % 8 == 0


def test_read_by_seq(full_log, records, block_reader):
    for seq in [0, 1, 2999, *random.Random(1).sample(range(3000), 200)]:
        assert full_log.read(seq) == records[seq]
    wanted = [2999, 0, 17, 17, 1500, 3]
    assert full_log.read_many(wanted) == [records[s] for s in wanted]
    rows = full_log.read_rows(wanted, "b7").to_pylist()
    assert [r["seq"] for r in rows] == wanted and {r["broker"] for r in rows} == {"b7"}
    assert [r["offset"] for r in rows] == [records[s].offset for s in wanted]
    assert rows[1]["commit_log_offset"] is None and rows[2]["commit_log_offset"] == 1700
    with pytest.raises(IndexError, match="3000 is not in the log"):
        full_log.read(3000)


def test_first_seq_at_or_after_with_non_monotonic_timestamps(full_log, records):
    stamps = [r.timestamp_ms for r in records]
    for target in [0, stamps[0], 1_005_000, 1_015_000, max(stamps), max(stamps) + 1,
                   *random.Random(2).sample(range(990_000, 1_040_000), 150)]:
        expected = next((i for i, t in enumerate(stamps) if t >= target), None)
        assert full_log.first_seq_at_or_after(target) == expected, target


@pytest.mark.parametrize(("begin", "end"), [(None, None), (1_010_000, 1_012_000), (None, 1_000_500),
                                            (1_029_000, None), (2_000_000, None), (1_015_000, 1_015_000)])
def test_time_scans_find_every_record_in_the_window(full_log, records, begin, end):
    rows = rows_of(full_log, begin, end)
    expected = [i for i, r in enumerate(records)
                if (begin is None or r.timestamp_ms >= begin) and (end is None or r.timestamp_ms <= end)]
    assert [r["seq"] for r in rows] == expected
    if begin is not None and expected:
        # The time index lets the scan skip what is certainly older than the window.
        first = min(start for start, _ in full_log.scan_ranges(begin, end))
        assert 0 < first <= expected[0] or expected[0] == 0


def test_scan_filters_and_pieces(full_log, records, block_reader):
    rows = rows_of(full_log, topics=["topic-1"], partitions=[2, 3])
    assert [r["seq"] for r in rows] == [i for i, r in enumerate(records)
                                        if r.topic == "topic-1" and r.partition in (2, 3)]
    pieces = full_log.scan_ranges(piece_bytes=1000)
    assert len(pieces) > len(full_log.segments())
    assert [a for a, _ in pieces[1:]] == [b for _, b in pieces[:-1]] and pieces[0][0] == 0


def test_append_arrow_table_and_bad_records(tmp_path, records):
    table = pa.Table.from_pylist(
        [{"topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp_ms": r.timestamp_ms,
          "key": r.key, "keys": list(r.keys), "commit_log_offset": r.commit_log_offset, "size": r.size}
         for r in records[:50]], schema=APPEND_SCHEMA)
    with open_log(tmp_path / "log") as log:
        assert log.append(table) == range(0, 50)
        assert log.read_many(range(50)) == records[:50]
        before = snapshot(tmp_path / "log")
        bad = [records[60], MessageRecord("t", "zero", 0, 0, None, ())]
        with pytest.raises(InvalidAppendError, match="record 1 of the batch: partition='zero'"):
            log.append(bad)
        with pytest.raises(InvalidAppendError, match="lacks column"):
            log.append(table.drop_columns(["keys"]))
        assert snapshot(tmp_path / "log") == before and log.next_seq == 50  # nothing written


def test_rollback_after_rolls_then_rewrite_gives_same_bytes(tmp_path, records):
    with open_log(tmp_path / "a") as log:
        log.append(records[:700])
        log.flush()
        committed = log.position()
        log.append(records[700:2500])  # several rolls past the committed segment
        assert len(log.segments()) > 3
        log.truncate_to(committed)
        assert log.position() == committed and log.next_seq == 700
        assert log.read(699) == records[699]
        log.append(records[700:])
    with open_log(tmp_path / "b") as straight:
        straight.append(records[:700])
        straight.append(records[700:])
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")


def test_reopen_with_committed_position_after_killed_writer(tmp_path, records):
    path = tmp_path / "log"
    log = open_log(path)
    log.append(records[:1234])
    log.flush()
    committed = json.loads(json.dumps(log.position().to_dict()))
    log.append(records[1234:2900])  # never committed; the "process" dies without closing
    for segment in log._segments:
        segment._fd and os.close(segment._fd)
    del log
    with open_log(path, committed=LogPosition.from_dict(committed)) as again:
        assert again.next_seq == 1234 and again.read_many(range(1234)) == records[:1234]
        again.append(records[1234:])
    with open_log(tmp_path / "straight") as straight:  # batches follow append calls: the same calls
        straight.append(records[:1234])
        straight.append(records[1234:])
    assert snapshot(path) == snapshot(tmp_path / "straight")


def test_rollback_to_initial_empties_the_log(tmp_path, records):
    with open_log(tmp_path / "log") as log:
        log.append(records[:900])
        log.truncate_to(LogPosition.initial())
        assert log.next_seq == 0 and len(log.segments()) == 1 and log.segments()[0].size_bytes == 0
        log.append(records[:5])
        assert log.read(4) == records[4]
    with open_log(tmp_path / "log", committed=LogPosition.initial()) as log:
        assert log.next_seq == 0


def test_reader_sees_only_the_committed_prefix_while_writer_appends(tmp_path, records):
    path = tmp_path / "log"
    with open_log(path) as writer:
        writer.append(records[:1500])
        writer.flush()
        committed = writer.position()
        writer.append(records[1500:2600])
        before = snapshot(path)
        with open_log(path, writable=False, committed=committed) as reader:
            assert reader.next_seq == 1500
            assert reader.segments()[-1].size_bytes == committed.segment_bytes
            assert [r["seq"] for r in rows_of(reader)] == list(range(1500))
            assert reader.first_seq_at_or_after(max(r.timestamp_ms for r in records[:1500]) + 1) is None
            writer.append(records[2600:])  # the writer keeps going (and rolls) under the reader
            writer.flush()
            assert reader.read_many([0, 1499]) == [records[0], records[1499]]
            with pytest.raises(IndexError):
                reader.read(1500)
        assert snapshot(path) != before  # (the writer's doing, not the reader's)


def test_reader_never_modifies_files(full_log, records):
    full_log.flush()
    committed = full_log.position()
    before = snapshot(full_log.directory)
    with open_log(full_log.directory, writable=False, committed=committed) as reader:
        rows_of(reader, 1_010_000, 1_011_000)
        reader.read_rows(range(0, 3000, 7), "b")
    with open_log(full_log.directory, writable=False) as reader:  # no checkpoint: recovery in memory
        assert reader.next_seq == 3000
    assert snapshot(full_log.directory) == before


def test_torn_tail_at_every_byte_offset(tmp_path):
    records = make_records(40, seed=4)
    path = tmp_path / "log"
    with open_log(path, segment_bytes=1 << 20) as log:
        log.append(records[:39])
        log.flush()
        committed = log.position()
    segment = path / f"{0:020d}.log"
    good = segment.read_bytes()
    extra = encode_records(39, records[39:40])
    for cut in range(1, len(extra)):
        shutil.copytree(path, tmp_path / "torn", dirs_exist_ok=True)
        (tmp_path / "torn" / segment.name).write_bytes(good + extra[:cut])
        with open_log(tmp_path / "torn", writable=False) as reader:
            assert reader.next_seq == 39, cut
        with open_log(tmp_path / "torn") as recovered:  # Kafka-style: the torn record goes
            assert recovered.next_seq == 39 and recovered.read(38) == records[38]
            assert recovered.position() == committed
        assert (tmp_path / "torn" / segment.name).read_bytes() == good
        shutil.rmtree(tmp_path / "torn")


@pytest.mark.parametrize("damage", ["delete", "garbage", "wrong_size", "zero_length", "truncate"])
@pytest.mark.parametrize("which", ["sealed", "active"])
def test_sparse_index_rebuilt_when_lost_or_corrupt(tmp_path, records, damage, which):
    path = tmp_path / "log"
    committed, infos = write_log(path, records)
    pristine = snapshot(path)
    base = infos[1].base_seq if which == "sealed" else infos[-1].base_seq
    for suffix in (".index", ".timeindex"):
        victim = path / f"{base:020d}{suffix}"
        if damage == "delete":
            victim.unlink()
        elif damage == "garbage":
            victim.write_bytes(random.Random(9).randbytes(max(victim.stat().st_size, 240)))
        elif damage == "wrong_size":
            victim.write_bytes(victim.read_bytes() + b"\x01\x02\x03")
        elif damage == "zero_length":
            victim.write_bytes(b"")
        else:
            victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    if which == "sealed" and damage != "delete":
        with open_log(path, writable=False, committed=committed) as reader:  # rebuilt in memory
            assert reader.read_many(range(0, 3000, 13)) == records[0:3000:13]
            assert [r["seq"] for r in rows_of(reader, 1_010_000, 1_012_000)] == [
                i for i, r in enumerate(records) if 1_010_000 <= r.timestamp_ms <= 1_012_000]
    with open_log(path, committed=committed) as log:
        assert log.read_many(range(0, 3000, 7)) == records[0:3000:7]
    assert snapshot(path) == pristine  # the writer's rebuild gives the very same files


def test_summary_recomputed_when_missing_or_garbage(tmp_path, records):
    path = tmp_path / "log"
    committed, _ = write_log(path, records)
    pristine = snapshot(path)
    (path / f"{0:020d}.summary").unlink()
    summaries = sorted(path.glob("*.summary"))
    summaries[1].write_bytes(b"junk")
    with open_log(path, writable=False, committed=committed) as reader:
        assert reader.segments()[0].min_timestamp == min(r.timestamp_ms for r in records[: reader.segments()[0].next_seq])
    with open_log(path, committed=committed):
        pass
    assert snapshot(path) == pristine


def test_bad_log_files_give_clear_errors(tmp_path, records):
    path = tmp_path / "log"
    committed, infos = write_log(path, records)
    active = infos[-1].path
    active.write_bytes(active.read_bytes()[:-10])  # committed bytes lost
    with pytest.raises(CorruptFileError, match=f"{active}.*committed data lost"):
        open_log(path, writable=False, committed=committed)
    sealed = infos[2].path
    (path / sealed.with_suffix(".summary").name).unlink()
    sealed.write_bytes(b"")  # zero-length sealed segment
    with pytest.raises(CorruptFileError, match=str(sealed)):
        open_log(path, writable=False, committed=committed)
    sealed.write_bytes(random.Random(3).randbytes(5000))  # garbage
    with pytest.raises(CorruptFileError, match=f"{sealed}: invalid batch at byte 0"):
        open_log(path, committed=committed)
    os.unlink(infos[1].path)
    with pytest.raises(CorruptFileError, match="starts at"):
        open_log(path, writable=False)


@pytest.mark.parametrize("field", [0, 5, 9, 13, 17, 25, 33, 41, 50, 54, 58, 62, 70, 82, 120, -1])  # head, blocks
def test_corrupt_batch_detected_on_read(tmp_path, field, block_reader):
    records = make_records(120)
    path = tmp_path / "log"
    with open_log(path, segment_bytes=1 << 20) as log:
        log.append(records)
        committed = log.position()
        victim = log.segments()[0].path
    data = bytearray(victim.read_bytes())
    start = len(encode_records(0, records[:BATCH]))  # the second batch: records 40..79
    second = encode_records(BATCH, records[BATCH : 2 * BATCH])
    length, head_length = len(second), bf.check_head(second, 0, len(second)).header.head_length
    data[start + field % length] ^= 0xFF
    victim.write_bytes(bytes(data))
    with open_log(path, writable=False, committed=committed) as reader:
        with pytest.raises(CorruptFileError, match=f"{victim}: invalid batch at byte {start}"):
            list(reader.scan_range(0, 120, "b"))
        with pytest.raises(CorruptFileError, match=str(victim)):
            reader.read_rows([50], "b")
        with pytest.raises(CorruptFileError, match=str(victim)):
            reader.read_few([50])
        if field % length >= head_length:  # a damaged block harms its batch only
            assert reader.read_many([0, 39, 80, 119]) == [records[i] for i in (0, 39, 80, 119)]
            assert reader.read_few([0, 39, 80, 119]) == [records[i] for i in (0, 39, 80, 119)]
    with pytest.raises(CorruptFileError, match=f"{victim}: invalid batch at byte {start}"):
        open_log(path)  # recovery: a bad batch followed by more batches is not a torn tail


def test_retention_deletes_only_the_oldest(full_log, records):
    infos = full_log.segments()
    with pytest.raises(InvalidOptionError, match="not the oldest"):
        full_log.delete_segment(infos[1].base_seq)
    full_log.delete_segment(infos[0].base_seq)
    assert full_log.start_seq == infos[1].base_seq and not infos[0].path.exists()
    assert full_log.read(infos[1].base_seq) == records[infos[1].base_seq]
    with pytest.raises(IndexError):
        full_log.read(0)
    assert rows_of(full_log)[0]["seq"] == infos[1].base_seq
    while len(full_log.segments()) > 1:
        full_log.delete_segment(full_log.segments()[0].base_seq)
    with pytest.raises(InvalidOptionError):
        full_log.delete_segment(full_log.segments()[0].base_seq)  # never the active one


def test_settings_are_validated(tmp_path):
    with pytest.raises(InvalidOptionError, match="segment_bytes"):
        MetadataLog.open(tmp_path, segment_bytes=2**31, index_interval_bytes=1, writable=True)
    with pytest.raises(InvalidOptionError, match="max_index_bytes"):
        MetadataLog.open(tmp_path, segment_bytes=100, index_interval_bytes=1, max_index_bytes=12, writable=True)
    with pytest.raises(CorruptFileError, match="malformed log position"):
        LogPosition.from_dict({"next_seq": "1", "segment_base": 0, "segment_bytes": 0})


def test_full_sparse_index_rolls_the_segment(tmp_path, records):
    # A tiny index (3 time entries, one kept for the roll) forces rolls long before the size limit.
    with open_log(tmp_path / "log", segment_bytes=1 << 20, max_index_bytes=36) as log:
        log.append(records[:800])
        infos = log.segments()
        assert len(infos) > 3
        assert log.read_many(range(800)) == records[:800]
    with open_log(tmp_path / "log", segment_bytes=1 << 20, max_index_bytes=36, writable=False) as log:
        assert log.next_seq == 800


KILLED_WRITER = textwrap.dedent("""
    import json, sys
    from tests.storage.test_metadata_log import make_records, open_log
    from pathlib import Path
    log = open_log(Path(sys.argv[1]))
    records = make_records(20_000, seed=8)
    start = 0
    while True:
        log.append(records[start:start + 37])
        start += 37
        log.flush()
        print(json.dumps(log.position().to_dict()), flush=True)
""")


def test_writer_killed_mid_batch(tmp_path):
    """kill -9 a writer at random points; rolling back to the last position it reported gives
    exactly the records of that position."""
    rng = random.Random(12)
    expected = make_records(20_000, seed=8)
    root = Path(__file__).resolve().parents[2]
    for trial in range(4):
        path = tmp_path / f"log{trial}"
        writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)], cwd=root,
                                  stdout=subprocess.PIPE, text=True)
        lines = [writer.stdout.readline() for _ in range(rng.randint(3, 40))]
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        writer.stdout.close()
        committed = LogPosition.from_dict(json.loads(lines[-1]))
        with open_log(path, writable=False, committed=committed) as reader:
            assert [r["seq"] for r in rows_of(reader)] == list(range(committed.next_seq))
        with open_log(path, committed=committed) as log:
            assert log.next_seq == committed.next_seq
            assert log.read_many(range(0, log.next_seq, 5)) == expected[0 : log.next_seq : 5]
            log.append(expected[log.next_seq : log.next_seq + 100])
            assert log.read(log.next_seq - 1) == expected[log.next_seq - 1]


operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 60)),
        st.tuples(st.just("commit"), st.just(0)),
        st.tuples(st.just("crash"), st.just(0)),
        st.tuples(st.just("rollback"), st.just(0)),
        st.tuples(st.just("query"), st.integers(0, 2**31)),
        st.tuples(st.just("reader"), st.integers(0, 2**31)),
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations, st.integers(0, 2**16))
def test_log_matches_a_list_model(tmp_path_factory, ops, seed):
    path = tmp_path_factory.mktemp("model")
    pool = make_records(1500, seed=seed)
    rng = random.Random(seed)
    records: list[MessageRecord] = []
    committed_count, committed = 0, LogPosition.initial()
    log = open_log(path, segment_bytes=3000, max_index_bytes=96)
    try:
        for op, arg in ops:
            if op == "append":
                batch = [r for r in pool[len(records) : len(records) + arg]]
                assert log.append(batch) == range(len(records), len(records) + len(batch))
                records += batch
            elif op == "commit":
                log.flush()
                committed, committed_count = log.position(), len(records)
            elif op == "crash":
                log.close()
                log = open_log(path, committed=committed)
                records = records[:committed_count]
            elif op == "rollback":
                log.truncate_to(committed)
                records = records[:committed_count]
            elif op == "reader":  # a reader of the last commit, while the writer holds more
                with open_log(path, writable=False, committed=committed) as reader:
                    assert reader.next_seq == committed_count
                    assert [r["seq"] for r in rows_of(reader)] == list(range(committed_count))
                    if committed_count:
                        seq = arg % committed_count
                        assert reader.read(seq) == records[seq]
            else:
                assert log.next_seq == len(records)
                if records:
                    seqs = [rng.randrange(len(records)) for _ in range(5)]
                    assert log.read_many(seqs) == [records[s] for s in seqs]
                    target = records[arg % len(records)].timestamp_ms + rng.randint(-50, 50)
                    assert log.first_seq_at_or_after(target) == next(
                        (i for i, r in enumerate(records) if r.timestamp_ms >= target), None)
                    lo, hi = sorted((target, target + rng.randint(0, 3000)))
                    assert [r["seq"] for r in rows_of(log, lo, hi)] == [
                        i for i, r in enumerate(records) if lo <= r.timestamp_ms <= hi]
        with open_log(path, writable=False, committed=committed) as reader:
            assert reader.read_many(range(committed_count)) == records[:committed_count]
    finally:
        log.close()


def test_readers_of_later_commits_reuse_walked_heads_but_not_a_rewritten_file(tmp_path):
    records = make_records(900, seed=4)
    path = tmp_path / "log"
    with open_log(path, segment_bytes=1 << 20) as writer:
        writer.append(records[:500])
        writer.flush()
        first = writer.position()
        with open_log(path, writable=False, committed=first) as reader:
            assert reader.read_many([0, 499]) == [records[0], records[499]]  # walks the heads: remembered
        writer.append(records[500:])
        writer.flush()
        second = writer.position()
    with open_log(path, writable=False, committed=second) as reader:
        segment = reader.segment(0)
        calls = []
        check = segment._check_at
        segment._check_at = lambda *args: calls.append(args) or check(*args)
        assert reader.read_many(range(900)) == records
        # one check of the last remembered head, then only the heads written since
        assert len(calls) == 1 + -(-400 // BATCH)
    # the same file (path and inode) rewritten with other records
    other = make_records(900, seed=5)
    with open_log(tmp_path / "other", segment_bytes=1 << 20) as log:
        log.append(other)
        log.flush()
        rewritten = log.position()
    victim = path / "00000000000000000000.log"
    inode = victim.stat().st_ino
    victim.write_bytes((tmp_path / "other" / "00000000000000000000.log").read_bytes())
    assert victim.stat().st_ino == inode
    for suffix in (".index", ".timeindex"):
        (path / f"00000000000000000000{suffix}").write_bytes(
            (tmp_path / "other" / f"00000000000000000000{suffix}").read_bytes())
    with open_log(path, writable=False, committed=rewritten) as reader:
        assert reader.read_many(range(900)) == other

