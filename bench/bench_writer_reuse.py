"""Appends of small batches: a shard writer kept open between appends vs one opened per append.

Before issue 8 every micro-batch opened the shard writer and ran full recovery (the rollback of
the active hash index file scans its whole slot table; the sparse indexes were regrown on open
and trimmed on close). Now a worker keeps its writer open and only revalidates on each lock
acquisition. Measured in the same run, same batches, default StoreSettings (5,000,000 slots):

  reopen      a new ShardWriter per append: lock, full recovery, append, close (the baseline)
  kept        one writer, ``with writer.locked():`` per append: nothing changed -> the fast path
  alternating two writers of one process take turns: each finds the other's commit and adopts it
              (what two Python workers writing one shard do)

    .venv/bin/python bench/bench_writer_reuse.py [--batch-records 1000] [--appends 200]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from msgindex.storage.message import MessageRecord
from msgindex.storage.store import open_store

BASE_MS = 1_700_000_000_000


def batches(count: int, size: int) -> list[list[MessageRecord]]:
    rng = random.Random(1)
    out = []
    for b in range(count):
        keys = [(f"k{rng.randrange(10**6)}", f"c{rng.randrange(5000)}") for _ in range(size)]
        out.append([MessageRecord("orders", (b * size + i) % 6, b * size + i, BASE_MS + b * 100 + i, keys[i][0], keys[i])
                    for i in range(size)])
    return out


def reopen(store, work):
    for batch in work:
        with store.writer("b") as writer:
            writer.append(batch)


def kept(store, work):
    writer = store.writer("b", hold_lock=False)
    for batch in work:
        with writer.locked(10):
            writer.append(batch)
    writer.close()


def alternating(store, work):
    writers = [store.writer("b", hold_lock=False), store.writer("b", hold_lock=False)]
    for n, batch in enumerate(work):
        with writers[n % 2].locked(10):
            writers[n % 2].append(batch)
    for writer in writers:
        writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-records", type=int, default=1000)
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=".",
                        help="where the shards go (e.g. /dev/shm: no fsync cost, only the writer's own work)")
    args = parser.parse_args()
    work = batches(args.appends, args.batch_records)
    variants = {"reopen": reopen, "kept": kept, "alternating": alternating}
    best = dict.fromkeys(variants, float("inf"))
    with tempfile.TemporaryDirectory(prefix="bench-writer-", dir=args.dir) as tmp:
        for run in range(args.runs):  # round robin, fastest kept: the machine is shared
            for name, variant in variants.items():
                with open_store(Path(tmp) / f"{name}-{run}", create=True) as store:
                    with store.writer("b"):
                        pass  # the shard exists and is committed empty: every variant starts alike
                    started = time.perf_counter()
                    variant(store, work)
                    best[name] = min(best[name], time.perf_counter() - started)
    print(f"{args.appends} appends of {args.batch_records:,} records each, default StoreSettings, in {args.dir}, "
          f"best of {args.runs}:")
    for name, seconds in best.items():
        records_per_s = args.appends * args.batch_records / seconds
        print(f"  {name:12s} {args.appends / seconds:8,.1f} appends/s  {records_per_s:10,.0f} records/s"
              f"  {best['reopen'] / seconds:5.2f}x reopen")


if __name__ == "__main__":
    main()
