"""msgindex on an object store vs key-sorted zstd Parquet on the same object store, one run.

A real S3 API server (moto's, in its own process on loopback) holds both:

* msgindex: ``--records`` rows (bench_vs_parquet's workload: Zipf keys, 4 topics x 8 partitions,
  extra keys) over ``--shards`` shards (partition % shards), written as the pipeline writes them:
  appends of ``--append-rows`` (a micro-batch), alternating shards, each committed (chunk PUT +
  version put-if-absent), compaction running by itself (default tuning: at most every 10 s, or
  at once past 16 chunks). Queried with ``msgindex.open(url).lookup``.
* Parquet: the same rows, keys exploded, sorted by key, zstd, one file on the same server, read
  with ``pyarrow.dataset`` (``S3FileSystem``) and a ``lookup_key`` filter (row groups pruned by
  statistics), the dataset object reused between queries (its footer cached).

Requests are counted by msgindex's client (every request it sends; ranges are coalesced by
msgindex itself, so the count is what went over the wire). A latency proxy (its own process)
adds ``--latency-ms`` before forwarding every request to the server: real S3's first-byte latency
(~10-30 ms), which loopback hides; both sides are timed through it too. A relay adding no delay
counts, outside both clients, the requests and bytes each side's warm one-key read asks of the
server.

Measured: warm one-key lookups (requests, time, vs the Parquet filter), a fresh process's open +
one key (requests), 1,000 keys in one call, requests per one-key lookup after a tenth of the
appends and after all of them (flat in appends), the same through the latency proxy, bytes in the
bucket vs the Parquet file, requests per append and the append rate against a local store's, and
the monthly request cost of a 10-shard pipeline at 1 s and 30 s triggers at S3's list prices.

    .venv/bin/python bench/bench_object_store.py --records 1000000
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from bench_vs_parquet import generate, write_exploded
from moto_s3 import Servers

import msgindex
from msgindex.storage.objects.store import ObjectStore

# S3 Standard list prices (us-east-1): PUT, COPY, POST, LIST $0.005 / 1,000; GET and others $0.0004 / 1,000
PRICE_PUT_LIST = 0.005 / 1000
PRICE_GET = 0.0004 / 1000
SECONDS_PER_MONTH = 30 * 24 * 3600
PIPELINE_SHARDS = 10



def requests_of(store: ObjectStore, call) -> tuple[int, float, object]:
    before = store.client.request_count()
    start = time.perf_counter()
    result = call()
    return store.client.request_count() - before, time.perf_counter() - start, result


def fresh_process_requests(url: str, options: dict, key: str) -> tuple[int, float, int]:
    """(requests, seconds, rows) of opening the store and looking one key up in a new process."""
    script = textwrap.dedent(f"""
        import json, time, msgindex
        start = time.perf_counter()
        store = msgindex.open({url!r}, storage_options={options!r})
        rows = store.lookup({key!r}).num_rows
        print(json.dumps([store.client.request_count(), time.perf_counter() - start, rows]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise SystemExit(done.stderr)
    return tuple(json.loads(done.stdout.strip().splitlines()[-1]))


def parquet_filter(dataset: ds.Dataset, keys: list[str]) -> pa.Table:
    expression = ds.field("lookup_key") == keys[0] if len(keys) == 1 else ds.field("lookup_key").isin(keys)
    return dataset.to_table(filter=expression)


def write(table: pa.Table, url: str, options: dict, shards: int, append_rows: int, probe_keys: list[str]) -> dict:
    """Write `table` in appends of `append_rows`, alternating shards; what each append cost, and
    the requests of one-key lookups (of `probe_keys`) after a tenth of the appends."""
    store = msgindex.open(url, create=True, storage_options=options)
    broker = table.column("partition").to_numpy() % shards
    parts = [table.filter(pa.array(broker == b)) for b in range(shards)]
    writers = [store.writer(f"b{b}") for b in range(shards)]
    appends, per_append, start = 0, [], time.perf_counter()
    checkpoints = {}
    total_appends = sum(-(-p.num_rows // append_rows) for p in parts)
    position = [0] * shards
    while any(position[b] < parts[b].num_rows for b in range(shards)):
        for b in range(shards):
            if position[b] >= parts[b].num_rows:
                continue
            before = store.client.request_count()
            writers[b].append(parts[b].slice(position[b], append_rows))
            per_append.append(store.client.request_count() - before)
            position[b] += append_rows
            appends += 1
            if appends == max(total_appends // 10, 1):
                reader = msgindex.open(url, storage_options=options)
                reader.lookup(probe_keys[0])
                checkpoints["tenth"] = statistics.median(lookups(reader, probe_keys)[0])
                checkpoints["tenth_chunks"] = sum(len(w.refresh().chunks) for w in writers)
    seconds = time.perf_counter() - start
    return {"store": store, "seconds": seconds, "appends": appends, "per_append": per_append,
            "requests": dict(store.client.requests), "checkpoints": checkpoints,
            "chunks": [len(w.refresh().chunks) for w in writers]}


def local_append_seconds(table: pa.Table, shards: int, append_rows: int) -> float:
    with tempfile.TemporaryDirectory() as directory:
        store = msgindex.open(Path(directory) / "local", create=True)
        broker = table.column("partition").to_numpy() % shards
        parts = [table.filter(pa.array(broker == b)) for b in range(shards)]
        writers = [store.writer(f"b{b}") for b in range(shards)]
        start = time.perf_counter()
        position = [0] * shards
        while any(position[b] < parts[b].num_rows for b in range(shards)):
            for b in range(shards):
                if position[b] < parts[b].num_rows:
                    writers[b].append(parts[b].slice(position[b], append_rows))
                    position[b] += append_rows
        seconds = time.perf_counter() - start
        for writer in writers:
            writer.close()
        return seconds


def lookups(store: ObjectStore, keys: list[str]) -> tuple[list[int], list[float]]:
    counts, times = [], []
    for key in keys:
        count, seconds, _ = requests_of(store, lambda key=key: store.lookup(key))
        counts.append(count)
        times.append(seconds)
    return counts, times


def parquet_times(dataset: ds.Dataset, keys: list[list[str]]) -> list[float]:
    times = []
    for ask in keys:
        start = time.perf_counter()
        parquet_filter(dataset, ask)
        times.append(time.perf_counter() - start)
    return times


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--append-rows", type=int, default=5_000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--keys", type=int, default=60, help="random keys timed one by one (per setting)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    servers = Servers(args.latency_ms)
    try:
        servers.create_bucket("bench")
        table = generate(args.records, args.seed)
        rng = np.random.default_rng(args.seed)
        distinct = pc.unique(table.column("key")).to_pylist()
        one_keys = [str(k) for k in rng.choice(distinct, args.keys, replace=False)]
        # keys written in the first tenth of the appends too: looked up after a tenth and at the end
        early = pc.unique(table.slice(0, table.num_rows // 10).column("key")).to_pylist()
        probe_keys = [str(k) for k in rng.choice(early, 20, replace=False)]
        many = [str(k) for k in rng.choice(distinct, 1000, replace=False)]

        written = write(table, "s3://bench/index", servers.options(), args.shards, args.append_rows, probe_keys)
        local_seconds = local_append_seconds(table, args.shards, args.append_rows)
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "rows.parquet"
            write_exploded(table, path)
            servers.filesystem().create_dir("bench/parquet")
            with servers.filesystem().open_output_stream("bench/parquet/rows.parquet") as out:
                out.write(path.read_bytes())
        store_bytes = servers.bucket_bytes("bench", "index/")
        live_bytes = sum(chunk.info.size for b in range(args.shards)
                         for chunk in written["store"].writer(f"b{b}").refresh().chunks)
        parquet_bytes = servers.bucket_bytes("bench", "parquet/")

        store = msgindex.open("s3://bench/index", storage_options=servers.options())
        dataset = ds.dataset("bench/parquet/rows.parquet", filesystem=servers.filesystem(), format="parquet")
        # warm both (footers cached, connections open)
        store.lookup(one_keys[0])
        parquet_filter(dataset, [one_keys[0]])
        counts, times = lookups(store, one_keys)
        parquet_one = parquet_times(dataset, [[k] for k in one_keys])
        fresh = [fresh_process_requests("s3://bench/index", servers.options(), k) for k in one_keys[:3]]
        many_requests, _, many_found = requests_of(store, lambda: store.lookup(many))
        many_rows = many_found.num_rows
        many_times = [requests_of(store, lambda: store.lookup(many))[1] for _ in range(3)]
        parquet_many = parquet_times(dataset, [many] * 3)

        slow = msgindex.open("s3://bench/index", storage_options=servers.options(slow=True))
        slow_dataset = ds.dataset("bench/parquet/rows.parquet", filesystem=servers.filesystem(slow=True),
                                  format="parquet")
        slow.lookup(one_keys[0])
        parquet_filter(slow_dataset, [one_keys[0]])
        _, slow_times = lookups(slow, one_keys[:20])
        relay = msgindex.open("s3://bench/index", storage_options=servers.options(relay=True))
        relay.lookup(one_keys[0])
        before = servers.relay_traffic()
        _, relay_times = lookups(relay, one_keys[:20])  # the same keys through a relay adding no delay
        relay_traffic = [(after - was) / 20 for after, was in zip(servers.relay_traffic(), before)]
        relay_dataset = ds.dataset("bench/parquet/rows.parquet", filesystem=servers.filesystem(relay=True),
                                   format="parquet")
        parquet_filter(relay_dataset, [one_keys[0]])
        before = servers.relay_traffic()
        parquet_times(relay_dataset, [[k] for k in one_keys[:20]])
        parquet_traffic = [(after - was) / 20 for after, was in zip(servers.relay_traffic(), before)]
        slow_parquet = parquet_times(slow_dataset, [[k] for k in one_keys[:20]])
        slow_many = [requests_of(slow, lambda: slow.lookup(many))[1] for _ in range(3)]
        relay_many = [requests_of(relay, lambda: relay.lookup(many))[1] for _ in range(3)]
        slow_parquet_many = parquet_times(slow_dataset, [many] * 3)

        per_append = written["per_append"]
        requests = written["requests"]
        puts_lists = requests.get("PUT", 0) + requests.get("LIST", 0)
        gets = requests.get("GET", 0)
        per_append_cost = (puts_lists * PRICE_PUT_LIST + gets * PRICE_GET) / written["appends"]
        monthly = {trigger: per_append_cost * PIPELINE_SHARDS * SECONDS_PER_MONTH / trigger for trigger in (1, 30)}
        rate = args.records / written["seconds"]
        local_rate = args.records / local_seconds

        print(f"{args.records:,} records in {written['appends']} appends of {args.append_rows:,} over "
              f"{args.shards} shards; chunks per shard at the end {written['chunks']}, after a tenth of the "
              f"appends {written['checkpoints'].get('tenth_chunks')} in all")
        print("| measure | msgindex | Parquet (pyarrow.dataset) | ratio | goal |")
        print("|---|---|---|---|---|")
        p50 = statistics.median(times)
        print(f"| warm one-key lookup p50 ({len(one_keys)} keys) | {ms(p50)}, {statistics.median(counts):.0f} requests "
              f"(max {max(counts)}) | {ms(statistics.median(parquet_one))} | "
              f"{p50 / statistics.median(parquet_one):.3f} | <= 0.2, <= 8 requests |")
        reader = msgindex.open("s3://bench/index", storage_options=servers.options())
        reader.lookup(probe_keys[0])
        print(f"| one-key requests after a tenth of the appends / after all (the same 20 keys) | "
              f"{written['checkpoints'].get('tenth', 0):.0f} / {statistics.median(lookups(reader, probe_keys)[0]):.0f} "
              f"| | | flat |")
        print(f"| fresh process: open + one key | {statistics.median([f[0] for f in fresh]):.0f} requests "
              f"({', '.join(str(f[0]) for f in fresh)}), {ms(statistics.median([f[1] for f in fresh]))} | | | "
              f"<= 20 requests |")
        print(f"| 1,000 keys ({many_rows:,} rows) | {ms(statistics.median(many_times))}, {many_requests} requests | "
              f"{ms(statistics.median(parquet_many))} | "
              f"{statistics.median(many_times) / statistics.median(parquet_many):.3f} | <= 64 requests |")
        print(f"| one key, +{args.latency_ms:g} ms a request | {ms(statistics.median(slow_times))} (max "
              f"{ms(max(slow_times))}) | {ms(statistics.median(slow_parquet))} | "
              f"{statistics.median(slow_times) / statistics.median(slow_parquet):.3f} | <= 100 ms |")
        print(f"| 1,000 keys, +{args.latency_ms:g} ms a request | {ms(statistics.median(slow_many))} | "
              f"{ms(statistics.median(slow_parquet_many))} | "
              f"{statistics.median(slow_many) / statistics.median(slow_parquet_many):.3f} | <= 500 ms |")
        # the latency's share alone: the same lookups through a relay that adds no delay; divided by
        # the delay, the requests that waited one after another
        latency_s = args.latency_ms / 1000
        print(f"| the same through a relay adding no delay (its own cost: every byte through a Python process): "
              f"one key, 1,000 keys | {ms(statistics.median(relay_times))}, {ms(statistics.median(relay_many))} | | | |")
        # what each side asks of the server for one warm key, counted by the relay (outside both
        # clients): on moto a ranged GET costs what its object's size says (moto reads the whole
        # object), on S3 what its first byte and its bytes do
        print(f"| warm one key through the relay: requests, bytes served | {relay_traffic[0]:.1f}, "
              f"{relay_traffic[1]:,.0f} | {parquet_traffic[0]:.1f}, {parquet_traffic[1]:,.0f} | "
              f"{relay_traffic[1] / parquet_traffic[1]:.4f} (bytes) | |")
        print(f"| requests in series: (with the delay - through the relay) / {args.latency_ms:g} ms: one key, 1,000 keys "
              f"| {(statistics.median(slow_times) - statistics.median(relay_times)) / latency_s:.1f}, "
              f"{(statistics.median(slow_many) - statistics.median(relay_many)) / latency_s:.1f} | | | |")
        print(f"| bytes: chunks the newest versions list | {live_bytes:,} | {parquet_bytes:,} | "
              f"{live_bytes / parquet_bytes:.3f} | <= 3 |")
        print(f"| bytes in the bucket now (replaced chunks wait out the {written['store'].tuning.grace_s:g} s grace "
              f"period) | {store_bytes:,} | {parquet_bytes:,} | {store_bytes / parquet_bytes:.3f} | |")
        print(f"| requests per append | median {statistics.median(per_append):.0f}, max {max(per_append)} "
              f"(compaction's included) | | | <= 4 |")
        print(f"| append rate | {rate:,.0f} records/s | local store {local_rate:,.0f} records/s | "
              f"{rate / local_rate:.3f} | |")
        print(f"requests while writing: {requests}; per append ${per_append_cost:.8f}")
        print(f"monthly request cost of a {PIPELINE_SHARDS}-shard pipeline (appends like these, S3 list prices): "
              f"1 s trigger ${monthly[1]:,.2f}, 30 s trigger ${monthly[30]:,.2f}")
    finally:
        servers.stop()


if __name__ == "__main__":
    main()
