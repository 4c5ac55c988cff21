"""What a process keeps of object stores between ``ObjectStore`` instances: the objects that are
never rewritten, and the newest version it has seen of each shard.

A query opens its store anew (each Spark task, each planning step, each ``msgindex.open``), and
without this each open paid for the manifest, the shards' versions and the chunks' footers
again: 8 requests, mostly one after another, for a one-key lookup that needs 1 (its log block).

```
what                          kept until             why it may be kept
store manifest (raw bytes)    the process ends       created once by put-if-absent, never rewritten
version N of a shard          dropped (LRU)          put-if-absent, never rewritten; deleted only by
                                                     collection, a grace period after its successor
newest version seen, a shard  replaced by a newer    a floor: never answer from an older one
chunk footers (+ hash        dropped (LRU, bytes)   chunks are immutable; keyed by the chunk's URL,
  sections: small ones at                            whose name is unique (time + random)
  once, big ones once read
  again), by chunk URL
```

What is NOT kept across instances: whether a version is the newest. A new ``ObjectStore`` asks
(one LIST per shard, ``after`` the newest version seen: a GET only when there is a newer one), so
a lookup on a store opened after a commit -- by any process -- sees it. Within one instance,
``max_staleness_s`` bounds how old a version its lookups answer from (store.py), and a Spark query
reads the versions its driver pinned (``StorePin``).

Entries are keyed by the store's identity: its URL with the storage options and the environment
variables a client reads its endpoint and credentials from, hashed (two endpoints with the same
bucket name, or keys that see different objects, never share an entry; no secret is held in a
key). A manifest that a store deleted and made again at the same URL in the same process would
be the first one's: settings only describe how a store is written, and a store whose shards are
all gone reads its manifest again (``ObjectStore.brokers``), so such a store is never served as
the one it replaced.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from msgindex.storage.location import StoreLocation
from msgindex.storage.objects.chunk_format import ChunkFooter
from msgindex.storage.objects.versions import ShardVersion

# A version holds a few hundred bytes per chunk and per source partition: a few thousand of them
# (every shard of every store a process reads, and the versions its queries pinned) are a few MB.
MAX_VERSIONS = 4096
FOOTER_CACHE_BYTES = 256 * 1024 * 1024
_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "OBJECT_STORE_")


def store_identity(location: StoreLocation) -> str:
    """The key of `location`'s entries: a digest of its URL, its storage options and the
    client's environment (see the module docstring)."""
    parts = [location.url, location.kind, *sorted(f"{k}={v}" for k, v in location.options.items()),
             *sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES))]
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


class ObjectStoreCache:
    """The process-wide cache of the module docstring. Thread-safe."""

    def __init__(self, max_versions: int = MAX_VERSIONS) -> None:
        self._lock = threading.Lock()
        self._manifests: dict[str, bytes] = {}
        self._versions: OrderedDict[tuple[str, str, int], ShardVersion] = OrderedDict()
        self._newest: dict[tuple[str, str], ShardVersion] = {}
        self._max_versions = max_versions

    # --- the manifest -------------------------------------------------------------------------
    def manifest(self, identity: str) -> bytes | None:
        with self._lock:
            return self._manifests.get(identity)

    def remember_manifest(self, identity: str, raw: bytes) -> None:
        with self._lock:
            self._manifests[identity] = raw

    def forget_manifest(self, identity: str) -> None:
        with self._lock:
            self._manifests.pop(identity, None)

    # --- versions -----------------------------------------------------------------------------
    def version(self, identity: str, shard: str, number: int) -> ShardVersion | None:
        """Version `number` of `shard` when this process has read or committed it."""
        with self._lock:
            found = self._versions.get((identity, shard, number))
            if found is not None:
                self._versions.move_to_end((identity, shard, number))
            return found

    def newest(self, identity: str, shard: str) -> ShardVersion | None:
        """The newest version of `shard` this process has seen (not necessarily the newest one)."""
        with self._lock:
            return self._newest.get((identity, shard))

    def remember(self, identity: str, shard: str, version: ShardVersion) -> ShardVersion:
        """Keep `version` (read or committed by this process); returns the newest seen, which
        another thread may have made newer than `version`. A shard without versions
        (``ShardVersion()``: never committed, or its versions deleted) is returned as it is."""
        if not version.number:
            return version
        with self._lock:
            self._versions[(identity, shard, version.number)] = version
            self._versions.move_to_end((identity, shard, version.number))
            while len(self._versions) > self._max_versions:
                self._versions.popitem(last=False)
            newest = self._newest.get((identity, shard))
            if newest is None or newest.number < version.number:
                self._newest[(identity, shard)] = newest = version
            return newest

    def forget_store(self, identity: str) -> None:
        """Forget the store's manifest and every version of every shard: a shard's versions were
        deleted from the top (a roll-back, or the store deleted and made again at its URL, whose
        new versions reuse the old numbers), so nothing remembered of it can be trusted."""
        with self._lock:
            self._manifests.pop(identity, None)
            for cached in [at for at in self._versions if at[0] == identity]:
                del self._versions[cached]
            for cached in [at for at in self._newest if at[0] == identity]:
                del self._newest[cached]

    def clear(self) -> None:
        """Forget everything, footers too (tests that count a fresh process's requests)."""
        with self._lock:
            self._manifests.clear()
            self._versions.clear()
            self._newest.clear()
        FOOTERS.clear()


@dataclass(frozen=True)
class CachedFooter:
    """A chunk's footer as cached: with its whole hash section when that is small."""

    footer: ChunkFooter
    items: np.ndarray | None = None

    def nbytes(self) -> int:
        return self.footer.nbytes() + (self.items.nbytes if self.items is not None else 0)


class FooterCache:
    """Footers of chunks by object URL, least recently used dropped past `capacity` bytes."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._held = 0
        self._footers: OrderedDict[str, CachedFooter] = OrderedDict()
        self._page_reads: dict[str, int] = {}
        self._lock = threading.Lock()

    def get(self, url: str, load: Callable[[], CachedFooter]) -> CachedFooter:
        with self._lock:
            footer = self._footers.get(url)
            if footer is not None:
                self._footers.move_to_end(url)
                return footer
        footer = load()
        with self._lock:
            if url not in self._footers:
                self._footers[url] = footer
                self._held += footer.nbytes()
                self._shrink()
        return footer

    def holds(self, url: str) -> bool:
        with self._lock:
            return url in self._footers

    def count_page_read(self, url: str) -> int:
        """How many lookups have read hash pages of the chunk at `url` while its footer was held
        (the whole section is worth keeping once a process keeps coming back: ``shard.py``)."""
        with self._lock:
            if url not in self._footers:
                return 0
            count = self._page_reads.get(url, 0) + 1
            self._page_reads[url] = count
            return count

    def replace(self, url: str, footer: CachedFooter) -> None:
        """Hold `footer` (the same chunk's, with more of it) in place of the one held for `url`."""
        with self._lock:
            held = self._footers.get(url)
            if held is None:
                return
            self._footers[url] = footer
            self._footers.move_to_end(url)
            self._held += footer.nbytes() - held.nbytes()
            self._page_reads.pop(url, None)
            self._shrink()

    def _shrink(self) -> None:
        while self._held > self._capacity and len(self._footers) > 1:
            url, dropped = self._footers.popitem(last=False)
            self._held -= dropped.nbytes()
            self._page_reads.pop(url, None)

    @property
    def capacity(self) -> int:
        return self._capacity

    def clear(self) -> None:
        with self._lock:
            self._footers.clear()
            self._page_reads.clear()
            self._held = 0


FOOTERS = FooterCache(FOOTER_CACHE_BYTES)
STORE_CACHE = ObjectStoreCache()
