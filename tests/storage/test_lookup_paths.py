"""Every path of a verified lookup gives the model's answer: a few candidates read record by
record, more read as columns by the compiled record reader (local stores), many read in chunks of
blocks (inline and on the read pool) whose ordered parts meet in overlap windows; and the overlap
windows against a full sort. Stores of both kinds (an object store's chunks are read by ranged GETs
in parallel)."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from msgindex.storage import result_order, verified_reads
from msgindex.storage.log import batch_format as bf
from msgindex.storage.log import metadata_log
from msgindex.storage.store import StoreSettings
from tests.object_store import STORE_KINDS, Stores
from tests.storage.kinds import is_object_store, patch_few_candidates
from tests.storage.shard_model import KEY_POOL, TOPICS, ShardModel, make_record, model_lookup, table_rows

BASE = 1_700_000_000_000
# Small hash files (many files, colliding slots) and segments (chunks that cross segments); the
# log keeps its 512-record blocks: every append of up to 512 records is one block.
SETTINGS = StoreSettings(hash_slot_num=7, index_num=700, segment_bytes=30_000, index_interval_bytes=300)
PATHS = {
    "record by record": {"FEW_CANDIDATES": 10**9},
    # candidates grouped by record in Python (as a few are) or with numpy (as more are) whatever their count
    "record by record, grouped in Python": {"FEW_CANDIDATES": 10**9, "_VECTOR_PAIRS": 10**9},
    "record by record, grouped with numpy": {"FEW_CANDIDATES": 10**9, "_VECTOR_PAIRS": 0},
    "compiled columns": {"FEW_CANDIDATES": 0, "COMPILED_COLUMNS_RECORDS": 10**9},
    "one chunk": {"FEW_CANDIDATES": 0, "COMPILED_COLUMNS_RECORDS": 0, "READ_CHUNK_BLOCKS": 10**6},
    "chunks inline": {"FEW_CANDIDATES": 0, "COMPILED_COLUMNS_RECORDS": 0, "READ_CHUNK_BLOCKS": 1,
                      "PARALLEL_MIN_CHUNKS": 10**9},
    "chunks on the pool": {"FEW_CANDIDATES": 0, "COMPILED_COLUMNS_RECORDS": 0, "READ_CHUNK_BLOCKS": 2,
                           "PARALLEL_MIN_CHUNKS": 2},
}


@pytest.fixture(scope="module", params=[(order, kind) for order in ("any time order", "nearly in time order")
                                         for kind in STORE_KINDS], ids=lambda p: f"{p[0]}-{p[1]}")
def filled(tmp_path_factory, request):
    """A store (of each kind) of ~3,000 records with hot keys (hundreds of records each),
    colliding keys and topics, keyless and multi-key records, message keys past the first of the keys;
    their timestamps either span 20 s in any order (all chunks overlap in time) or move on 5 s
    per append, 20 s of jitter (chunks overlap at their edges only). Returns how to open it, and
    its model."""
    order, kind = request.param
    stores = Stores(kind, tmp_path_factory.mktemp("paths"))
    if kind != "local":
        stores.server = request.getfixturevalue("s3")
        stores.bucket = stores.server.bucket()
    rng = random.Random(5)
    model = ShardModel("b")
    step = 0 if order == "any time order" else 5_000
    with stores.create(settings=SETTINGS) as store, store.writer("b") as writer:
        offset = 0
        for batch_id in range(16):
            batch = [make_record(rng, offset + i, base_ms=BASE + step * batch_id)
                     for i in range(rng.choice([1, 37, 200, 512]))]
            # some messages' keys are not their first index key (stored apart from the keys list)
            batch = [replace(record, key=record.keys[-1]) if record.key is None and len(record.keys) > 1
                     and rng.random() < 0.5 else record for record in batch]
            offset += len(batch)
            writer.append(batch)
            model.append(batch)
    return stores.open, model


@pytest.mark.parametrize("path", list(PATHS))
def test_every_lookup_path_answers_like_the_model(filled, path, monkeypatch):
    for name, value in PATHS[path].items():
        if name == "FEW_CANDIDATES":
            patch_few_candidates(monkeypatch, value)
        elif name == "_VECTOR_PAIRS":
            monkeypatch.setattr(verified_reads, name, value)
        else:
            monkeypatch.setattr(metadata_log, name, value)
    open_filled, model = filled
    rng = random.Random(path)
    with open_filled() as store:
        on_objects = is_object_store(store)
        if on_objects and path == "chunks inline":
            pytest.skip("an object store reads chunks of blocks on its I/O threads always: 'on the pool' covers it")
        if path == "compiled columns" and (on_objects or bf.compiled_blocks is None):
            pytest.skip("the compiled record reader was not built here" if bf.compiled_blocks is None
                        else "an object store's blocks come by ranged GETs, not from a file: no compiled reader")
        for key in KEY_POOL:
            assert table_rows(store.lookup(key)) == model_lookup([model], [key]), key
        assert table_rows(store.lookup(KEY_POOL)) == model_lookup([model], KEY_POOL)
        for _ in range(6 if on_objects else 12):  # (an object store's lookup is ~30 requests here)
            keys = rng.sample(KEY_POOL, rng.randint(1, 4))
            topic = rng.choice([None, *TOPICS])
            begin = rng.choice([None, BASE + rng.randint(0, 50_000)])
            end = rng.choice([None, BASE + rng.randint(20_000, 100_000)])
            partitions = rng.choice([None, [0], [1, 2]])
            limit = rng.choice([None, 0, 1, 17, 500])
            got = store.lookup(keys, topic=topic, begin_ms=begin, end_ms=end, partitions=partitions,
                               max_results=limit)
            assert table_rows(got) == model_lookup([model], keys, topic=topic, begin_ms=begin, end_ms=end,
                                                   partitions=partitions, max_results=limit)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5)), max_size=80))
@example([(7, 1), (3, 0), (7, 1), (7, 0), (3, 2), (7, 1)])  # a record under two pairs, one of them three times
def test_candidates_grouped_by_record_with_numpy_as_in_python(candidates):
    seqs = np.array([seq for seq, _ in candidates], dtype=np.int64)
    who = np.array([number for _, number in candidates], dtype=np.int64)
    oracle = verified_reads.pairs_by_record_scalar(seqs, who)
    saved, verified_reads._VECTOR_PAIRS = verified_reads._VECTOR_PAIRS, 0  # numpy's grouping, however few
    try:
        grouped = verified_reads.pairs_by_record(seqs, who)
    finally:
        verified_reads._VECTOR_PAIRS = saved
    (records, repeated_seqs, repeated_numbers), (want_records, want_seqs, want_numbers) = grouped, oracle
    assert [column.tolist() for column in records] == [column.tolist() for column in want_records]
    assert records.as_dict() == {seq: sorted(set(n for s, n in candidates if s == seq)) for seq, _ in candidates}
    assert sorted(zip(repeated_seqs.tolist(), repeated_numbers.tolist())) == sorted(
        zip(want_seqs.tolist(), want_numbers.tolist()))


def test_chunked_lookups_really_use_several_chunks(filled, monkeypatch):
    open_filled, _ = filled
    monkeypatch.setattr(metadata_log, "READ_CHUNK_BLOCKS", 1)
    monkeypatch.setattr(metadata_log, "COMPILED_COLUMNS_RECORDS", 0)  # (that path reads each segment at once)
    parts = []
    with open_filled() as store, store.reader("b") as reader:
        original = reader._verified
        monkeypatch.setattr(reader, "_verified", lambda *a: parts.append(original(*a)) or parts[-1])
        reader.lookup(KEY_POOL)
    assert len(parts[0]) > 10  # verified and ordered chunk by chunk, then merged


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(-8, 8), min_size=1, max_size=12), min_size=1, max_size=8), st.booleans())
@example([[0, 5], [-9, 0, 10], [2, 10]], False)  # two separate windows
def test_overlap_windows_give_the_order_of_a_full_sort(runs, nearly_in_time_order):
    """Runs each in order (as a log's chunks: nearly in time order, or in any order), cut where
    they meet; ordering only the windows of rows that may be out of place must give the full
    sort (ties by position: rows are distinct)."""
    step = 10 if nearly_in_time_order else 0
    stamps = np.concatenate([np.sort(np.array(run, dtype=np.int64) + step * i) for i, run in enumerate(runs)])
    cuts = np.cumsum([len(run) for run in runs])[:-1]
    position = np.arange(len(stamps))
    order = position.copy()
    for low, high in result_order.overlaps(stamps, cuts):
        window = slice(low, high)
        order[window] = low + np.lexsort((position[window], stamps[window]))
    assert np.array_equal(order, np.lexsort((position, stamps)))
