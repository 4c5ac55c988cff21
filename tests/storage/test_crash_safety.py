"""kill -9 a writer process mid-batch, 50 times: the shard must come back as exactly the committed
batches, and writing the lost batches again must give the bytes of an uninterrupted run."""

from __future__ import annotations

import inspect
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from msgindex.storage.hash_index.index_file import IndexFile
from msgindex.storage.shard import ShardWriter
from msgindex.storage.store import open_store
from tests.storage.shard_model import (
    CRASH_BATCHES,
    KEY_POOL,
    TINY,
    ShardModel,
    crash_batches,
    model_lookup,
    model_scan,
    shard_files,
    table_rows,
)

TRIALS = 50
SEEDS = 5  # trials share a few batch sets so that their uninterrupted references are reused
CHILD = Path(__file__).with_name("crash_writer.py")
BROKER = "b0"


def reference_run(root: Path, seed: int) -> tuple[list[dict[str, bytes]], float]:
    """Shard files after each batch of an uninterrupted run (a fresh writer per batch, closed),
    and the mean time one append takes (to aim the kills inside appends)."""
    snapshots, spent = [], 0.0
    with open_store(root, create=True, settings=TINY) as store:
        with store.writer(BROKER):
            pass
        snapshots.append(shard_files(root / f"broker={BROKER}"))  # before batch 0
        for batch in crash_batches(seed):
            with store.writer(BROKER) as writer:
                started = time.perf_counter()
                writer.append(batch)
                spent += time.perf_counter() - started
            snapshots.append(shard_files(root / f"broker={BROKER}"))
    return snapshots, spent / CRASH_BATCHES


class WriterServer:
    """The fork server of crash_writer.py: one Python start-up for all trials."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def run_and_kill(self, root: Path, seed: int, target: int, delay: float) -> int:
        """Start a writer, SIGKILL it `delay` s after it begins batch `target`; its wait status."""
        self.process.stdin.write(f"run {root} {BROKER} {seed}\n")
        self.process.stdin.flush()
        pid = int(self._expect("pid"))
        killed = False
        while True:
            word, value = self._line()
            if word == "begin" and int(value) == target and not killed:
                if delay:
                    time.sleep(delay)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:  # it finished first; the server reports its exit
                    pass
                killed = True
            elif word == "exit":
                return int(value)

    def _expect(self, word: str) -> str:
        got, value = self._line()
        assert got == word, (got, value)
        return value

    def _line(self) -> tuple[str, str]:
        line = self.process.stdout.readline()
        assert line, "the crash writer server died"
        word, _, value = line.strip().partition(" ")
        return word, value

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)
        self.process.stdout.close()


@pytest.fixture
def scratch(tmp_path):
    """A scratch directory on tmpfs when there is one: kill -9 keeps the page cache, so fsync
    adds nothing to what a process crash tests, only minutes of waiting."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        directory = Path(tempfile.mkdtemp(prefix="msgindex-crash-", dir=shm))
        yield directory
        shutil.rmtree(directory, ignore_errors=True)
    else:
        yield tmp_path


def assert_shard_equals_model(root: Path, model: ShardModel) -> None:
    with open_store(root) as store, store.reader(BROKER) as reader:
        assert reader.committed_ranges.to_json() == model.ranges_json()
        assert reader.record_count == len(model.records)
        scanned = [row for s, e in reader.scan_ranges() for row in table_rows(reader.scan_range(s, e))]
        assert scanned == model_scan([model])
        for key in KEY_POOL[:6] + ["k1", "🔑"]:
            assert table_rows(reader.lookup(key)) == model_lookup([model], [key])
        assert table_rows(reader.lookup(KEY_POOL, topic="orders")) == model_lookup([model], KEY_POOL, topic="orders")


def committed_batches(seed: int, record_count: int) -> int:
    """How many of the trial's batches a shard holding `record_count` records committed (a batch
    commits whole or not at all)."""
    sizes = [len(batch) for batch in crash_batches(seed)]
    prefixes = [sum(sizes[:n]) for n in range(len(sizes) + 1)]
    assert record_count in prefixes, f"{record_count} records is not a prefix of whole batches {prefixes}"
    return prefixes.index(record_count)


def has_uncommitted_data(files: dict[str, bytes], committed: dict[str, bytes]) -> bool:
    """Records or hash entries past the commit (not just preallocated sparse-index space)."""
    for name, data in files.items():
        if name.startswith("index/") and data != committed.get(name):
            return True
        if name.endswith(".log") and len(data) > len(committed.get(name, b"")):
            return True
    return False


@pytest.mark.slow
def test_kill_9_mid_batch_then_recover(scratch):
    server = WriterServer()
    try:
        run_trials(scratch, server)
    finally:
        server.close()


def run_trials(tmp_path: Path, server: WriterServer) -> None:
    rng = random.Random(20260521)
    references = {seed: reference_run(tmp_path / f"ref{seed}", seed) for seed in range(SEEDS)}
    outcomes = {"killed": 0}
    torn_trials = 0  # trials killed with uncommitted bytes on disk
    trial = -1
    while outcomes["killed"] < TRIALS:  # a writer that finished before its kill does not count
        trial += 1
        assert trial < 3 * TRIALS, outcomes
        seed = trial % SEEDS
        snapshots, batch_seconds = references[seed]
        root = tmp_path / f"trial{trial}"
        open_store(root, create=True, settings=TINY).close()
        target = rng.randrange(CRASH_BATCHES)
        delay = rng.uniform(0, 1.2 * batch_seconds)
        status = server.run_and_kill(root, seed, target, delay)
        outcome = "killed" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL else f"status {status}"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

        # the shard equals the model of the batches it committed
        with open_store(root) as store, store.reader(BROKER) as reader:
            committed = committed_batches(seed, reader.record_count) - 1  # the last whole batch
        assert committed >= target - 1, (trial, committed, target)  # the child may run on briefly
        model = ShardModel(BROKER)
        for batch in crash_batches(seed)[: committed + 1]:
            model.append(batch)
        assert_shard_equals_model(root, model)

        # opening a writer rolls back to exactly the bytes the committed prefix had
        shard = root / f"broker={BROKER}"
        before = shard_files(shard)
        with open_store(root) as store:
            store.writer(BROKER).close()
        assert shard_files(shard) == snapshots[committed + 1], f"trial {trial}: rollback is not byte-exact"
        torn_trials += has_uncommitted_data(before, snapshots[committed + 1])

        # writing the lost batches again gives the uninterrupted run's bytes
        with open_store(root) as store, store.writer(BROKER) as writer:
            for batch in crash_batches(seed):
                writer.append(batch)  # committed ones are skipped
        assert shard_files(shard) == snapshots[-1], f"trial {trial}: rewritten shard differs"
    print(f"crash trials: {outcomes}, {torn_trials} left uncommitted bytes")
    # most kills must land inside an append, or this test would prove little
    assert torn_trials >= TRIALS // 4, f"only {torn_trials} of {TRIALS} kills left uncommitted bytes"


# --- kills at exact points -------------------------------------------------------------------
# A writer killed at one exact line (a tracer SIGKILLs the process just before the line runs):
# instants a few microseconds wide that the random trials above rarely hit, hit every run.
FORK = multiprocessing.get_context("fork")


def _kill_before(function, line: str) -> Callable:
    """A tracer that SIGKILLs the process just before `function` runs the source line `line`."""
    source, first = inspect.getsourcelines(function)
    target = first + next(n for n, text in enumerate(source) if text.strip() == line)

    def trace(frame, event, arg):
        if frame.f_code is not function.__code__:
            return None

        def each_line(frame, event, arg):
            if event == "line" and frame.f_lineno == target:
                os.kill(os.getpid(), signal.SIGKILL)
            return each_line
        return each_line
    return trace


def _write_killed(root: Path, batches: list, function, line: str) -> None:
    """In a child process: open a writer (it rolls back what a dead writer left) and append
    `batches`, killed just before `function` runs `line` (the open counts)."""
    def child():
        sys.settrace(_kill_before(function, line))
        with open_store(root) as store, store.writer(BROKER) as writer:
            for batch in batches:
                writer.append(batch)
        os._exit(0)
    process = FORK.Process(target=child)
    process.start()
    process.join(60)
    assert process.exitcode == -signal.SIGKILL, f"never reached {line!r} in {function.__qualname__}"


def _committed_then(root: Path, seed: int, committed: int) -> dict[str, bytes]:
    """A store whose shard committed the first `committed` batches of `seed`; its files."""
    with open_store(root, create=True, settings=TINY) as store, store.writer(BROKER) as writer:
        for batch in crash_batches(seed)[:committed]:
            writer.append(batch)
    return shard_files(root / f"broker={BROKER}")


def _assert_recovers_to(root: Path, seed: int, committed: int, files: dict[str, bytes]) -> None:
    """The next writer rolls the shard back to exactly `files`, and finishes the batches."""
    with open_store(root) as store:
        store.writer(BROKER).close()
    assert shard_files(root / f"broker={BROKER}") == files
    model = ShardModel(BROKER)
    for batch in crash_batches(seed)[:committed]:
        model.append(batch)
    assert_shard_equals_model(root, model)


def test_killed_between_the_key_hashes_and_the_prev_indexes_of_a_put(tmp_path):
    # Seed 1 leaves its active file with 7 entries: batch 1's first put is one entry into it
    # whose slot points at a committed entry. put_hashes wrote its keyHash and died before its
    # prevIndex (0 in the file) and its slot: a rollback that took that 0 as the slot's old value
    # zeroed a committed slot, and every later writer refused the shard.
    files = _committed_then(tmp_path, seed=1, committed=1)
    _write_killed(tmp_path, crash_batches(1)[1:], IndexFile.put_hashes, 'block["phy_offset"] = offsets')
    _assert_recovers_to(tmp_path, 1, 1, files)


def test_killed_while_rolling_back(tmp_path):
    # A writer dies just before committing batch 1 (every entry and slot of it written); the
    # next dies in its rollback before writing the header. The rollback after that must still
    # find what is left to undo: a header that counts entries it already zeroed was refused as
    # a damaged header.
    files = _committed_then(tmp_path, seed=1, committed=1)
    _write_killed(tmp_path, crash_batches(1)[1:], ShardWriter._commit, "committed_before = {state.name: "
                  "state.index_count for state in self._checkpoint.index_files}")
    _write_killed(tmp_path, [], IndexFile.rollback_to, "self._write_header(header)")
    _assert_recovers_to(tmp_path, 1, 1, files)
