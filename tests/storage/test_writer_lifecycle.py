"""Writers that stay open between appends (the pipeline's per-worker writers): the lock is taken
per append and the writer revalidates its view on each acquisition -- unchanged (fast path),
another process committed (adopt), a writer died mid-append (roll back) -- across real processes."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import random
import signal

import pytest

from msgindex.errors import InvalidAppendError
from msgindex.storage.shard import (
    REVALIDATION_ADOPTED,
    REVALIDATION_RECOVERED,
    REVALIDATION_ROLLED_BACK,
    REVALIDATION_UNCHANGED,
    index_entries,
)
from msgindex.storage.store import open_store
from tests.storage.shard_model import KEY_POOL, TINY, ShardModel, make_batch, model_lookup, model_scan, table_rows

BROKER = "b"
FORK = multiprocessing.get_context("fork")


def _batches(seed: int, count: int, size: int = 20):
    rng = random.Random(seed)
    return [make_batch(rng, n * size, size) for n in range(count)]


def assert_shard_holds(root, batches) -> None:
    """The shard's committed ranges, records (scan) and lookups are the model's of `batches`."""
    model = ShardModel(BROKER)
    for batch in batches:
        model.append(batch)
    with open_store(root) as store, store.reader(BROKER) as reader:
        assert reader.committed_ranges.to_json() == model.ranges_json()
        assert [row for s, e in reader.scan_ranges() for row in table_rows(reader.scan_range(s, e))] == model_scan([model])
        for key in KEY_POOL:
            assert table_rows(reader.lookup(key)) == model_lookup([model], [key])


def _alternating_writer(root: str, parity: int, seed: int, count: int, turns, done) -> None:
    """A process with ONE writer kept open, appending every other batch when it is its turn."""
    with open_store(root) as store:
        writer = store.writer(BROKER, hold_lock=False)
        seen = []
        for n, batch in enumerate(_batches(seed, count)):
            if n % 2 != parity:
                continue
            turns[parity].acquire()
            with writer.locked(30):
                seen.append(writer.last_revalidation)
                writer.append(batch)
            done.put((parity, n, seen[-1]))
            turns[1 - parity].release()
        writer.close()


def test_two_processes_alternating_on_one_shard(tmp_path):
    root = tmp_path / "s"
    open_store(root, create=True, settings=TINY).close()
    count = 12
    turns = [FORK.Semaphore(1), FORK.Semaphore(0)]
    done = FORK.Queue()
    workers = [FORK.Process(target=_alternating_writer, args=(str(root), p, 5, count, turns, done)) for p in (0, 1)]
    for worker in workers:
        worker.start()
    events = [done.get(timeout=60) for _ in range(count)]
    for worker in workers:
        worker.join(30)
        assert worker.exitcode == 0
    assert [n for _, n, _ in events] == list(range(count))
    # each writer's first acquisition is cold; after that the other process has always committed
    assert [how for _, n, how in events[2:]] == [REVALIDATION_ADOPTED] * (count - 2)
    assert_shard_holds(root, _batches(5, count))


def test_unchanged_shard_takes_the_fast_path_and_locking_is_required(tmp_path):
    # one segment for all the batches: its sparse indexes hold entries, and room for more
    settings = dataclasses.replace(TINY, segment_bytes=100_000)
    with open_store(tmp_path / "s", create=True, settings=settings) as store:
        writer = store.writer(BROKER, hold_lock=False)
        with pytest.raises(InvalidAppendError, match="while holding the lock"):
            writer.append(_batches(1, 1)[0])
        outcomes = []
        for batch in _batches(1, 4):
            with writer.locked(5):
                outcomes.append(writer.last_revalidation)
                writer.append(batch)
        assert outcomes == [REVALIDATION_RECOVERED] + [REVALIDATION_UNCHANGED] * 3
        with store.writer(BROKER):  # a tool opens and closes the shard meanwhile (trims files)
            pass
        with writer.locked(5):
            assert writer.last_revalidation != REVALIDATION_UNCHANGED  # its view is stale: never written through
            writer.append(make_batch(random.Random(2), 500, 10))
        writer.close()
        with store.reader(BROKER) as reader:
            assert reader.record_count == 90


def _die_mid_append(root: str, batch, fraction: float) -> None:
    """Write the log records and part of the hash entries of `batch`, then SIGKILL ourselves."""
    with open_store(root) as store:
        writer = store.writer(BROKER, hold_lock=False)
        with writer.locked(10):
            seqs = writer.log.append(batch)
            keys, phys, stamps = index_entries(batch, seqs)
            part = int(len(keys) * fraction)
            writer._put_keys(keys[:part], phys[:part], stamps[:part])
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_kill_9_mid_append_then_a_kept_writer_rolls_back(tmp_path, fraction):
    root = tmp_path / "s"
    batches = _batches(9, 6, size=40)
    with open_store(root, create=True, settings=TINY) as store:
        writer = store.writer(BROKER, hold_lock=False)  # opened before the crash, kept open
        for batch in batches[:3]:
            with writer.locked(5):
                writer.append(batch)
        child = FORK.Process(target=_die_mid_append, args=(str(root), batches[3], fraction))
        child.start()
        child.join(30)
        assert child.exitcode == -signal.SIGKILL
        with store.reader(BROKER) as reader:
            assert reader.record_count == 120  # the dead writer committed nothing
        for batch in batches[3:]:
            with writer.locked(5):
                if batch is batches[3]:
                    assert writer.last_revalidation == REVALIDATION_ROLLED_BACK
                writer.append(batch)
        writer.close()
    assert_shard_holds(root, batches)
