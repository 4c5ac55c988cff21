"""A store on an object store: the same API and answers as a local ``Store``, with shards made of
versions and chunks (``shard.py``).

```
<root>/msgindex.json         the store manifest (created once, put-if-absent; same format as local)
<root>/_shards/<name>        one mark per shard: put empty before its first commit, "committed" after it
<root>/broker=<name>/...     one shard (shard.py)
```

Where a local store lists its shards in the manifest (a read-modify-write under a file lock),
an object store cannot rewrite one object from many writers without a lock; each shard marks
itself instead, with put-if-absent, before its first commit, and says so in the mark once that
commit exists. Readers list the marks: a shard whose mark says it committed but whose versions are
gone (the mark older than the grace period, so not a shard committing its first version right
now) is damage, an error naming it, never a store that quietly answers without it; a shard whose
first writer died before committing (its mark still empty) is simply empty.

A store object caches per shard the version it read. A lookup answers from a version at most
``max_staleness_s`` old (default 1 s; 0: ask for a newer one, one LIST per shard, on every
lookup): asking before every lookup would add a request and a round trip to each, while commits
arrive at most once per micro-batch. Commits made through this process's writers are seen at
once. The shards of a lookup are read in parallel.

Across store objects, the process keeps what is never rewritten -- the manifest, version objects,
chunk footers -- and the newest version it saw of each shard (``cache.py``): a store opened anew
(a new query) asks whether each shard has a newer version (one LIST, no GET when not), so it sees
every commit made before it was opened, by any process, and never an older version than one this
process already read. A warm one-key lookup on a new store object sends the shards LIST and per
shard its versions LIST and the key's log block (and the hash pages of a chunk whose hash section
is too big to read with its footer, ``shard.CACHED_HASH_BYTES``, until the process has read them
``shard.WARM_PAGE_READS`` times and keeps the whole section); a second one on the same store object within
``max_staleness_s`` only the log block.

**A query of many tasks** (Spark) reads one snapshot: its driver ``pin()``s the newest version of
every shard and hands the ``StorePin`` (the manifest's bytes and the version numbers) to its
tasks, whose stores, opened with it, read exactly those versions: no manifest GET, no LIST, the
version objects by number (a version collected meanwhile -- a query older than the grace
period -- is replaced by the newest, never by an older one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from msgindex.errors import CorruptFileError, InvalidOptionError, ObjectStoreError, StoreNotFoundError, UpgradeRequiredError
from msgindex.storage.backfill import BackfillResult, FieldBackfill
from msgindex.storage.location import StoreLocation
from msgindex.storage.manifest import (
    MANIFEST_FILE,
    SHARD_DIR_PREFIX,
    STORE_FORMAT_VERSION,
    decode_manifest,
    encode_manifest,
)
from msgindex.storage.objects.cache import STORE_CACHE, store_identity
from msgindex.storage.objects.client import PROBE_PREFIX, ObjectClient, ObjectInfo, web_page_answer
from msgindex.storage.objects.shard import (
    MARK_COMMITTED,
    SHARDS_DIR,
    ObjectShardReader,
    ObjectShardWriter,
    ObjectTuning,
)
from msgindex.storage.objects.versions import ShardVersion, ShardVersions
from msgindex.storage.query import FieldsArg, KeysArg, Query, as_query, sort_and_limit
from msgindex.storage.retention import RetentionReport
from msgindex.storage.settings import StoreSettings
from msgindex.storage.shard import validate_broker_name

SHARD_THREADS = 8
# A store lists its shards' marks at most this often: a lookup loop would otherwise pay a LIST per
# lookup for something that changes when a broker joins (a new shard's records then show within
# this time; every known shard is read at its newest version on every lookup).
SHARDS_TTL_S = 2.0
DEFAULT_MAX_STALENESS_S = 1.0


@dataclass(frozen=True)
class ShardCompaction:
    """What ``compact_shards`` did (or would do) to one shard: its chunk count before and after,
    chunks merged away, bytes of chunks read to merge, objects collected after."""

    broker: str
    chunks_before: int
    chunks_after: int
    merged_away: int
    bytes_merged: int
    collected: int


@dataclass(frozen=True)
class StorePin:
    """The snapshot a query of many tasks reads (module docstring): the store manifest's bytes and
    each shard's version number, chosen by ``ObjectStore.pin``; small and picklable."""

    manifest: bytes
    versions: tuple[tuple[str, int], ...]  # (broker, version number), sorted by broker


_SHARD_POOL: ThreadPoolExecutor | None = None
_SHARD_POOL_LOCK = threading.Lock()


def _shard_pool() -> ThreadPoolExecutor:
    """Threads that each run one shard's lookup (which waits on the I/O pool: a separate pool)."""
    global _SHARD_POOL
    with _SHARD_POOL_LOCK:
        if _SHARD_POOL is None:
            _SHARD_POOL = ThreadPoolExecutor(max_workers=SHARD_THREADS, thread_name_prefix="msgindex-shards")
        return _SHARD_POOL


def open_object_store(location: StoreLocation, *, create: bool = False, settings: StoreSettings | None = None,
                      tuning: ObjectTuning | None = None, client: ObjectClient | None = None,
                      max_staleness_s: float = DEFAULT_MAX_STALENESS_S, pin: StorePin | None = None) -> ObjectStore:
    """Open the store at `location` (an object-store URL); with create=True make it when missing.
    A missing manifest is StoreNotFoundError naming the URL; a missing bucket, wrong credentials
    or an endpoint that does not answer are ObjectStoreError lines. The manifest comes from
    `pin`, or (unless `create`) the process's cache (``cache.py``) when this process read it
    before: no request.
    With `pin` the store reads the pinned versions (module docstring)."""
    client = client or ObjectClient(location)
    identity = store_identity(location)
    # (create=True reads it: the caller means to make the store if it is gone)
    known = pin.manifest if pin is not None else None if create else STORE_CACHE.manifest(identity)
    if known is not None:
        return _opened(location, known, client, tuning, max_staleness_s, pin, from_cache=True)
    key = MANIFEST_FILE  # keys are relative to the URL's prefix (the client's store carries it)
    raw = client.get(key)
    if raw is not None and raw.lstrip()[:1] == b"<":  # a manifest is JSON: this is an HTML or XML page
        raise ObjectStoreError(f"{location.url}: reading {MANIFEST_FILE}: {web_page_answer()}")
    if raw is None and [info for info in client.list("") if not info.key.startswith(PROBE_PREFIX)]:
        raw = client.get(key)  # another process may have created the store between the GET and the LIST
        if raw is None and not create:
            raise StoreNotFoundError(f"{location.url}: not a msgindex store (objects, but no {MANIFEST_FILE})")
        if raw is None:
            raise StoreNotFoundError(f"{location.url}: cannot create a msgindex store here: it holds objects and no "
                                     f"{MANIFEST_FILE}")
    if raw is None:
        if not create:
            raise StoreNotFoundError(f"{location.url}: no such msgindex store (no {MANIFEST_FILE})")
        settings = settings or StoreSettings()
        created = encode_manifest(settings, None)
        if not client.put_if_absent(key, created):
            raw = client.get(key)  # another process created it first: open what it made
        else:
            raw = created
    return _opened(location, raw, client, tuning, max_staleness_s, pin)


def _opened(location: StoreLocation, raw: bytes, client: ObjectClient, tuning: ObjectTuning | None,
            max_staleness_s: float, pin: StorePin | None, *, from_cache: bool = False) -> ObjectStore:
    """The store whose manifest is `raw` (checked, then kept in the process's cache)."""
    manifest = decode_manifest(raw, source=f"{location.url.rstrip('/')}/{MANIFEST_FILE}")
    if manifest.version != STORE_FORMAT_VERSION:
        raise UpgradeRequiredError(f"{location.url}: store format {manifest.version}; this msgindex reads format "
                                   f"{STORE_FORMAT_VERSION}")
    STORE_CACHE.remember_manifest(store_identity(location), raw)
    return ObjectStore(location, manifest.settings, client, tuning, max_staleness_s=max_staleness_s,
                       manifest=raw, pinned=dict(pin.versions) if pin is not None else None,
                       manifest_from_cache=from_cache)


class ObjectStore:
    """A msgindex store on an object store (module docstring); ``Store``'s API."""

    def __init__(self, location: StoreLocation, settings: StoreSettings, client: ObjectClient,
                 tuning: ObjectTuning | None = None, *, max_staleness_s: float = DEFAULT_MAX_STALENESS_S,
                 manifest: bytes | None = None, pinned: dict[str, int] | None = None,
                 manifest_from_cache: bool = False) -> None:
        self.location = location
        self.root = location.url
        self.settings = settings
        self.client = client
        self.tuning = tuning or ObjectTuning()
        self.max_staleness_s = max_staleness_s
        self.identity = store_identity(location)
        self._manifest = manifest if manifest is not None else encode_manifest(settings, None)
        self._manifest_unchecked = manifest_from_cache  # not read from the bucket by this store
        self._pinned = pinned
        self._readers: dict[str, tuple[float, ObjectShardReader]] = {}  # broker -> (when checked, reader)
        self._brokers: tuple[float, list[str]] | None = None  # (when listed, the shards' names)
        self._lock = threading.Lock()

    # --- shards -------------------------------------------------------------------------------
    def brokers(self) -> list[str]:
        """Names of the store's shards (their marks: one LIST, at most every SHARDS_TTL_S; the
        pinned ones of a pinned store), sorted."""
        if self._pinned is not None:
            return sorted(self._pinned)
        now = time.monotonic()
        with self._lock:
            if self._brokers is not None and now - self._brokers[0] < SHARDS_TTL_S:
                return list(self._brokers[1])
        names = sorted(info.key.rsplit("/", 1)[-1] for info in self.client.list(f"{SHARDS_DIR}/"))
        if not names and self._manifest_unchecked:
            self._check_manifest()
        with self._lock:
            self._brokers = (now, names)
        return list(names)

    def _check_manifest(self) -> None:
        """A store opened from the process's cache that shows no shard: is it still there (it
        may have been deleted since this process read its manifest)?"""
        if self.client.get(MANIFEST_FILE) is None:
            STORE_CACHE.forget_manifest(self.identity)
            raise StoreNotFoundError(f"{self.root}: no such msgindex store (no {MANIFEST_FILE}: deleted)")
        self._manifest_unchecked = False

    def pin(self) -> StorePin:
        """The newest version of every shard, asked now (the shards as ``brokers`` lists them,
        then one LIST per shard in parallel, GETs only for versions this process has not read):
        the snapshot a query's tasks read (module docstring). This store reads it too from now on."""
        if self._pinned is None:
            brokers = self.brokers()
            readers = self._in_shards(self._fresh_reader, brokers)
            self._pinned = {b: reader.version.number for b, reader in zip(brokers, readers)}
        return StorePin(self._manifest, tuple(sorted(self._pinned.items())))

    def missing_shards(self) -> list[str]:
        """Shards whose marks say they committed, marked longer than the grace period ago, that
        have no version (their objects were deleted)."""
        now = int(time.time() * 1000)
        old = [info for info in self.client.list(f"{SHARDS_DIR}/")
               if info.last_modified_ms < now - self.tuning.grace_s * 1000]
        return sorted(info.key.rsplit("/", 1)[-1] for info in old
                      if not self._versions(info.key.rsplit("/", 1)[-1]).numbers() and self._marked_committed(info))

    def _marked_committed(self, mark: ObjectInfo) -> bool:
        """Whether a shard's mark says its first version was committed (shard.MARK_COMMITTED):
        a shard whose first writer died before committing has an empty mark and nothing lost."""
        return self.client.get(mark.key) == MARK_COMMITTED

    def is_registered(self, broker: str) -> bool:
        return broker in self.brokers()

    def shard_prefix(self, broker: str) -> str:
        validate_broker_name(broker)
        return f"{SHARD_DIR_PREFIX}{broker}"

    def _versions(self, broker: str) -> ShardVersions:
        return ShardVersions(self.client, self.shard_prefix(broker))

    def writer(self, broker: str, *, hold_lock: bool = True) -> ObjectShardWriter:
        """The writer of `broker`'s shard (no lock is taken: commits settle races). Its commits
        are seen by this store's lookups at once."""
        return ObjectShardWriter(self.client, self.shard_prefix(broker), broker, tuning=self.tuning,
                                 on_commit=lambda version: self._committed(broker, version))

    def _committed(self, broker: str, version: ShardVersion) -> None:
        STORE_CACHE.remember(self.identity, self.shard_prefix(broker), version)
        with self._lock:
            cached = self._readers.get(broker)
            if cached is None or cached[1].version.number < version.number:
                self._readers[broker] = (time.monotonic(), ObjectShardReader(
                    self.client, self.shard_prefix(broker), broker, version))
            if self._brokers is not None and broker not in self._brokers[1]:
                self._brokers = None

    def reader(self, broker: str, version: ShardVersion | None = None) -> ObjectShardReader:
        """A reader on the newest version of `broker`'s shard (or on `version`; a pinned store:
        on the pinned one)."""
        if version is None and self._pinned is not None and broker in self._pinned:
            version = self._pinned_version(broker, self._pinned[broker])
        if version is None:
            version = self._newest_version(broker)
        return ObjectShardReader(self.client, self.shard_prefix(broker), broker, version)

    def _newest_version(self, broker: str, known: ShardVersion | None = None) -> ShardVersion:
        """The newest version of `broker`'s shard, asked now: one LIST from the newest this
        process has seen (or `known`), a GET only for a version newer than that (cache.py)."""
        shard = self.shard_prefix(broker)
        seen = STORE_CACHE.newest(self.identity, shard)
        floor = known if seen is None or (known is not None and known.number >= seen.number) else seen
        version = self._versions(broker).latest(floor)
        if not version.number:
            self._check_present(broker)
        if floor is not None and (version.number < floor.number or (  # versions deleted from the top, or
                version.number == floor.number and version.commit_id != floor.commit_id)):  # the store made again
            STORE_CACHE.forget_store(self.identity)
            with self._lock:
                self._readers.clear()
        return STORE_CACHE.remember(self.identity, shard, version)

    def _pinned_version(self, broker: str, number: int) -> ShardVersion:
        """Version `number` of `broker`'s shard, as its query's driver pinned it: from the
        process's cache, else one GET; when collected meanwhile (a query older than the grace
        period), the newest (never an older one)."""
        shard = self.shard_prefix(broker)
        if not number:
            return ShardVersion()  # the shard had no version when the query began: it reads nothing
        version = STORE_CACHE.version(self.identity, shard, number) or self._versions(broker).read(number)
        if version is None:
            return self._newest_version(broker)
        STORE_CACHE.remember(self.identity, shard, version)
        return version

    def _check_present(self, broker: str) -> None:
        marks = {info.key.rsplit("/", 1)[-1]: info for info in self.client.list(f"{SHARDS_DIR}/")}
        if broker not in marks:
            raise InvalidOptionError(f"{self.root}: no shard for broker {broker!r} (brokers in the store: "
                                     f"{sorted(marks)})")
        if marks[broker].last_modified_ms < time.time() * 1000 - self.tuning.grace_s * 1000 and \
                self._marked_committed(marks[broker]):
            raise CorruptFileError(
                f"{self.root}/{self.shard_prefix(broker)}: the shard is marked as committed ({SHARDS_DIR}/{broker}) "
                f"but has no versions: its objects were deleted; restore them, or remove the mark to accept the loss")

    # --- queries ------------------------------------------------------------------------------
    def lookup(self, keys: KeysArg | Query | None = None, *, topic: str | None = None, begin_ms: int | None = None,
               end_ms: int | None = None, max_results: int | None = None, brokers: Iterable[str] | None = None,
               partitions: Iterable[int] | None = None, fields: FieldsArg | None = None) -> pa.Table:
        """As ``Store.lookup``: verified rows in ROW_SCHEMA and result order, every shard read
        at its newest version, shards in parallel."""
        query = as_query(keys, topic=topic, begin_ms=begin_ms, end_ms=end_ms, max_results=max_results,
                         brokers=brokers, partitions=partitions, fields=fields)
        selected = self._selected_brokers(query.brokers)
        tables = self._in_shards(lambda b: self._cached_reader(b).lookup(query), selected)
        return sort_and_limit(tables, query.max_results)

    def _in_shards(self, work, brokers: list[str]) -> list:
        """work(broker) for every broker, in parallel when there are several; results in order."""
        if len(brokers) <= 1:
            return [work(b) for b in brokers]
        futures = [_shard_pool().submit(work, b) for b in brokers]
        return [future.result() for future in futures]

    def scan(self, query: Query | None = None, *, begin_ms: int | None = None, end_ms: int | None = None,
             brokers: Iterable[str] | None = None, topics: Iterable[str] | None = None,
             partitions: Iterable[int] | None = None) -> Iterator[pa.RecordBatch]:
        """As ``Store.scan``: every committed record in the window, shard by shard in log order."""
        query = as_query(query, begin_ms=begin_ms, end_ms=end_ms, brokers=brokers, topics=topics,
                         partitions=partitions)
        for broker in self._selected_brokers(query.brokers):
            reader = self.reader(broker)
            for start, end in reader.scan_ranges(query.begin_ms, query.end_ms):
                yield from reader.scan_range(start, end, query)

    def apply_retention(self, *, max_age_ms: int | None = None, max_bytes: int | None = None,
                        now_ms: int | None = None, dry_run: bool = False) -> RetentionReport:
        """As ``Store.apply_retention``: every shard's oldest whole chunks (never the newest)."""
        report = RetentionReport()
        for broker in self.brokers():
            report = report.merge(self.writer(broker).apply_retention(
                max_age_ms=max_age_ms, max_bytes=max_bytes, now_ms=now_ms, dry_run=dry_run))
        return report

    def backfill(self, broker: str, backfill: FieldBackfill, *, lock_timeout_s: float = 120.0) -> BackfillResult:
        """As ``Store.backfill``: index `backfill`'s fields over the records shard `broker` committed
        before they existed (``ObjectShardWriter.backfill``: the chunks holding records that get
        values are rewritten and committed in place in one version). `lock_timeout_s` is unused:
        an object-store shard has no lock, its versions settle races with other writers."""
        self._newest_version(broker)  # an unknown or lost shard is an error naming it, before any work
        return self.writer(broker).backfill(backfill)

    def compact(self, *, everything: bool = True) -> dict[str, int]:
        """Merge every shard's chunks (``msgindex compact``: as many as fit in one merged chunk
        each), then collect what is past the grace period. Returns chunks merged away per shard."""
        return {c.broker: c.merged_away for c in self.compact_shards(everything=everything)}

    def compact_shards(self, brokers: Iterable[str] | None = None, *, everything: bool = True,
                       dry_run: bool = False) -> list[ShardCompaction]:
        """``compact`` of `brokers` (all: None), shard by shard, saying what each did; with
        `dry_run` what each would merge (nothing is written or deleted)."""
        selected = self.brokers() if brokers is None else sorted(set(brokers))
        for broker in selected:
            self.reader(broker)  # an unknown or lost shard is an error naming it, before any work
        done = []
        for broker in selected:
            writer = self.writer(broker)
            before = writer.refresh()
            if dry_run:
                runs = writer.plan(before.chunks, everything=everything)
                done.append(ShardCompaction(broker, len(before.chunks), len(before.chunks) - sum(
                    end - start - 1 for start, end in runs), sum(end - start - 1 for start, end in runs),
                    sum(c.info.size for start, end in runs for c in before.chunks[start:end]), 0))
                continue
            merged = writer.compact(everything=everything)
            after = writer.state
            read = sum(c.info.size for c in before.chunks if after.chunk_named(c.name) is None)
            collected = writer.collect()
            done.append(ShardCompaction(broker, len(before.chunks), len(after.chunks), merged, read, collected))
        return done

    def close(self) -> None:
        with self._lock:
            self._readers.clear()

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ObjectStore({self.root!r})"

    # --- internals ----------------------------------------------------------------------------
    def _selected_brokers(self, brokers: frozenset[str] | None) -> list[str]:
        return self.brokers() if brokers is None else sorted(brokers)

    def _cached_reader(self, broker: str) -> ObjectShardReader:
        now = time.monotonic()
        with self._lock:
            cached = self._readers.get(broker)
        pinned = self._pinned is not None and broker in self._pinned
        if cached is not None and (pinned or now - cached[0] < self.max_staleness_s):
            return cached[1]
        if cached is None or pinned:
            reader = self.reader(broker)
        else:
            newest = self._newest_version(broker, cached[1].version)
            reader = cached[1] if newest.number == cached[1].version.number else ObjectShardReader(
                self.client, self.shard_prefix(broker), broker, newest)
        with self._lock:
            self._readers[broker] = (now, reader)
        return reader

    def _fresh_reader(self, broker: str) -> ObjectShardReader:
        """A reader on the newest version of `broker`'s shard, asked now; this store's lookups
        read it from now on."""
        with self._lock:
            cached = self._readers.get(broker)
        newest = self._newest_version(broker, cached[1].version if cached is not None else None)
        reader = cached[1] if cached is not None and newest.number == cached[1].version.number else ObjectShardReader(
            self.client, self.shard_prefix(broker), broker, newest)
        with self._lock:
            self._readers[broker] = (time.monotonic(), reader)
        return reader
