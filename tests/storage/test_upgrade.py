"""`msgindex upgrade`: a format-1 store (row-per-record logs, written by the old writer kept in
``v1_writer``) is refused with a clear error, converted in place, identical afterwards, and a crash
at any step of the conversion loses nothing."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from msgindex.cli import main
from msgindex.errors import UpgradeRequiredError
from msgindex.storage.checkpoint import read_checkpoint
from msgindex.storage.durable import versioned_json, write_atomically
from msgindex.storage.maintenance import upgrade as upgrade_module
from msgindex.storage.message import MessageRecord
from msgindex.storage.store import MANIFEST_FILE, STORE_FORMAT, StoreSettings, open_store
from tests.storage.v1_writer import oracle_log_files

SETTINGS = StoreSettings(hash_slot_num=97, index_num=400, segment_bytes=6_000, index_interval_bytes=300)


def make_records(count: int, seed: int = 3) -> list[MessageRecord]:
    rng = random.Random(seed)
    return [
        MessageRecord(f"t{i % 3}", i % 4, i, 1_000_000 + 10 * i + rng.randint(-900, 900),
                      None if i % 13 == 0 else f"key-{i % 150}",
                      ((f"key-{i % 150}",) if i % 13 else ()) + ((f"x\udc80{i % 7}",) if i % 5 == 0 else ()),
                      i * 7 if i % 3 else -1, i % 50 if i % 2 else -1)
        for i in range(count)
    ]


def make_v1_store(root: Path, batches: list[list[MessageRecord]]) -> None:
    """A store as the format-1 code left it: hash index files and checkpoint as the writer makes
    them (they did not change), the log rewritten by the old per-record writer, manifest 1."""
    with open_store(root, create=True, settings=SETTINGS) as store, store.writer("b1") as writer:
        for batch in batches:
            writer.append(batch)
    shard = root / "broker=b1"
    for path in (shard / "log").iterdir():
        path.unlink()
    files = oracle_log_files(batches, segment_bytes=SETTINGS.segment_bytes,
                             index_interval_bytes=SETTINGS.index_interval_bytes, max_index_bytes=10 * 1024 * 1024)
    for name, data in files.items():
        (shard / "log" / name).write_bytes(data)
    last = max(name for name in files if name.endswith(".log"))
    checkpoint = read_checkpoint(shard / "checkpoint")
    old_position = {"next_seq": sum(map(len, batches)), "segment_base": int(last[:20]),
                    "segment_bytes": len(files[last]), "offset_index_entries": len(files[last[:20] + ".index"]) // 8,
                    "time_index_entries": len(files[last[:20] + ".timeindex"]) // 12,
                    "min_timestamp": None, "max_timestamp": None}  # format 1 had no log_format member
    _write_v1_checkpoint(shard / "checkpoint", checkpoint, old_position, batch_id=len(batches) - 1)
    body = json.loads((root / MANIFEST_FILE).read_text())
    write_atomically(root / MANIFEST_FILE, versioned_json(STORE_FORMAT, 1, {"settings": body["settings"]}))


def _write_v1_checkpoint(path: Path, checkpoint, log_position: dict, batch_id: int) -> None:
    """The checkpoint as format-1 stores have it: version 1, the last Spark batch id, no source ranges."""
    body = {key: value for key, value in checkpoint.to_dict().items() if key != "source_ranges"}
    body.update(format="msgindex-shard-checkpoint", version=1, batch_id=batch_id, log_position=log_position)
    canonical = lambda doc: json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()  # noqa: E731
    body["crc32"] = zlib.crc32(canonical(body))
    write_atomically(path, canonical(body) + b"\n")


def hash_files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "broker=b1" / "index").iterdir())}


def check_store(root: Path, records: list[MessageRecord]) -> None:
    with open_store(root) as store:
        rows = [row for batch in store.scan() for row in batch.to_pylist()]
        assert [r["offset"] for r in rows] == [r.offset for r in records]
        assert [r["keys"] for r in rows] == [[k.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                                              if "\udc80" in k else k for k in r.keys] for r in records]
        for key in ("key-7", "key-149", "x\udc803"):
            expected = sorted(i for i, r in enumerate(records) if key in r.keys)
            assert sorted(store.lookup(key).column("seq").to_pylist()) == expected, key
        with store.reader("b1") as reader:
            assert reader.log.read_many(range(len(records))) == records  # exact texts, surrogates included


@pytest.fixture
def old_store(tmp_path):
    records = make_records(1500)
    batches = [records[:400], records[400:1100], records[1100:]]
    make_v1_store(tmp_path / "store", batches)
    return tmp_path / "store", records


def test_old_store_is_refused_then_upgraded_in_place(old_store, capsys):
    root, records = old_store
    before = hash_files(root)
    with pytest.raises(UpgradeRequiredError, match=f"run `msgindex upgrade {root}`"):
        open_store(root)
    assert main(["lookup", str(root), "--key", "key-7"]) == 2
    assert "msgindex upgrade" in capsys.readouterr().err
    assert main(["upgrade", str(root)]) == 0
    out = capsys.readouterr().out
    assert "store format 1 -> 2" in out and "broker=b1: converted: 1,500 records" in out
    assert hash_files(root) == before  # seqs did not change, so the hash index files did not
    assert sorted(p.name for p in (root / "broker=b1").iterdir()) == ["checkpoint", "index", "lock", "log"]
    check_store(root, records)
    assert main(["upgrade", str(root)]) == 0  # again: nothing to do
    assert "already format 2" in capsys.readouterr().out
    with open_store(root) as store, store.writer("b1") as writer:  # and the shard takes appends again
        writer.adopt_log_offsets()  # its version-1 checkpoint knew batch ids, not offsets (issue 8)
        writer.append(make_records(10, seed=9))


@pytest.mark.parametrize("crash_at", ["build", "verify", "first_rename", "second_rename", "checkpoint"])
def test_crash_at_any_step_loses_nothing(old_store, monkeypatch, crash_at):
    root, records = old_store
    real_rename, real_write_checkpoint = os.rename, upgrade_module.write_checkpoint
    renames = []

    class Crash(Exception):
        pass

    def rename(src, dst):
        renames.append(src)
        if (crash_at, len(renames)) in (("first_rename", 1), ("second_rename", 2)):
            raise Crash
        real_rename(src, dst)

    def crash(*args, **kwargs):
        raise Crash

    if crash_at == "build":
        monkeypatch.setattr(upgrade_module, "CHUNK_RECORDS", 500)
        calls = iter(range(10))
        real_old_records = upgrade_module._old_records

        def failing_records(*args):
            for item in real_old_records(*args):
                if next(calls) == 1:
                    raise Crash
                yield item
        monkeypatch.setattr(upgrade_module, "_old_records", failing_records)
    elif crash_at == "verify":
        monkeypatch.setattr(upgrade_module, "_verify", crash)
    elif crash_at == "checkpoint":
        monkeypatch.setattr(upgrade_module, "write_checkpoint", crash)
    monkeypatch.setattr(upgrade_module.os, "rename", rename)
    with pytest.raises(Crash):
        upgrade_module.upgrade_store(root)
    monkeypatch.undo()
    if crash_at in ("build", "verify"):  # before the marker: the old store is untouched
        with pytest.raises(UpgradeRequiredError):
            open_store(root)
    assert os.rename is real_rename and upgrade_module.write_checkpoint is real_write_checkpoint
    report = upgrade_module.upgrade_store(root)
    assert report.to_version == 2
    check_store(root, records)


def test_upgrade_cli_errors_are_one_line(tmp_path):
    done = subprocess.run([str(Path(sys.executable).parent / "msgindex"), "upgrade", str(tmp_path / "nope")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a msgindex store" in done.stderr
