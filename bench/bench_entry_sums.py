"""What the entry checksums (storage/hash_index/entry_sums.py) cost a lookup: the same store read by two
handles in one process, one whose hash index files check the chunks of entries lookups touch
(what every reader does) and one that does not (the code before), queried in alternating
blocks so that both see the same machine load.

Measured, on bench_vs_parquet.py's workload (default sizing: one hash index file):
* warm: one-key p50/p99 of random keys and 1,000 keys per call (median), each handle long-lived,
  so most chunks were checked by earlier lookups (what a Store kept open sees);
* cold: the first lookup of a fresh handle with the process's memory of checked chunks cleared
  (what a CLI run or a fresh reader pays): one key, and 1,000 keys (which touch most chunks).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
from bench_vs_parquet import generate, write_store  # the script's folder is on sys.path

from msgindex.storage.hash_index import entry_sums
from msgindex.storage.hash_index.index_file import IndexFile
from msgindex.storage.store import open_store

BLOCK = 25


def unguarded(root: Path):
    """A store handle whose readers do not check entries (guard_entries a no-op while opening)."""
    original = IndexFile.guard_entries
    IndexFile.guard_entries = lambda self: None
    try:
        store = open_store(root)
        store.lookup("warm-up")  # opens the shard readers (and their index files) now
    finally:
        IndexFile.guard_entries = original
    return store


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=2000, help="one-key lookups timed per side")
    parser.add_argument("--runs", type=int, default=9, help="1,000-key lookups and cold opens per side")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="msgindex-entry-sums-") as work:
        root = Path(work) / "store"
        table = generate(args.records, args.seed)
        write_store(table, root, 1_000_000)
        distinct = pc.unique(table.column("key")).to_pylist()
        rng = np.random.default_rng(args.seed)
        keys = [distinct[i] for i in rng.integers(0, len(distinct), args.keys)]
        key_sets = [[distinct[i] for i in rng.integers(0, len(distinct), 1000)] for _ in range(args.runs)]
        sums = sorted((root / "broker=b0" / "index").glob(f"*{entry_sums.SUFFIX}"))
        print(f"{args.records:,} records; entry checksums: {sum(p.stat().st_size for p in sums):,} bytes")

        guarded, plain = open_store(root), unguarded(root)
        guarded.lookup("warm-up")
        one = {"checked": [], "unchecked": []}
        for start in range(0, len(keys), BLOCK):
            for name, store in (("checked", guarded), ("unchecked", plain)):
                one[name] += [timed(lambda k=key, s=store: s.lookup(k)) for key in keys[start : start + BLOCK]]
        many = {"checked": [], "unchecked": []}
        for key_set in key_sets:
            for name, store in (("checked", guarded), ("unchecked", plain)):
                many[name].append(timed(lambda s=store, ks=key_set: s.lookup(ks)))
        guarded.close()
        plain.close()

        cold = {(name, what): [] for name in ("checked", "unchecked") for what in ("one", "many")}
        for run in range(args.runs):
            for name in ("checked", "unchecked"):
                for what, query in (("one", keys[run]), ("many", key_sets[run])):
                    entry_sums.forget_checked()
                    store = unguarded(root) if name == "unchecked" else open_store(root)
                    store.lookup("warm-up")  # both sides: the shard's reader is open, no chunk checked
                    cold[(name, what)].append(timed(lambda s=store, q=query: s.lookup(q)))
                    store.close()

    def ms(values: list[float], q: float | None = None) -> str:
        value = statistics.median(values) if q is None else float(np.percentile(values, q))
        return f"{value * 1000:.3f} ms"

    print("| measure | entries checked | not checked | ratio |")
    print("|---|---|---|---|")
    for label, a, b in (
        (f"one key p50 ({args.keys} keys, warm handle)", ms(one["checked"], 50), ms(one["unchecked"], 50)),
        ("one key p99", ms(one["checked"], 99), ms(one["unchecked"], 99)),
        (f"1,000 keys (median of {args.runs}, warm handle)", ms(many["checked"]), ms(many["unchecked"])),
        (f"one key, fresh handle (median of {args.runs})", ms(cold[("checked", "one")]), ms(cold[("unchecked", "one")])),
        (f"1,000 keys, fresh handle (median of {args.runs})", ms(cold[("checked", "many")]),
         ms(cold[("unchecked", "many")])),
    ):
        print(f"| {label} | {a} | {b} | {float(a.split()[0]) / float(b.split()[0]):.2f} |")


if __name__ == "__main__":
    main()
