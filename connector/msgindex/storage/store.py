"""The store: a directory of per-broker shards plus a manifest, and queries across shards.

```
<root>/msgindex.json     {"format": "msgindex-store", "version": 2, "settings": {...}, "shards": [...]}
<root>/broker=<name>/    one shard (see shard.py)
```
The manifest (``manifest.py``) fixes the settings for the life of the store and lists its shards:
a listed shard whose directory is gone is an error for every read, never a store that quietly
answers without it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from msgindex.errors import CorruptFileError, InvalidOptionError, StoreNotFoundError, UpgradeRequiredError
from msgindex.storage.location import parse_location
from msgindex.storage.manifest import (  # noqa: F401  (MANIFEST_FILE, STORE_FORMAT, read_manifest: re-exported)
    LEGACY_STORE_VERSIONS,
    MANIFEST_FILE,
    STORE_FORMAT,
    STORE_FORMAT_VERSION,
    Manifest,
    load_manifest,
    read_manifest,
    shard_directories,
    write_manifest,
)
from msgindex.storage.query import FieldsArg, KeysArg, Query, as_query, sort_and_limit
from msgindex.storage.retention import RetentionReport, apply_shard_retention
from msgindex.storage.settings import StoreSettings
from msgindex.storage.shard import (
    SHARD_DIR_PREFIX,
    AppendResult,
    ShardReader,
    ShardWriter,
    checkpoint_path,
    shard_directory,
    validate_broker_name,
)
from msgindex.times import TimeArg

if TYPE_CHECKING:
    from msgindex.storage.backfill import BackfillResult, FieldBackfill
    from msgindex.storage.objects.store import ObjectStore, StorePin

LISTING_SETTLED_NS = 2_000_000_000

__all__ = [
    "AppendResult",
    "RetentionReport",
    "ShardReader",
    "ShardWriter",
    "Store",
    "StoreSettings",
    "open_store",
]


def open_store(root: str | os.PathLike, *, create: bool = False, settings: StoreSettings | None = None,
               storage_options: Mapping[str, str] | None = None, max_staleness_s: float | None = None,
               pin: StorePin | None = None) -> Store | ObjectStore:
    """Open the store at `root` (a local path or an object-store URL: ``location.py``); with
    create=True make it (and its parents) when missing.

    A missing path, or a directory without a manifest, raises StoreNotFoundError naming it
    (create=True refuses to turn a non-empty foreign directory into a store). `storage_options`
    configure an object store's client (endpoint, credentials, ...: ``location.py``);
    `max_staleness_s` how old a version an object store's lookups may answer from (default 1 s:
    ``objects/store.py``; a local store always answers from its last commit); `pin` the
    snapshot an object store reads (``ObjectStore.pin``: a query's tasks; ignored locally, where
    every reader reads the last commit)."""
    location = parse_location(root, storage_options)
    if not location.is_local:
        from msgindex.storage.objects.store import DEFAULT_MAX_STALENESS_S, open_object_store

        return open_object_store(location, create=create, settings=settings,
                                 max_staleness_s=DEFAULT_MAX_STALENESS_S if max_staleness_s is None else max_staleness_s,
                                 pin=pin)
    root = location.local_path
    manifest = root / MANIFEST_FILE
    if manifest.exists():
        return _current(manifest)
    if not create:
        if not root.exists():
            raise StoreNotFoundError(f"{root}: no such msgindex store (the path does not exist)")
        if root.is_dir() and shard_directories(root):
            raise StoreNotFoundError(
                f"{root}: holds msgindex shards but no {MANIFEST_FILE} (the store manifest: its settings and shard "
                f"list); restore it from a backup")
        raise StoreNotFoundError(f"{root}: not a msgindex store (no {MANIFEST_FILE} in it)")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise StoreNotFoundError(
            f"{root}: cannot create a msgindex store here: it exists, is not empty and has no {MANIFEST_FILE}"
        )
    settings = settings or StoreSettings()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # e.g. a parent is a regular file
        raise StoreNotFoundError(f"{root}: cannot create a msgindex store here ({error.strerror})") from None
    write_manifest(manifest, settings, shards=())
    return Store(root, settings, shards=())


class Store:
    """A msgindex store: per-broker shards under one root, queried together.

    Readers are cached per shard and refreshed when the shard commits (its checkpoint file is
    replaced), so repeated lookups are cheap and always see the latest committed batch."""

    def __init__(self, root: Path, settings: StoreSettings, *, shards: tuple[str, ...] | None = None) -> None:
        self.root = Path(root)
        self.settings = settings
        self._shards = shards  # the manifest's list as last read (None: not recorded in this store)
        self._readers: dict[str, tuple[Any, ShardReader]] = {}
        self._checkpoints: dict[str, str] = {}  # broker -> its checkpoint's path (stat on every lookup)
        self._listed: tuple[tuple[int, int], list[str]] | None = None  # ((inode, mtime) of the root, brokers)

    # --- shards -------------------------------------------------------------------------------
    def brokers(self) -> list[str]:
        """Names of the shards in the store, sorted. CorruptFileError when the manifest lists a
        shard whose directory is missing (``missing_shards``)."""
        present = self._present_shards()
        if self._shards is not None and not set(self._shards) <= set(present):
            missing = self.missing_shards()
            if missing:
                raise CorruptFileError(_missing_message(self.root, missing))
        return present

    def _present_shards(self) -> list[str]:
        # Every lookup asks: the list is kept while the root directory is unchanged. Creating or
        # removing a shard changes the root's mtime; a listing is only kept once that mtime is
        # LISTING_SETTLED_NS old, so that a change within the same mtime tick is never missed.
        info = os.stat(self.root)
        version = (info.st_ino, info.st_mtime_ns)
        if self._listed is not None and self._listed[0] == version:
            return list(self._listed[1])
        names = shard_directories(self.root)
        # the manifest is replaced inside the root too (a shard registered since it was read)
        self._shards = load_manifest(self.root / MANIFEST_FILE).shards
        settled = time.time_ns() - info.st_mtime_ns > LISTING_SETTLED_NS
        self._listed = (version, names) if settled else None
        return list(names)

    def missing_shards(self) -> list[str]:
        """Shards the manifest lists whose directories are missing (re-reads the manifest)."""
        self._shards = load_manifest(self.root / MANIFEST_FILE).shards
        if self._shards is None:
            return []
        present = set(shard_directories(self.root))
        return sorted(set(self._shards) - present)

    def is_registered(self, broker: str) -> bool:
        """True when the manifest lists `broker` (as last read)."""
        return self._shards is not None and broker in self._shards

    def writer(self, broker: str, *, hold_lock: bool = True) -> ShardWriter:
        """The writer of `broker`'s shard (created when new). It holds the shard's lock until
        closed, or with hold_lock=False only inside ``with writer.locked(timeout):`` blocks."""
        validate_broker_name(broker)
        return ShardWriter(shard_directory(self.root, broker), broker, self.settings, hold_lock=hold_lock,
                           store_root=self.root)

    def reader(self, broker: str) -> ShardReader:
        """A new reader on the committed snapshot of `broker`'s shard (the caller closes it)."""
        return ShardReader(self._existing_shard(broker), broker, self.settings, registered=self.is_registered(broker))

    # --- queries ------------------------------------------------------------------------------
    def lookup(
        self,
        keys: KeysArg | Query | None = None,
        *,
        topic: str | None = None,
        begin: TimeArg | None = None,
        end: TimeArg | None = None,
        begin_ms: int | None = None,
        end_ms: int | None = None,
        max_results: int | None = None,
        brokers: Iterable[str] | None = None,
        partitions: Iterable[int] | None = None,
        fields: FieldsArg | None = None,
    ) -> pa.Table:
        """Messages indexed under any of `keys` (str, bytes, or an iterable of them) or any of
        `fields`' values (``{"order": ["o-42"]}``: storage/fields.py; a field that does not cover
        every offset a shard holds gives a FieldCoverageWarning naming what it misses), verified
        against the metadata log, in ROW_SCHEMA, ordered by (timestamp, broker, topic, partition,
        offset); `max_results` keeps the first ones in that order (None: all). A big result is a
        table of several record batches (``to_batches()``; ``combine_chunks()`` makes one).
        `begin`/`end` bound the time as people type it (``-1h``, ``2026-11-25 10:00``, UTC
        unless a zone is given; ``msgindex.times``), `begin_ms`/`end_ms` in epoch ms; inclusive.
        A ``Query`` may stand for all the arguments."""
        query = as_query(keys, topic=topic, begin=begin, end=end, begin_ms=begin_ms, end_ms=end_ms, max_results=max_results,
                         brokers=brokers, partitions=partitions, fields=fields)
        tables = [self._cached_reader(broker).lookup(query) for broker in self._selected_brokers(query.brokers)]
        return sort_and_limit(tables, query.max_results)

    def scan(
        self,
        query: Query | None = None,
        *,
        begin: TimeArg | None = None,
        end: TimeArg | None = None,
        begin_ms: int | None = None,
        end_ms: int | None = None,
        brokers: Iterable[str] | None = None,
        topics: Iterable[str] | None = None,
        partitions: Iterable[int] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Every committed record in the time window (inclusive, ms), shard by shard in log
        order, as ROW_SCHEMA record batches. Uses the sparse time index to skip segments. A
        ``Query`` (its keys ignored) may stand for the restrictions."""
        query = as_query(query, begin=begin, end=end, begin_ms=begin_ms, end_ms=end_ms, brokers=brokers, topics=topics,
                         partitions=partitions)
        for broker in self._selected_brokers(query.brokers):
            # its own reader: a lookup meanwhile may replace (and close) the cached one
            with self.reader(broker) as reader:
                for start, end in reader.scan_ranges(query.begin_ms, query.end_ms):
                    yield from reader.scan_range(start, end, query)

    def backfill(self, broker: str, backfill: FieldBackfill, *, lock_timeout_s: float = 120.0) -> BackfillResult:
        """Index `backfill`'s fields over the records shard `broker` committed before they existed
        (backfill.py: the shard is rebuilt under its writer lock, waiting up to `lock_timeout_s`)."""
        from msgindex.storage.backfill import backfill_shard

        return backfill_shard(self._existing_shard(broker), broker, self.settings, backfill,
                              lock_timeout_s=lock_timeout_s)

    def apply_retention(
        self,
        *,
        max_age_ms: int | None = None,
        max_bytes: int | None = None,
        now_ms: int | None = None,
        dry_run: bool = False,
    ) -> RetentionReport:
        """Delete every shard's expired log segments, oldest first, and the hash index files that
        only point into them (retention.py), never a shard's active ones. `max_age_ms`: segments
        whose newest record is older than now_ms - max_age_ms; `max_bytes`: a per-shard size cap;
        `dry_run`: report, delete nothing. Takes each shard's writer lock."""
        report = RetentionReport()
        for broker in self.brokers():
            with self.writer(broker) as writer:
                report = report.merge(apply_shard_retention(
                    writer, max_age_ms=max_age_ms, max_bytes=max_bytes, now_ms=now_ms, dry_run=dry_run
                ))
        return report

    def pin(self) -> None:
        """An object store's snapshot for a query's tasks (``ObjectStore.pin``); a local store
        has none to hand over: every reader of it reads the last commit."""
        return None

    def close(self) -> None:
        for _, reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # --- internals ----------------------------------------------------------------------------
    def _selected_brokers(self, brokers: frozenset[str] | None) -> list[str]:
        return self.brokers() if brokers is None else sorted(brokers)

    def _existing_shard(self, broker: str) -> Path:
        validate_broker_name(broker)
        directory = shard_directory(self.root, broker)
        if not directory.is_dir():
            if self.is_registered(broker) and broker in self.missing_shards():
                raise CorruptFileError(_missing_message(self.root, [broker]))
            raise InvalidOptionError(
                f"{self.root}: no shard for broker {broker!r} (brokers in the store: {self.brokers()})"
            )
        return directory

    def _cached_reader(self, broker: str) -> ShardReader:
        """A reader on the latest commit: the checkpoint is replaced by rename on every commit,
        so a changed (inode, mtime, size) means a new snapshot."""
        cached = self._readers.get(broker)
        checkpoint = self._checkpoints.get(broker) if cached is not None else None
        if checkpoint is None:
            checkpoint = self._checkpoints[broker] = str(checkpoint_path(self._existing_shard(broker)))
        try:
            info = os.stat(checkpoint)
            version = (info.st_ino, info.st_mtime_ns, info.st_size)
        except (FileNotFoundError, NotADirectoryError):
            version = None
        if cached is not None and cached[0] == version and version is not None:
            # a cached broker was validated when first read; its checkpoint still stands, and
            # its mapped files must not have changed in place since
            cached[1].check_unchanged()
            return cached[1]
        directory = self._existing_shard(broker)
        if cached is not None:
            cached[1].close()
            del self._readers[broker]
        reader = ShardReader(directory, broker, self.settings, registered=self.is_registered(broker))
        self._readers[broker] = (version, reader)
        return reader


def _current(path: Path) -> Store:
    """The store whose manifest is at `path`, in the current format (else UpgradeRequiredError)."""
    manifest: Manifest = load_manifest(path)
    if manifest.version != STORE_FORMAT_VERSION:
        raise UpgradeRequiredError(
            f"{path.parent}: store format {manifest.version} (row-per-record metadata logs); this msgindex reads "
            f"format {STORE_FORMAT_VERSION}: run `msgindex upgrade {path.parent}` to convert it in place"
        )
    return Store(path.parent, manifest.settings, shards=manifest.shards)


def _missing_message(root: Path, missing: list[str]) -> str:
    names = ", ".join(f"{root / (SHARD_DIR_PREFIX + name)}" for name in missing)
    return (f"{names}: shard directory missing, but the store manifest ({root / MANIFEST_FILE}) lists it: restore it "
            f"from a backup (its records cannot be found otherwise), or run `msgindex repair {root} --forget-missing` "
            f"to accept the loss")
