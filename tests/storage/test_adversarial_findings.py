"""What the adversarial run (tests/adversarial) found, one test each: a file of a store replaced by
a directory, a committed segment deleted by hand, a hash entry pointing past the log, inspect on a
damaged file. A clear error naming the file, or the right answer; nothing committed deleted."""

from __future__ import annotations

import struct

import pytest

from msgindex.cli import main
from msgindex.errors import CorruptFileError, StoreNotFoundError
from msgindex.storage.hash_index import entry_sums
from msgindex.storage.hash_index.index_file import ENTRY_SIZE, HEADER_SIZE, IndexFile
from msgindex.storage.store import open_store
from tests.storage import damage
from tests.storage.shard_model import model_lookup, model_scan, table_rows


@pytest.fixture
def small(tmp_path):
    return damage.build(tmp_path / "store")


def read_everything(small: damage.SmallStore) -> None:
    with open_store(small.root) as store:
        assert table_rows(store.lookup(small.keys())) == model_lookup(small.models.values(), small.keys())
        assert table_rows(list(store.scan())) == model_scan(small.models.values())


def append_one(small: damage.SmallStore) -> None:
    with open_store(small.root) as store, store.writer("b1") as writer:
        writer.append([damage.record(0, 50_000)])


def inspect(path, capsys) -> tuple[int, str]:
    code = main(["inspect", str(path)])
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("which", [0, -1])
def test_a_log_segment_replaced_by_a_directory_is_named(small, which):
    victim = damage.segments(small, "b1")[which]
    damage.replace_by_directory(victim)
    with pytest.raises(CorruptFileError, match=f"{victim}: is a directory"):  # was a bare IsADirectoryError
        read_everything(small)


@pytest.mark.parametrize("suffix", [".index", ".timeindex", ".summary"])
def test_a_derived_file_replaced_by_a_directory(small, suffix):
    victim = damage.segments(small, "b1", suffix)[0]
    damage.replace_by_directory(victim)
    before = damage.listing(small.root)
    read_everything(small)  # readers recompute it
    with pytest.raises(CorruptFileError, match=f"{victim}: a directory where"):
        append_one(small)  # the writer would rewrite it: it names it and leaves the directory alone
    assert damage.listing(small.root) == before and victim.is_dir()


@pytest.mark.parametrize("name", ["checkpoint", "lock"])
def test_a_checkpoint_or_lock_replaced_by_a_directory_stops_the_writer_clearly(small, name):
    victim = damage.shard(small, "b1") / name
    damage.replace_by_directory(victim)
    with pytest.raises(CorruptFileError, match=str(victim)):
        append_one(small)


def test_the_active_segment_deleted_names_it_and_its_sidecars_stay(small):
    victim = damage.segments(small, "b1")[-1]
    victim.unlink()
    sidecars = sorted(p.name for p in victim.parent.glob(victim.stem + ".*"))
    assert sidecars  # .index, .timeindex
    with pytest.raises(CorruptFileError, match=str(victim)):
        read_everything(small)
    with pytest.raises(CorruptFileError, match=str(victim)):
        append_one(small)
    assert sorted(p.name for p in victim.parent.glob(victim.stem + ".*")) == sidecars


def test_the_oldest_segment_deleted_keeps_its_sidecars_when_a_writer_opens(small):
    victim = damage.segments(small, "b1")[0]
    victim.unlink()
    before = damage.listing(small.root)
    with pytest.raises(CorruptFileError, match=victim.name):
        append_one(small)
    assert damage.listing(small.root) == before


def test_a_hash_entry_pointing_past_the_log_is_an_error_not_a_miss(small):
    victim = damage.index_files(small, "b1")[0]
    entries = HEADER_SIZE + damage.SMALL.hash_slot_num * 4
    raw = bytearray(victim.read_bytes())
    key_hash, phy = struct.unpack_from(">iq", raw, entries + 5 * ENTRY_SIZE)
    struct.pack_into(">q", raw, entries + 5 * ENTRY_SIZE + 4, 1 << 32)  # phyOffset of entry 5
    victim.write_bytes(bytes(raw))
    assert key_hash  # entry 5 is a real one
    with pytest.raises(CorruptFileError, match=f"{victim}: hash index entries 0..39 fail their checksum"):
        with open_store(small.root) as store:
            for key in small.keys():
                store.lookup(key)
    # without the entry checksums (entry_sums.py), the shape of the chunk gives it away
    entry_sums.sums_path(victim).unlink()
    with pytest.raises(CorruptFileError, match=f"{victim}: hash index entry 6 has a phyOffset below the entry before"):
        with open_store(small.root) as store:
            for key in small.keys():
                store.lookup(key)
    # and when the shape holds (the newest entry: nothing after it), the check at open
    with open_store(small.root) as store:
        last = store.reader("b1").index_files()[0][0].index_count - 1
    raw = bytearray(victim.read_bytes())
    struct.pack_into(">q", raw, entries + 5 * ENTRY_SIZE + 4, phy)
    struct.pack_into(">q", raw, entries + last * ENTRY_SIZE + 4, 1 << 32)
    victim.write_bytes(bytes(raw))
    with pytest.raises(CorruptFileError, match=f"{victim}: committed entry {last} points at seq {1 << 32}"):
        with open_store(small.root) as store:
            for key in small.keys():
                store.lookup(key)


def test_inspect_a_damaged_segment_names_what_its_damage_breaks(small, capsys):
    victim = damage.segments(small, "b1")[0]
    damage.scribble(victim, victim.stat().st_size // 2, 8)
    code, said = inspect(victim, capsys)
    assert code == 2 and str(victim) in said and "checksum" in said


@pytest.mark.parametrize("name", ["msgindex.json", "broker=b1/checkpoint"])
def test_inspect_a_store_file_replaced_by_a_directory(small, capsys, name):
    victim = small.root / name
    damage.replace_by_directory(victim)
    code, said = inspect(victim, capsys)
    assert code == 2 and f"{victim}: is a directory" in said


def test_inspect_a_store_root_without_manifest_names_it(small, capsys):
    (small.root / "msgindex.json").unlink()
    with pytest.raises(StoreNotFoundError, match="msgindex.json"):
        open_store(small.root)
    code, said = inspect(small.root, capsys)
    assert code == 2 and "msgindex.json" in said


HELD = """
import sys, time
from pathlib import Path
from msgindex.errors import CorruptFileError
from msgindex.storage.settings import StoreSettings
from msgindex.storage.store import open_store
from tests.storage import damage

root, how = Path(sys.argv[1]), sys.argv[2]
small = damage.build(root, settings=StoreSettings(hash_slot_num=4096, index_num=8000, segment_bytes=1 << 20,
                                                  index_interval_bytes=4096))
victim = damage.index_files(small, "b1")[-1]
with open_store(root) as store:
    store.lookup(small.keys())  # readers cached, index files mapped
    time.sleep(0.05)  # later than the file's last write (mtime granularity)
    damage.truncate(victim, 4096) if how == "truncate" else damage.zero(victim)
    try:
        store.lookup(small.keys())
        print("answered")
    except CorruptFileError as error:
        print("error", error)
"""


@pytest.mark.parametrize("how", ["truncate", "zero"])
def test_an_index_file_changed_under_a_long_lived_store_is_an_error_not_sigbus(tmp_path, how):
    """Store keeps its readers (and their mapped index files) until the next commit: a file
    truncated under them killed the process with SIGBUS, one zeroed made lookups miss."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    child = subprocess.run([sys.executable, "-c", HELD, str(tmp_path / "s"), how], cwd=repo, capture_output=True,
                           text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(repo)})
    assert child.returncode == 0, f"status {child.returncode}: {child.stderr[-1500:]}"
    assert child.stdout.startswith("error ") and "/broker=b1/index/" in child.stdout, child.stdout


def test_inspect_says_what_every_file_of_a_store_is(tmp_path, capsys):
    """Every file and directory of an intact store (with hash runs): exit 0, a kind, what it is."""
    import json

    from tests.adversarial.file_attacks import build_pristine

    small = build_pristine(tmp_path / "s")
    kinds = {}
    for path in [small.root, *sorted(small.root.rglob("*"))]:
        code = main(["inspect", str(path), "--json"])
        out = capsys.readouterr()
        assert code == 0, f"{path}: {out.err}"
        report = json.loads(out.out)
        assert report.get("is"), f"{path}: no description in {sorted(report)}"
        assert not report.get("problems"), report["problems"]
        kinds[path.suffix if path.suffix != ".json" and path.suffix else path.name] = report["kind"]
    assert kinds[".index"] == "offset_index" and kinds[".timeindex"] == "time_index"
    assert kinds[".summary"] == "segment_summary" and kinds[".log"] == "log_segment"
    assert kinds[".hashrun"] == "hash_run" and kinds["msgindex.json"] == "manifest"
    assert kinds["checkpoint"] == "checkpoint" and kinds["broker=b1"] == "shard"
    assert kinds[small.root.name] == "store" and kinds["log"] == "log_directory"


def test_inspect_the_manifest_names_a_missing_shard(small, capsys):
    damage.remove(damage.shard(small, "b2"))
    code, said = inspect(small.root / "msgindex.json", capsys)
    assert code == 2 and "broker=b2: shard directory missing" in said


def test_another_shards_sealed_segment_is_an_error_not_its_records(small):
    """Its seqs are the same (0..35), its checksums valid: only the summary written when this
    shard's segment was sealed (its size) tells; before, readers returned b2's records as b1's."""
    victim = damage.segments(small, "b1")[0]
    victim.write_bytes(damage.segments(small, "b2")[0].read_bytes())
    with pytest.raises(CorruptFileError, match=f"{victim}: .* but its summary .*summary, written when it was sealed"):
        read_everything(small)


def test_another_shards_checkpoint_names_the_checkpoint(small):
    checkpoint = damage.shard(small, "b1") / "checkpoint"
    checkpoint.write_bytes((damage.shard(small, "b2") / "checkpoint").read_bytes())
    with pytest.raises(CorruptFileError, match=f"or {checkpoint} is another shard's"):
        read_everything(small)


def _move_entry_2(path, move) -> None:
    at = HEADER_SIZE + damage.SMALL.hash_slot_num * 4 + 2 * ENTRY_SIZE + 4
    raw = bytearray(path.read_bytes())
    struct.pack_into(">q", raw, at, move(struct.unpack_from(">q", raw, at)[0]))
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("keys", [["shared0"], None], ids=["few candidates", "many candidates"])
def test_an_entry_moved_to_a_record_without_its_key_is_an_error(small, keys, monkeypatch):
    """Entry 2 (shared0 of record 0) pointed at record 1, which carries no key of its hash: the
    lookup that follows it raised nothing and missed record 0. (Both verification paths; the
    lookup's own check, behind the entry checksums, which catch it first: test_entry_sums.py.)"""
    monkeypatch.setattr(IndexFile, "guard_entries", lambda self: None)
    victim = damage.index_files(small, "b1")[0]
    _move_entry_2(victim, lambda phy: phy + 1)
    keys = keys or small.keys()[3::7] + [f"shared{n}" for n in range(4)]
    with pytest.raises(CorruptFileError, match=f"{victim}: a committed hash entry of keyHash .* points at record seq 1"):
        with open_store(small.root) as store:
            store.lookup(keys, brokers=["b1"])


def test_another_shards_active_index_file_is_an_error(small):
    """Same header and slot count as b1's own (both shards hold the same records' times): only
    its entries tell, and readers check the newest ones against the log when they open it."""
    victim = damage.index_files(small, "b1")[-1]
    victim.write_bytes(damage.index_files(small, "b2")[-1].read_bytes())
    with pytest.raises(CorruptFileError, match=f"{victim}: committed entry .* carries no key of that hash"):
        with open_store(small.root) as store:
            store.lookup(["k0-70"])
