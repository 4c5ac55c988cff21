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

A reader caches per shard the version it read and the chunks' footers; each lookup asks whether
a newer version exists (one LIST per shard), so it always answers from the newest commit. The
shards of a lookup are read in parallel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

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
from msgindex.storage.query import KeysArg, Query, as_query, sort_and_limit
from msgindex.storage.retention import RetentionReport
from msgindex.storage.settings import StoreSettings
from msgindex.storage.shard import validate_broker_name

SHARD_THREADS = 8
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
                      tuning: ObjectTuning | None = None, client: ObjectClient | None = None) -> ObjectStore:
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
            return ObjectStore(location, settings, client, tuning)
    manifest = decode_manifest(raw, source=f"{location.url.rstrip('/')}/{MANIFEST_FILE}")
    if manifest.version != STORE_FORMAT_VERSION:
        raise UpgradeRequiredError(f"{location.url}: store format {manifest.version}; this msgindex reads format "
                                   f"{STORE_FORMAT_VERSION}")
    return ObjectStore(location, manifest.settings, client, tuning)


class ObjectStore:
    """A msgindex store on an object store (module docstring); ``Store``'s API."""

    def __init__(self, location: StoreLocation, settings: StoreSettings, client: ObjectClient,
                 tuning: ObjectTuning | None = None) -> None:
        self.location = location
        self.root = location.url
        self.settings = settings
        self.client = client
        self.tuning = tuning or ObjectTuning()
        self._readers: dict[str, ObjectShardReader] = {}
        self._lock = threading.Lock()

    # --- shards -------------------------------------------------------------------------------
    def brokers(self) -> list[str]:
        """Names of the store's shards (their marks: one LIST), sorted."""
        return sorted(info.key.rsplit("/", 1)[-1] for info in self.client.list(f"{SHARDS_DIR}/"))

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
        """The writer of `broker`'s shard (no lock is taken: commits settle races)."""
        return ObjectShardWriter(self.client, self.shard_prefix(broker), broker, tuning=self.tuning)

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
    def lookup(self, keys: KeysArg | Query, *, topic: str | None = None, begin_ms: int | None = None,
               end_ms: int | None = None, max_results: int | None = None, brokers: Iterable[str] | None = None,
               partitions: Iterable[int] | None = None) -> pa.Table:
        """As ``Store.lookup``: verified rows in ROW_SCHEMA and result order, every shard read
        at its newest version, shards in parallel."""
        query = as_query(keys, topic=topic, begin_ms=begin_ms, end_ms=end_ms, max_results=max_results,
                         brokers=brokers, partitions=partitions)
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
        merged = {}
        for broker in self.brokers():
            writer = self.writer(broker)
            merged[broker] = writer.compact(everything=everything)
            writer.collect()
        return merged

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
        with self._lock:
            cached = self._readers.get(broker)
        if cached is None:
            reader = self.reader(broker)
        else:
            newest = self._versions(broker).latest(cached.version)
            reader = cached if newest is cached.version else ObjectShardReader(
                self.client, self.shard_prefix(broker), broker, newest)
        with self._lock:
            self._readers[broker] = reader
        return reader
