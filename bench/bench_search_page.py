"""The search page's cost over the store's own: ``GET /api/search`` of ``msgindex serve`` (lookup,
first page, timeline, JSON, HTTP on loopback) against ``Store.lookup`` of the same key, both
measured in this run.

Builds a store of the demo's workload (``loadgen.incident_records``: Zipf order keys, customers in
KEYS headers, payment ids in UNIQ_KEY) with the storage API, serves it in this process, and times
a tail key (a handful of hits), a mid key and the hottest key (a fifth of the records at most),
each as the median of --calls calls. Prints both latencies and their ratio per key, and the HTTP
round trip alone (urllib to the same server), which a tail key's search is mostly made of.

usage: python bench/bench_search_page.py [--records 1000000] [--calls 50]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode

from msgindex.cli.serve import SearchApp
from msgindex.kafka.loadgen import incident_records
from msgindex.storage.message import MessageRecord
from msgindex.storage.store import StoreSettings, open_store

PARTITIONS = {"orders": 3, "payments": 2}
BATCH = 100_000


def build(root: Path, records: int) -> None:
    settings = StoreSettings(hash_slot_num=1_000_000, index_num=4_000_000)
    offsets: dict[tuple[str, int], int] = {}
    with open_store(root, create=True, settings=settings) as store, store.writer("b0") as writer:
        batch: list[MessageRecord] = []
        for message in incident_records("orders", "payments", records, end_ms=1_795_600_800_000):
            key = message.key.decode()
            partition = zlib.crc32(message.key) % PARTITIONS[message.topic]
            offset = offsets.get((message.topic, partition), 0)
            offsets[(message.topic, partition)] = offset + 1
            keys = (key, *(value.decode() for _, value in message.headers))
            batch.append(MessageRecord(message.topic, partition, offset, message.timestamp_ms, key, keys))
            if len(batch) == BATCH:
                writer.append(batch)
                batch = []
        if batch:
            writer.append(batch)


def median_ms(call, calls: int) -> float:
    call()  # warm: readers opened, files mapped
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="msgindex-bench-"))
    try:
        started = time.perf_counter()
        build(tmp / "store", args.records)
        print(f"built {args.records:,} records in {time.perf_counter() - started:.1f} s")
        with open_store(tmp / "store") as store:
            app = SearchApp(store, str(tmp / "store"), None)
            handler = app.handler()
            handler.log_message = lambda *args: None  # no access log in the bench's output
            server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            url = f"http://127.0.0.1:{server.server_address[1]}/api/search?"
            try:
                def nothing():
                    try:
                        urllib.request.urlopen(url.replace("/api/search?", "/api/none"))
                    except urllib.error.HTTPError:
                        pass

                print(f"HTTP round trip alone (a 404 of the same server): {median_ms(nothing, args.calls):.2f} ms")
                print(f"{'key':<14} {'hits':>8} {'Store.lookup ms':>16} {'/api/search ms':>15} {'ratio':>6}")
                for key in ("order-00321", "order-00042", "order-00000"):
                    hits = store.lookup(key).num_rows
                    lookup = median_ms(lambda key=key: store.lookup(key), args.calls)

                    def page(key=key):
                        with urllib.request.urlopen(url + urlencode({"value": key})) as response:
                            json.loads(response.read())

                    served = median_ms(page, args.calls)
                    print(f"{key:<14} {hits:>8,} {lookup:>16.2f} {served:>15.2f} {served / lookup:>6.1f}")
            finally:
                server.shutdown()
                server.server_close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
