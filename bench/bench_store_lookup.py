"""Store-level verified key lookups per second, for 1 key and for 1000 keys per call.

Builds a store of RECORDS records (one shard, one key per record, a few topics) in a temporary
directory, then times `Store.lookup` (hash candidates from every index file + verification of each
candidate against the metadata log + Arrow rows) against a baseline measured in the same run: the
raw RocketMQ primitive `IndexFile.select_phy_offsets` (hash match only, no verification, no rows)
for the same keys. Prints rates and the ratio verified / raw, and the speed-up over a second baseline, what tools
without an index do: one full scan of the log filtering on the key.

usage: python bench/bench_store_lookup.py [--records 2000000] [--calls 2000]
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc

from msgindex.storage.message import MessageRecord, index_key
from msgindex.storage.store import StoreSettings, open_store

TOPICS = ["orders", "payments", "users", "events"]
BASE_MS = 1_700_000_000_000
BATCH = 100_000


def build(root: Path, records: int) -> None:
    settings = StoreSettings(hash_slot_num=1_000_000, index_num=4_000_000)
    with open_store(root, create=True, settings=settings) as store, store.writer("b0") as writer:
        for start in range(0, records, BATCH):
            batch = [
                MessageRecord(TOPICS[i % 4], i % 8, i, BASE_MS + (i * 37) % 3_600_000, f"key-{i}", (f"key-{i}",))
                for i in range(start, min(start + BATCH, records))
            ]
            writer.append(batch)


def rate(calls: int, seconds: float) -> float:
    return calls / seconds if seconds else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--calls", type=int, default=2000, help="1-key lookups timed")
    parser.add_argument("--batch-calls", type=int, default=20, help="1000-key lookups timed")
    args = parser.parse_args()
    rng = random.Random(42)
    tmp = Path(tempfile.mkdtemp(prefix="msgindex-bench-"))
    try:
        started = time.perf_counter()
        build(tmp / "store", args.records)
        print(f"built {args.records} records in {time.perf_counter() - started:.1f} s")
        ids = [rng.randrange(args.records) for _ in range(max(args.calls, args.batch_calls * 1000))]
        with open_store(tmp / "store") as store:
            reader = store.reader("b0")
            index_files = [index_file for _, index_file in reader.index_files()]
            store.lookup("warm-up", topic="orders")

            # 1 key per call
            t = time.perf_counter()
            for i in ids[: args.calls]:
                assert store.lookup(f"key-{i}", topic=TOPICS[i % 4]).num_rows == 1
            verified_1 = rate(args.calls, time.perf_counter() - t)
            t = time.perf_counter()
            for i in ids[: args.calls]:
                key = index_key(TOPICS[i % 4], f"key-{i}")
                hits = [p for f in reversed(index_files) for p in f.select_phy_offsets(key, 64, 0, 2**62)]
                assert i in hits
            raw_1 = rate(args.calls, time.perf_counter() - t)

            # 1000 keys per call (any topic: the shard's 4 topics are all probed)
            t = time.perf_counter()
            for c in range(args.batch_calls):
                chunk = ids[c * 1000 : (c + 1) * 1000]
                assert store.lookup([f"key-{i}" for i in chunk]).num_rows == len(set(chunk))
            verified_1000 = rate(args.batch_calls * 1000, time.perf_counter() - t)
            t = time.perf_counter()
            for c in range(args.batch_calls):
                for i in ids[c * 1000 : (c + 1) * 1000]:
                    for topic in TOPICS:
                        for f in reversed(index_files):
                            f.select_phy_offsets(index_key(topic, f"key-{i}"), 64, 0, 2**62)
            raw_1000 = rate(args.batch_calls * 1000, time.perf_counter() - t)

            # what tools without an index do: scan every record, filter on the key
            wanted = f"key-{ids[0]}"
            t = time.perf_counter()
            hits = sum(
                pc.sum(pc.equal(pc.list_flatten(batch.column("keys")), wanted)).as_py() or 0
                for batch in store.scan()
            )
            assert hits == 1
            scan_1 = rate(1, time.perf_counter() - t)
            reader.close()
        print(f"index files: {len(index_files)}")
        print(f"1 key/call:     verified {verified_1:10.0f} lookups/s   "
              f"raw select_phy_offsets {raw_1:10.0f}/s   ratio {verified_1 / raw_1:.2f}")
        print(f"1000 keys/call: verified {verified_1000:10.0f} keys/s      "
              f"raw select_phy_offsets {raw_1000:10.0f}/s   ratio {verified_1000 / raw_1000:.2f}")
        print(f"1000 keys/call: {verified_1000 / 1000:.1f} calls/s")
        print(f"full log scan:  {scan_1:10.3f} lookups/s   verified 1-key lookup is {verified_1 / scan_1:.0f}x faster")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
