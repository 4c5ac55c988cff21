"""Verified key lookups per second on a real RocketMQ broker's store vs the broker's own
``queryMessage`` over its admin API, same broker, same queries, same run.

Starts a RocketMQ 5.3.3 NameServer + Broker (Maven Central jars, 127.0.0.1, RocketMQ's default
index sizing, 128 MiB commit-log files), sends MESSAGES small messages in batch sends (message i
has KEYS ``k<i % HOT_KEYS> m<i>``), then times two query sets:

* ``unique``: keys ``m<i>`` (one message each), the "find order 42" lookup;
* ``hot``: keys ``k<j>`` (MESSAGES / HOT_KEYS messages each, kept under RocketMQ's 64-message cap
  so both sides return the same rows).

msgindex answers each query with ``RocketMQBrokerStore.lookup`` (one key per call, every index
hit verified against the commit log, rows as Arrow), in this process, while the broker runs. The
broker answers through ``DefaultMQAdminExt.queryMessage`` in one warmed-up client JVM (index walk
+ commit-log reads on the broker, the client's key filter). Both sides' answers are checked to be
the same messages on a sample. Prints both rates and the ratio msgindex / broker.

usage: python bench/bench_rocketmq_store.py [--messages 1000000] [--hot-keys 20000] [--queries 2000]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.rocketmq.harness: the broker launcher and client

TOPIC = "bench"
DEFAULT_HASH_SLOT_NUM, DEFAULT_INDEX_NUM = 5_000_000, 20_000_000  # the broker's defaults
COMMIT_LOG_FILE_SIZE = 128 << 20
BATCH = 256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--hot-keys", type=int, default=20_000, help="distinct k<j> keys (messages / hot-keys each)")
    parser.add_argument("--queries", type=int, default=2000, help="queries per set")
    parser.add_argument("--rounds", type=int, default=1, help="times each side runs the query set")
    parser.add_argument("--work", type=Path, help="keep the broker's files here (default: a temp dir, deleted)")
    args = parser.parse_args()

    from msgindex.storage.rocketmq.broker_store import open_rocketmq
    from tests.rocketmq.harness import LocalRocketMQ, read_json_lines, write_json_lines

    with tempfile.TemporaryDirectory(prefix="bench-rocketmq-") as tmp:
        work = args.work or Path(tmp)
        broker = LocalRocketMQ(work / "broker", topics=(TOPIC,), commit_log_file_size=COMMIT_LOG_FILE_SIZE,
                               hash_slot_num=DEFAULT_HASH_SLOT_NUM, index_num=DEFAULT_INDEX_NUM, heap="768m")
        started = time.perf_counter()
        broker.start()
        print(f"broker up in {time.perf_counter() - started:.1f} s")
        try:
            started = time.perf_counter()
            broker.client("bulk", TOPIC, str(args.messages), str(args.hot_keys), str(BATCH), str(work / "bulk.json"),
                          timeout=3600)
            produced = time.perf_counter() - started
            print(f"produced {args.messages:,} messages in {produced:.1f} s ({args.messages / produced:,.0f}/s)")
            _wait_indexed(broker, open_rocketmq, args.messages)

            rng = random.Random(7)
            query_sets = {
                "unique": [f"m{rng.randrange(args.messages)}" for _ in range(args.queries)],
                "hot": [f"k{rng.randrange(args.hot_keys)}" for _ in range(args.queries)],
            }
            forever = (0, 1 << 62)
            with open_rocketmq(broker.store_root, hash_slot_num=DEFAULT_HASH_SLOT_NUM,
                               index_num=DEFAULT_INDEX_NUM) as store:
                log_bytes = sum(f.size for f in store.commit_log.files)
                print(f"store: {len(store.commit_log.files)} commit-log files ({log_bytes >> 20} MiB), "
                      f"{len(store.index_files())} index file(s)")
                for name, keys in query_sets.items():
                    queries = [{"topic": TOPIC, "key": k, "maxNum": 64, "begin": forever[0], "end": forever[1]}
                               for k in keys]
                    # the same answers on a sample (also warms both sides)
                    sample = queries[:50]
                    answers = broker.query(sample, work)
                    for query, answer in zip(sample, answers):
                        ours = store.lookup(query["key"], topic=TOPIC)["commit_log_offset"].to_pylist()
                        assert sorted(answer) == sorted(ours), (query, len(answer), len(ours))
                    started = time.perf_counter()
                    rows = 0
                    for _ in range(args.rounds):
                        for key in keys:
                            rows += store.lookup(key, topic=TOPIC).num_rows
                    ours_s = time.perf_counter() - started
                    write_json_lines(work / "bench-queries.jsonl", queries)
                    broker.client("bench", str(work / "bench-queries.jsonl"), str(args.rounds), str(work / "bench.json"))
                    theirs = read_json_lines(work / "bench.json")[0]
                    assert theirs["rows"] == rows, (theirs, rows)
                    ours_rate = args.rounds * len(keys) / ours_s
                    theirs_rate = theirs["queries"] / theirs["seconds"]
                    print(json.dumps({
                        "query_set": name, "queries": args.rounds * len(keys), "rows": rows,
                        "msgindex_lookups_per_s": round(ours_rate, 1),
                        "broker_queryMessage_per_s": round(theirs_rate, 1),
                        "ratio_msgindex_over_broker": round(ours_rate / theirs_rate, 2),
                    }))
        finally:
            broker.stop()


def _wait_indexed(broker, open_rocketmq, messages: int, timeout: float = 600) -> None:
    """Until the broker's reput thread has indexed every message (its index lags the commit log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open_rocketmq(broker.store_root, hash_slot_num=DEFAULT_HASH_SLOT_NUM, index_num=DEFAULT_INDEX_NUM) as store:
            last = f"m{messages - 1}"
            if store.lookup(last, topic=TOPIC).num_rows:
                return
        time.sleep(1)
    raise SystemExit("the broker did not index every message in time")


if __name__ == "__main__":
    main()
