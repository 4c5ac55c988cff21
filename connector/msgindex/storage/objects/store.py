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

A store object caches per shard the version it read and the chunks' footers. A lookup answers
from a version at most ``max_staleness_s`` old (default 1 s; 0: ask for a newer one, one LIST per
shard, on every lookup): asking before every lookup would add a request and a round trip to each,
while commits arrive at most once per micro-batch. Commits made through this store object's own
writers are seen at once. The shards of a lookup are read in parallel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from msgindex.errors import CorruptFileError, InvalidOptionError, StoreNotFoundError, UpgradeRequiredError
from msgindex.storage.location import StoreLocation
from msgindex.storage.manifest import (
    MANIFEST_FILE,
    SHARD_DIR_PREFIX,
    STORE_FORMAT_VERSION,
    decode_manifest,
    encode_manifest,
)
from msgindex.storage.objects.client import ObjectClient, ObjectInfo
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
                      max_staleness_s: float = DEFAULT_MAX_STALENESS_S) -> ObjectStore:
    """Open the store at `location` (an object-store URL); with create=True make it when missing.
    A missing manifest is StoreNotFoundError naming the URL; a missing bucket, wrong credentials
    or an endpoint that does not answer are ObjectStoreError lines."""
    client = client or ObjectClient(location)
    key = MANIFEST_FILE  # keys are relative to the URL's prefix (the client's store carries it)
    raw = client.get(key)
    if raw is None and client.list(""):
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
        if not client.put_if_absent(key, encode_manifest(settings, None)):
            raw = client.get(key)  # another process created it first: open what it made
        else:
            return ObjectStore(location, settings, client, tuning, max_staleness_s=max_staleness_s)
    manifest = decode_manifest(raw, source=f"{location.url.rstrip('/')}/{MANIFEST_FILE}")
    if manifest.version != STORE_FORMAT_VERSION:
        raise UpgradeRequiredError(f"{location.url}: store format {manifest.version}; this msgindex reads format "
                                   f"{STORE_FORMAT_VERSION}")
    return ObjectStore(location, manifest.settings, client, tuning, max_staleness_s=max_staleness_s)


class ObjectStore:
    """A msgindex store on an object store (module docstring); ``Store``'s API."""

    def __init__(self, location: StoreLocation, settings: StoreSettings, client: ObjectClient,
                 tuning: ObjectTuning | None = None, *, max_staleness_s: float = DEFAULT_MAX_STALENESS_S) -> None:
        self.location = location
        self.root = location.url
        self.settings = settings
        self.client = client
        self.tuning = tuning or ObjectTuning()
        self.max_staleness_s = max_staleness_s
        self._readers: dict[str, tuple[float, ObjectShardReader]] = {}  # broker -> (when checked, reader)
        self._brokers: tuple[float, list[str]] | None = None  # (when listed, the shards' names)
        self._lock = threading.Lock()

    # --- shards -------------------------------------------------------------------------------
    def brokers(self) -> list[str]:
        """Names of the store's shards (their marks: one LIST, at most every SHARDS_TTL_S), sorted."""
        now = time.monotonic()
        with self._lock:
            if self._brokers is not None and now - self._brokers[0] < SHARDS_TTL_S:
                return list(self._brokers[1])
        names = sorted(info.key.rsplit("/", 1)[-1] for info in self.client.list(f"{SHARDS_DIR}/"))
        with self._lock:
            self._brokers = (now, names)
        return list(names)

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
        with self._lock:
            cached = self._readers.get(broker)
            if cached is None or cached[1].version.number < version.number:
                self._readers[broker] = (time.monotonic(), ObjectShardReader(
                    self.client, self.shard_prefix(broker), broker, version))
            if self._brokers is not None and broker not in self._brokers[1]:
                self._brokers = None

    def reader(self, broker: str, version: ShardVersion | None = None) -> ObjectShardReader:
        """A reader on the newest version of `broker`'s shard (or on `version`)."""
        if version is None:
            version = self._versions(broker).latest()
            if not version.number:
                self._check_present(broker)
        return ObjectShardReader(self.client, self.shard_prefix(broker), broker, version)

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
        if len(selected) <= 1:
            tables = [self._cached_reader(b).lookup(query) for b in selected]
        else:
            futures = [_shard_pool().submit(lambda b=b: self._cached_reader(b).lookup(query)) for b in selected]
            tables = [future.result() for future in futures]
        return sort_and_limit(tables, query.max_results)

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
        if cached is not None and now - cached[0] < self.max_staleness_s:
            return cached[1]
        if cached is None:
            reader = self.reader(broker)
        else:
            newest = self._versions(broker).latest(cached[1].version)
            reader = cached[1] if newest is cached[1].version else ObjectShardReader(
                self.client, self.shard_prefix(broker), broker, newest)
        with self._lock:
            self._readers[broker] = (now, reader)
        return reader
