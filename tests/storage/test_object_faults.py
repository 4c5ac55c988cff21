"""Faults against a store on a real S3 API server (moto's, over HTTP), each proven against ground
truth (records are a pure function of their offset: object_racers.record): processes appending
to one shard at once while others read and compact, writers SIGKILLed at each point of an append
and of a compaction, requests refused, cut or truncated on the wire (FaultProxy) and retried by
the client or failed with one clear line, a commit whose answer was lost, wrong credentials, a
missing bucket, an endpoint that does not answer. Afterwards every committed row is there exactly
once, nothing uncommitted is visible, and no version lists an object that is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import msgindex
from msgindex.errors import CorruptFileError, ObjectStoreError
from msgindex.storage.location import parse_location
from msgindex.storage.objects.cache import STORE_CACHE
from msgindex.storage.objects.client import ObjectClient
from msgindex.storage.objects.shard import ObjectShardWriter, ObjectTuning
from msgindex.storage.objects.store import ObjectStore, open_object_store
from msgindex.storage.objects.versions import ShardVersions
from msgindex.storage.settings import StoreSettings
from tests.object_store import FaultProxy, bucket_as, require_credentials, start_s3_server
from tests.storage.object_racers import BROKER, KEYS, batch, check_rows

REPO = Path(__file__).resolve().parents[2]
ALL_KEYS = [f"k{n}" for n in range(KEYS)]


def _store(url: str, options: dict, **tuning) -> ObjectStore:
    # no staleness: these tests read through one handle what another has just committed
    return open_object_store(parse_location(url, options), create=True, tuning=ObjectTuning(**tuning),
                             max_staleness_s=0)


def _rows(store: ObjectStore) -> list[tuple[int, int]]:
    """Every committed (partition, offset), each row checked against its record, none twice."""
    scanned = [row for b in store.scan() for row in b.to_pylist()]
    looked_up = check_rows(store.lookup(ALL_KEYS).to_pylist())
    assert sorted(check_rows(scanned)) == sorted(looked_up)
    return sorted(looked_up)


def _offsets(*ranges: tuple[int, int]) -> list[tuple[int, int]]:
    return sorted({(0, o) for start, count in ranges for o in range(start, start + count)})


def _versions_intact(store: ObjectStore, broker: str = BROKER, within_ms: int | None = None) -> None:
    """No version a reader may hold lists an object that is gone: the newest one, and every older
    one superseded less than `within_ms` ago (the grace period) when given."""
    versions = ShardVersions(store.client, store.shard_prefix(broker))
    present = {info.key for info in store.client.list(f"{store.shard_prefix(broker)}/chunks/")}
    numbers = versions.numbers()
    now = int(time.time() * 1000)
    held = [versions.read(numbers[-1])]
    if within_ms is not None:
        for older, newer in zip(numbers, numbers[1:]):
            successor = versions.read(newer)
            if successor is not None and successor.committed_at_ms > now - within_ms:
                held.append(versions.read(older))
    for version in filter(None, held):
        missing = [c.name for c in version.chunks if f"{store.shard_prefix(broker)}/{c.name}" not in present]
        assert not missing, f"version {version.number} lists chunks that are gone: {missing}"


def _spawn(role: str, spec: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.storage.object_racers", role, json.dumps(spec)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def _finish(process: subprocess.Popen, timeout: float = 300) -> list[dict]:
    out, err = process.communicate(timeout=timeout)
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert process.returncode == 0, f"status {process.returncode}: {lines[-3:]} {err[-3000:]}"
    return lines


# --- processes racing -----------------------------------------------------------------------------
@pytest.mark.parametrize("racers", ["two appenders", "appender and compactor"])
def test_processes_race_on_one_shard_while_another_reads(s3, tmp_path, racers):
    """Two appenders of overlapping offset ranges (compaction and collection on in each), or one
    appender and a process compacting everything and collecting in a loop, while a third process
    reads through fresh handles and through readers it keeps pinned: every answer is whole
    committed rows, once each, never losing one; pinned readers answer the same within the grace
    period; at the end the shard holds exactly the union of the slices, and no version a reader
    may still hold lists a deleted object."""
    tuning = {"compaction_interval_s": 0.0, "max_chunks": 4, "grace_s": 8.0, "collect_interval_s": 0.5}
    store = _store(s3.url(), s3.options, **tuning)
    store.writer(BROKER).append(batch(0, 2000, partition=1))  # an old chunk that compaction leaves alone
    stop, go = tmp_path / "stop", tmp_path / "go"
    spec = {"url": store.root, "options": s3.options, "tuning": tuning, "stop": str(stop), "go": str(go),
            "pin_s": 3.0}
    appenders = [_spawn("append", {**spec, "seed": seed, "batches": 14, "span": 400, "size": 30, "pause_s": 0.1})
                 for seed in ((1, 2) if racers == "two appenders" else (1,))]
    others = [_spawn("read", spec)]
    if racers == "appender and compactor":
        others.append(_spawn("compact", spec))
    go.write_text("")
    try:
        done = [_finish(process) for process in appenders]
    finally:
        stop.write_text("")
    reader_says, *compactor_says = [_finish(process)[-1] for process in others]
    assert "error" not in reader_says and reader_says["reads"] >= 3, reader_says
    if compactor_says:
        assert compactor_says[0]["rounds"] >= 2 and compactor_says[0]["merged"] >= 1, compactor_says
    lost = sum(lines.pop()["lost_versions"] for lines in done)
    assert lost >= 1 or racers != "two appenders", "no appender lost a version to the other: nothing raced"
    slices = [(line["start"], line["count"]) for lines in done for line in lines]
    base = [(1, offset) for offset in range(2000)]
    rows = _rows(msgindex.open(store.root, storage_options=s3.options))
    assert rows == _offsets(*slices) + base  # the union of every slice, each row once
    assert sum(line["appended"] for lines in done for line in lines) == len(rows) - len(base)  # each by one appender
    _versions_intact(store, within_ms=int(tuning["grace_s"] * 1000))
    assert len(store.writer(BROKER).refresh().chunks) <= 8  # compaction kept up
    # collection past the grace period (however fast the race was) takes only what no version lists
    store.writer(BROKER).collect(now_ms=int(time.time() * 1000) + 10_000)
    _versions_intact(store)
    assert _rows(msgindex.open(store.root, storage_options=s3.options)) == rows


def test_many_opening_a_new_store_with_create_at_once_all_open_it(s3):
    """Tasks of a job that each open the store with create=True on a new prefix, at once: one
    creates the manifest, every other opens it. (Those that listed the prefix just after it
    appeared were told "it holds objects and no msgindex.json".)"""
    for _ in range(3):
        url = s3.url()
        start = threading.Barrier(8)
        outcomes: list[object] = []

        def open_it(url=url, start=start, outcomes=outcomes) -> None:
            start.wait()
            try:
                outcomes.append(msgindex.open(url, create=True, storage_options=s3.options).settings)
            except Exception as error:  # noqa: BLE001 - reported below
                outcomes.append(error)

        threads = [threading.Thread(target=open_it) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert outcomes == [StoreSettings()] * 8, [str(o) for o in outcomes if isinstance(o, Exception)]


# --- writers killed ---------------------------------------------------------------------------------
def _die(s3, url: str, tuning: dict, **spec) -> list[dict]:
    child = _spawn("die", {"url": url, "options": s3.options, "tuning": tuning, **spec})
    out, err = child.communicate(timeout=300)
    assert child.returncode == -signal.SIGKILL, f"status {child.returncode}: {err[-3000:]}"
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize("shard", ["existing shard", "new shard"])
def test_a_writer_killed_before_its_commit_leaves_nothing_visible(s3, shard):
    """Killed after its chunk, before its version: the rows are not there, the store answers
    (also once the grace period is over, for a shard that never committed), the chunk is
    collected as an orphan, and the batch appended again is committed once."""
    tuning = {"grace_s": 0.5}
    store = _store(s3.url(), s3.options, **tuning)
    broker = BROKER if shard == "existing shard" else "new"
    store.writer(BROKER).append(batch(0, 10))
    _die(s3, store.root, tuning, at="before_commit", broker=broker, first=10, batches=1, size=20)
    time.sleep(0.6)  # past the grace period: the dead writer's objects are old now
    reader = _store(store.root, s3.options, **tuning)
    assert _rows(reader) == _offsets((0, 10))  # nothing of the dead writer, and no error
    assert reader.missing_shards() == []
    writer = store.writer(broker)
    assert writer.collect() == 1  # its chunk, an orphan
    assert writer.append(batch(10, 20)).appended == 20
    assert _rows(reader) == _offsets((0, 30))
    _versions_intact(store, broker)


def test_a_writer_killed_right_after_its_commit(s3):
    """Killed the moment its version exists (before it returned, compacted or collected): the
    rows are committed, once; the same batch appended again (the retried task) adds nothing."""
    store = _store(s3.url(), s3.options)
    store.writer(BROKER).append(batch(0, 10))
    said = _die(s3, store.root, {}, at="after_commit", first=10, batches=1, size=20)
    assert said == [{"begin": 10}]
    assert _rows(store) == _offsets((0, 30))
    result = store.writer(BROKER).append(batch(10, 20))
    assert (result.appended, result.already_committed) == (0, 20)
    assert _rows(store) == _offsets((0, 30))


@pytest.mark.parametrize("at", ["before_commit", "after_commit"])
def test_a_compactor_killed_mid_compaction(s3, at):
    """Killed after writing the merged chunk but before its version (the merge is invisible, its
    chunk an orphan), or right after the version (the replaced chunks stay until the grace
    period): the answers never change, collection deletes only what no version within the grace
    period lists, and compaction runs again."""
    tuning = {"grace_s": 30.0, "compaction_interval_s": 3600}
    store = _store(s3.url(), s3.options, **tuning)
    writer = store.writer(BROKER)
    for start in range(0, 60, 10):
        writer.append(batch(start, 10))
    pinned = store.reader(BROKER)
    before = writer.refresh()
    assert len(before.chunks) == 6
    _die(s3, store.root, tuning, at=at, compact=True)
    after = writer.refresh()
    assert (after.number, len(after.chunks)) == ((before.number, 6) if at == "before_commit" else (before.number + 1, 1))
    assert _rows(store) == _offsets((0, 60))
    assert check_rows(pinned.lookup(ALL_KEYS).to_pylist())  # the version before still reads
    now = int(time.time() * 1000)
    assert writer.collect(now_ms=now) == 0  # inside the grace period nothing goes
    assert writer.collect(now_ms=now + 31_000) == (1 if at == "before_commit" else 6)  # the orphan, or the replaced
    _versions_intact(store)
    assert writer.compact(everything=True) == (5 if at == "before_commit" else 0)
    assert _rows(msgindex.open(store.root, storage_options=s3.options)) == _offsets((0, 60))


@pytest.mark.parametrize("delay_s", [0.4, 0.9, 1.6])
def test_a_writer_killed_at_a_random_moment(s3, delay_s):
    """A process appending batch after batch (compacting as it goes) is SIGKILLed from outside
    at some moment: every batch it said was committed is there, the one in flight is there
    whole or not at all, nothing else, each row once."""
    tuning = {"compaction_interval_s": 0.0, "max_chunks": 3, "grace_s": 60.0}
    store = _store(s3.url(), s3.options, **tuning)
    child = _spawn("die", {"url": store.root, "options": s3.options, "tuning": tuning, "at": "after_delay",
                           "first": 0, "batches": 400, "size": 7})
    deadline = time.monotonic() + 120
    head = []
    while child.poll() is None and time.monotonic() < deadline:  # wait for its first commit
        head.append(child.stdout.readline())
        if '"committed"' in head[-1]:
            break
    time.sleep(delay_s)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    out = child.stdout.read()  # (not communicate(): it would skip what readline() buffered)
    lines = [json.loads(line) for line in "".join(head).splitlines() + out.splitlines() if line.strip()]
    assert child.returncode == -signal.SIGKILL and "done" not in lines[-1], lines[-1]
    committed = [line["committed"] for line in lines if "committed" in line]
    begun = [line["begin"] for line in lines if "begin" in line]
    rows = _rows(msgindex.open(store.root, storage_options=s3.options))
    said_committed = _offsets(*[(start, 7) for start in committed])
    with_in_flight = _offsets(*[(start, 7) for start in committed + begun[len(committed):]])
    assert rows in (said_committed, with_in_flight), \
        f"{len(rows)} rows: neither the {len(said_committed)} said committed nor those and the batch in flight"
    _versions_intact(store, within_ms=60_000)


@pytest.mark.parametrize("grace_s", [0.4, 3600.0])
def test_an_idle_writer_never_commits_below_the_newest_version(s3, grace_s):
    """A writer kept open (the pipeline's per-worker writers) while others commit more versions
    than a shard keeps: collection deletes old version objects, which freed the idle writer's
    next number, and its append was created there, below the newest, reported as committed and
    never seen. Versions now go only once their successor is older than the grace period, and a
    writer whose view is older than half of it reads the newest again first."""
    url = s3.url()
    store = _store(url, s3.options, keep_versions=3, compaction_interval_s=3600, grace_s=grace_s)
    idle = store.writer(BROKER)
    idle.append(batch(0, 5))  # it knows version 1
    busy = store.writer(BROKER)
    for n in range(1, 8):
        busy.append(batch(n * 5, 5))  # versions 2..8
    time.sleep(0.5)
    busy.collect()
    remaining = busy.versions.numbers()
    assert remaining == ([6, 7, 8] if grace_s < 1 else list(range(1, 9)))  # old ones go only past the grace period
    assert idle.append(batch(100, 5)).appended == 5
    assert idle.refresh().number == 9
    assert _rows(_store(url, s3.options)) == _offsets((0, 40), (100, 5))


def test_a_writer_stalled_before_its_commit_never_commits_below_the_newest_nor_a_collected_chunk(s3, monkeypatch):
    """The idle-writer case inside one append: the writer has read the newest version and put its
    chunk, then stalls (a paused VM, a starved machine) while others commit and collection deletes
    the versions it knew and its chunk (unlisted for longer than the grace period: an orphan to
    collection). Its version put then succeeds at a number free again below the newest; after a
    commit built on a view older than half the grace period the writer lists newer versions,
    finds them, writes its chunk again and commits on the newest, reporting its rows once."""
    url = s3.url()
    store = _store(url, s3.options, keep_versions=3, compaction_interval_s=3600, grace_s=0.4)
    stalled = store.writer(BROKER)
    stalled.append(batch(0, 5))  # version 1
    busy = store.writer(BROKER)
    try_commit = stalled.versions.try_commit
    stalls = []

    def stall_then_commit(candidate):
        if not stalls:
            stalls.append(candidate.number)
            for n in range(1, 8):
                busy.append(batch(n * 5, 5))  # versions 2..8 while this writer still builds on 1
            time.sleep(0.5)
            assert busy.collect() == 1  # its chunk, unlisted past the grace period
            assert busy.versions.numbers() == [6, 7, 8]  # number 2 is free again
        return try_commit(candidate)

    monkeypatch.setattr(stalled.versions, "try_commit", stall_then_commit)
    assert stalled.append(batch(100, 5)).appended == 5
    assert stalls == [2]
    assert stalled.refresh().number == 9  # on top; the stray version 2 is never the newest
    assert _rows(_store(url, s3.options)) == _offsets((0, 40), (100, 5))


# --- requests failing on the wire -------------------------------------------------------------------
TARGETS = {  # the request of an append that fails, as the proxy matches it
    "chunk PUT": ("PUT", r"/chunks/"),
    "shard mark PUT": ("PUT", r"/_shards/"),
    "version PUT": ("PUT", r"/_commits/"),
    "version LIST": ("GET", r"list-type=2.*_commits"),
    "version GET": ("GET", r"/_commits/\d+\.json"),
}


@pytest.fixture
def proxy(s3):
    proxy = FaultProxy(s3.endpoint)
    yield proxy
    proxy.close()


@pytest.mark.parametrize("retries", ["0", "3"], ids=["no client retries", "client retries"])
@pytest.mark.parametrize("target", list(TARGETS))
def test_a_request_that_fails_mid_append(s3, proxy, target, retries):
    """Each request of an append refused (never reached the server), cut (the server acted, the
    answer was lost) or truncated, in an append that also loses a version to another writer (so
    it lists and reads the newest): the client retries the request and the append succeeds, or
    the append fails with one ObjectStoreError line naming the store; either way the writer
    appending the batch again, and a fresh writer, commit every row exactly once, and nothing a
    version lists is missing."""
    method, path = TARGETS[target]
    options = {**s3.options, "endpoint": proxy.endpoint, "max_retries": retries}
    for action in ["refuse", "cut"] + (["truncate"] if method == "GET" else []):
        url = s3.url()
        store = _store(url, options)
        direct = _store(url, s3.options)  # another writer, not through the proxy
        broker, expected = ("new", []) if target == "shard mark PUT" else (BROKER, [(0, 10), (100, 5)])
        if broker == BROKER:
            direct.writer(BROKER).append(batch(0, 10))
        writer = store.writer(broker)
        writer.refresh()
        if broker == BROKER:
            direct.writer(BROKER).append(batch(100, 5))  # `writer` is stale now: it will lose a version
        rule = proxy.fail(action, method=method, path=path)
        try:
            first = writer.append(batch(10, 20)).appended
        except ObjectStoreError as error:
            first = None
            assert "\n" not in str(error) and url in str(error), str(error)
        assert rule.hits == 1, f"{action} {target}: the fault never hit: {proxy.log}"
        proxy.clear()
        again = writer.append(batch(10, 20))
        fresh = store.writer(broker).append(batch(10, 20))
        assert _rows(direct) == _offsets(*expected, (10, 20)), f"{action} {target}: first append {first}"
        assert (first or 0) + again.appended + fresh.appended == 20, (action, first, again, fresh)
        _versions_intact(direct, broker)


@pytest.mark.parametrize("retries", ["0", "3"], ids=["no client retries", "client retries"])
def test_a_commit_whose_answer_was_lost_is_found_not_written_twice(s3, proxy, retries):
    """The version PUT reached the server and created the version, but its answer was cut: the
    writer reads the number back, finds its own commit and returns the rows as appended, once
    (no second version, no error)."""
    store = _store(s3.url(), {**s3.options, "endpoint": proxy.endpoint, "max_retries": retries})
    writer = store.writer(BROKER)
    writer.append(batch(0, 10))
    number = writer.state.number
    cut = proxy.fail("cut", method="PUT", path=r"/_commits/")
    assert writer.append(batch(10, 20)).appended == 20
    assert cut.hits == 1
    assert writer.refresh().number == number + 1
    assert _rows(store) == _offsets((0, 30))


def test_a_lost_commit_answer_and_a_failed_read_back_lose_nothing(s3, proxy):
    """The version PUT created the version but its answer was cut, and reading it back failed
    too: the writer cannot know whether it committed, so it must keep its chunk (the version may
    list it) and report the error; appending again finds the rows committed."""
    url = s3.url()
    store = _store(url, {**s3.options, "endpoint": proxy.endpoint, "max_retries": "0"})
    writer = store.writer(BROKER)
    writer.append(batch(0, 10))
    proxy.fail("cut", method="PUT", path=r"/_commits/")
    proxy.fail("refuse", method="GET", count=3)
    with pytest.raises(ObjectStoreError, match="does not answer") as failed:
        writer.append(batch(10, 20))
    assert "\n" not in str(failed.value)
    proxy.clear()
    reader = _store(url, s3.options)
    _versions_intact(reader)  # the committed version's chunk is still there
    assert _rows(reader) == _offsets((0, 30))
    assert writer.append(batch(10, 20)).appended == 0


def test_a_commit_that_loses_its_version_commits_at_the_next(s3):
    """Writers that all know version N: the second loses N+1 to the first, reads what won, drops
    the rows it committed (overlapping offsets: its chunk is written again without them) and
    commits the rest at N+2; the third, none of whose rows was committed, commits its one chunk
    at N+3."""
    store = _store(s3.url(), s3.options)
    first, second, third = store.writer(BROKER), store.writer(BROKER), store.writer(BROKER)
    for writer in (first, second, third):
        writer.refresh()
    assert first.append(batch(0, 30)).appended == 30
    overlapping = second.append(batch(20, 30))  # loses version 1; rows 20..29 are committed
    assert (overlapping.appended, overlapping.already_committed) == (20, 10)
    chunks = len(store.client.list(f"{store.shard_prefix(BROKER)}/chunks/"))
    disjoint = third.append(batch(100, 10))  # loses version 1; none of its rows is committed: same chunk at 3
    assert disjoint.appended == 10 and len(store.client.list(f"{store.shard_prefix(BROKER)}/chunks/")) == chunks + 1
    assert third.refresh().number == 3
    assert _rows(store) == _offsets((0, 50), (100, 10))
    assert len(store.client.list(f"{store.shard_prefix(BROKER)}/chunks/")) == 3  # the loser's first chunk is gone


# --- one line for what a user must fix --------------------------------------------------------------
def test_an_endpoint_that_stops_answering_is_one_line_within_seconds(s3, proxy):
    store = _store(s3.url(), {**s3.options, "endpoint": proxy.endpoint, "connect_timeout": "1s", "max_retries": "1",
                              "retry_timeout": "3"})
    store.writer(BROKER).append(batch(0, 10))
    proxy.close()  # the endpoint goes away under an open store
    began = time.monotonic()
    for attempt in (lambda: store.lookup("k1"), lambda: store.writer(BROKER).append(batch(10, 5))):
        with pytest.raises(ObjectStoreError, match=rf"endpoint {proxy.endpoint} does not answer") as failed:
            attempt()
        assert "\n" not in str(failed.value) and store.root in str(failed.value)
    assert time.monotonic() - began < 30


@pytest.mark.parametrize("retries", ["0", "3"], ids=["no client retries", "client retries"])
def test_refused_connections_are_retried_or_one_line(s3, proxy, retries):
    """The next connections are closed as soon as they are accepted (a load balancer dropping
    them): a client that retries appends and reads; one that does not says so in one line; then
    the same append commits its rows once."""
    url = s3.url()
    _store(url, s3.options).writer(BROKER).append(batch(0, 10))
    options = {**s3.options, "endpoint": proxy.endpoint, "max_retries": retries}
    store = _store(url, options)  # (its own client: no pooled connection yet)
    proxy.refuse_connections(2)
    try:
        first = store.writer(BROKER).append(batch(10, 20)).appended
    except ObjectStoreError as error:
        first = 0
        assert retries == "0" and "\n" not in str(error) and url in str(error), str(error)
    assert first == (20 if retries != "0" else 0) and proxy.refused_connections >= 1
    proxy.clear()
    assert store.writer(BROKER).append(batch(10, 20)).appended == 20 - first
    assert _rows(_store(url, options)) == _offsets((0, 30))


@pytest.mark.parametrize(("action", "count"), [("refuse", 2), ("cut", 2), ("truncate", 1)])
def test_reads_dropped_more_often_than_the_client_retries_are_read_once_more(s3, proxy, action, count):
    """object_store gives up on some dropped connections at once, or after its retries: a read is
    idempotent, so the client reads once more (client.READ_RETRY_PAUSE_S); with no retries
    allowed, it does not."""
    url = s3.url()
    _store(url, s3.options).writer(BROKER).append(batch(0, 10))
    store = _store(url, {**s3.options, "endpoint": proxy.endpoint, "max_retries": "1"})
    # one more than object_store retries (it never retries a truncated answer)
    proxy.fail(action, method="GET", count=count)
    assert _rows(store) == _offsets((0, 10))
    proxy.clear()
    store = _store(url, {**s3.options, "endpoint": proxy.endpoint, "max_retries": "0"})
    proxy.fail(action, method="GET", count=1)
    with pytest.raises(ObjectStoreError):
        _rows(store)


def test_a_request_slower_than_the_timeout_is_one_line(s3, proxy):
    store = _store(s3.url(), {**s3.options, "endpoint": proxy.endpoint, "timeout": "1s", "max_retries": "0"})
    store.writer(BROKER).append(batch(0, 10))
    proxy.fail("delay", method="GET", delay_s=3)
    began = time.monotonic()
    # (the manifest is in this process's cache since the first open: the LIST of the shards waits)
    with pytest.raises(ObjectStoreError, match=rf"{store.root}: listing _shards/: the endpoint {proxy.endpoint} "
                                               "does not answer") as failed:
        msgindex.open(store.root, storage_options={**s3.options, "endpoint": proxy.endpoint, "timeout": "1s",
                                                   "max_retries": "0"}).lookup("k1")
    assert "\n" not in str(failed.value) and time.monotonic() - began < 3


def test_an_endpoint_that_ignores_conditional_writes_is_refused_before_any_commit(s3, proxy):
    """Found by an attack run: behind an endpoint that drops If-None-Match, two processes both
    committed one version and 1,600-1,800 rows each append had reported were gone. The first
    create of a process on a location checks that a second create of one object is refused."""
    url = s3.url()
    proxy.fail("unconditional", method="PUT", count=10**6)
    with pytest.raises(ObjectStoreError, match=rf"{url}: the endpoint does not refuse to create an object that "
                                               r"exists \(it ignores If-None-Match: \*\)") as failed:
        _store(url, {**s3.options, "endpoint": proxy.endpoint})
    assert "\n" not in str(failed.value)
    assert not [key for key in s3.keys(url) if "_msgindex_probe" in key]  # the check's object is deleted
    proxy.clear()
    store = _store(url, {**s3.options, "endpoint": proxy.endpoint})  # a conditional endpoint: fine
    store.writer(BROKER).append(batch(0, 10))
    assert _rows(store) == _offsets((0, 10))


def test_a_read_that_stalls_past_a_few_seconds_is_not_read_again(s3, proxy, monkeypatch):
    """An endpoint that answers a byte a second held a reader for two of the client's timeouts
    (the client's extra read of a dropped one): a read that failed slowly is not read again."""
    from msgindex.storage.objects import client as client_module

    monkeypatch.setattr(client_module, "READ_RETRY_MAX_FAILED_S", 0.5)
    url = s3.url()
    _store(url, s3.options).writer(BROKER).append(batch(0, 10))
    store = _store(url, {**s3.options, "endpoint": proxy.endpoint, "timeout": "2s", "max_retries": "1"})
    proxy.fail("dribble", method="GET", delay_s=0.5, count=10)
    began = time.monotonic()
    with pytest.raises(ObjectStoreError) as failed:
        _rows(store)
    assert "\n" not in str(failed.value) and url in str(failed.value)
    assert len(proxy.requests("GET")) <= 2 and time.monotonic() - began < 10  # object_store's own retry at most


def test_a_truncated_chunk_is_named_as_the_inspector_names_it(s3):
    url = s3.url()
    store = _store(url, s3.options)
    store.writer(BROKER).append(batch(0, 200))
    [chunk] = [key for key in s3.keys(url) if key.endswith(".chunk")]
    s3.truncate(url, chunk, 100)
    STORE_CACHE.clear()
    with pytest.raises(CorruptFileError, match=r"\.chunk: the chunk object is shorter than its shard version records "
                                               r"\([\d,]+ bytes\): it was replaced or truncated") as failed:
        _rows(_store(url, s3.options))
    assert "\n" not in str(failed.value)


@pytest.mark.parametrize("status", [200, 404])
def test_an_endpoint_that_is_a_web_page_is_named_not_the_store(s3, status):
    """A console or proxy port answers HTML to everything: that used to read as a store whose
    manifest is torn (200) or end in the page's HTML (404)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = b"<!DOCTYPE html><html><body><h1>Welcome to nginx!</h1></body></html>"
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(ObjectStoreError, match="answered with a web page") as failed:
            msgindex.open("s3://bucket/index", storage_options={**s3.options, "endpoint": endpoint, "max_retries": "0"})
        assert "\n" not in str(failed.value) and "<" not in str(failed.value)
    finally:
        server.shutdown()


def test_a_missing_bucket_is_one_line_for_readers_and_writers(s3):
    for call in (lambda: msgindex.open("s3://no-such-bucket-x/i", storage_options=s3.options),
                 lambda: msgindex.open("s3://no-such-bucket-x/i", create=True, storage_options=s3.options)):
        with pytest.raises(ObjectStoreError, match="bucket 'no-such-bucket-x' does not exist") as failed:
            call()
        assert "\n" not in str(failed.value)


# --- damage: named, never a quiet answer --------------------------------------------------------------
def test_a_committed_shard_whose_objects_are_gone_is_named(s3):
    """Its mark says it committed, its versions were deleted by hand: lookups name it (the other
    shard's rows are not quietly returned alone), missing_shards lists it; a chunk a version lists
    deleted, or a version object altered, is likewise an error naming the object."""
    store = _store(s3.url(), s3.options, grace_s=0.0)
    store.writer(BROKER).append(batch(0, 10))
    store.writer("other").append(batch(0, 5, partition=1))
    chunk = store.writer(BROKER).refresh().chunks[0].name
    store.client.delete([f"{store.shard_prefix(BROKER)}/{chunk}"])
    with pytest.raises(CorruptFileError, match=f"broker={BROKER}/{chunk}: chunk object listed by the shard version "
                                               "is missing"):
        _store(store.root, s3.options).lookup(ALL_KEYS)
    version = ShardVersions(store.client, store.shard_prefix("other"))
    key = version.key(version.numbers()[-1])
    store.client.put(key, store.client.get(key).replace(b'"record_count":5', b'"record_count":6'))
    # a process that read the version before keeps the copy it checked (versions are never
    # rewritten: cache.py); a process that reads it now finds the damage
    STORE_CACHE.clear()
    with pytest.raises(CorruptFileError, match=f"{key}: shard version checksum mismatch"):
        _store(store.root, s3.options).lookup(ALL_KEYS, brokers=["other"])
    store.client.delete([info.key for info in store.client.list(f"{store.shard_prefix('other')}/")])
    fresh = _store(store.root, s3.options, grace_s=0.0)
    assert fresh.missing_shards() == ["other"]
    with pytest.raises(CorruptFileError, match="broker=other: the shard is marked as committed"):
        fresh.lookup(ALL_KEYS, brokers=["other"])


@pytest.fixture(scope="module")
def checked_s3(tmp_path_factory):
    """A second S3 server that checks credentials (the session's does not: tests/object_store.py),
    with the storage options of an IAM user allowed everything ("writer") and of one allowed
    nothing ("nobody")."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed (the dev extra installs it)")
    process, server = start_s3_server(str(tmp_path_factory.mktemp("s3-auth") / "moto.log"))
    try:
        yield server, require_credentials(server)
    finally:
        process.kill()
        process.wait(timeout=30)


def test_wrong_credentials_are_one_line_naming_what_is_wrong(checked_s3):
    server, identities = checked_s3
    writer = identities["writer"]
    url = f"s3://{bucket_as(server, writer)}/index"
    store = msgindex.open(url, create=True, storage_options=writer)  # the right keys work
    store.writer(BROKER).append(batch(0, 10))
    assert _rows(msgindex.open(url, storage_options=writer)) == _offsets((0, 10))
    unknown = "AKIAUNKNOWNKEY000000"
    for options, wrong in (({**writer, "secret_access_key": "not-the-secret"}, "secret access key does not match"),
                           ({**writer, "access_key_id": unknown}, f"access key id '{unknown}' is not known"),
                           (identities["nobody"], "access denied")):
        shard_writer = ObjectShardWriter(ObjectClient(parse_location(url, options)), f"broker={BROKER}", BROKER)
        for call in (lambda o=options: msgindex.open(url, storage_options=o),  # a reader, and a writer's append
                     lambda w=shard_writer: w.append(batch(10, 5))):
            with pytest.raises(ObjectStoreError, match=wrong) as failed:
                call()
            assert "\n" not in str(failed.value) and url in str(failed.value) and server.endpoint in str(failed.value)
    assert _rows(msgindex.open(url, storage_options=writer)) == _offsets((0, 10))  # nothing was written
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, "AWS_ENDPOINT_URL": server.endpoint,
           "AWS_ACCESS_KEY_ID": writer["access_key_id"], "AWS_SECRET_ACCESS_KEY": "not-the-secret",
           "AWS_REGION": writer["region"]}
    done = subprocess.run([str(Path(sys.executable).parent / "msgindex"), "lookup", url, "--key", "k1"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "secret access key does not match" in done.stderr and url in done.stderr
