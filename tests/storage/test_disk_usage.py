"""Bytes that follow the data: a store at RocketMQ's default sizing takes its slot table and a growth
step of entries beyond what it holds, not 420 MB before the first message; `msgindex inspect` says
what each kind of file takes per record; stores whose hash index files were allocated in full (the
code before growth) keep working."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from msgindex.storage.hash_index import index_file as index_file_module
from msgindex.storage.hash_index.index_file import ENTRY_SIZE, GROWTH_ENTRIES, HEADER_SIZE, SLOT_SIZE, IndexFile
from msgindex.storage.maintenance.disk_usage import KINDS, disk_usage, kind_of
from msgindex.storage.message import MessageRecord
from msgindex.storage.settings import StoreSettings
from msgindex.storage.store import open_store

T0 = 1_700_000_000_000
pytestmark = pytest.mark.timeout(300)


def records(first: int, count: int) -> list[MessageRecord]:
    return [MessageRecord("orders", n % 4, n, T0 + n, f"acct:{n % 997:07d}:v2", (f"acct:{n % 997:07d}:v2", f"trace-{n}"))
            for n in range(first, first + count)]


def index_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "broker=b" / "index").iterdir() if kind_of(p) == "hash_index_files")


def test_a_store_at_default_sizing_takes_bytes_that_follow_its_data(tmp_path: Path) -> None:
    root = tmp_path / "store"
    defaults = StoreSettings()
    slots_end = HEADER_SIZE + defaults.hash_slot_num * SLOT_SIZE
    with open_store(root, create=True) as store:
        with store.writer("b") as writer:
            writer.append(records(0, 3_000))  # 6,000 entries
        [path] = index_files(root)
        assert path.stat().st_size == slots_end + GROWTH_ENTRIES * ENTRY_SIZE  # 21.3 MB, not 420 MB
        usage = disk_usage(root)
        assert usage.kinds["hash_index_files"].allocated >= path.stat().st_size  # no hole under the writer
        assert max(usage.apparent, usage.allocated) < 23_000_000

        with store.writer("b") as writer:
            writer.append(records(3_000, 70_000))  # 146,000 entries: three steps
        entries = 1 + 2 * 73_000
        assert path.stat().st_size == slots_end + -(-entries // GROWTH_ENTRIES) * GROWTH_ENTRIES * ENTRY_SIZE
        assert store.lookup("acct:0000005:v2").num_rows == len(range(5, 73_000, 997))
        assert store.lookup("trace-72999").num_rows == 1


def test_inspect_states_bytes_per_record_by_kind(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with open_store(root, create=True, settings=StoreSettings(hash_slot_num=10_007, index_num=300_000)) as store:
        with store.writer("b") as writer:
            writer.append(records(0, 5_000))
    usage = disk_usage(root)
    done = subprocess.run([str(Path(sys.executable).with_name("msgindex")), "inspect", str(root), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    per_record = report["bytes_per_record"]
    assert set(per_record) == {*KINDS, "total"}
    for kind, measured in usage.kinds.items():
        assert report["disk_usage"][kind] == {"files": measured.files, "bytes": measured.apparent,
                                              "allocated_bytes": measured.allocated}
        assert per_record[kind] == round(max(measured.apparent, measured.allocated) / 5_000, 2)
    assert per_record["log"] > 0 and per_record["hash_index_files"] > 0
    assert report["bytes"] == max(usage.apparent, usage.allocated)
    shard = report["shards"][0]
    assert shard["bytes_per_record"]["hash_index_files"] == per_record["hash_index_files"]
    human = subprocess.run([str(Path(sys.executable).with_name("msgindex")), "inspect", str(root)],
                           capture_output=True, text=True, timeout=120)
    assert human.returncode == 0 and "bytes_per_record:" in human.stdout and "hash_index_files:" in human.stdout


def test_a_store_whose_index_files_were_allocated_in_full_keeps_working(tmp_path: Path, monkeypatch) -> None:
    """Before growth a writer created each hash index file at its full size: such a file is read
    and written on, and stays full size (a file never shrinks)."""
    monkeypatch.setattr(index_file_module, "GROWTH_ENTRIES", 4096)
    root = tmp_path / "store"
    settings = StoreSettings(hash_slot_num=1_009, index_num=50_000)
    full = IndexFile.file_size(settings.hash_slot_num, settings.index_num)
    with open_store(root, create=True, settings=settings) as store:
        with store.writer("b") as writer:
            writer.append(records(0, 1_000))
        [path] = index_files(root)
        assert path.stat().st_size < full
        fd = os.open(path, os.O_RDWR)  # what the code before growth left: the whole file allocated
        try:
            os.posix_fallocate(fd, 0, full)
        finally:
            os.close(fd)
        assert store.lookup("trace-999").num_rows == 1
        with store.writer("b") as writer:
            writer.append(records(1_000, 30_000))  # fills the first file, rolls to a second
        assert path.stat().st_size == full and len(index_files(root)) == 2
        assert store.lookup("acct:0000005:v2").num_rows == len(range(5, 31_000, 997))
        assert store.lookup("trace-999").num_rows == 1 and store.lookup("trace-30999").num_rows == 1
