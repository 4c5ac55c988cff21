"""A full disk is an error naming the file, never a signal, and nothing committed is lost.

The store lives on a small tmpfs mounted for the test (root only; skipped, saying so, where
mounting is not allowed). Writers run in subprocesses so that a SIGBUS would show as the exit
status instead of killing pytest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from msgindex.storage.store import open_store
from tests.small_disk import fill_disk
from tests.storage.shard_model import shard_files

# index files of ~0.5 MB: a few fit, the disk fills while rolling to new ones
SETTINGS = dict(hash_slot_num=4096, index_num=25_000, segment_bytes=256 << 10, index_interval_bytes=4096)

WRITER = textwrap.dedent("""
    import sys
    from msgindex.errors import MsgIndexError
    from msgindex.storage.message import MessageRecord
    from msgindex.storage.hash_index import index_file
    from msgindex.storage.store import open_store

    root, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if len(sys.argv) > 4:
        index_file.GROWTH_ENTRIES = int(sys.argv[4])
    store = open_store(root)
    try:
        with store.writer("b") as writer:
            for batch in range(first, last):
                writer.append([MessageRecord("t", 0, batch * 500 + i, 1_700_000_000_000 + i, f"k{batch}-{i}",
                                                    (f"k{batch}-{i}", f"shared{i % 7}")) for i in range(500)])
                print(f"committed {batch}", flush=True)
    except (MsgIndexError, OSError) as error:
        print(f"error {type(error).__name__}: {error}", flush=True)
        sys.exit(3)
""")


def _write(root: Path, first: int, last: int, growth: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WRITER, str(root), str(first), str(last),
                           *([] if growth is None else [str(growth)])], capture_output=True, text=True, timeout=300)


def _committed(output: str) -> list[int]:
    return [int(line.split()[1]) for line in output.splitlines() if line.startswith("committed ")]


def test_a_full_disk_is_a_clear_error_and_loses_nothing(small_disk):
    from msgindex.storage.settings import StoreSettings

    root = small_disk / "index"
    open_store(root, create=True, settings=StoreSettings(**SETTINGS)).close()
    first = _write(root, 0, 2)
    assert first.returncode == 0 and _committed(first.stdout) == [0, 1], first.stdout + first.stderr
    filler = fill_disk(small_disk, leave_bytes=300 << 10)

    full = _write(root, 2, 40)  # runs out of space somewhere: a log write or a new index file
    assert full.returncode == 3, f"expected a clean error, got status {full.returncode}: {full.stderr[-2000:]}"
    error = full.stdout.splitlines()[-1]
    # whichever write met the full disk (a log segment, a new index file, a checkpoint), the error
    # is StorageFullError naming that file under the store
    assert error.startswith(f"error StorageFullError: {root}/") and "no space left" in error, error
    committed = [0, 1] + _committed(full.stdout)

    # reopening the writer while the disk is still full: an error or a clean rollback, never SIGBUS
    again = _write(root, committed[-1] + 1, committed[-1] + 2)
    assert again.returncode not in (-signal.SIGBUS, -signal.SIGSEGV), again.stderr[-2000:]
    assert again.returncode in (0, 3), again.stderr[-2000:]
    committed += _committed(again.stdout)

    # space comes back: the shard resumes exactly where its checkpoint says
    filler.unlink()
    more = _write(root, committed[-1] + 1, committed[-1] + 3)
    assert more.returncode == 0, more.stdout + more.stderr
    committed += _committed(more.stdout)
    with open_store(root) as store:
        for batch in committed:
            assert store.lookup(f"k{batch}-7").num_rows == 1, f"batch {batch} lost"
        assert sum(b.num_rows for b in store.scan()) == 500 * len(committed)
    assert shard_files(root / "broker=b")  # still a shard


@pytest.mark.parametrize("failure", ["enospc", "short"])
def test_a_log_write_on_a_full_disk_is_storage_full_naming_the_segment(tmp_path, monkeypatch, failure):
    """The log's own write path, where the tmpfs test may not land: pwrite failing with ENOSPC,
    or writing short, is StorageFullError naming the segment, and the commit before survives."""
    import errno

    from msgindex.errors import StorageFullError
    from msgindex.storage.message import MessageRecord
    from msgindex.storage.settings import StoreSettings

    records = [MessageRecord("t", 0, i, 1_700_000_000_000 + i, f"k{i}", (f"k{i}",)) for i in range(20)]
    with open_store(tmp_path / "s", create=True, settings=StoreSettings(**SETTINGS)) as store:
        with store.writer("b") as writer:
            writer.append(records[:10])
            real_pwrite = os.pwrite

            def full_pwrite(fd, data, offset):
                if failure == "enospc":
                    raise OSError(errno.ENOSPC, "No space left on device")
                return real_pwrite(fd, data[: len(data) // 2], offset)

            monkeypatch.setattr(os, "pwrite", full_pwrite)
            with pytest.raises(StorageFullError, match=r"broker=b/log/00000000000000000000\.log: .*"):
                writer.append(records[10:])
            monkeypatch.undo()
        with store.writer("b") as writer:
            assert writer.append(records).appended == 10
        assert sum(b.num_rows for b in store.scan()) == 20


# One hash index file whose full size (8 MB) is twice the disk: it grows in steps of 80 KB ahead of
# its entries, so the store fits until the data does not
GROWING = dict(hash_slot_num=4096, index_num=400_000, segment_bytes=256 << 10, index_interval_bytes=4096)
GROWTH_STEP = 4096  # entries


def test_a_hash_index_file_that_grows_into_a_full_disk_is_a_clear_error_and_loses_nothing(small_disk):
    """Growing a hash index file (index_file: allocated ahead of its writer in steps) on a disk that
    fills up: StorageFullError naming a file of the store, never a signal; the file keeps a length
    of whole entries; once space is back the shard resumes exactly where its checkpoint says."""
    from msgindex.storage.hash_index.index_file import IndexFile
    from msgindex.storage.settings import StoreSettings

    root = small_disk / "index"
    open_store(root, create=True, settings=StoreSettings(**GROWING)).close()
    assert IndexFile.file_size(GROWING["hash_slot_num"], GROWING["index_num"]) > os.statvfs(small_disk).f_blocks * \
        os.statvfs(small_disk).f_frsize  # the old full-size allocation could not even start
    first = _write(root, 0, 2, GROWTH_STEP)
    assert first.returncode == 0 and _committed(first.stdout) == [0, 1], first.stdout + first.stderr
    filler = fill_disk(small_disk, leave_bytes=400 << 10)

    full = _write(root, 2, 400, GROWTH_STEP)  # 1,000 entries a batch: a step every ~4 batches
    assert full.returncode == 3, f"expected a clean error, got status {full.returncode}: {full.stderr[-2000:]}"
    error = full.stdout.splitlines()[-1]
    # growing by 80 KB is the largest write by far (a batch's log bytes are a few KB)
    assert error.startswith(f"error StorageFullError: {root}/broker=b/index/") and "no space left to allocate" in error, error
    committed = [0, 1] + _committed(full.stdout)
    assert len(committed) > 6  # it grew at least once before the disk was full
    [index] = [p for p in (root / "broker=b" / "index").iterdir() if p.name.isdigit()]
    entries_at = 40 + 4 * GROWING["hash_slot_num"]
    assert (index.stat().st_size - entries_at) % (20 * GROWTH_STEP) == 0  # whole steps, nothing half-grown

    again = _write(root, committed[-1] + 1, committed[-1] + 2, GROWTH_STEP)
    assert again.returncode not in (-signal.SIGBUS, -signal.SIGSEGV), again.stderr[-2000:]
    assert again.returncode in (0, 3), again.stderr[-2000:]
    committed += _committed(again.stdout)

    filler.unlink()
    more = _write(root, committed[-1] + 1, committed[-1] + 9, GROWTH_STEP)  # grows again
    assert more.returncode == 0, more.stdout + more.stderr
    committed += _committed(more.stdout)
    with open_store(root) as store:
        for batch in committed:
            assert store.lookup(f"k{batch}-7").num_rows == 1, f"batch {batch} lost"
        assert store.lookup("shared3").num_rows == len(committed) * len(range(3, 500, 7))
        assert sum(b.num_rows for b in store.scan()) == 500 * len(committed)
