"""Benchmark: msgindex's IndexFile against RocketMQ's own (rocketmq-store 5.5.1), same machine, same run.

(1) Build rate, entries/s with hashing included: msgindex ``put_keys`` on a list of str (and on an
    Arrow array) vs RocketMQ's ``IndexFile.putKey`` over the same keys, each round into a fresh
    default-size file; the JVM is warmed up first and every round gets fresh String objects (Java
    caches hashCode per String object). Wall-clock and thread-CPU rates are both shown (the CPU
    figure is the steadier one on a shared machine); the sides alternate in cycles.
(2) Key lookup latency p50/p99 on one FULL default-size file (5M slots, 20M entries, 420 MB,
    written with ``put_keys`` into a temp dir and deleted afterwards): msgindex
    ``select_phy_offsets`` vs Java ``selectPhyOffset``, same file, same keys, maxNum 64 (RocketMQ's
    cap), the whole time range. msgindex's ``candidates`` and batched ``candidates_many`` are shown too.
(3) Candidate finding (``candidate_arrays``: every entry of a key's chain with its hash, no early
    stop) in one default-size file of 10M entries where one hot key holds 10% of them, and in a
    1M-entry file (the 1M-record store of issue 15): a hot key, the hot key's slot neighbour, one
    cold key, and 1,000 cold keys (with and without the hot key among them): without hash runs
    (verified scans), with a chain of runs (``hash_run``: as an active file gets them when sealed
    after commits) and with one run (a full file sealed at its roll). Baseline in the same
    run: the plain chain walk, one Python step per entry (``reference_candidates``: what
    ``candidates`` did before).

Quick run:  .venv/bin/python bench/bench_index_file.py --build-keys 200000 --lookup-entries 1000000 --candidate-entries 2000000
Full run:   .venv/bin/python bench/bench_index_file.py
Only (3):   .venv/bin/python bench/bench_index_file.py --skip-build --skip-lookup
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.interop

from msgindex import IndexFile  # noqa: E402
from msgindex.storage.hash_index import hash_run  # noqa: E402
from msgindex.storage.hash_index import index_file as index_file_module  # noqa: E402
from msgindex.storage.hash_index.index_file import (  # noqa: E402
    DEFAULT_HASH_SLOT_NUM,
    DEFAULT_INDEX_NUM,
    index_file_name,
    reference_candidates,
)
from msgindex.storage.hash_index.java_hash import index_hash, index_hashes  # noqa: E402
from tests.interop.rocketmq_harness import BENCH_BASE_TS, Script  # noqa: E402

MAX_NUM = 64  # RocketMQ's maxMsgsNumBatch
WHOLE_RANGE = (0, 2**63 - 1)
FILE_NAME = index_file_name(BENCH_BASE_TS, utc=True)  # RocketMQ's MappedFile wants a numeric name


def bench_keys(start: int, count: int) -> list[str]:
    """Realistic index keys: topic#key, several topics, order-id-like keys."""
    return [f"orders-{i % 8}#ORD-{i * 2654435761 % 10**12:012d}-{i}" for i in range(start, start + count)]


def write_key_file(path: Path, keys: list[str]) -> None:
    path.write_text("\n".join(keys) + "\n", encoding="utf-8")


def build_round(folder: Path, keys, slots: int, num: int) -> tuple[float, float]:
    """(wall, CPU) entries/s of one put_keys call into a fresh file, hashing included."""
    n = len(keys)
    offsets = np.arange(n, dtype=np.int64)
    stamps = BENCH_BASE_TS + offsets
    path = folder / "py-build"
    with IndexFile.create(path, slots, num) as f:
        gc.collect()
        start, cpu_start = time.perf_counter(), time.thread_time()
        written = f.put_keys(keys, offsets, stamps)
        cpu, wall = time.thread_time() - cpu_start, time.perf_counter() - start
    path.unlink()
    return written / wall, written / cpu


def percentile_ns(samples: list[int], q: float) -> int:
    ordered = sorted(samples)
    return ordered[int(len(ordered) * q)] if q < 1 else ordered[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-keys", type=int, default=3_000_000, help="keys per build round")
    parser.add_argument("--rounds", type=int, default=3, help="timed build rounds per side")
    parser.add_argument("--warmup", type=int, default=2, help="untimed Java warm-up rounds per JVM")
    parser.add_argument("--cycles", type=int, default=2, help="alternations of the Java and msgindex rounds")
    parser.add_argument("--lookup-entries", type=int, default=DEFAULT_INDEX_NUM - 1,
                        help="entries in the lookup file (default: full)")
    parser.add_argument("--lookup-queries", type=int, default=20_000)
    parser.add_argument("--slots", type=int, default=DEFAULT_HASH_SLOT_NUM)
    parser.add_argument("--index-num", type=int, default=DEFAULT_INDEX_NUM)
    parser.add_argument("--java-heap", default="1g")
    parser.add_argument("--candidate-entries", type=int, default=10_000_000,
                        help="entries of the hot-key file of (3)")
    parser.add_argument("--hot-fraction", type=float, default=0.1)
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--skip-lookup", action="store_true")
    parser.add_argument("--skip-candidates", action="store_true")
    args = parser.parse_args()
    slots, num = args.slots, args.index_num

    with tempfile.TemporaryDirectory(prefix="bench-index-file-") as tmp:
        folder = Path(tmp)
        if not args.skip_build:
            build(folder, args, slots, num)
        if not args.skip_lookup:
            lookup(folder, args, slots, num)
        if not args.skip_candidates:
            candidates(folder, args, slots, num)
    return 0


def build(folder: Path, args: argparse.Namespace, slots: int, num: int) -> None:
    n = min(args.build_keys, num - 1)
    keys = bench_keys(0, n)
    arrow_keys = pa.array(keys, pa.string())
    key_file = folder / "build-keys.txt"
    write_key_file(key_file, keys)
    print(f"== build: {n:,} keys into a fresh {slots:,}-slot / {num:,}-entry file per round; "
          f"{args.cycles} cycles of (JVM: {args.warmup} warm-up + {args.rounds} rounds, then msgindex rounds)")
    sides: dict[str, list[tuple[float, float]]] = {"RocketMQ putKey": [], "msgindex put_keys (str)": [],
                                                  "msgindex put_keys (Arrow)": []}
    build_round(folder, keys[: min(n, 100_000)], slots, num)  # numpy's power tables and caches
    for _ in range(args.cycles):  # alternate the sides: the machine's load drifts
        script = Script()
        script.bench_put(key_file, slots, num, folder, args.warmup, args.rounds)
        fields = script.run(heap=args.java_heap, timeout=3600)[0].split()
        cpu_at = fields.index("cpu")
        sides["RocketMQ putKey"] += list(zip(map(float, fields[2:cpu_at]), map(float, fields[cpu_at + 1 :])))
        sides["msgindex put_keys (str)"] += [build_round(folder, keys, slots, num) for _ in range(args.rounds)]
        sides["msgindex put_keys (Arrow)"] += [build_round(folder, arrow_keys, slots, num) for _ in range(args.rounds)]
    best = {name: (max(r[0] for r in rates), max(r[1] for r in rates)) for name, rates in sides.items()}
    for name, rates in sides.items():
        print(f"{name:27s} best wall {best[name][0]:12,.0f}/s  best CPU {best[name][1]:12,.0f}/s  "
              f"(wall per round: {', '.join(f'{r[0]:,.0f}' for r in rates)})")
    java = best["RocketMQ putKey"]
    for name in ("msgindex put_keys (str)", "msgindex put_keys (Arrow)"):
        print(f"ratio {name} / RocketMQ putKey: wall {best[name][0] / java[0]:.2f}, "
              f"CPU {best[name][1] / java[1]:.2f}  (goal >= 1.0)")


def lookup(folder: Path, args: argparse.Namespace, slots: int, num: int) -> None:
    entries = min(args.lookup_entries, num - 1)
    path = folder / FILE_NAME
    print(f"== lookup: file of {slots:,} slots / {num:,} entries ({IndexFile.file_size(slots, num):,} B), "
          f"{entries:,} entries written")
    start = time.perf_counter()
    chunk = 2_000_000
    with IndexFile.create(path, slots, num) as f:
        for lo in range(0, entries, chunk):
            count = min(chunk, entries - lo)
            offsets = np.arange(lo, lo + count, dtype=np.int64)
            f.put_keys(bench_keys(lo, count), offsets, BENCH_BASE_TS + offsets)
        f.flush()
        print(f"generated in {time.perf_counter() - start:.1f}s; full: {f.is_full}; "
              f"slots used {f.hash_slot_count:,}")
    rng = np.random.default_rng(7)
    picks = rng.integers(0, entries, args.lookup_queries)
    query_keys = [bench_keys(int(i), 1)[0] for i in picks]
    key_file = folder / "lookup-keys.txt"
    write_key_file(key_file, query_keys)

    script = Script()
    script.bench_query(path, key_file, slots, num, MAX_NUM, *WHOLE_RANGE)
    _, j50, j99, jhits = script.run(heap="256m", timeout=3600)[0].split()
    with IndexFile.open(path, slots, num, read_only=True) as f:
        for key in query_keys:  # warm-up: page cache and code paths, like the JVM's pass
            f.select_phy_offsets(key, MAX_NUM, *WHOLE_RANGE)
        select_ns, hits = time_calls(lambda k: f.select_phy_offsets(k, MAX_NUM, *WHOLE_RANGE), query_keys)
        python_ns, python_hits = time_calls(lambda k: f.python_select_phy_offsets(k, MAX_NUM, *WHOLE_RANGE), query_keys)
        cand_ns, _ = time_calls(f.candidates, query_keys)
        start = time.perf_counter()
        f.candidates_many(query_keys)
        batch_s = time.perf_counter() - start
    p50, p99 = percentile_ns(select_ns, 0.5), percentile_ns(select_ns, 0.99)
    print(f"RocketMQ selectPhyOffset   p50 {int(j50) / 1000:8.2f} us  p99 {int(j99) / 1000:8.2f} us  hits {jhits}")
    walk = "compiled walk" if index_file_module._compiled_walk is not None else "Python walk: not compiled"
    print(f"msgindex select_phy_offsets p50 {p50 / 1000:8.2f} us  p99 {p99 / 1000:8.2f} us  hits {hits}  ({walk})")
    print(f"msgindex python_select_phy_offsets p50 {percentile_ns(python_ns, 0.5) / 1000:8.2f} us  "
          f"p99 {percentile_ns(python_ns, 0.99) / 1000:8.2f} us  hits {python_hits}  (the Python walk)")
    print(f"msgindex candidates        p50 {percentile_ns(cand_ns, 0.5) / 1000:8.2f} us  "
          f"p99 {percentile_ns(cand_ns, 0.99) / 1000:8.2f} us")
    print(f"msgindex candidates_many   {len(query_keys):,} keys in {batch_s * 1000:.1f} ms "
          f"({batch_s / len(query_keys) * 1e6:.2f} us/key)")
    print(f"latency ratio RocketMQ/msgindex: p50 {int(j50) / p50:.2f}, p99 {int(j99) / p99:.2f}  (> 1 means msgindex is faster)")
    os.remove(path)


HOT_KEY = "orders-0#HOT-CUSTOMER"


def write_hot_file(path: Path, entries: int, hot_fraction: float, slots: int, num: int) -> int:
    """`entries` puts, a `hot_fraction` of them HOT_KEY at random places, the rest bench_keys."""
    rng = np.random.default_rng(11)
    hot_count = 0
    with IndexFile.create(path, slots, num) as f:
        for lo in range(0, entries, 1_000_000):
            count = min(1_000_000, entries - lo)
            keys = bench_keys(lo, count)
            for i in np.flatnonzero(rng.random(count) < hot_fraction).tolist():
                keys[i] = HOT_KEY
                hot_count += 1
            offsets = np.arange(lo, lo + count, dtype=np.int64)
            f.put_keys(keys, offsets, BENCH_BASE_TS + offsets)
        f.flush()
    return hot_count


def best_ms(fn, repeat: int) -> tuple[float, float]:
    """(best, median) wall time of `repeat` calls, in ms."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return min(times), sorted(times)[len(times) // 2]


def candidates(folder: Path, args: argparse.Namespace, slots: int, num: int) -> None:
    for entries in (min(args.candidate_entries, num - 1), min(1_000_000, num - 1)):
        path = folder / FILE_NAME
        start = time.perf_counter()
        hot = write_hot_file(path, entries, args.hot_fraction, slots, num)
        print(f"== candidates: {entries:,} entries ({hot:,} of {HOT_KEY!r}) in a {slots:,}-slot / {num:,}-entry "
              f"file, written in {time.perf_counter() - start:.1f}s")
        hot_hash = index_hash(HOT_KEY)
        neighbour = hot_hash + slots if hot_hash + slots < 2**31 else hot_hash - slots  # same slot
        rng = np.random.default_rng(5)
        cold_keys = [bench_keys(int(i), 1)[0] for i in rng.integers(0, entries, 1000)]
        cold = index_hashes(cold_keys).astype(np.int64)
        cases = {
            "hot key": np.array([hot_hash]),
            "hot key's slot neighbour": np.array([neighbour]),
            "1 cold key": cold[:1],
            "1,000 cold keys": cold,
            "1,000 keys incl. the hot key": np.append(cold[:-1], hot_hash),
        }
        with IndexFile.open(path, slots, num, read_only=True) as f:
            walk_ms, _ = best_ms(lambda: reference_candidates(f, hot_hash), 1)
            found = len(reference_candidates(f, hot_hash))
            walk_cold_ms, _ = best_ms(lambda: [reference_candidates(f, int(h)) for h in cold], 3)
            print(f"baseline: plain walk, hot key {walk_ms:9.2f} ms ({found:,} candidates); "
                  f"1,000 cold keys {walk_cold_ms:7.2f} ms")
            without = time_cases(f, cases, "no run")
        # runs as an active file gets them when sealed after commits (one per TAIL_ENTRIES)
        with IndexFile.open(path, slots, num) as f:
            start = time.perf_counter()
            for committed in range(hash_run.TAIL_ENTRIES, f.index_count, hash_run.TAIL_ENTRIES):
                hash_run.seal_committed([f], {path.name: committed})
            hash_run.seal_committed([f], {path.name: f.index_count})
            tail_s = time.perf_counter() - start
        ranges = hash_run.chain_ranges(path)
        print(f"{len(ranges)} hash runs written as commits of {hash_run.TAIL_ENTRIES:,} entries are sealed, in "
              f"{tail_s:.2f}s total ({run_bytes(path):,} B)")
        with IndexFile.open(path, slots, num, read_only=True) as f:
            with_runs = time_cases(f, cases, f"{len(ranges)} runs")
        hash_run.remove_runs(path)
        with IndexFile.open(path, slots, num) as f:  # one run, as a full file sealed at its roll
            start = time.perf_counter()
            hash_run.write(f, 1, f.index_count)
            seal_s = time.perf_counter() - start
        print(f"one hash run over the whole file (a full file sealed at its roll) written in {seal_s:.2f}s: "
              f"{run_bytes(path):,} B")
        with IndexFile.open(path, slots, num, read_only=True) as f:
            with_run = time_cases(f, cases, "1 run")
        print(f"ratio plain walk / candidate_arrays, hot key: no run {walk_ms / without['hot key']:.0f}x, "
              f"{len(ranges)} runs {walk_ms / with_runs['hot key']:.0f}x, 1 run {walk_ms / with_run['hot key']:.0f}x; "
              f"1,000 cold keys: {walk_cold_ms / without['1,000 cold keys']:.1f}x")
        os.remove(path)
        hash_run.remove_runs(path)


def run_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*" + hash_run.SUFFIX))


def time_cases(f: IndexFile, cases: dict[str, np.ndarray], label: str) -> dict[str, float]:
    """Best ms of candidate_arrays per case (after a warm-up call), printed with the hit counts."""
    best = {}
    for name, hashes in cases.items():
        hits = f.candidate_arrays(hashes)[0].size  # warm-up: page tables, run block checksums
        repeat = 5 if hits > 10_000 else 200 if hashes.size == 1 else 30
        best[name], median = best_ms(lambda: f.candidate_arrays(hashes), repeat)
        print(f"  candidate_arrays, {label:8s} {name:30s} best {best[name]:9.3f} ms  median {median:9.3f} ms"
              f"  ({hits:,} candidates)")
    return best


def time_calls(fn, keys: list[str]) -> tuple[list[int], int]:
    samples, hits = [], 0
    clock = time.perf_counter_ns
    for key in keys:
        start = clock()
        found = fn(key)
        samples.append(clock() - start)
        hits += len(found)
    return samples, hits


if __name__ == "__main__":
    raise SystemExit(main())
