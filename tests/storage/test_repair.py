"""`msgindex repair`: a shard's lost checkpoint rebuilt from its files (issue 10, F4)."""

from __future__ import annotations

import pytest

from msgindex.cli import main
from msgindex.errors import CorruptFileError
from msgindex.storage.log.columns import LogColumns
from msgindex.storage.maintenance.repair import repair_store
from msgindex.storage.message import MessageRecord
from msgindex.storage.store import open_store
from tests.storage import damage
from tests.storage.shard_model import model_lookup, model_scan, table_rows


@pytest.fixture
def small(tmp_path):
    return damage.build(tmp_path / "store", appends=8)


def answers(root, keys):
    with open_store(root) as store:
        return table_rows(store.lookup(keys)), table_rows(list(store.scan()))


def repair_cli(root, capsys, *args) -> tuple[int, str, str]:
    code = main(["repair", str(root), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_deleted_checkpoint_is_rebuilt_exactly(small, capsys):
    checkpoint = damage.shard(small, "b1") / "checkpoint"
    lost = checkpoint.read_bytes()
    before = answers(small.root, small.keys())
    checkpoint.unlink()
    with pytest.raises(CorruptFileError, match="msgindex repair"):
        answers(small.root, small.keys())

    code, out, err = repair_cli(small.root, capsys, "--dry-run")
    assert code == 0 and "would be rebuilt" in out and not checkpoint.exists()
    code, out, err = repair_cli(small.root, capsys)
    assert code == 0, err
    assert "broker=b1: checkpoint rebuilt" in out and "broker=b2: intact" in out
    assert checkpoint.read_bytes() == lost  # the very checkpoint the last commit wrote
    assert answers(small.root, small.keys()) == before
    with open_store(small.root) as store, store.writer("b1") as writer:  # a replay appends nothing
        replayed = writer.append([damage.record(0, offset) for offset in range(96)])
    assert (replayed.appended, replayed.already_committed) == (0, 96)
    assert main(["inspect", str(small.root)]) == 0


def test_an_unreadable_checkpoint_is_rebuilt(small, capsys):
    checkpoint = damage.shard(small, "b2") / "checkpoint"
    lost = checkpoint.read_bytes()
    damage.zero(checkpoint)
    code, out, err = repair_cli(small.root, capsys, "--broker", "b2")
    assert code == 0, err
    assert checkpoint.read_bytes() == lost


def test_after_retention_only_the_retained_records_are_committed(tmp_path, capsys):
    small = damage.build(tmp_path / "store", brokers=("b1",), appends=12)
    model = small.models["b1"]
    with open_store(small.root) as store:
        report = store.apply_retention(max_bytes=6000)
        assert report.deleted_segments
        with store.reader("b1") as reader:
            model.log_start_seq = reader.checkpoint.log_start_seq
            ranges = reader.checkpoint.source_ranges
    before = answers(small.root, small.keys())
    (damage.shard(small, "b1") / "checkpoint").unlink()
    code, out, err = repair_cli(small.root, capsys)
    assert code == 0, err
    assert answers(small.root, small.keys()) == before
    assert before[1] == model_scan([model])
    with open_store(small.root) as store, store.reader("b1") as reader:
        assert reader.checkpoint.log_start_seq == model.log_start_seq and reader.checkpoint.source_ranges == ranges


def _torn_append(store_root, broker, records, *, put_keys: int):
    """What a writer killed mid-append leaves: the log batches of `records` written, `put_keys`
    of their hash index entries put, no commit."""
    with open_store(store_root) as store:
        writer = store.writer(broker)
        columns = LogColumns.of(records)
        ranges = writer.checkpoint.source_ranges
        seqs = writer._append_to_log(columns, ranges)
        from msgindex.storage.append_columns import AppendColumns

        keys, phys, stamps = AppendColumns.from_log_columns(columns).index_entries(seqs.start)
        if put_keys:
            writer._put_keys(keys[:put_keys], phys[:put_keys], stamps[:put_keys])
        writer._log.flush()
        for index_file in writer._files:
            index_file.flush()
        writer._unlock()  # dies: nothing committed, files left as they are


@pytest.mark.parametrize("put_keys", [0, 5])
def test_a_torn_last_append_is_left_uncommitted(small, capsys, put_keys):
    model = small.models["b1"]
    torn = [damage.record(0, 1000 + i) for i in range(10)]
    _torn_append(small.root, "b1", torn, put_keys=put_keys)
    (damage.shard(small, "b1") / "checkpoint").unlink()
    code, out, err = repair_cli(small.root, capsys)
    assert code == 0, err
    assert "follow the last complete append" in out
    keys = small.keys()
    assert answers(small.root, keys)[0] == model_lookup(small.models.values(), keys)
    with open_store(small.root) as store, store.writer("b1") as writer:
        assert writer.append(torn).appended == 10  # never committed: indexed when replayed
    model.append(torn)
    assert answers(small.root, keys + ["k0-1005"])[0] == model_lookup(small.models.values(), keys + ["k0-1005"])


def test_damaged_hash_entries_are_refused_and_nothing_is_written(small, capsys):
    shard = damage.shard(small, "b1")
    (shard / "checkpoint").unlink()
    victim = damage.index_files(small, "b1")[1]
    damage.zero(victim, damage.SMALL.hash_slot_num * 4 + 40)  # every entry of a full file
    code, out, err = repair_cli(small.root, capsys)
    assert code == 2 and "broker=b1: refused" in err and "cannot be rebuilt safely" in err
    assert not (shard / "checkpoint").exists()


def test_a_held_lock_is_refused(small, capsys):
    with open_store(small.root) as store, store.writer("b2"):
        code, out, err = repair_cli(small.root, capsys, "--broker", "b2")
    assert code == 2 and "stop the indexing job" in err


def test_damaged_derived_files_are_removed_and_rebuilt(small, capsys):
    summary = damage.segments(small, "b1", ".summary")[0]
    timeindex = damage.segments(small, "b2", ".timeindex")[0]
    damage.scribble(summary, 8, 8)
    damage.scribble(timeindex, 0, 4)
    assert main(["inspect", str(small.root)]) == 2
    assert "derived file" in capsys.readouterr().err
    code, out, err = repair_cli(small.root, capsys)
    assert code == 0 and str(summary) in out and str(timeindex) in out
    with open_store(small.root) as store:  # a writer rebuilds them
        for broker in ("b1", "b2"):
            store.writer(broker).close()
    assert main(["inspect", str(small.root)]) == 0


def test_a_missing_shard_is_forgotten_only_when_asked(small, capsys):
    damage.remove(damage.shard(small, "b2"))
    code, out, err = repair_cli(small.root, capsys)
    assert code == 2 and "--forget-missing" in err
    code, out, err = repair_cli(small.root, capsys, "--forget-missing")
    assert code == 0 and "removed from the store manifest" in out
    keys = small.keys()
    assert answers(small.root, keys)[0] == model_lookup([small.models["b1"]], keys)


def test_an_unannotated_batch_after_the_last_append_is_a_torn_tail(tmp_path):
    small = damage.build(tmp_path / "store", brokers=("b1",), appends=1)
    with open_store(small.root) as store:
        writer = store.writer("b1")
        writer._log.append([MessageRecord("t", 0, 99, damage.BASE_MS, None, ())])
        writer._log.flush()
        writer._unlock()
    (damage.shard(small, "b1") / "checkpoint").unlink()
    report = repair_store(small.root)
    assert not report.refused
    with open_store(small.root) as store, store.reader("b1") as reader:
        assert reader.record_count == 12


def test_a_log_without_commit_notes_is_refused(tmp_path):
    """A log whose batches carry no annotation (written before annotations existed)."""
    with open_store(tmp_path / "store", create=True, settings=damage.SMALL) as store:
        writer = store.writer("b1")
        writer._log.append([MessageRecord("t", 0, i, damage.BASE_MS, None, ()) for i in range(5)])
        writer._log.flush()
        writer._unlock()
    (tmp_path / "store" / "broker=b1" / "checkpoint").unlink()
    report = repair_store(tmp_path / "store")
    assert report.refused and "commit note" in report.refused[0].action
    assert not (tmp_path / "store" / "broker=b1" / "checkpoint").exists()
