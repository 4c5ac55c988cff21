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

Quick run:  .venv/bin/python bench/bench_index_file.py --build-keys 200000 --lookup-entries 1000000
Full run:   .venv/bin/python bench/bench_index_file.py
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
from msgindex.storage.index_file import DEFAULT_HASH_SLOT_NUM, DEFAULT_INDEX_NUM, index_file_name  # noqa: E402
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
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--skip-lookup", action="store_true")
    args = parser.parse_args()
    slots, num = args.slots, args.index_num

    with tempfile.TemporaryDirectory(prefix="bench-index-file-") as tmp:
        folder = Path(tmp)
        if not args.skip_build:
            build(folder, args, slots, num)
        if not args.skip_lookup:
            lookup(folder, args, slots, num)
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
        cand_ns, _ = time_calls(f.candidates, query_keys)
        start = time.perf_counter()
        f.candidates_many(query_keys)
        batch_s = time.perf_counter() - start
    p50, p99 = percentile_ns(select_ns, 0.5), percentile_ns(select_ns, 0.99)
    print(f"RocketMQ selectPhyOffset   p50 {int(j50) / 1000:8.2f} us  p99 {int(j99) / 1000:8.2f} us  hits {jhits}")
    print(f"msgindex select_phy_offsets p50 {p50 / 1000:8.2f} us  p99 {p99 / 1000:8.2f} us  hits {hits}")
    print(f"msgindex candidates        p50 {percentile_ns(cand_ns, 0.5) / 1000:8.2f} us  "
          f"p99 {percentile_ns(cand_ns, 0.99) / 1000:8.2f} us")
    print(f"msgindex candidates_many   {len(query_keys):,} keys in {batch_s * 1000:.1f} ms "
          f"({batch_s / len(query_keys) * 1e6:.2f} us/key)")
    print(f"latency ratio RocketMQ/msgindex: p50 {int(j50) / p50:.2f}, p99 {int(j99) / p99:.2f}  (> 1 means msgindex is faster)")
    os.remove(path)


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
