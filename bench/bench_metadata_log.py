"""Metadata-log batch and block sizing: bytes, point-read cost and read throughput per size.

The same rows (bench_vs_parquet's generator: Zipf keys, 4 topics, ~12% extra keys, jittered
timestamps) are appended to a log with each (records per batch, records per block), then
measured:
* bytes per record of the segment files;
* a point read: one random record read alone (``read_few``: one block read, checked,
  decompressed, one record decoded), what a lookup of a few keys pays per record; median;
* 1,000 random seqs read as rows (``read_rows``: touches most blocks of a small log);
* a full scan to Arrow rows (``scan_range``), rows/s;
* appends, rows/s.
Baseline in the same run: the same rows as one zstd Parquet file read whole with pyarrow (bytes,
scan rows/s).

    .venv/bin/python bench/bench_metadata_log.py [--records N] [--sizes 4096/512,4096/4096,...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from msgindex.storage.log.metadata_log import MetadataLog

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_parquet import generate  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--sizes", default="4096/128,4096/256,4096/512,4096/1024,4096/4096,1024/512,16384/512",
                        help="records per batch / records per block, comma separated")
    parser.add_argument("--append-rows", type=int, default=100_000)
    args = parser.parse_args()
    table = generate(args.records, seed=7)
    rng = np.random.default_rng(3)
    with tempfile.TemporaryDirectory() as tmp:
        parquet = Path(tmp) / "rows.parquet"
        pq.write_table(table, parquet, compression="zstd")
        pq_bytes = parquet.stat().st_size
        t_pq = min(timed(lambda: pq.read_table(parquet))[0] for _ in range(3))
        print(f"{args.records:,} records; baseline zstd Parquet (unsorted, same rows): "
              f"{pq_bytes / args.records:.2f} B/record, read whole {args.records / t_pq:,.0f} rows/s")
        print("| batch / block records | B/record | vs Parquet | point read (p50) | 1,000 random seqs | "
              "full scan rows/s | vs Parquet read | append rows/s |")
        print("|---|---|---|---|---|---|---|---|")
        for size in args.sizes.split(","):
            batch_records, block_records = (int(n) for n in size.split("/"))
            directory = Path(tmp) / f"log{batch_records}-{block_records}"
            with MetadataLog.open(directory, segment_bytes=1 << 30, index_interval_bytes=4096, writable=True,
                                  batch_records=batch_records, block_records=block_records) as log:
                t_append, _ = timed(lambda: [log.append(table.slice(s, args.append_rows))
                                             for s in range(0, table.num_rows, args.append_rows)])
                log.flush()
                committed = log.position()
            log_bytes = sum(p.stat().st_size for p in directory.glob("*.log"))
            with MetadataLog.open(directory, segment_bytes=1 << 30, index_interval_bytes=4096, writable=False,
                                  committed=committed) as log:
                points = [timed(lambda: log.read_few([seq]))[0] for seq in rng.integers(0, args.records, 300).tolist()]
                seqs = rng.integers(0, args.records, 1000)
                t_rows = statistics.median(timed(lambda: log.read_rows(seqs, "b"))[0] for _ in range(3))
                t_scan = min(timed(lambda: sum(b.num_rows for b in log.scan_range(0, log.next_seq, "b")))[0]
                             for _ in range(2))
            print(f"| {batch_records:,} / {block_records:,} | {log_bytes / args.records:.2f} | "
                  f"{log_bytes / pq_bytes:.2f} | {statistics.median(points) * 1e6:,.0f} us | {t_rows * 1000:,.1f} ms | "
                  f"{args.records / t_scan:,.0f} | {t_pq / t_scan:.2f} | {args.records / t_append:,.0f} |")


if __name__ == "__main__":
    main()
