"""``msgindex retention``: a store's retention from the command line, with --dry-run."""

from __future__ import annotations

import pytest

from msgindex.cli import main
from msgindex.cli.retention import parse_size_bytes
from msgindex.storage.store import open_store
from msgindex.times import parse_duration_ms
from tests.storage.shard_model import TINY, shard_files
from tests.storage.test_retention import fill


@pytest.mark.parametrize(("text", "ms"), [("7d", 604_800_000), ("12h", 43_200_000), ("30m", 1_800_000),
                                          ("45s", 45_000), ("500ms", 500), ("60000", 60_000), ("1.5h", 5_400_000)])
def test_durations(text, ms):
    assert parse_duration_ms("--max-age", text) == ms


@pytest.mark.parametrize(("text", "size"), [("50GiB", 50 << 30), ("500MB", 500 << 20), ("10g", 10 << 30),
                                            ("1048576", 1 << 20), ("2k", 2048)])
def test_sizes(text, size):
    assert parse_size_bytes("--max-bytes", text) == size


@pytest.mark.parametrize(("option", "text"), [("--max-age", "soon"), ("--max-age", "-1d"), ("--max-bytes", "big"),
                                              ("--max-bytes", "5 parsecs")])
def test_bad_values_are_named(tmp_path, capsys, option, text):
    open_store(tmp_path / "s", create=True).close()
    assert main(["retention", str(tmp_path / "s"), f"{option}={text}"]) == 2
    assert capsys.readouterr().err.strip() == f"msgindex retention: {option} {text!r} is not a " + (
        "duration: use e.g. 7d, 12h, 1h30m, 45s, 500ms" if option == "--max-age" else "size: use e.g. 50GiB, 500MB, 10g or bytes")


def test_dry_run_then_run(tmp_path, capsys):
    with open_store(tmp_path / "s", create=True, settings=TINY) as store:
        fill(store)
    shard = tmp_path / "s" / "broker=b"
    before = shard_files(shard)
    assert main(["retention", str(tmp_path / "s"), "--max-age", "1m", "--dry-run"]) == 0
    planned = capsys.readouterr().out.splitlines()
    assert planned[-1].startswith("would delete ") and shard_files(shard) == before
    assert main(["retention", str(tmp_path / "s"), "--max-age", "1m"]) == 0
    done = capsys.readouterr().out.splitlines()
    assert [line.replace("would delete", "deleted", 1) for line in planned] == done
    assert set(shard_files(shard)) < set(before)


def test_nothing_to_do_is_an_error(tmp_path, capsys):
    open_store(tmp_path / "s", create=True).close()
    assert main(["retention", str(tmp_path / "s")]) == 2
    assert "give --max-age and/or --max-bytes" in capsys.readouterr().err
