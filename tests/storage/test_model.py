"""Stateful property test: any sequence of appends (replays included), file rolls, crashes that
leave part of a batch on disk, reopens and queries answers like a plain in-memory model."""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from msgindex.storage.index_file import HEADER_SIZE
from msgindex.storage.shard import index_entries
from msgindex.storage.store import open_store
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
    @initialize(seed=st.integers(0, 2**32 - 1))
    def setup(self, seed):
        self.tmp = Path(tempfile.mkdtemp(prefix="msgindex-model-"))
        self.store = open_store(self.tmp / "store", create=True, settings=TINY)
        self.rng = random.Random(seed)
        self.models = {b: ShardModel(b) for b in BROKERS}
        self.writers = {}
        self.next_offset = 0

    def teardown(self):
        for writer in self.writers.values():
            writer.close()
        self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

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
                assert reader.record_count == len(self.models[broker].records)

    def _present(self):
        return [self.models[b] for b in self.store.brokers()]


def _committed_size(segment: Path, reader) -> int:
    """Bytes of `segment` that the committed position covers (the whole file if it is sealed)."""
    position = reader.checkpoint.log_position
    if int(segment.stem) != position.segment_base:
        return segment.stat().st_size
    return position.segment_bytes


StoreMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreModel = StoreMachine.TestCase
