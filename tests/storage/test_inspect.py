"""`msgindex inspect`: index files (msgindex's and RocketMQ-sized), segments, shards, stores."""

from __future__ import annotations

import json

import pytest

from msgindex.cli import main
from msgindex.errors import CorruptFileError, InvalidOptionError
from msgindex.storage.hash_index.index_file import IndexFile, index_file_name
from msgindex.storage.maintenance.inspect import format_report, inspect_path
from msgindex.storage.message import MessageRecord
from msgindex.storage.store import open_store
from tests.storage.shard_model import TINY

BASE = 1_700_000_000_000


@pytest.fixture
def store(tmp_path):
    with open_store(tmp_path / "store", create=True, settings=TINY) as s:
        with s.writer("b1") as writer:
            writer.append([MessageRecord("t", 0, i, BASE + i * 10, None, ("Aa", "BB", f"k{i}")) for i in range(20)])
        with s.writer("b2") as writer:
            writer.append([MessageRecord("u", 1, 0, BASE, "x", ("x",))])
        yield s


def test_index_file_outside_a_store(tmp_path):
    path = tmp_path / index_file_name(BASE)
    with IndexFile.create(path, 10, 50) as f:
        for i in range(30):
            f.put_key(f"t#{'Aa' if i % 2 else 'BB'}{i % 3}", i, BASE + 1000 * i)
    with pytest.raises(CorruptFileError, match="--hash-slots"):
        inspect_path(path)  # RocketMQ's default sizing does not fit this small file
    report = inspect_path(path, hash_slot_num=10, index_num=50)
    assert report["kind"] == "index_file" and report["entries"] == 30
    assert report["header"]["index_count"] == 31
    assert report["approx_time_range"]["min_ms"] == BASE and report["approx_time_range"]["max_ms"] == BASE + 29_000
    assert report["phy_offset_range"] == [0, 29]
    chains = report["chain_length"]
    assert sum(chains["histogram"].values()) == chains["chains"] == report["slots_used"]
    assert chains["mean"] * chains["chains"] == pytest.approx(30)
    assert "slot_fill_ratio" in format_report(report)


def test_cli_on_store_shard_segment_and_index(store, capsys):
    assert main(["inspect", str(store.root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "store" and report["brokers"] == ["b1", "b2"] and report["records"] == 21
    b1 = report["shards"][0]
    assert b1["source_ranges"] == {"t": {"0": [[0, 20]]}} and len(b1["index_files"]) == 60 // (TINY.index_num - 1) + 1
    assert sum(seg["records"] for seg in b1["segments"]) == 20

    shard = store.root / "broker=b1"
    assert main(["inspect", str(shard)]) == 0
    assert "source_ranges:\n  t:\n    0:\n      - 0, 20" in capsys.readouterr().out

    segment = sorted((shard / "log").glob("*.log"))[0]
    assert main(["inspect", str(segment), "--json"]) == 0
    seg = json.loads(capsys.readouterr().out)
    assert seg["kind"] == "log_segment" and seg["base_seq"] == 0 and seg["records"] > 0

    index = sorted((shard / "index").iterdir())[0]
    assert main(["inspect", str(index), "--json"]) == 0  # sizing found in the store's manifest
    assert json.loads(capsys.readouterr().out)["entries"] == TINY.index_num - 1


def test_cli_errors_name_the_path(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x00" * 7)
    assert main(["inspect", str(garbage)]) == 2
    assert "garbage" in capsys.readouterr().err
    with pytest.raises(InvalidOptionError, match="neither"):
        inspect_path(tmp_path)


def _damage(store_root, kind):
    """Make one kind of damage a user meets in the field; returns the path to inspect and the
    file the error must name."""
    shard = store_root / "broker=b1"
    index = sorted((shard / "index").iterdir())[0]
    segment = sorted((shard / "log").glob("*.log"))[0]
    if kind == "empty_file":
        target = store_root.parent / "empty"
        target.write_bytes(b"")
        return target, target
    if kind == "garbage_file":
        target = store_root.parent / "garbage"
        target.write_bytes(bytes(range(256)) * 5)
        return target, target
    if kind == "truncated_rocketmq_file":
        target = store_root.parent / index_file_name(BASE)
        target.write_bytes(index.read_bytes()[: IndexFile.file_size(TINY.hash_slot_num, TINY.index_num) // 2])
        return target, target
    if kind == "not_a_store_dir":
        target = store_root.parent / "photos"
        target.mkdir()
        (target / "cat.jpg").write_bytes(b"\xff\xd8")
        return target, target
    checkpoint = shard / "checkpoint"
    if kind == "garbage_checkpoint":
        checkpoint.write_bytes(b"\x00\x01garbage")
        return shard, checkpoint
    if kind == "empty_checkpoint":
        checkpoint.write_bytes(b"")
        return store_root, checkpoint
    if kind == "altered_checkpoint":
        body = json.loads(checkpoint.read_text())
        body["record_count"] += 1000
        checkpoint.write_text(json.dumps(body))
        return shard, checkpoint
    if kind == "foreign_checkpoint":
        checkpoint.write_text("[]")
        return shard, checkpoint
    if kind == "truncated_index_in_shard":
        with open(index, "r+b") as f:
            f.truncate(100)
        return store_root, index
    if kind == "index_file_is_a_directory":
        index.unlink()
        index.mkdir()
        return shard, index
    if kind == "truncated_segment":
        with open(segment, "r+b") as f:
            f.truncate(30)
        return segment, segment
    raise AssertionError(kind)


DAMAGE = [
    "empty_file", "garbage_file", "truncated_rocketmq_file", "not_a_store_dir", "garbage_checkpoint",
    "empty_checkpoint", "altered_checkpoint", "foreign_checkpoint", "truncated_index_in_shard",
    "index_file_is_a_directory", "truncated_segment",
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", DAMAGE)
def test_cli_damage_is_one_line_naming_the_file(store, capsys, kind):
    target, culprit = _damage(store.root, kind)
    store.close()
    assert main(["inspect", str(target)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("msgindex inspect: "), captured.err
    assert str(culprit) in lines[0] and "Traceback" not in captured.err
    assert captured.out == ""


@pytest.mark.parametrize("flag", ["--hash-slots", "--index-num"])
@pytest.mark.parametrize("value", ["0", "-5", str(2**31)])
def test_cli_rejects_impossible_sizing_instead_of_defaulting(tmp_path, capsys, flag, value):
    path = tmp_path / index_file_name(BASE)
    IndexFile.create(path, 10, 50).close()
    other = "--index-num" if flag == "--hash-slots" else "--hash-slots"
    assert main(["inspect", str(path), flag, value, other, "10" if other == "--hash-slots" else "50"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and value in err and "must be an int" in err
