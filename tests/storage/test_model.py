"""Stateful property test: any sequence of appends (replays included), file rolls, crashes that
leave part of a batch on disk, reopens and queries answers like a plain in-memory model. On an
object store: writers that died before their commit (and the retry of their batch), stale writers
that lose versions, compaction, collection and retention, likewise against the model."""

from __future__ import annotations

import random
import shutil
import uuid
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from msgindex.storage.hash_index.index_file import HEADER_SIZE
from msgindex.storage.objects.shard import ObjectTuning
from msgindex.storage.shard import index_entries
from tests.storage.kinds import committed_state, shard_bytes
from tests.storage.shard_model import (
    KEY_POOL,
    TINY,
    TOPICS,
    ShardModel,
    make_batch,
    model_lookup,
    model_scan,
    table_rows,
)

BROKERS = ["b0", "b1"]
BASE = 1_700_000_000_000
windows = st.one_of(
    st.none(),
    st.tuples(st.integers(BASE - 1000, BASE + 21_000), st.integers(0, 8000)).map(lambda t: (t[0], t[0] + t[1])),
)


class StoreMachine(RuleBasedStateMachine):
    """The rules of both kinds of store; ``stores`` (tests/object_store.py) is set on a subclass."""

    stores = None
    tuning = None

    @initialize(seed=st.integers(0, 2**32 - 1))
    def setup(self, seed):
        self.name = f"model-{uuid.uuid4().hex[:8]}"
        self.store = self.stores.create(self.name, settings=TINY, tuning=self.tuning)
        self.rng = random.Random(seed)
        self.models = {b: ShardModel(b) for b in BROKERS}
        self.writers = {}
        self.next_offset = 0
        self.lost = []  # (object stores) batches of writers that died before their commit

    def teardown(self):
        if not hasattr(self, "store"):
            return
        for writer in self.writers.values():
            writer.close()
        self.store.close()
        if self.stores.is_local:
            shutil.rmtree(self.stores.root(self.name), ignore_errors=True)

    def _writer(self, broker):
        if broker not in self.writers:
            self.writers[broker] = self.store.writer(broker)
        return self.writers[broker]

    def _batch(self, size):
        batch = make_batch(self.rng, self.next_offset, size)
        self.next_offset += size
        return batch

    @rule(broker=st.sampled_from(BROKERS), size=st.integers(0, 25))
    def append(self, broker, size):
        batch = self._batch(size)
        result = self._writer(broker).append(batch)
        assert (result.appended, result.already_committed) == (size, 0)
        assert self.models[broker].append(batch) == size

    @rule(broker=st.sampled_from(BROKERS), back=st.integers(0, 30), new=st.integers(0, 5), seed=st.integers(0, 9))
    def replay(self, broker, back, new, seed):
        """Records the shard holds again (a replayed or speculative task), mixed with new ones."""
        model = self.models[broker]
        old = model.records[len(model.records) - min(back, len(model.records)):]
        batch = old + self._batch(new)
        random.Random(seed).shuffle(batch)
        result = self._writer(broker).append(batch)
        assert (result.appended, result.already_committed) == (new, len(old))
        assert model.append(batch) == new

    @rule(broker=st.sampled_from(BROKERS))
    def reopen(self, broker):
        if broker in self.writers:
            self.writers.pop(broker).close()
        self._writer(broker)

    @rule(keys=st.lists(st.sampled_from(KEY_POOL + ["absent"]), min_size=1, max_size=4),
          topic=st.one_of(st.none(), st.sampled_from(TOPICS + ["other"])), window=windows,
          max_results=st.one_of(st.none(), st.integers(0, 5)))
    def lookup(self, keys, topic, window, max_results):
        begin, end = window or (None, None)
        got = self.store.lookup(keys, topic=topic, begin_ms=begin, end_ms=end, max_results=max_results)
        expected = model_lookup(self._present(), keys, topic=topic, begin_ms=begin, end_ms=end, max_results=max_results)
        assert table_rows(got) == expected

    @rule(window=windows, topics=st.one_of(st.none(), st.lists(st.sampled_from(TOPICS), max_size=2)))
    def scan(self, window, topics):
        begin, end = window or (None, None)
        got = table_rows(self.store.scan(begin_ms=begin, end_ms=end, topics=topics))
        assert got == model_scan(self._present(), begin_ms=begin, end_ms=end, topics=topics)

    @invariant()
    def committed_ranges(self):
        if not hasattr(self, "store"):
            return
        for broker in self.store.brokers():
            with self.store.reader(broker) as reader:
                assert reader.committed_ranges.to_json() == self.models[broker].ranges_json()
                assert reader.record_count == len(self.models[broker].rows())

    def _present(self):
        return [self.models[b] for b in self.store.brokers()]


class LocalStoreMachine(StoreMachine):
    """A local store: crashes that leave part of a batch in its files."""

    @rule(broker=st.sampled_from(BROKERS), size=st.integers(1, 25), fraction=st.floats(0, 1),
          cut_log=st.integers(0, 40), lag_header=st.booleans())
    def crash_mid_batch(self, broker, size, fraction, cut_log, lag_header):
        """Write the records and part of the hash entries of a batch, never commit, and drop the
        writer; maybe the index headers never got written (a put writes them last), maybe the
        tail of the log file is torn as a dying write would leave it."""
        writer = self._writer(broker)
        batch = self._batch(size)
        seqs = writer.log.append(batch)
        keys, phys, stamps = index_entries(batch, seqs)
        part = int(len(keys) * fraction)
        headers = {path: path.read_bytes()[:HEADER_SIZE] for path in writer.index_file_paths()}
        writer._put_keys(keys[:part], phys[:part], stamps[:part])
        if lag_header:
            for path, header in headers.items():
                with open(path, "r+b") as f:
                    f.write(header)
        log_dir = writer.directory / "log"
        writer.close()
        del self.writers[broker]
        if cut_log:
            newest = sorted(log_dir.glob("*.log"))[-1]
            committed = self.store.reader(broker)
            committed.close()
            size_now = newest.stat().st_size
            with open(newest, "r+b") as f:  # bytes past the committed position only
                f.truncate(max(size_now - cut_log, _committed_size(newest, committed)))


class ObjectStoreMachine(StoreMachine):
    """An object store: no locks, so several writers of a shard at once (the cached one goes
    stale and loses versions), writers dead before their commit, compaction, collection (no
    grace period: no reader is held between steps) and retention by whole chunks."""

    tuning = ObjectTuning(compaction_interval_s=3600, max_chunks=6, grace_s=0)

    @rule(broker=st.sampled_from(BROKERS), size=st.integers(1, 25))
    def die_before_commit(self, broker, size):
        """A writer put its chunk and died before its commit: nothing of it is visible; its batch
        comes again later (the retried task)."""
        batch = self._batch(size)
        self.store.writer(broker)._write_chunk(batch, np.arange(len(batch)))
        self.lost.append((broker, batch))

    @rule(data=st.data())
    def retry_lost(self, data):
        if not self.lost:
            return
        broker, batch = self.lost.pop(data.draw(st.integers(0, len(self.lost) - 1)))
        writer = self._writer(broker) if data.draw(st.booleans()) else self.store.writer(broker)
        result = writer.append(batch)
        # (usually all of it; less when a replay's slice spanned its offsets since: committed by range)
        fresh = self.models[broker].append(batch)
        assert (result.appended, result.already_committed) == (fresh, len(batch) - fresh)

    @rule(broker=st.sampled_from(BROKERS), size=st.integers(1, 25))
    def append_by_another_writer(self, broker, size):
        """Another writer (another task or process) commits: the cached writer is now stale."""
        batch = self._batch(size)
        assert self.store.writer(broker).append(batch).appended == size
        assert self.models[broker].append(batch) == size

    @rule(broker=st.sampled_from(BROKERS), everything=st.booleans(), cached=st.booleans())
    def compact(self, broker, everything, cached):
        if self.models[broker].records:
            (self._writer(broker) if cached else self.store.writer(broker)).compact(everything=everything)

    @rule(broker=st.sampled_from(BROKERS))
    def collect(self, broker):
        if self.models[broker].records:
            self.store.writer(broker).collect()

    @rule(broker=st.sampled_from(BROKERS), fraction=st.floats(0, 1), dry_run=st.booleans())
    def retention(self, broker, fraction, dry_run):
        model = self.models[broker]
        if not model.records:
            return
        before = committed_state(self.store, broker)
        cap = int(shard_bytes(self.store, broker) * fraction)
        report = self.store.writer(broker).apply_retention(max_bytes=cap, dry_run=dry_run)
        start, count = committed_state(self.store, broker)
        if dry_run:
            assert (start, count) == before
        else:  # the oldest whole chunks, never the newest, until the shard fits (or one chunk is left)
            assert count == before[1] and before[0] <= start < count
            assert (start > before[0]) == bool(report.deleted_segments)
            with self.store.reader(broker) as reader:
                assert shard_bytes(self.store, broker) <= cap or len(reader.version.chunks) == 1
        model.log_start_seq = start

    @invariant()
    def listed_chunks_exist(self):
        if not hasattr(self, "store"):
            return
        for broker in self.store.brokers():
            with self.store.reader(broker) as reader:
                prefix = self.store.shard_prefix(broker)
                present = {info.key for info in self.store.client.list(f"{prefix}/chunks/")}
                assert {f"{prefix}/{c.name}" for c in reader.version.chunks} <= present



def _committed_size(segment: Path, reader) -> int:
    """Bytes of `segment` that the committed position covers (the whole file if it is sealed)."""
    position = reader.checkpoint.log_position
    if int(segment.stem) != position.segment_base:
        return segment.stat().st_size
    return position.segment_bytes


# An object store's step costs tens of requests (~10 ms each): fewer, shorter runs.
MACHINE_SETTINGS = {
    "local": settings(max_examples=80, stateful_step_count=25, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow]),
    "s3": settings(max_examples=12, stateful_step_count=20, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow]),
}


def test_store_model(stores):
    machine = LocalStoreMachine if stores.is_local else ObjectStoreMachine
    run_state_machine_as_test(type(machine.__name__, (machine,), {"stores": stores}),
                              settings=MACHINE_SETTINGS[stores.kind])
