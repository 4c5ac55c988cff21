"""Processes that race on one object-store shard, for test_object_faults: appenders, a compactor,
a reader, and a writer that SIGKILLs itself at a chosen point. Each is run as

    python -m tests.storage.object_racers ROLE JSON

(JSON: the store URL, storage options, tuning and the role's own arguments) and prints one JSON
line per thing it did, in ONE write (a kill between text and newline would tear the line). The
records are a pure function of their offset (``record``), so every row a reader sees can be
checked field by field: a torn or foreign row cannot pass.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.storage

from msgindex.errors import CorruptFileError  # noqa: E402
from msgindex.storage.location import parse_location  # noqa: E402
from msgindex.storage.message import MessageRecord  # noqa: E402
from msgindex.storage.objects.shard import ObjectTuning  # noqa: E402
from msgindex.storage.objects.store import ObjectStore, open_object_store  # noqa: E402

BASE_MS = 1_700_000_000_000
KEYS = 13
BROKER = "a"


def record(offset: int, partition: int = 0) -> MessageRecord:
    """Record `offset` of partition `partition` (topic "t"): a shared key, one of its own."""
    key = f"k{offset % KEYS}"
    return MessageRecord("t", partition, offset, BASE_MS + (offset * 7919) % 100_000, key, (key, f"o{partition}-{offset}"),
                         commit_log_offset=offset * 10, size=100 + offset % 7)


def batch(start: int, count: int, partition: int = 0) -> list[MessageRecord]:
    return [record(offset, partition) for offset in range(start, start + count)]


def check_rows(rows: list[dict]) -> list[tuple[int, int]]:
    """The (partition, offset) of `rows`, after checking each one is exactly its record and none
    is there twice (AssertionError naming the first that is not)."""
    seen = []
    for row in rows:
        want = record(row["offset"], row["partition"])
        got = (row["topic"], row["key"], tuple(row["keys"]), round(row["timestamp"].timestamp() * 1000),
               row["commit_log_offset"], row["size"])
        assert got == (want.topic, want.key, want.keys, want.timestamp_ms, want.commit_log_offset, want.size), \
            f"torn row {row}"
        seen.append((row["partition"], row["offset"]))
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} rows twice"
    return seen


def open_store(spec: dict) -> ObjectStore:
    return open_object_store(parse_location(spec["url"], spec["options"]), tuning=ObjectTuning(**spec["tuning"]))


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def start_together(spec: dict) -> None:
    """Wait for the file `go` (every racer is up and imported): the races overlap in time."""
    while "go" in spec and not os.path.exists(spec["go"]):
        time.sleep(0.01)


# --- roles -----------------------------------------------------------------------------------------
def append(spec: dict) -> None:
    """Append `batches` random slices of `span` offsets (partition `partition`), overlapping each
    other and the other appenders'; say each committed slice, and how many versions were lost."""
    from msgindex.storage.objects import versions

    lost = 0
    real_commit = versions.ShardVersions.try_commit

    def counted_commit(self, version):
        nonlocal lost
        won = real_commit(self, version)
        lost += not won
        return won

    versions.ShardVersions.try_commit = counted_commit
    store = open_store(spec)
    writer = store.writer(BROKER)
    rng = random.Random(spec["seed"])
    start_together(spec)
    for _ in range(spec["batches"]):
        start = rng.randrange(0, spec["span"])
        result = writer.append(batch(start, spec["size"], spec.get("partition", 0)))
        say(start=start, count=spec["size"], appended=result.appended, skipped=result.already_committed)
        time.sleep(spec.get("pause_s", 0))  # (the race lasts a while however fast the server answers)
    say(lost_versions=lost)


def compact(spec: dict) -> None:
    """Compact (everything) and collect, over and over, until the file `stop` exists."""
    store = open_store(spec)
    rounds = merged = 0
    start_together(spec)
    while not os.path.exists(spec["stop"]):
        merged += store.compact(everything=True).get(BROKER, 0)
        rounds += 1
        time.sleep(0.05)
    say(rounds=rounds, merged=merged)


def read(spec: dict) -> None:
    """Look up every key through fresh handles and through readers pinned to a version, until
    the file `stop` exists. A fresh answer never loses a row an earlier one had; a pinned reader
    answers the same every time while it is younger than `pin_s` (well inside the grace
    period); every row is its record, once. Says how many reads it checked, or what was wrong."""
    keys = [f"k{n}" for n in range(KEYS)]
    committed: set[tuple[int, int]] = set()
    pinned: list[tuple[float, object, list]] = []
    reads = pinned_reads = 0
    start_together(spec)
    try:
        while not os.path.exists(spec["stop"]):
            store = open_store(spec)
            if BROKER not in store.brokers():
                time.sleep(0.05)
                continue
            now_rows = check_rows(store.lookup(keys).to_pylist())
            lost = committed - set(now_rows)
            assert not lost, f"committed rows went missing: {sorted(lost)[:5]}"
            committed = set(now_rows)
            reads += 1
            reader = store.reader(BROKER)
            pinned.append((time.monotonic(), reader, sorted(check_rows(reader.lookup(keys).to_pylist()))))
            for at, old, answer in list(pinned):
                if time.monotonic() - at > spec["pin_s"]:
                    pinned.remove((at, old, answer))
                    continue
                again = sorted(check_rows(old.lookup(keys).to_pylist()))
                assert again == answer, f"a reader pinned {time.monotonic() - at:.1f} s ago answers differently"
                pinned_reads += 1
        say(reads=reads, pinned_reads=pinned_reads, rows=len(committed))
    except (AssertionError, CorruptFileError) as wrong:
        say(error=f"{type(wrong).__name__}: {wrong}", reads=reads)
        sys.exit(3)


def die(spec: dict) -> None:
    """Append (or compact) and SIGKILL this process at `at`: "before_commit" (the chunk is put,
    the version not), "after_commit" (the version is created; nothing after it ran), or
    "after_delay" (at a random moment of a run of appends)."""
    from msgindex.storage.objects import versions

    store = open_store(spec)
    real_commit = versions.ShardVersions.try_commit

    def commit_then_die(self, version):
        if spec["at"] == "before_commit":
            os.kill(os.getpid(), signal.SIGKILL)
        won = real_commit(self, version)
        if won and spec["at"] == "after_commit":
            os.kill(os.getpid(), signal.SIGKILL)
        return won

    if spec["at"] != "after_delay":
        versions.ShardVersions.try_commit = commit_then_die
    if spec.get("compact"):
        store.writer(spec.get("broker", BROKER)).compact(everything=True)
    else:
        writer = store.writer(spec.get("broker", BROKER))
        for start in range(spec["first"], spec["first"] + spec["batches"] * spec["size"], spec["size"]):
            say(begin=start)
            writer.append(batch(start, spec["size"]))
            say(committed=start)
    say(done=True)


ROLES = {"append": append, "compact": compact, "read": read, "die": die}

if __name__ == "__main__":
    try:
        ROLES[sys.argv[1]](json.loads(sys.argv[2]))
    except Exception:  # noqa: BLE001 - the test reads the traceback from stderr
        traceback.print_exc()
        sys.exit(1)
