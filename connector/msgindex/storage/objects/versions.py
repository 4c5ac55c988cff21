"""The commit protocol of an object-store shard: numbered versions, each created only if absent.

```
broker=<name>/_commits/<20-digit number>.json   version N of the shard: its whole committed state
broker=<name>/chunks/<unique name>.chunk         chunk objects (chunk_format.py), immutable
```

A version is the shard's whole committed state (``ShardVersion``): the chunks in seq order with
their bases and facts, the committed source offset ranges (exactly once, as ``SourceRanges`` in a
local shard's checkpoint), the topics, the record counts, and the chunks it removed with when.
Version N+1 is written with put-if-absent (S3 ``If-None-Match: *``, GCS ``ifGenerationMatch=0``,
Azure ``If-None-Match: *``), after every object it names exists: so a reader that finds version N
finds everything it lists, and of two writers that both try N+1 exactly one succeeds. The loser
reads what won and commits again at the next number (``shard.py`` says what it keeps) — the way
Delta Lake commits ``_delta_log/<v>.json`` and Lance ``_versions/<n>.manifest``. No writer ever
overwrites or deletes a version it did not create, and nothing but a version makes an object part
of the shard: an object written by a writer that died before its commit is invisible, and
collected later.

Why whole states and not deltas (Delta's actions): a reader needs exactly one version object, so
a fresh reader costs one LIST and one GET per shard, and old versions can be deleted without a
checkpoint mechanism. A state holds a few hundred bytes per chunk and per source partition, and
compaction keeps chunks few.

Each version is canonical JSON with a CRC-32 of the rest (like a local checkpoint); every field
is checked before use, a damaged version is a CorruptFileError naming it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

from msgindex.errors import CorruptFileError
from msgindex.storage.durable import FORMAT_FIELD, VERSION_FIELD, parse_versioned_json
from msgindex.storage.objects.chunk_format import ChunkInfo
from msgindex.storage.objects.client import ObjectClient, ObjectInfo
from msgindex.storage.source_ranges import SourceRanges

VERSION_FORMAT = "msgindex-shard-version"
VERSION_FORMAT_VERSION = 1
COMMITS_DIR = "_commits"
CHUNKS_DIR = "chunks"
CHUNK_SUFFIX = ".chunk"
VERSION_DIGITS = 20
_VERSION_NAME = re.compile(r"^(\d{20})\.json$")


@dataclass(frozen=True)
class ChunkRef:
    """A chunk as a version lists it: its object name (under the shard), the seq of its first
    record, and its facts (``chunk_format.ChunkInfo``)."""

    name: str
    base_seq: int
    info: ChunkInfo

    @property
    def next_seq(self) -> int:
        return self.base_seq + self.info.records

    def to_json(self) -> list:
        i = self.info
        return [self.name, self.base_seq, i.records, i.size, i.footer_offset, i.footer_length, i.footer_crc,
                i.min_timestamp, i.max_timestamp, i.hash_entries]

    @classmethod
    def from_json(cls, item: Any) -> ChunkRef:
        name, base, records, size, footer_offset, footer_length, footer_crc, min_ts, max_ts, entries = item
        ints = (base, records, size, footer_offset, footer_length, footer_crc, min_ts, max_ts, entries)
        if not isinstance(name, str) or not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
            raise ValueError(f"malformed chunk {item!r}")
        return cls(name, base, ChunkInfo(records, size, footer_offset, footer_length, min_ts, max_ts, entries,
                                         footer_crc))


@dataclass(frozen=True)
class Removed:
    """An object a version stopped listing (compaction, retention), and when (ms): it is deleted
    only after the grace period, since a reader may still read the version before."""

    name: str
    at_ms: int


@dataclass(frozen=True)
class ShardVersion:
    """The committed state of an object-store shard at version ``number`` (0: nothing yet)."""

    number: int = 0
    chunks: tuple[ChunkRef, ...] = ()
    log_start_seq: int = 0
    record_count: int = 0
    topics: tuple[str, ...] = ()
    source_ranges: SourceRanges = field(default_factory=SourceRanges)
    removed: tuple[Removed, ...] = ()
    commit_id: str = ""
    committed_at_ms: int = 0
    compacted_at_ms: int = 0  # the last compaction's commit (writers compact at most once per interval)
    retained_at_ms: int = 0  # the last retention's commit
    extra: dict[str, Any] = field(default_factory=dict)  # reserved for later additions

    def successor(self, **changes: Any) -> ShardVersion:
        """The next version with `changes`, a new commit id."""
        return dataclasses.replace(self, number=self.number + 1, commit_id=uuid.uuid4().hex, **changes)

    # --- bytes ------------------------------------------------------------------------------------
    def encode(self) -> bytes:
        body = {FORMAT_FIELD: VERSION_FORMAT, VERSION_FIELD: VERSION_FORMAT_VERSION, **self._body()}
        body["crc32"] = zlib.crc32(_canonical(body))
        return _canonical(body) + b"\n"

    def _body(self) -> dict[str, Any]:
        return {
            "number": self.number, "chunks": [c.to_json() for c in self.chunks], "log_start_seq": self.log_start_seq,
            "record_count": self.record_count, "topics": list(self.topics),
            "source_ranges": self.source_ranges.to_json(), "removed": [[r.name, r.at_ms] for r in self.removed],
            "commit_id": self.commit_id, "committed_at_ms": self.committed_at_ms,
            "compacted_at_ms": self.compacted_at_ms, "retained_at_ms": self.retained_at_ms, "extra": self.extra,
        }

    @classmethod
    def decode(cls, raw: bytes, *, source: object) -> ShardVersion:
        version, body = parse_versioned_json(raw, source=source, what="shard version", format_name=VERSION_FORMAT,
                                             versions=(VERSION_FORMAT_VERSION,))
        stored = body.pop("crc32", None)
        if stored != zlib.crc32(_canonical({FORMAT_FIELD: VERSION_FORMAT, VERSION_FIELD: version, **body})):
            raise CorruptFileError(f"{source}: shard version checksum mismatch (the object was altered)")
        try:
            decoded = cls(
                number=_int(body["number"]), chunks=tuple(ChunkRef.from_json(c) for c in body["chunks"]),
                log_start_seq=_int(body["log_start_seq"]), record_count=_int(body["record_count"]),
                topics=tuple(str(t) for t in body["topics"]),
                source_ranges=SourceRanges.from_json(body["source_ranges"], source=source),
                removed=tuple(Removed(str(name), _int(at)) for name, at in body["removed"]),
                commit_id=str(body["commit_id"]), committed_at_ms=_int(body["committed_at_ms"]),
                compacted_at_ms=_int(body["compacted_at_ms"]), retained_at_ms=_int(body["retained_at_ms"]),
                extra=dict(body.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError) as bad:
            raise CorruptFileError(f"{source}: shard version is malformed ({bad})") from None
        decoded.check(source)
        return decoded

    def check(self, source: object) -> None:
        """The invariants every reader relies on: chunks tile [log_start_seq, record_count)."""
        at = self.log_start_seq
        problems = []
        names = [c.name for c in self.chunks]
        if len(set(names)) != len(names):
            problems.append("a chunk is listed twice")
        for chunk in self.chunks:
            if chunk.base_seq != at or chunk.info.records < 1:
                problems.append(f"chunk {chunk.name} starts at seq {chunk.base_seq}, not {at}")
                break
            if not 0 < chunk.info.footer_offset < chunk.info.size or chunk.info.min_timestamp > chunk.info.max_timestamp:
                problems.append(f"chunk {chunk.name} has impossible sizes or times")
            at = chunk.next_seq
        if at != self.record_count or not 0 <= self.log_start_seq <= self.record_count:
            problems.append(f"chunks end at seq {at}, the version says {self.record_count} records")
        if problems:
            raise CorruptFileError(f"{source}: shard version {self.number} is inconsistent: {'; '.join(problems)}")

    def chunk_named(self, name: str) -> ChunkRef | None:
        return next((c for c in self.chunks if c.name == name), None)


class ShardVersions:
    """The versions of the shard whose objects are under `shard_prefix` (see module doc)."""

    def __init__(self, client: ObjectClient, shard_prefix: str) -> None:
        self.client = client
        self.prefix = shard_prefix.rstrip("/")

    def key(self, number: int) -> str:
        return f"{self.prefix}/{COMMITS_DIR}/{number:0{VERSION_DIGITS}d}.json"

    def url(self, number: int) -> str:
        return f"{self.client.location.url.rstrip('/')}/{self.key(number)}"

    def numbers(self, *, after: int | None = None) -> list[int]:
        """The version numbers present (after `after`), ascending: one LIST."""
        return sorted(self._listed(after))

    def _listed(self, after: int | None = None) -> dict[int, ObjectInfo]:
        offset = self.key(after) if after is not None else None
        found = {}
        for info in self.client.list(f"{self.prefix}/{COMMITS_DIR}/", after=offset):
            number = version_number(info.key.rsplit("/", 1)[-1])
            if number is not None:
                found[number] = info
        return found

    def read(self, number: int) -> ShardVersion | None:
        """Version `number`, or None when there is none."""
        raw = self.client.get(self.key(number))
        if raw is None:
            return None
        version = ShardVersion.decode(raw, source=self.url(number))
        if version.number != number:
            raise CorruptFileError(f"{self.url(number)}: holds version {version.number}")
        return version

    def latest(self, known: ShardVersion | None = None) -> ShardVersion:
        """The newest version (`known`, or ShardVersion() for a shard that never committed,
        when there is none newer): one LIST, plus one GET when there is a newer one.

        The LIST starts at `known` itself, so that a `known` remembered from long ago (a
        process-wide cache: ``cache.py``) is returned only while it is still there. Collection
        deletes a version only once newer ones exist, so a `known` that is gone with nothing
        newer means versions were deleted from the top (``msgindex repair --roll-back``, the
        store deleted and made again, by hand): a second LIST from the start finds the newest
        left (ShardVersion() when none is: no committed state). A `known` still listed but in
        another size is read again: a store made again reuses the numbers. The caller's cache
        then forgets the store (``ObjectStore._newest_version``)."""
        start = known.number if known is not None and known.number else 0
        listed = self._listed(after=start - 1 if start else None)
        for number in sorted((n for n in listed if n > start), reverse=True):
            version = self.read(number)
            if version is not None:  # (deleted between the LIST and the GET: an older one is newest)
                return version
        if known is None:
            return ShardVersion()
        if start and start not in listed:
            return self.latest(None)
        if start and listed[start].size != len(known.encode()):
            # Not the bytes `known` was read or committed as: the number holds another version (the
            # store was deleted and made again at its URL), or an older writer's encoding of it.
            again = self.read(start)
            if again is None:
                return self.latest(None)
            if again.commit_id != known.commit_id:
                return again
        return known

    def try_commit(self, version: ShardVersion) -> bool:
        """Create `version` if its number is free: True when this call created it. A request
        whose answer was lost is settled by reading the number back (our commit id or not)."""
        try:
            created = self.client.put_if_absent(self.key(version.number), version.encode())
        except Exception:
            # the answer was lost: what the number holds now settles it (ours, another's, or
            # nothing readable: then the outcome is unknown, and the caller must not act as if lost)
            existing = self._read_quietly(version.number)
            if existing is not None:
                return existing.commit_id == version.commit_id
            raise
        if created:
            return True
        existing = self.read(version.number)  # our own earlier attempt, retried by the client?
        return existing is not None and existing.commit_id == version.commit_id

    def _read_quietly(self, number: int) -> ShardVersion | None:
        try:
            return self.read(number)
        except Exception:
            return None

    def delete_older_than(self, number: int, *, superseded_before_ms: int) -> None:
        """Delete the version objects below `number` (never the newest: readers need one) whose
        successor was written before `superseded_before_ms`. A version whose successor is younger
        stays: a writer that still knows it as the newest would otherwise find its next number
        free and create it there, below the newest, where no reader looks."""
        listed = self._listed()
        present = sorted(listed)
        doomed = [self.key(n) for n, successor in zip(present, present[1:])
                  if n < number and listed[successor].last_modified_ms < superseded_before_ms]
        if doomed:
            self.client.delete(doomed)


def version_number(name: str) -> int | None:
    """The number of the version object called `name` (``<20 digits>.json``), else None."""
    match = _VERSION_NAME.match(name)
    return int(match.group(1)) if match else None


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an integer")
    return value


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
