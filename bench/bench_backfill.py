"""Issue 22's ``--backfill-fields``, its storage half: what giving a field to every record of an
existing store costs, against indexing the same records with the field from the start, and
against what a Parquet user does instead (rewrite the metadata copy with the new column), one run.

The re-read from Kafka and Spark's evaluation of the field are the same work for the backfill and
for re-indexing (both read the records back from Kafka), so they are left out: this measures the
store's part. Workload: ``bench_vs_parquet``'s (``--shape``), one shard, appends of 200,000
records; the field is an order id per record.

* key-only appends: the store as it was (its time, for scale);
* backfill: ``Store.backfill`` of the field over all of it (a local shard is rewritten whole);
* re-index with the field: the same records appended with the field into a new store;
* Parquet: the compact zstd copy rewritten with the field as a column (``pyarrow``; the key
  sort kept, as bench_vs_parquet writes it).

The same four again in an S3 bucket (moto's server on loopback, ``moto_s3``; skipped with
``--no-object-store``): the store written by appends of 200,000 records (compaction by itself, as
the pipeline leaves it), the backfill rewriting the chunks that hold records given values, and the
Parquet copy read from and written to the bucket.

    .venv/bin/python bench/bench_backfill.py --records 1000000
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from bench_vs_parquet import SHAPES, generate
from moto_s3 import Servers, add_object_store_flag

import msgindex
from msgindex.storage.backfill import VALUES_SCHEMA, FieldBackfill
from msgindex.storage.fields import FieldDefinition
from msgindex.storage.message import APPEND_SCHEMA, FIELDS_COLUMN
from msgindex.storage.source_ranges import SourceRows

FIELD = FieldDefinition("order", "expression", "get_json_object(CAST(value AS STRING), '$.order.id')", "single")
APPEND_ROWS = 200_000


def appended(root: str, table: pa.Table, field: pa.Array | None, options: dict | None = None) -> float:
    """Seconds to append `table` (with `field` as its fields column) into a new store at `root`."""
    store = msgindex.open(root, create=True, storage_options=options)
    started = time.perf_counter()
    with store.writer("b0") as writer:
        for start in range(0, table.num_rows, APPEND_ROWS):
            part = table.slice(start, APPEND_ROWS)
            if field is None:
                writer.append(part)
            else:
                writer.append(part.append_column(FIELDS_COLUMN, field.slice(start, APPEND_ROWS)), fields=[FIELD])
    return time.perf_counter() - started


def measure(root: str, table: pa.Table, field: pa.Array, values: pa.Table, options: dict | None,
            filesystem: pafs.FileSystem, copy_dir: str) -> tuple[dict[str, float], object]:
    """The four timings at `root` (a directory or a bucket's prefix), the Parquet copies under
    `copy_dir` of `filesystem`; and the backfill's result."""
    records = table.select([f.name for f in APPEND_SCHEMA])
    held = SourceRows.of(table.column("topic"), table.column("partition"), table.column("offset")).ranges()
    key_only = appended(f"{root}/keys", records, None, options)
    store = msgindex.open(f"{root}/keys", storage_options=options)
    started = time.perf_counter()
    result = store.backfill("b0", FieldBackfill(values, (FIELD,), held))
    backfill = time.perf_counter() - started
    with_field = appended(f"{root}/fields", records, field, options)
    columns = ["key", "topic", "partition", "offset", "timestamp_ms"]
    pq.write_table(table.select(columns).sort_by("key"), f"{copy_dir}/copy.parquet", compression="zstd",
                   filesystem=filesystem)
    order = pc.list_flatten(field).field("value")  # one value a record, in the table's order
    started = time.perf_counter()
    old = pq.read_table(f"{copy_dir}/copy.parquet", filesystem=filesystem)  # what the user has
    assert old.num_rows == table.num_rows  # (the new copy needs every row again)
    new = table.select(columns).append_column("order", order).sort_by("key")
    pq.write_table(new, f"{copy_dir}/copy-with-field.parquet", compression="zstd", filesystem=filesystem)
    parquet = time.perf_counter() - started
    return {"key-only appends (the store before)": key_only, "backfill of the field": backfill,
            "re-index: appends with the field into a new store": with_field,
            "Parquet: the compact copy rewritten with the field column": parquet}, result


def report(where: str, args, seconds: dict[str, float], result) -> None:
    print(f"{where}: shape {args.shape}, {args.records:,} records, one shard; backfill: {result.values_added:,} "
          f"values added to {result.records_with_values:,} records, {result.records_rewritten:,} rewritten")
    print("| measure | seconds | records/s | backfill / this |")
    print("|---|---|---|---|")
    backfill = seconds["backfill of the field"]
    for name, took in seconds.items():
        print(f"| {name} | {took:.2f} | {args.records / took:,.0f} | {backfill / took:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="project")
    parser.add_argument("--seed", type=int, default=7)
    add_object_store_flag(parser, "the run in an S3 bucket")
    args = parser.parse_args()

    table = generate(args.records, args.seed, SHAPES[args.shape])
    rng = np.random.default_rng(args.seed)
    pair = VALUES_SCHEMA.field("fields").type
    field = pa.array([[{"name": FIELD.name, "value": f"o-{v:09d}"}] for v in rng.integers(0, args.records, args.records)
                      .tolist()], pair)
    values = pa.table({"topic": table.column("topic"), "partition": table.column("partition"),
                       "offset": table.column("offset"), "timestamp_ms": table.column("timestamp_ms"),
                       "fields": field}).cast(VALUES_SCHEMA)
    with tempfile.TemporaryDirectory() as directory:
        seconds, result = measure(directory, table, field, values, None, pafs.LocalFileSystem(), directory)
    report("local store", args, seconds, result)
    if args.object_store:
        servers = Servers()
        try:
            servers.create_bucket("bench")
            servers.filesystem().create_dir("bench/parquet")
            seconds, result = measure("s3://bench/index", table, field, values, servers.options(),
                                      servers.filesystem(), "bench/parquet")
        finally:
            servers.stop()
        report("\nS3 bucket (moto on loopback)", args, seconds, result)


if __name__ == "__main__":
    main()
