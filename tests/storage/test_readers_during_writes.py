"""Readers in other processes see a consistent committed snapshot while a writer appends, rolls log
segments and hash index files (or, on an object store, commits versions and compacts and
collects chunks): no exception, no torn row, no missing committed row.

One writer process appends batches of random size through ``Store.writer(...)`` (kept open for
three appends, then closed and reopened: both lifecycles; tiny sizing: a log segment rolls every
few batches, a hash index file every ~1,500 keys) and after each commit publishes how many records
it has committed. Reader processes loop
``msgindex.open(path).lookup(...)`` and ``.scan()``; every answer must be exactly the records of
some committed prefix at least as long as the count published before the call, row by row.
Progress files live in a local scratch directory for both kinds of store.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

RUN_SECONDS = {"local": 25, "s3": 20}
MIN_READS = {"local": (20, 5), "s3": (6, 2)}  # (lookups, scans) per reader: an object store's cost requests
READERS = 2
# object stores: compaction after most commits, collection every second, a grace period several
# times longer than a reader keeps a version (one lookup or scan) yet shorter than the run
TUNING = {"compaction_interval_s": 0.5, "max_chunks": 6, "grace_s": 8.0, "collect_interval_s": 1.0}

COMMON = textwrap.dedent("""
    import json, os, random, sys, time
    from pathlib import Path
    import msgindex
    from msgindex.storage.durable import write_atomically
    from msgindex.storage.message import MessageRecord
    from msgindex.storage.store import StoreSettings

    KEYS = 40

    def record(i):
        return MessageRecord(f"t{i % 2}", i % 3, i, 1_000_000 + 10 * i + (i * 7919) % 3000, f"k{i % KEYS}",
                             (f"k{i % KEYS}",) + ((f"x{i % 5}",) if i % 4 == 0 else ()))

    def progress(scratch):
        try:
            return int((scratch / "progress").read_text())
        except FileNotFoundError:
            return 0

    def open_store(root, create=False, settings=None, tuning=None):
        if tuning is None:
            return msgindex.storage.store.open_store(root, create=create, settings=settings)
        from msgindex.storage.location import parse_location
        from msgindex.storage.objects.shard import ObjectTuning
        from msgindex.storage.objects.store import open_object_store
        return open_object_store(parse_location(root), create=create, settings=settings, tuning=ObjectTuning(**tuning))
""")

WRITER = COMMON + textwrap.dedent("""
    root, scratch = sys.argv[1], Path(sys.argv[2])
    deadline = time.monotonic() + float(sys.argv[3])
    tuning = json.loads(sys.argv[4])
    rng = random.Random(5)
    settings = StoreSettings(hash_slot_num=53, index_num=1500, segment_bytes=12_000, index_interval_bytes=400)
    store = open_store(root, create=True, settings=settings, tuning=tuning)
    written, batch_id = 0, 0
    writer = store.writer("b0")
    while time.monotonic() < deadline:
        count = rng.randint(1, 400)
        writer.append([record(i) for i in range(written, written + count)])
        written += count
        batch_id += 1
        write_atomically(scratch / "progress", str(written).encode())
        if batch_id % 3 == 0:  # also the close/reopen lifecycle: indexes trimmed on close, regrown on open
            writer.close()
            writer = store.writer("b0")
    writer.close()
    (scratch / "done").write_text(str(written))
    print(written, batch_id)
""")

READER = COMMON + textwrap.dedent("""
    root, scratch = sys.argv[1], Path(sys.argv[2])
    rng = random.Random(int(sys.argv[3]))
    while not (scratch / "progress").exists():
        time.sleep(0.01)

    def check_rows(rows, seqs_expected, what):
        seqs = [r["seq"] for r in rows]
        assert seqs == seqs_expected, (what, seqs[:10], seqs_expected[:10], len(seqs), len(seqs_expected))
        for r in rows:
            want = record(r["seq"])
            got = (r["topic"], r["partition"], r["offset"], r["key"], tuple(r["keys"]))
            assert got == (want.topic, want.partition, want.offset, want.key, want.keys), (what, r)
            assert round(r["timestamp"].timestamp() * 1000) == want.timestamp_ms, (what, r)

    lookups = scans = 0
    while not (scratch / "done").exists():
        floor = progress(scratch)  # committed before the calls below start
        store = msgindex.open(root)
        try:
            k = rng.randrange(KEYS)
            rows = sorted(store.lookup(f"k{k}").to_pylist(), key=lambda r: r["seq"])
            top = rows[-1]["seq"] + 1 if rows else 0
            check_rows(rows, list(range(k, max(top, k), KEYS)), "lookup")
            assert top + KEYS > floor, ("lookup missed committed rows", top, floor)
            lookups += 1
            if lookups % 4 == 0:
                rows = [r for batch in store.scan() for r in batch.to_pylist()]
                assert len(rows) >= floor, ("scan missed committed rows", len(rows), floor)
                check_rows(rows, list(range(len(rows))), "scan")
                scans += 1
        finally:
            store.close()
    print(lookups, scans)
""")


def test_readers_see_whole_committed_snapshots_while_the_writer_rolls(stores):
    root, scratch = stores.root("store"), stores.tmp_path
    seconds = RUN_SECONDS[stores.kind]
    tuning = json.dumps(None if stores.is_local else TUNING)
    repo = Path(__file__).resolve().parents[2]
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(scratch), str(seconds), tuning], cwd=repo,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=stores.env)
    readers = [subprocess.Popen([sys.executable, "-c", READER, str(root), str(scratch), str(seed)], cwd=repo,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=stores.env)
               for seed in range(READERS)]
    out, err = writer.communicate(timeout=seconds + 120)
    assert writer.returncode == 0, err[-3000:]
    written, batches = map(int, out.split())
    for reader in readers:
        out, err = reader.communicate(timeout=120)
        assert reader.returncode == 0, err[-3000:]
        lookups, scans = map(int, out.split())
        assert (lookups, scans) >= MIN_READS[stores.kind] and scans >= MIN_READS[stores.kind][1], (lookups, scans)
    if stores.is_local:
        log_dir, index_dir = root / "broker=b0" / "log", root / "broker=b0" / "index"
        segments = len(list(log_dir.glob("*.log")))
        index_files = len(list(index_dir.iterdir()))
        assert batches > 50 and segments > 10 and index_files > 5, (batches, segments, index_files)  # rolls happened
        assert written > 10_000
    else:  # versions committed, chunks compacted away and collected meanwhile (each append put one)
        with stores.open(root) as store:
            chunks = len(store.writer("b0").refresh().chunks)
            listed = len(store.client.list(f"{store.shard_prefix('b0')}/chunks/"))
        assert batches > 20 and chunks < batches // 3 and listed < batches, (batches, chunks, listed)
