"""The pipeline's parts without Spark or Kafka: partition -> broker map, quarantine files, index
ownership, key extraction, shard owners and their lock waits, the job's flag checks."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from msgindex.cli import index as index_job
from msgindex.errors import CorruptFileError, IndexInUseError, InvalidOptionError, ShardLockedError
from msgindex.spark.pipeline import job as pipeline
from msgindex.spark.pipeline.kafka_records import KEY_RAW, KEYS_HEADERS, UNIQ_HEADERS, records_to_append
from msgindex.spark.pipeline.ownership import IndexClaim, JobIdentity
from msgindex.spark.pipeline.partition_brokers import FILE_NAME, PartitionBrokerMap
from msgindex.spark.pipeline.quarantine import committed_ranges, read_quarantine, write_quarantine
from msgindex.spark.pipeline.shard_owner import append_to_shard, forget_writers
from msgindex.spark.pipeline.spark_checkpoint import batch_end_offsets as spark_batch_end_offsets
from msgindex.spark.pipeline.spark_checkpoint import clear_interrupted_first_batch, local_path
from msgindex.storage.location import parse_location
from msgindex.storage.message import MessageRecord
from msgindex.storage.root_files import root_files
from msgindex.storage.source_ranges import SourceRows
from msgindex.storage.store import StoreSettings, open_store

SMALL = StoreSettings(hash_slot_num=17, index_num=50, segment_bytes=4096)


def test_partition_broker_map_only_grows_and_survives_reopen(tmp_path):
    brokers = PartitionBrokerMap(tmp_path)
    assert brokers.extend({("t", 0): "1", ("t", 1): "2"}) == {("t", 0): "1", ("t", 1): "2"}
    # a leader change later must not move a partition to another shard
    assert brokers.extend({("t", 0): "3", ("u", 0): "3"}) == {("u", 0): "3"}
    assert PartitionBrokerMap(tmp_path).as_dict() == {("t", 0): "1", ("t", 1): "2", ("u", 0): "3"}
    assert PartitionBrokerMap(tmp_path).missing([("t", 1), ("v", 0)]) == {("v", 0)}


@pytest.mark.parametrize("content", ["{", "[]", '{"format_version": 1}', '{"format_version": 9, "topics": {}}',
                                     '{"format_version": 1, "topics": {"t": {"x": "1"}}}',
                                     '{"format_version": 1, "topics": {"t": {"-1": "1"}}}',
                                     '{"format_version": 1, "topics": {"t": {"0": "../b"}}}',
                                     '{"format_version": 1, "topics": {"t": {"0": 7}}}', "\0" * 40])
def test_partition_broker_map_corrupt_file_is_named(tmp_path, content):
    (tmp_path / FILE_NAME).write_text(content)
    with pytest.raises(CorruptFileError, match=FILE_NAME):
        PartitionBrokerMap(tmp_path)


def _bad_rows(values: list[bytes | None], first_offset: int = 0, partition: int = 0) -> pa.Table:
    n = len(values)
    return pa.table({"src_topic": ["meta"] * n, "src_partition": pa.array([partition] * n, pa.int32()),
                     "src_offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
                     "src_timestamp_ms": pa.array([5] * n, pa.int64()), "raw_value": pa.array(values, pa.binary())})


def test_quarantine_is_exactly_once_by_source_offsets_and_read_back(tmp_path):
    rows = _bad_rows([b"{oops", b"\xff", None])
    first = write_quarantine(tmp_path, 3, rows, ["bad json", "not utf-8", "null"])
    assert (first.written, first.already) == (3, 0)
    again = write_quarantine(tmp_path, 9, rows, ["bad json", "not utf-8", "null"])  # a replay, or a new checkpoint
    assert (again.written, again.already) == (0, 3)
    mixed = write_quarantine(tmp_path, 4, _bad_rows([b"old", b"x"], first_offset=2), ["r", "r"])  # offset 2 is in
    assert (mixed.written, mixed.already) == (1, 1)
    assert committed_ranges(tmp_path).to_json() == {"meta": {"0": [[0, 4]]}}
    table = read_quarantine(tmp_path).to_pylist()
    assert [(r["batch_id"], r["offset"], r["reason"], r["value"], r["value_base64"]) for r in table] == [
        (3, 0, "bad json", "{oops", "e29vcHM="), (3, 1, "not utf-8", None, "/w=="), (3, 2, "null", None, None),
        (4, 3, "r", "x", "eA==")]
    assert len(read_quarantine(tmp_path / "missing")) == 0


def test_quarantine_reads_legacy_batch_files_as_set_aside(tmp_path):
    import json

    line = {"batch_id": 1, "reason": "r", "source": {"topic": "meta", "partition": 0, "offset": 7, "timestamp_ms": 5},
            "value": "x", "value_base64": "eA=="}
    (tmp_path / "batch-00000000000000000001-malformed.jsonl").write_text(json.dumps(line) + "\n")
    result = write_quarantine(tmp_path, 2, _bad_rows([b"a", b"x"], first_offset=6), ["r", "r"])
    assert (result.written, result.already) == (1, 1)
    assert [r["offset"] for r in read_quarantine(tmp_path).to_pylist()] == [6, 7]


def test_one_job_per_index_at_a_time(tmp_path):
    first = JobIdentity.current("q1", "/ck/1")
    with IndexClaim(tmp_path, first):
        running = f"another job right now \\(host {first.host} pid {first.pid}, query 'q1', checkpoint /ck/1"
        with pytest.raises(IndexInUseError, match=running):
            with IndexClaim(tmp_path, JobIdentity.current("q2", "file:///ck/2")):
                pass
    with IndexClaim(tmp_path, JobIdentity.current("q2", "hdfs://nn/ck/2")):  # free again; any checkpoint location
        pass


@pytest.mark.parametrize(("written", "run"), [
    ("from_avro(value, '{\"a\": \"b,c\"}').id", "from_avro(value, '{\"a\": \"b,c\"}', map('mode', 'PERMISSIVE')).id"),
    ("FROM_AVRO ( substring(value, 6), 's' ).x", "FROM_AVRO ( substring(value, 6), 's' , map('mode', 'PERMISSIVE')).x"),
    ("from_avro(value, 's', map('mode', 'FAILFAST')).x", "from_avro(value, 's', map('mode', 'FAILFAST')).x"),  # as written
    ("concat(from_avro(key, 'it\\'s, (').y, from_avro(value, r's\\').z)",
     "concat(from_avro(key, 'it\\'s, (', map('mode', 'PERMISSIVE')).y, from_avro(value, r's\\', map('mode', 'PERMISSIVE')).z)"),
    ("from_avro(from_avro(value, 'a').b, 'c')",
     "from_avro(from_avro(value, 'a', map('mode', 'PERMISSIVE')).b, 'c', map('mode', 'PERMISSIVE'))"),
    # not from_avro calls: another function, a string, a backquoted name, a comment
    ("my_from_avro(value, 's')", "my_from_avro(value, 's')"),
    ("concat('from_avro(a, b)', `from_avro(c, d)`) /* from_avro(e, f) */ -- from_avro(g, h)",
     "concat('from_avro(a, b)', `from_avro(c, d)`) /* from_avro(e, f) */ -- from_avro(g, h)"),
    ("get_json_object(CAST(value AS STRING), '$.order.id')", "get_json_object(CAST(value AS STRING), '$.order.id')"),
])
def test_from_avro_without_options_runs_permissive(written, run):
    from msgindex.spark.pipeline.field_values import permissive_avro

    assert permissive_avro(written) == run


def test_record_keys_follow_the_spec():
    table = pa.table({
        "topic": ["t"] * 6, "partition": pa.array([0] * 6, pa.int32()), "offset": pa.array(range(6), pa.int64()),
        "timestamp_ms": pa.array([7] * 6, pa.int64()),
        KEY_RAW: pa.array([b"k", None, b"", "ключ".encode(), b"\xff\xfe", b"a b"], pa.binary()),
        KEYS_HEADERS: pa.array([[b" x  k y "], [b"h"], None, [], [b"\xff z"], [b"", None]], pa.list_(pa.binary())),
        UNIQ_HEADERS: pa.array([[b"U"], [], [b"u2"], ["ключ".encode()], [], [b""]], pa.list_(pa.binary())),
    })
    records, unkeyed, _ = records_to_append(table)
    assert [r.keys for r in records] == [("k", "x", "y", "U"), ("h",), ("u2",), ("ключ",),
                                         ("\udcff\udcfe", "\udcff", "z"), ("a b",)]
    assert [r.key for r in records] == ["k", None, "", "ключ", "\udcff\udcfe", "a b"]
    assert unkeyed == 2
    assert records[0] == MessageRecord("t", 0, 0, 7, "k", ("k", "x", "y", "U"))


@pytest.mark.parametrize("with_headers", [False, True])
def test_utf8_records_are_appended_as_arrow_with_the_same_keys(with_headers):
    from msgindex.spark.pipeline.kafka_records import _message_records
    from msgindex.storage.log.metadata_log import records_from_table
    from msgindex.storage.message import APPEND_SCHEMA

    rows = 6
    table = pa.table({
        "topic": ["t", "u"] * 3, "partition": pa.array(range(rows), pa.int32()),
        "offset": pa.array(range(10, 10 + rows), pa.int64()), "timestamp_ms": pa.array([7] * rows, pa.int64()),
        KEY_RAW: pa.array([b"k", None, b"", "ключ".encode(), b"k", b"a b"], pa.binary()),
        KEYS_HEADERS: pa.array([[b" x  k y "], [b"h"], None, [], [], [b"", None]] if with_headers else [[]] * rows,
                               pa.list_(pa.binary())),
        UNIQ_HEADERS: pa.array([[b"U"], [], [b"u2"], ["ключ".encode()], [], [b""]] if with_headers else [None] * rows,
                               pa.list_(pa.binary())),
    })
    appended, unkeyed, _ = records_to_append(table)
    assert isinstance(appended, pa.Table) and appended.schema == APPEND_SCHEMA
    expected, expected_unkeyed = _message_records(table)
    assert records_from_table(appended) == expected and unkeyed == expected_unkeyed == 2


def test_non_utf8_keys_fall_back_to_message_records():
    table = pa.table({
        "topic": ["t"], "partition": pa.array([0], pa.int32()), "offset": pa.array([0], pa.int64()),
        "timestamp_ms": pa.array([7], pa.int64()), KEY_RAW: pa.array([b"ok"], pa.binary()),
        KEYS_HEADERS: pa.array([[b"\xff"]], pa.list_(pa.binary())), UNIQ_HEADERS: pa.array([[]], pa.list_(pa.binary())),
    })
    appended, _, _ = records_to_append(table)
    assert isinstance(appended, list) and appended[0].keys == ("ok", "\udcff")


def test_shard_append_waits_for_the_lock_then_skips_what_is_committed(tmp_path):
    store = open_store(tmp_path / "index", create=True, settings=SMALL)
    root = str(store.root)
    records = [MessageRecord("t", 0, n, 1000 + n, f"k{n}", (f"k{n}",)) for n in range(5)]
    sources = SourceRows.of(["t"] * 5, [0] * 5, list(range(5)))
    holder = store.writer("b1")  # another attempt of the same task, still writing
    try:
        with pytest.raises(ShardLockedError, match="waiting"):
            append_to_shard(root, "b1", records, sources, lock_timeout_s=0.3, adopt_legacy_offsets=True)
        releaser = threading.Timer(0.3, holder.close)
        releaser.start()
        started = time.monotonic()
        first = append_to_shard(root, "b1", records, sources, lock_timeout_s=10, adopt_legacy_offsets=True).result
        assert time.monotonic() - started >= 0.25 and (first.appended, first.already_committed) == (5, 0)
        second = append_to_shard(root, "b1", records, sources, lock_timeout_s=10, adopt_legacy_offsets=True).result
        assert (second.appended, second.already_committed) == (0, 5)  # the speculative copy
        assert store.lookup("k3").column("offset").to_pylist() == [3]
    finally:
        holder.close()
        forget_writers()


def test_batch_end_offsets_from_sparks_offset_log(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "4").write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":12,"1":30},"u":{"0":1}}\n')
    assert spark_batch_end_offsets(tmp_path, 4) == {("t", 0): 12, ("t", 1): 30, ("u", 0): 1}
    assert spark_batch_end_offsets(tmp_path.as_uri(), 4) == {("t", 0): 12, ("t", 1): 30, ("u", 0): 1}
    assert spark_batch_end_offsets(tmp_path, 5) == {}
    assert spark_batch_end_offsets("hdfs://nn/ck", 4) == {} and local_path("s3a://b/ck") is None


def test_an_unfinished_first_offset_entry_is_cleared_and_nothing_else(tmp_path):
    """A job SIGKILLed while Spark wrote its first offset-log entry leaves only Spark's temporary
    files (Spark then refuses the checkpoint: STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY)."""
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    unfinished = [".0.ab33f013-09b3-490e-9f66-76274724a391.tmp", "..0.ab33f013-09b3-490e-9f66-76274724a391.tmp.crc"]
    for name in unfinished:
        (offsets / name).write_bytes(b"")
    assert clear_interrupted_first_batch(str(tmp_path)) == sorted(unfinished)
    assert list(offsets.iterdir()) == []
    # an entry exists (Spark ignores temporary files then), or something else is there: untouched
    for others in (["0"], ["notes.txt"]):
        for name in [*unfinished, *others]:
            (offsets / name).write_bytes(b"v1\n")
        assert clear_interrupted_first_batch(tmp_path.as_uri()) == []
        assert sorted(p.name for p in offsets.iterdir()) == sorted([*unfinished, *others])
        for p in offsets.iterdir():
            p.unlink()
    assert clear_interrupted_first_batch("s3a://b/ck") == [] and clear_interrupted_first_batch(str(tmp_path / "x")) == []


def test_batch_end_offsets_from_an_offset_log_in_a_bucket(s3):
    """An s3a:// checkpoint is read with msgindex's own client (the lag of every batch line)."""
    checkpoint = s3.url("ck").replace("s3://", "s3a://")
    files = root_files(parse_location(checkpoint, s3.options))
    files.replace("offsets/4", b'v1\n{"batchWatermarkMs":0}\n{"t":{"0":12,"1":30}}\n')
    assert spark_batch_end_offsets(checkpoint, 4, storage_options=s3.options) == {("t", 0): 12, ("t", 1): 30}
    assert spark_batch_end_offsets(checkpoint, 5, storage_options=s3.options) == {}


BASE = ["--bootstrap-servers", "127.0.0.1:1", "--path"]


@pytest.mark.parametrize("extra, message", [
    (["--subscribe", "a", "--retention-ms", "soon"], "--retention-ms 'soon' is not a duration"),
    (["--subscribe", "a", "--retention-bytes", "lots"], "--retention-bytes 'lots' is not a size"),
    (["--subscribe", "a", "--retention-interval", "0"], "--retention-interval"),
    (["--subscribe", "a", "--remote", "http://h:1"], "sc://HOST:PORT"),
    (["--subscribe", "a", "--remote", "sc://h:1", "--master", "local[1]"], "drop --master and --conf"),
    (["--subscribe", " , "], "names no topic"),
    (["--subscribe-pattern", "("], "not a regular expression"),
    (["--subscribe", "a", "--starting-offsets", "yesterday"], "--starting-offsets"),
    (["--subscribe", "a", "--max-offsets-per-trigger", "0"], "--max-offsets-per-trigger"),
    (["--subscribe", "a", "--trigger-interval", "soon"], "--trigger-interval"),
    (["--subscribe", "a", "--kafka-option", "novalue"], "KEY=VALUE"),
    (["--subscribe", "a", "--kafka-option", "bootstrap.servers=x"], "use --bootstrap-servers"),
    (["--subscribe", "a", "--min-partitions", "0"], "--min-partitions"),
    (["--subscribe", "a", "--conf", "executor.memory=1g"], "spark.KEY=VALUE"),
    (["--subscribe", "a", "--conf", "spark.x"], "spark.KEY=VALUE"),
])
def test_job_rejects_bad_flag_values(tmp_path, extra, message):
    args = index_job.build_parser().parse_args([*BASE, str(tmp_path), *extra])
    with pytest.raises(InvalidOptionError, match=message):
        index_job.options_from_args(args)


@pytest.mark.parametrize("extra", [
    ["--subscribe", "a", "--subscribe-pattern", "b"],
    ["--subscribe", "a", "--available-now", "--trigger-interval", "1 second"],
    ["--subscribe", "a", "--no-such-flag"],
    ["--subscribe", "a", "--input", "payloads"],
    [],
])
def test_job_rejects_unknown_and_contradictory_flags(tmp_path, extra, capsys):
    with pytest.raises(SystemExit) as exited:
        index_job.build_parser().parse_args([*BASE, str(tmp_path), *extra])
    assert exited.value.code == 2 and "error:" in capsys.readouterr().err


def test_sizing_flags_must_match_an_existing_index(tmp_path):
    open_store(tmp_path / "ix", create=True, settings=SMALL).close()
    args = index_job.build_parser().parse_args([*BASE, str(tmp_path / "ix"), "--subscribe", "a", "--hash-slots", "99"])
    with pytest.raises(InvalidOptionError, match="hash_slot_num=99 \\(store has 17\\)"):
        pipeline.open_index(index_job.options_from_args(args))
    same = index_job.build_parser().parse_args([*BASE, str(tmp_path / "ix"), "--subscribe", "a", "--hash-slots", "17"])
    assert pipeline.open_index(index_job.options_from_args(same)).settings == SMALL


def test_cli_exposes_the_job(tmp_path, capsys):
    from msgindex.cli import main

    code = main(["index", *BASE, str(tmp_path), "--subscribe", "a", "--retention-ms", "soon"])
    assert code == 2 and capsys.readouterr().err.strip().splitlines() == [
        "msgindex index: --retention-ms 'soon' is not a duration: use e.g. 7d, 12h, 1h30m, 45s, 500ms"]


def test_sigterm_and_sigint_request_a_graceful_stop():
    import os
    import signal

    with pipeline._StopOnSignal() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not stop.requested.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stop.requested.is_set()
        with pytest.raises(KeyboardInterrupt):  # a second signal: stop at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) is not stop._handle


def test_a_lost_gateway_is_printed_unless_a_stop_was_asked_for():
    """Py4J logs "Exception while sending command." to the root logger, traceback and all, when
    the JVM's end of a call closes: after a signal to the whole process group that is the JVM
    stopping with the driver (a stop that exited 0 but printed a traceback, seen in CI); before
    one, a failure worth printing."""
    import logging
    import sys

    from py4j.protocol import Py4JNetworkError

    def record_of(error: BaseException) -> logging.LogRecord:
        try:
            raise error
        except BaseException:
            return logging.LogRecord("root", logging.ERROR, __file__, 1, "Exception while sending command.", None,
                                     sys.exc_info())

    stopping = threading.Event()
    quiet = pipeline._LostGatewayAfterStop(stopping)
    lost = record_of(Py4JNetworkError("Error while sending or receiving"))
    reset = record_of(ConnectionResetError(104, "Connection reset by peer"))
    closing = record_of(OSError(107, "Transport endpoint is not connected"))
    other = record_of(ValueError("a bug"))
    assert quiet.filter(lost) and quiet.filter(reset) and quiet.filter(closing) and quiet.filter(other)
    stopping.set()
    assert not quiet.filter(lost) and not quiet.filter(reset) and not quiet.filter(closing)
    assert quiet.filter(other)
    assert quiet.filter(logging.LogRecord("root", logging.WARNING, __file__, 1, "no exception", None, None))


def _records_task_rows(offsets: list[int], slices: list[int], partition: int = 0, broker: str = "1") -> pa.RecordBatch:
    n = len(offsets)
    return pa.RecordBatch.from_pydict({
        "broker": [broker] * n, "topic": ["t"] * n, "partition": pa.array([partition] * n, pa.int32()),
        "offset": pa.array(offsets, pa.int64()), "timestamp_ms": pa.array([1000 + o for o in offsets], pa.int64()),
        KEY_RAW: pa.array([f"k{o}".encode() for o in offsets], pa.binary()),
        KEYS_HEADERS: pa.array([[]] * n, pa.list_(pa.binary())), UNIQ_HEADERS: pa.array([[]] * n, pa.list_(pa.binary())),
        "slice": pa.array(slices, pa.int64()),
        "reason": pa.array([None] * n, pa.string()), "raw_value": pa.array([None] * n, pa.binary()),
    })


def test_a_task_commits_each_source_slice_as_its_own_range(tmp_path):
    """A coalesced task holding two non-adjacent slices of one partition (minPartitions split it,
    another task has the middle) must not commit the middle: the other task's rows still land."""
    from msgindex.spark.pipeline.commits import COMMIT_ARROW_SCHEMA
    from msgindex.spark.pipeline.task_writer import SinkConfig, write_task

    root = tmp_path / "ix"
    open_store(root, create=True, settings=SMALL).close()
    config = SinkConfig(str(root), "records", str(tmp_path / "q"))
    try:
        first = list(write_task(config, 0, [_records_task_rows([0, 1, 2], [0] * 3), _records_task_rows([6, 7], [2] * 2)]))
        assert first[0].schema == COMMIT_ARROW_SCHEMA
        assert first[0].to_pylist()[0] | {"write_ms": 0} == {"broker": "1", "appended": 5, "already_committed": 0,
            "keys_indexed": 5, "unkeyed": 0, "quarantined": 0, "quarantined_before": 0, "attempt": 0, "task": 0,
            "write_ms": 0, "deleted_segments": 0, "deleted_index_files": 0, "deleted_bytes": 0, "requests": 0,
            "field_counts": ""}
        middle = list(write_task(config, 0, [_records_task_rows([3, 4, 5], [1] * 3)]))[0].to_pylist()[0]
        assert (middle["appended"], middle["already_committed"]) == (3, 0)
        again = list(write_task(config, 5, [_records_task_rows(list(range(8)), [0] * 8)]))[0].to_pylist()[0]
        assert (again["appended"], again["already_committed"]) == (0, 8)  # e.g. a new checkpoint from earliest
        with open_store(root) as store:
            assert store.lookup([f"k{o}" for o in range(8)]).num_rows == 8
            with store.reader("1") as reader:
                assert reader.committed_ranges.to_json() == {"t": {"0": [[0, 8]]}}
    finally:
        forget_writers()


@pytest.mark.parametrize("kind", ["local", "object"])
def test_a_batch_counts_what_any_attempt_of_a_task_committed(kind, tmp_path, monkeypatch, request):
    """Attempts of one task interleave chunk by chunk (a speculative copy, a retry after the first
    died mid-task) and Spark keeps one attempt's result: the batch still counts each record it
    committed as new once, and what earlier runs committed as already committed."""
    from msgindex.spark.pipeline import task_writer
    from msgindex.spark.pipeline.attempt_counts import AttemptMarkers
    from msgindex.spark.pipeline.commits import commit_of_row, with_committed

    options = None
    if kind == "local":
        root = str(tmp_path / "ix")
        open_store(root, create=True, settings=SMALL).close()
    else:
        s3 = request.getfixturevalue("s3")
        root, options = s3.url("ix"), s3.options
        open_store(root, create=True, storage_options=options).close()
    monkeypatch.setattr(task_writer, "APPEND_ROWS", 3)
    config = task_writer.SinkConfig(root, "records", str(tmp_path / "q"),
                                    storage_options=tuple(sorted((options or {}).items())))
    chunks = [_records_task_rows([0, 1, 2, 3], [0] * 4), _records_task_rows([4, 5, 6, 7], [0] * 4),
              _records_task_rows([8, 9, 10, 11], [0] * 4)]

    def dies_after_two(batches):
        yield from batches[:2]
        raise RuntimeError("executor lost")

    try:
        list(task_writer.write_task(config, 0, chunks[:1], None))  # an earlier run committed offsets 0-3
        markers = AttemptMarkers(root, "run-1", options)
        with pytest.raises(RuntimeError):  # attempt 0 commits chunks 0 and 1 (4-7 new), dies before chunk 2
            list(task_writer.write_task(config, 0, dies_after_two(chunks), markers))
        accepted = [commit_of_row(row) for batch in task_writer.write_task(config, 0, chunks, markers)
                    for row in batch.to_pylist()]  # attempt 1: commits chunk 2, finds the rest committed
        assert [(c.appended, c.already_committed) for c in accepted] == [(4, 8)]
        counted = {key: (c.appended, c.keys_indexed) for key, c in markers.committed().items()}
        assert counted == {(0, "1"): (8, 8)}  # 4-7 by attempt 0, 8-11 by attempt 1
        corrected = with_committed(accepted[0], *counted[(0, "1")])
        assert (corrected.appended, corrected.already_committed, corrected.keys_indexed) == (8, 4, 8)
        markers.clear()
        assert markers.committed() == {}
        again = AttemptMarkers(root, "run-2", options)  # a replay of the batch: nothing new any more
        replay = [commit_of_row(row) for batch in task_writer.write_task(config, 0, chunks, again)
                  for row in batch.to_pylist()]
        assert again.committed() == {} and (replay[0].appended, replay[0].already_committed) == (0, 12)
        with open_store(root, storage_options=options) as store:
            assert store.lookup([f"k{o}" for o in range(12)]).num_rows == 12
    finally:
        forget_writers()


def test_session_leaves_cluster_settings_to_the_user(monkeypatch):
    from msgindex.spark.runtime.session import session_conf

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    local = session_conf("x", None, None, user_conf={})
    assert local["spark.master"] == "local[2]" and local["spark.driver.host"] == "127.0.0.1"
    assert local["spark.pyspark.python"] and local["spark.sql.session.timeZone"] == "UTC"
    # spark-submit / spark-defaults.conf named a cluster: no master, no loopback, no interpreter override
    cluster = session_conf("x", None, None, user_conf={"spark.master": "spark://h:7077", "spark.pyspark.python": "/opt/py",
                                                       "spark.jars": "/u.jar", "spark.driver.memory": "4g"})
    assert "spark.master" not in cluster and "spark.driver.host" not in cluster and "spark.driver.bindAddress" not in cluster
    assert "spark.pyspark.python" not in cluster and "spark.driver.memory" not in cluster
    assert cluster["spark.jars"].split(",")[-1] == "/u.jar"
    # explicit settings (--master, --conf) win over everything; PYSPARK_PYTHON is never overridden
    monkeypatch.setenv("PYSPARK_PYTHON", "/env/python")
    explicit = session_conf("x", "spark://o:1", {"spark.driver.host": "10.0.0.1", "spark.sql.session.timeZone": "UTC"},
                            user_conf={"spark.master": "spark://h:7077"})
    assert explicit["spark.master"] == "spark://o:1" and explicit["spark.driver.host"] == "10.0.0.1"
    assert "spark.pyspark.python" not in session_conf("x", "local[1]", None, user_conf={})


def test_user_spark_conf_reads_spark_defaults_and_submit_args(tmp_path, monkeypatch):
    from msgindex.spark.runtime import session
    from msgindex.spark.runtime.session import user_spark_conf

    monkeypatch.setattr(session, "_running_jvm_conf", dict)  # this test's own settings only, not a running JVM's
    (tmp_path / "spark-defaults.conf").write_text("# comment\nspark.master  spark://d:7077\nspark.executor.memory=2g\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--conf spark.executor.cores=3 --jars /a.jar pyspark-shell")
    monkeypatch.delenv("MASTER", raising=False)
    conf = user_spark_conf()
    assert conf["spark.master"] == "spark://d:7077" and conf["spark.executor.memory"] == "2g"
    assert conf["spark.executor.cores"] == "3" and conf["spark.jars"] == "/a.jar"


def test_old_shards_are_upgraded_for_records_and_refused_for_metadata(tmp_path):
    from msgindex.errors import LegacyCheckpointError
    from tests.storage.shard_model import downgrade_to_version_1

    with open_store(tmp_path / "ix", create=True, settings=SMALL) as store:
        with store.writer("b") as writer:
            writer.append([MessageRecord("t", 0, n, 1000, f"k{n}", (f"k{n}",)) for n in (0, 1, 2, 4)])
        downgrade_to_version_1(store.root / "broker=b" / "checkpoint")
        with pytest.raises(LegacyCheckpointError, match="shard 'b' was written by an older msgindex.*new --path"):
            pipeline.upgrade_legacy_shards(store, "metadata")
        assert pipeline.upgrade_legacy_shards(store, "records") == ["b"]
        assert pipeline.upgrade_legacy_shards(store, "records") == []
        with store.reader("b") as reader:
            assert reader.committed_ranges.to_json() == {"t": {"0": [[0, 3], [4, 5]]}}


def test_the_foreach_batch_function_is_picklable_and_lock_free(tmp_path):
    """Spark Connect runs the foreachBatch function in a server-side process: it must pickle."""
    from pyspark import cloudpickle

    from msgindex.spark.pipeline.sink import BatchWriter, KafkaSource, SinkConfig

    open_store(tmp_path / "ix", create=True, settings=SMALL).close()
    writer = BatchWriter(SinkConfig(str(tmp_path / "ix"), "records", str(tmp_path / "q")),
                         source=KafkaSource("127.0.0.1:1", subscribe=("a",)), parallelism=2,
                         claim=JobIdentity.current("q", "/ck"))
    assert writer.partition_brokers.as_dict() == {}
    copy = cloudpickle.loads(cloudpickle.dumps(writer))
    assert copy.config == writer.config and copy.parallelism == 2 and copy.source == writer.source
    assert copy._partition_brokers is None  # read again where the batches run


@pytest.mark.spark
def test_a_batch_asks_kafka_for_leaders_only_when_its_offset_log_entry_names_a_new_partition(spark, tmp_path,
                                                                                           monkeypatch):
    """Leaders come from Kafka only for partitions without a recorded shard; which partitions a
    batch has is read from Spark's offset log (asking Kafka on every batch cost ~0.3 s of a 1 s
    trigger)."""
    from msgindex.spark.pipeline.sink import BatchWriter, KafkaSource, SinkConfig

    open_store(tmp_path / "ix", create=True, settings=SMALL).close()
    checkpoint = tmp_path / "ck"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "3").write_text('v1\n{"batchWatermarkMs":0}\n{"a":{"0":12,"1":30}}\n')
    (checkpoint / "offsets" / "4").write_text('v1\n{"batchWatermarkMs":0}\n{"a":{"0":12,"1":30,"2":0}}\n')
    writer = BatchWriter(SinkConfig(str(tmp_path / "ix"), "records", str(tmp_path / "q")),
                         source=KafkaSource("127.0.0.1:1", subscribe=("a",)), checkpoint=str(checkpoint))
    asked = []

    def leaders(bootstrap, topics=None, timeout=None):
        asked.append(topics)
        return {("a", 0): 1, ("a", 1): 2, ("a", 2): 3}

    monkeypatch.setattr("msgindex.kafka.admin.partition_leaders", leaders)
    rows = spark.createDataFrame([], "key binary, value binary, topic string, partition int, offset long, "
                                     "timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>")
    writer.prepare(rows, 3)
    assert len(asked) == 1 and writer.partition_brokers.as_dict() == {("a", 0): "1", ("a", 1): "2", ("a", 2): "3"}
    columns = writer._projection[1]
    writer.prepare(rows, 3)  # every partition recorded: Kafka is not asked, the columns are reused
    assert writer.prepare(rows, 4).columns[:2] == ["broker", "topic"]
    assert len(asked) == 1 and writer._projection[1] is columns
    fresh = BatchWriter(writer.config, source=writer.source, checkpoint=str(checkpoint))
    fresh.prepare(rows, 5)  # no entry for the batch: Kafka is asked, as without a checkpoint
    BatchWriter(writer.config, source=writer.source).prepare(rows, 3)
    assert len(asked) == 3


def test_a_task_refuses_rows_out_of_offset_order_across_chunks(tmp_path, monkeypatch):
    """Chunks commit [min, max + 1) of their rows per slice: a slice's row arriving behind an
    earlier chunk would be skipped as committed, so the task fails instead of losing it."""
    from msgindex.errors import MsgIndexError
    from msgindex.spark.pipeline import task_writer

    root = tmp_path / "ix"
    open_store(root, create=True, settings=SMALL).close()
    monkeypatch.setattr(task_writer, "APPEND_ROWS", 2)
    config = task_writer.SinkConfig(str(root), "records", str(tmp_path / "q"))
    try:
        in_order = list(task_writer.write_task(config, 0, [_records_task_rows([0, 1], [0, 0]), _records_task_rows([2, 3], [0, 0]),
                                                            _records_task_rows([0, 1], [1, 1], partition=1)]))
        assert in_order[0].to_pylist()[0]["appended"] == 6
        with pytest.raises(MsgIndexError, match="t-0: offset 5 arrived after offset 7 of the same source slice"):
            list(task_writer.write_task(config, 1, [_records_task_rows([6, 7], [0, 0]), _records_task_rows([5, 8], [0, 0])]))
    finally:
        forget_writers()


@pytest.mark.parametrize("key", [b"k", b"\xff"], ids=["arrow", "message-records"])
def test_field_columns_become_pairs_with_counts_on_both_append_paths(key):
    from msgindex.spark.pipeline.field_values import COLUMN_PREFIX
    from msgindex.storage.fields import FieldDefinition
    from msgindex.storage.log.metadata_log import records_from_table

    definitions = [FieldDefinition("order", "expression", "get_json_object(CAST(value AS STRING), '$.id')", "single"),
                   FieldDefinition("trace", "header", "trace", "array")]
    rows = 4
    table = pa.table({
        "topic": ["t"] * rows, "partition": pa.array([0] * rows, pa.int32()), "offset": pa.array(range(rows), pa.int64()),
        "timestamp_ms": pa.array([7] * rows, pa.int64()), KEY_RAW: pa.array([key, b"a", None, b"b"], pa.binary()),
        KEYS_HEADERS: pa.array([[]] * rows, pa.list_(pa.binary())), UNIQ_HEADERS: pa.array([[]] * rows, pa.list_(pa.binary())),
        f"{COLUMN_PREFIX}0": pa.array([["o-1"], [None], [""], ["o-2"]], pa.list_(pa.string())),
        f"{COLUMN_PREFIX}1": pa.array([[b"t1", b"t2", b"t1"], None, [b"\xff"], []], pa.list_(pa.binary())),
    })
    appended, _, counts = records_to_append(table, definitions)
    records = appended if isinstance(appended, list) else records_from_table(appended)
    carried = [r.fields for r in records] if isinstance(appended, list) else [
        tuple((p["name"], p["value"]) for p in row or ()) for row in appended.column("fields").to_pylist()]
    assert carried == [(("order", "o-1"), ("trace", "t1"), ("trace", "t2"), ("trace", "t1")), (), (), (("order", "o-2"),)]
    assert counts == {"order": [2, 2, 0], "trace": [3, 3, 1]}  # [values, records without one, not UTF-8]
    assert isinstance(appended, list) == (key == b"\xff")


def test_settled_offsets_are_those_of_the_batches_this_process_completed():
    """completed_batches.py: [the first batch's start, this batch's start) per partition, for the
    partition's shard (every shard for metadata events); a partition seen first only sets its
    floor; Spark's symbolic -2/-1 are never a start; a topic created again (offsets below the
    floor) settles nothing."""
    from msgindex.spark.pipeline.completed_batches import ANY_SHARD, CompletedBatches, settled_for

    batches = CompletedBatches()
    shard_of = {("t", 0): "b0", ("t", 1): "b1"}
    assert batches.settled({("t", 0): 5, ("t", 1): -2}, shard_of) == {}
    settled = batches.settled({("t", 0): 9, ("t", 1): 3, ("u", 0): 4}, shard_of)
    assert {shard: ranges.ranges for shard, ranges in settled.items()} == {"b0": {("t", 0): ((5, 9),)}}
    later = batches.settled({("t", 0): 2, ("t", 1): 7}, shard_of)
    assert {shard: ranges.ranges for shard, ranges in later.items()} == {"b1": {("t", 1): ((3, 7),)}}
    assert settled_for(later, "b1").ranges == {("t", 1): ((3, 7),)} and settled_for(later, "b0") is None
    events = CompletedBatches()
    events.settled({("rmq", 0): 10}, None)
    for_all = events.settled({("rmq", 0): 40}, None)
    assert list(for_all) == [ANY_SHARD] and settled_for(for_all, "broker-a").ranges == {("rmq", 0): ((10, 40),)}
