"""The one timestamp rule (storage/message.py: years 0001..9999) on the storage side (issue 10, B3/B4):
appends refuse a record outside it, naming the record; a store written before the rule (such
records already on disk) reads without raising, each such timestamp read as the nearest bound in
results and in time windows alike, and one such record never breaks the others. On both kinds of
store (the ``stores`` fixture)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from msgindex.cli import main
from msgindex.errors import InvalidAppendError
from msgindex.storage.message import APPEND_SCHEMA, MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS, MessageRecord
from tests.storage.kinds import accept_any_timestamp
from tests.storage.shard_model import TINY

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
NOW = 1_700_000_000_000
LAST_MS = datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
FIRST_MS = datetime(1, 1, 1, tzinfo=UTC)


def rec(offset: int, timestamp_ms: int, key: str = "shared") -> MessageRecord:
    return MessageRecord("t", 0, offset, timestamp_ms, key, (key, f"own{offset}"))


@pytest.mark.parametrize("bad", [INT64_MAX, MAX_TIMESTAMP_MS + 1, MIN_TIMESTAMP_MS - 1, INT64_MIN])
def test_an_append_refuses_a_timestamp_outside_the_rule_naming_the_record(stores, bad):
    with stores.create("s", settings=TINY) as store, store.writer("b") as writer:
        with pytest.raises(InvalidAppendError, match=rf"record 1 of the batch \(t-0 offset 1\): timestamp {bad} ms"):
            writer.append([rec(0, NOW), rec(1, bad), rec(2, NOW)])
        table = pa.Table.from_pylist([dict(topic="t", partition=0, offset=5, timestamp_ms=bad, key=None, keys=[],
                                           commit_log_offset=-1, size=-1)], schema=APPEND_SCHEMA)
        with pytest.raises(InvalidAppendError, match="record 0 of the batch"):
            writer.append(table)
        assert writer.append([rec(3, MAX_TIMESTAMP_MS), rec(4, MIN_TIMESTAMP_MS)]).appended == 2  # the bounds are in
    with stores.open(stores.root("s")) as store:
        assert [r["timestamp"] for r in store.lookup("shared").to_pylist()] == [FIRST_MS, LAST_MS]


@pytest.fixture
def old_store(stores, monkeypatch):
    """A store written before the rule: records at INT64_MAX and INT64_MIN next to normal ones,
    all sharing the key 'shared'. Returns how to open it and its CLI arguments."""
    with monkeypatch.context() as patched:
        accept_any_timestamp(patched)
        with stores.create("s", settings=TINY) as store, store.writer("b") as writer:
            writer.append([rec(0, NOW), rec(1, INT64_MAX), rec(2, NOW + 1), rec(3, INT64_MIN), rec(4, NOW + 2)])
    return lambda: stores.open(stores.root("s")), stores.cli_args(stores.root("s"))


def test_records_already_on_disk_read_as_the_nearest_bound(old_store):
    with old_store[0]() as store:
        rows = store.lookup("shared").to_pylist()
        assert [(r["offset"], r["timestamp"]) for r in rows] == [
            (3, FIRST_MS), (0, datetime.fromtimestamp(NOW / 1000, UTC)),
            (2, datetime.fromtimestamp((NOW + 1) / 1000, UTC)),
            (4, datetime.fromtimestamp((NOW + 2) / 1000, UTC)), (1, LAST_MS)]
        assert sorted(r["offset"] for b in store.scan() for r in b.to_pylist()) == [0, 1, 2, 3, 4]
        assert store.lookup("own1").num_rows == 1  # its own key too


@pytest.mark.parametrize("begin, end, offsets", [
    (None, MAX_TIMESTAMP_MS, [0, 1, 2, 3, 4]),  # the last instant holds the late record
    (MAX_TIMESTAMP_MS, None, [1]),
    (NOW, MAX_TIMESTAMP_MS - 1, [0, 2, 4]),
    (MIN_TIMESTAMP_MS, MIN_TIMESTAMP_MS, [3]),
    (MIN_TIMESTAMP_MS + 1, NOW, [0]),
    (MAX_TIMESTAMP_MS + 1, None, []),  # past what any timestamp reads as
    (None, MIN_TIMESTAMP_MS - 1, []),
    (NOW + 5, NOW, []),  # an empty window stays accepted (Spark pushdown relies on it)
])
def test_time_windows_see_the_timestamps_results_show(old_store, begin, end, offsets):
    with old_store[0]() as store:
        looked_up = sorted(r["offset"] for r in store.lookup("shared", begin_ms=begin, end_ms=end).to_pylist())
        scanned = sorted(r["offset"] for b in store.scan(begin_ms=begin, end_ms=end) for r in b.to_pylist())
    assert looked_up == scanned == offsets


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_the_cli_shows_every_record(old_store, capsys, fmt):
    assert main(["lookup", *old_store[1], "--scan", "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert "9999-12-31T23:59:59.999Z" in out and "0001-01-01T00:00:00.000Z" in out
    if fmt == "json":
        assert len([json.loads(line) for line in out.splitlines()]) == 5
    assert main(["lookup", *old_store[1], "--key", "shared", "--format", fmt]) == 0
    assert "9999-12-31T23:59:59.999Z" in capsys.readouterr().out
