"""Requests a one-key lookup sends to an object store, counted (deterministic, unlike seconds on a
shared machine): the Python API in a fresh process and in a warm one, and Spark's ``where`` and
options lookups, on the same store in a bucket of moto's server (its own process, loopback).

The Python API's requests are counted by the store's client (``ObjectClient.requests``); Spark's
(it plans and reads in Python workers of its own) by a proxy in front of the server that writes
each request line it forwards to a file (``moto_s3.PROXY``) (moto's own log leaves out ranged GETs).

    .venv/bin/python bench/bench_lookup_requests.py --messages 100000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_spark_lookup import SHARD, build_store, key_of
from moto_s3 import PROXY, Servers, free_port, wait_for

BUCKET = "requests"
SHOW = False
ROOT = f"s3://{BUCKET}/store"
PYTHON_API = r"""
import json, sys, msgindex
options, key, root = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
out = {}
for name in ("fresh process: open + lookup", "warm process: open + lookup"):
    store = msgindex.open(root, storage_options=options)
    out[name] = (store.lookup(key).num_rows, dict(store.client.requests))
before = dict(store.client.requests)
rows = store.lookup(key).num_rows
out["same store: next lookup"] = (rows, {k: v - before.get(k, 0) for k, v in store.client.requests.items()
                                         if v - before.get(k, 0)})
print(json.dumps(out))
"""




def spark_requests(log: Path, query) -> tuple[int, dict[str, int]]:
    """(rows, requests by kind) that `query` sent to the bucket, from the counting proxy's log."""
    start = log.stat().st_size
    rows = query()
    counts: dict[str, int] = {}
    with open(log, "rb") as text:
        text.seek(start)
        for line in text.read().decode("latin-1").splitlines():
            if line.startswith("<- "):  # bytes coming back, not a request
                continue
            if SHOW:
                print("   ", line)
            kind = "LIST" if "list-type" in line else line.split(" ", 1)[0]
            counts[kind] = counts.get(kind, 0) + 1
    return rows, counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="Spark queries of each kind (counts of each)")
    parser.add_argument("--show", action="store_true", help="print the requests of each Spark query")
    args = parser.parse_args(argv)
    global SHOW
    SHOW = args.show
    cardinality = max(args.messages // 10, 1)
    servers = Servers(latency_ms=0)
    log = Path(tempfile.mkstemp(prefix="requests-", suffix=".log")[1])
    port = free_port()
    proxy = subprocess.Popen([sys.executable, "-c", PROXY, str(port), str(servers.port), "0", str(log)])
    try:
        wait_for(port, proxy, "the counting proxy")
        servers.create_bucket(BUCKET)
        build_store(ROOT, "orders", 4, args.messages, cardinality, 100, servers.options())
        endpoint = f"http://127.0.0.1:{port}"
        os.environ.update({**servers.env(), "AWS_ENDPOINT_URL": endpoint})  # Spark's workers read them
        options = {**servers.options(), "endpoint": endpoint}
        key = f"user-{int(key_of(12345, cardinality))}"
        print(f"store: {args.messages:,} messages, one shard ({SHARD}), in {ROOT}; key {key}")
        done = subprocess.run([sys.executable, "-c", PYTHON_API, json.dumps(options), key, ROOT],
                              check=True, capture_output=True, text=True)
        for name, (rows, counts) in json.loads(done.stdout).items():
            print(f"python API, {name:30s} rows {rows:3d}  requests {sum(counts.values()):2d}  {counts}")
        from msgindex.spark import enable_pushdown
        from msgindex.spark.runtime.session import build_spark_session

        spark = build_spark_session(app_name="bench-lookup-requests")
        enable_pushdown(spark)
        queries = {
            "where": lambda: spark.read.format("msgindex").load(ROOT).where(f"key = '{key}'")
            .select("partition", "offset").collect().__len__(),
            "option": lambda: spark.read.format("msgindex").option("key", key).load(ROOT)
            .select("partition", "offset").collect().__len__(),
        }
        for name, query in queries.items():
            for run in range(1, args.repeat + 1):
                rows, counts = spark_requests(log, query)
                print(f"spark {name:6s} query {run}:{'':20s} rows {rows:3d}  requests {sum(counts.values()):2d}  {counts}")
        spark.stop()
    finally:
        proxy.terminate()
        servers.stop()


if __name__ == "__main__":
    main()
