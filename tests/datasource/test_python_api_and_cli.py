"""The same lookups without Spark: ``msgindex.open(PATH)`` returning Arrow/pandas, the
``msgindex lookup`` command, and option parsing / filter translation as units."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta, timezone

import pyarrow as pa
import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    In,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)

import msgindex
from msgindex.cli import main
from msgindex.errors import InvalidOptionError
from msgindex.spark.read import pushdown
from msgindex.spark.read.options import ReadOptions
from msgindex.storage.message import ROW_SCHEMA
from tests.datasource.conftest import EDGE_KEY, WINDOW

UTC = UTC


def id_set(table: pa.Table) -> set[tuple]:
    return set(zip(*(table.column(name).to_pylist() for name in ("broker", "topic", "partition", "offset"))))


def test_open_lookup_returns_arrow_and_pandas(truth):
    with msgindex.open(truth.path) as store:
        table = store.lookup(["Aa", "with,comma"], topic="orders")
        assert table.schema == ROW_SCHEMA
        assert id_set(table) == truth.select(keys={"Aa", "with,comma"}, topics={"orders"})
        frame = table.to_pandas()
        assert len(frame) == table.num_rows and str(frame["timestamp"].dtype) == "datetime64[us, UTC]"
        window = store.lookup(EDGE_KEY, begin_ms=WINDOW[0], end_ms=WINDOW[1])
        assert sorted(window.column("timestamp").cast(pa.int64()).to_pylist()) == [w * 1000 for w in WINDOW]


def test_open_scan_time_window(truth):
    with msgindex.open(truth.path) as store:
        table = pa.Table.from_batches(list(store.scan(begin_ms=WINDOW[0], end_ms=WINDOW[1])), schema=ROW_SCHEMA)
    assert id_set(table) == truth.select(begin=WINDOW[0], end=WINDOW[1])


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_lookup_json(truth, capsys):
    code, out, _ = run_cli(capsys, "lookup", str(truth.path), "--key", "BB", "--key", "ключ-ünï",
                           "--topic", "payments", "--format", "json")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert {(r["broker"], r["topic"], r["partition"], r["offset"]) for r in rows} == \
        truth.select(keys={"BB", "ключ-ünï"}, topics={"payments"})
    assert all(r["timestamp"].endswith("Z") for r in rows)


def test_cli_lookup_window_csv_and_max(truth, capsys):
    begin = datetime.fromtimestamp(WINDOW[0] / 1000, UTC).isoformat(timespec="milliseconds")
    code, out, _ = run_cli(capsys, "lookup", str(truth.path), "--key", EDGE_KEY, "--begin", begin,
                           "--end", str(WINDOW[1]), "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 2 and {r["key"] for r in rows} == {EDGE_KEY}
    everything = len(truth.select(keys={"Aa"}))
    code, out, _ = run_cli(capsys, "lookup", str(truth.path), "--key", "Aa", "--limit", "3")
    lines = out.splitlines()
    assert lines[0].startswith("messages under Aa, window any time .. any time (UTC)")
    assert lines[1].split()[:4] == ["timestamp", "topic", "partition", "offset"]
    assert lines[-2:] == ["(3 messages)", f"({everything - 3:,} more messages not shown: --limit 0 shows all)"]
    assert lines[2].split()[0].endswith("Z")  # rows show their date, in UTC


def test_cli_scan(truth, capsys):
    code, out, _ = run_cli(capsys, "lookup", str(truth.path), "--scan", "--begin", str(WINDOW[0]),
                           "--end", str(WINDOW[1]), "--topic", "audit", "--format", "json", "--limit", "0")
    assert code == 0
    got = {(r["broker"], r["topic"], r["partition"], r["offset"]) for r in map(json.loads, out.splitlines())}
    assert got == truth.select(begin=WINDOW[0], end=WINDOW[1], topics={"audit"})


def test_cli_errors(truth, tmp_path, capsys):
    code, _, err = run_cli(capsys, "lookup", str(tmp_path / "nope"), "--key", "a")
    assert code == 2 and "does not exist" in err
    code, _, err = run_cli(capsys, "lookup", str(truth.path), "--key", "a", "--begin", "5 o'clock")
    assert code == 2 and "option '--begin' = \"5 o'clock\"" in err


# --- option parsing and filter translation ---------------------------------------------------
def test_option_times():
    def window(**times):
        parsed = ReadOptions.parse({"path": "/x", **times}, now_ms=1763700000123)
        return parsed.begin_ms, parsed.end_ms, parsed.window_needs_zone

    assert window(begin="1763700000123") == (1763700000123, None, False)
    assert window(begin="2025-11-21T04:40:00.123Z", end="2025-11-21T05:40:00.123+01:00") == \
        (1763700000123, 1763700000123, False)
    assert window(begin="-1h", end="now") == (1763700000123 - 3_600_000, 1763700000123, False)
    # no zone: read in the session's zone by the tasks; planned over every instant it can be
    naive = ReadOptions.parse({"path": "/x", "begin": "2025-11-21 04:40:00.123"})
    assert naive.window_needs_zone and naive.begin_ms == 1763700000123 - 86_400_000
    assert naive.window_in(UTC) == (1763700000123, None)
    assert naive.window_in(timezone(timedelta(hours=1))) == (1763700000123 - 3_600_000, None)
    for bad in ("noon", "2025-11-21T04:40:00.0001Z"):
        with pytest.raises(InvalidOptionError, match="option 'begin'"):
            ReadOptions.parse({"path": "/x", "begin": bad})
    with pytest.raises(InvalidOptionError, match="'begin' = '2025-11-23 00:00' is after option 'end'"):
        ReadOptions.parse({"path": "/x", "begin": "2025-11-23 00:00", "end": "2025-11-21 00:00"})
    # a zone-less begin may be after an exact end by less than a day: a task decides, no error
    ReadOptions.parse({"path": "/x", "begin": "2025-11-21 05:00", "end": "2025-11-21T04:40:00Z"})


def test_options_keys_json_and_conflicts():
    parsed = ReadOptions.parse({"path": "/x", "keys": '["a,b", "c"]', "topic": "t1,t2", "partitions": "0,3"})
    assert parsed.keys == ("a,b", "c") and parsed.topics == ("t1", "t2") and parsed.partitions == (0, 3)
    with pytest.raises(InvalidOptionError, match="'key' = 'a' and 'keys'"):
        ReadOptions.parse({"path": "/x", "key": "a", "keys": '["b"]'})
    with pytest.raises(InvalidOptionError, match="'begin' = '20' is after option 'end' = '10'"):
        ReadOptions.parse({"path": "/x", "begin": "20", "end": "10"})
    with pytest.raises(InvalidOptionError, match="'maxNum' = '4' limits key lookups"):
        ReadOptions.parse({"path": "/x", "maxnum": "4"})


def at_ms(ms: int, extra_us: int = 0) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms, microseconds=extra_us)


def test_filters_translate_exactly():
    query = pushdown.IndexQuery()
    filters = [
        EqualTo(("key",), "a"), In(("key",), ("a", "b", None)), In(("topic",), ("t",)),
        GreaterThan(("timestamp",), at_ms(1000, 500)), LessThan(("timestamp",), at_ms(2000)),
        LessThanOrEqual(("timestamp",), at_ms(1999, 999)), StringStartsWith(("key",), "a"),
        EqualTo(("offset",), 5), EqualTo(("partition",), True), Not(EqualTo(("broker",), "b")),
    ]
    query, rejected = pushdown.push(query, filters)
    assert rejected == filters[-4:]
    assert query.primary_keys == {"a"} and query.topics == {"t"}
    assert (query.begin_ms, query.end_ms) == (1001, 1999)
    assert query.is_lookup and query.keys_to_look_up == ("a",)
    empty, _ = pushdown.push(pushdown.IndexQuery(), [EqualTo(("timestamp",), at_ms(5, 1))])
    assert empty.is_empty
