"""What is in a store on an object store, and what is wrong with it: ``msgindex inspect URL`` (the
local counterpart is ``storage/maintenance/inspect.py``, which hands URLs here).

``inspect_url(url)`` recognises what the URL names: the store root (holds ``msgindex.json``), its
manifest, a shard (``.../broker=<name>``), a shard mark (``.../_shards/<name>``), a shard version
(``.../_commits/<20 digits>.json``) or a chunk object (``.../chunks/<name>.chunk``). It returns a
JSON-able dict, rendered by ``storage/maintenance/inspect.py``'s ``format_report``.

A shard's summary: its newest version and the versions kept, its chunks (records, bytes, hash
items, time ranges), source offsets, the objects removed and waiting for collection, orphans,
and bytes per record by kind (``log``: record batches, ``hash``: hash items, ``footer``: footers
and trailers, ``total``). Every report says the requests it took.

Problems, one line each naming the object (``problems``; the CLI exits 2), found unless
``verify=False`` only by the checks a reader makes (the newest version decodes, the chunks it
lists exist at the sizes it records), and otherwise by reading everything:

* every version object of the shard decodes (checksum, fields, chunks tiling
  [log_start_seq, record_count): ``ShardVersion.check``);
* each chunk the newest version lists: its trailer and footer agree with the version (checksum,
  facts, batches tiling the records), every batch checks (``batch_format.check_batch``: head,
  annotation and block checksums) and its head is the footer's copy, every record decodes,
  every page of hash items checks (page checksums), the items are sorted, the fences and the
  bloom filter are those of the items, and the items are exactly the ones the records call for:
  one per distinct index key of each record (the key hashes computed as the local verification
  computes them, ``verify.index_entries_of``). An item pointing at a record without a key of its
  hash, and a record key without an item, are named by seq;
* orphans (chunk objects no version lists: a writer died between its chunk and its commit) are
  reported too, as harmless: no reader reads them, collection deletes them after the grace
  period and ``msgindex repair URL --collect-now`` at once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from msgindex.errors import CorruptFileError, InvalidOptionError, MsgIndexError
from msgindex.storage import fields
from msgindex.storage.location import StoreLocation, parse_location
from msgindex.storage.log import batch_format as bf
from msgindex.storage.log.segment import BatchDirectory, BatchReads
from msgindex.storage.manifest import MANIFEST_FILE, SHARD_DIR_PREFIX, decode_manifest
from msgindex.storage.message import arrow_text, decode_text
from msgindex.storage.objects.chunk_format import (
    FOOTER_SIZE,
    HASH_ITEM_DTYPE,
    HASH_ITEM_SIZE,
    PAGE_BYTES,
    PAGE_ITEMS,
    TRAILER_SIZE,
    ChunkFooter,
    ChunkInfo,
    decode_footer,
    read_trailer,
    sorted_items,
)
from msgindex.storage.objects.client import ObjectClient, ObjectInfo
from msgindex.storage.objects.shard import SHARDS_DIR, ObjectShardWriter, Unlisted, in_parallel, listed_footer
from msgindex.storage.objects.store import ObjectStore, open_object_store
from msgindex.storage.objects.versions import (
    CHUNK_SUFFIX,
    CHUNKS_DIR,
    COMMITS_DIR,
    ChunkRef,
    ShardVersion,
    ShardVersions,
    version_number,
)
from msgindex.storage.reporting import first_line, iso_time, time_range
from msgindex.storage.verify import LISTED_PROBLEMS, index_entries_of

KIND_DESCRIPTIONS = {
    "object_store": "msgindex store on an object store: its manifest, a mark per shard (_shards/) and per shard its "
                    "versions (broker=<name>/_commits/) and chunk objects (broker=<name>/chunks/); never delete "
                    "anything in it by hand",
    "object_shard": "shard of one broker: numbered versions, each its whole committed state (created put-if-absent), "
                    "and the immutable chunk objects they list",
    "shard_version": "shard version: the shard's whole committed state at that number (its chunks, source offsets, "
                     "removed objects); never delete the newest (collection keeps the newest ones)",
    "chunk": "chunk object: record batches, their sorted hash items and a footer; immutable; never delete one the "
             "newest version lists (collection deletes the others after the grace period)",
    "shard_mark": "shard mark: says the shard exists (readers list the marks); put before the shard's first version",
    "manifest": "store manifest: format version and settings (never delete)",
}
# Chunks verified at once: their bytes are held until checked.
VERIFY_BATCH_BYTES = 256 * 1024 * 1024


def inspect_url(url: str, storage_options: Mapping[str, str] | None = None, *, verify: bool = True) -> dict[str, Any]:
    """A summary of what `url` names (module docstring), with its problems."""
    location = parse_location(url, storage_options)
    parts = location.prefix.split("/") if location.prefix else []
    kind, depth = _named(parts)
    root = _root_of(location, parts, depth, storage_options)
    client = ObjectClient(root)
    store = open_object_store(root, client=client)
    if kind == "store":
        report = _inspect_store(store, verify)
    elif kind == "manifest":
        report = {"kind": "manifest", "path": location.url, "is": KIND_DESCRIPTIONS["manifest"]}
        manifest = decode_manifest(client.get(MANIFEST_FILE) or b"", source=location.url)
        report.update(version=manifest.version, settings=manifest.settings.to_dict())
    else:
        broker = parts[-depth][len(SHARD_DIR_PREFIX):] if kind != "mark" else parts[-1]
        if kind == "mark":
            report = _inspect_mark(store, broker, location.url)
        elif kind == "shard":
            marks = shard_marks(store)
            if broker not in shard_names(store, marks):
                raise InvalidOptionError(f"{location.url}: no shard {broker!r} in the store (shards: "
                                         f"{shard_names(store, marks)})")
            report = ShardInspection(store, broker, verify, marks).report()
        elif kind == "version":
            report = _inspect_version(store, broker, parts[-1], location.url, verify)
        else:
            report = _inspect_chunk(store, broker, f"{CHUNKS_DIR}/{parts[-1]}", location.url, verify)
    report["requests"] = _requests(client)
    return report


def _named(parts: list[str]) -> tuple[str, int]:
    """(what the key parts name, how many trailing parts name it below the store root)."""
    in_shard = len(parts) >= 3 and parts[-3].startswith(SHARD_DIR_PREFIX)
    if in_shard and parts[-2] == CHUNKS_DIR and parts[-1].endswith(CHUNK_SUFFIX):
        return "chunk", 3
    if in_shard and parts[-2] == COMMITS_DIR and version_number(parts[-1]) is not None:
        return "version", 3
    if len(parts) >= 2 and parts[-2] == SHARDS_DIR:
        return "mark", 2
    if len(parts) >= 2 and parts[-2].startswith(SHARD_DIR_PREFIX) and parts[-1] in (CHUNKS_DIR, COMMITS_DIR):
        return "shard", 2  # a shard's chunks/ or _commits/ "directory": the shard
    if parts and parts[-1].startswith(SHARD_DIR_PREFIX):
        return "shard", 1
    if parts and parts[-1] == MANIFEST_FILE:
        return "manifest", 1
    return "store", 0


def _root_of(location: StoreLocation, parts: list[str], depth: int, options: Mapping[str, str] | None) -> StoreLocation:
    if not depth:
        return location
    scheme, rest = location.url.split("://", 1)
    netloc = rest.split("/", 1)[0]
    prefix = "/".join(parts[: len(parts) - depth])
    return parse_location(f"{scheme}://{netloc}/{prefix}" if prefix else f"{scheme}://{netloc}", options)


def _requests(client: ObjectClient) -> dict[str, int]:
    counts = dict(sorted(client.requests.items()))
    return {**counts, "total": sum(counts.values())}


def _url(store: ObjectStore, key: str) -> str:
    return f"{store.root.rstrip('/')}/{key}"


# --- the store -----------------------------------------------------------------------------------
def _inspect_store(store: ObjectStore, verify: bool) -> dict[str, Any]:
    """Settings, every shard (marked, or with objects under broker=<name>/) and their problems."""
    marks = shard_marks(store)
    shards, problems = [], []
    for broker in shard_names(store, marks):
        try:
            shard = ShardInspection(store, broker, verify, marks).report()
        except MsgIndexError as error:
            shard = {"kind": "object_shard", "path": _url(store, store.shard_prefix(broker)), "broker": broker,
                     "problems": [first_line(error)]}
        problems += shard.get("problems", [])
        shards.append(shard)
    records = sum(shard.get("records", 0) for shard in shards)
    return {
        "kind": "object_store",
        "path": store.root,
        "is": KIND_DESCRIPTIONS["object_store"],
        "settings": store.settings.to_dict(),
        "brokers": [shard["broker"] for shard in shards],
        "records": records,
        "bytes": sum(shard.get("bytes", 0) for shard in shards),
        "bytes_per_record": _per_record(_sum_kinds(shard.get("bytes_by_kind") for shard in shards), records),
        "shards": shards,
        **({"problems": problems} if verify or problems else {}),
    }


def shard_names(store: ObjectStore, marks: dict[str, ObjectInfo]) -> list[str]:
    """Every shard of the store: marked, or with objects under ``broker=<name>/`` (a shard whose
    mark is missing is skipped by lookups: inspect and repair must still see it)."""
    found = {name[len(SHARD_DIR_PREFIX):] for name in store.client.list_directories("")
             if name.startswith(SHARD_DIR_PREFIX)}
    return sorted(set(marks) | found)


def _inspect_mark(store: ObjectStore, broker: str, url: str) -> dict[str, Any]:
    report: dict[str, Any] = {"kind": "shard_mark", "path": url, "is": KIND_DESCRIPTIONS["shard_mark"],
                              "broker": broker}
    if broker not in store.brokers():
        raise InvalidOptionError(f"{url}: no such object (brokers in the store: {store.brokers()})")
    numbers = ShardVersions(store.client, store.shard_prefix(broker)).numbers()
    report["versions"] = len(numbers)
    report["problems"] = [] if numbers or broker not in store.missing_shards() else [_lost_shard(store, broker)]
    return report


def shard_marks(store: ObjectStore) -> dict[str, ObjectInfo]:
    """The shard marks by broker (one LIST)."""
    return {info.key.rsplit("/", 1)[-1]: info for info in store.client.list(f"{SHARDS_DIR}/")}


def _lost_shard(store: ObjectStore, broker: str) -> str:
    """The reader's line for a marked shard whose versions are gone."""
    try:
        store.reader(broker)
    except CorruptFileError as error:
        return first_line(error)
    return f"{_url(store, store.shard_prefix(broker))}: the shard has no versions"


# --- a shard -------------------------------------------------------------------------------------
class ShardInspection:
    """One shard's summary and problems (module docstring); ``report()`` leaves what it found in
    its attributes for ``repair``. The chunk objects are listed before the newest version is
    read: a chunk committed meanwhile is listed, not taken for an orphan."""

    def __init__(self, store: ObjectStore, broker: str, verify: bool,
                 marks: dict[str, ObjectInfo] | None = None) -> None:
        self.store = store
        self.marks = marks
        self.client = store.client
        self.broker = broker
        self.verify = verify
        self.prefix = store.shard_prefix(broker)
        self.url = _url(store, self.prefix)
        self.versions = ShardVersions(self.client, self.prefix)
        self.problems: list[str] = []
        self.damage: list[str] = []  # problems of committed data: answers depend on them
        self.numbers: list[int] = []
        self.newest: ShardVersion | None = None  # the newest version that decodes
        self.undecodable_newest: list[int] = []  # versions above it that do not decode
        self.undecodable_older: list[int] = []  # versions below it that do not decode (read with `verify`)
        self.mark: ObjectInfo | None = None
        self.unlisted = Unlisted((), ())

    def _damaged(self, line: str) -> None:
        self.problems.append(line)
        self.damage.append(line)

    def report(self) -> dict[str, Any]:
        listing = self.client.list(f"{self.prefix}/{CHUNKS_DIR}/")
        self.numbers = numbers = self.versions.numbers()
        self.newest = newest = self._newest(numbers)
        report: dict[str, Any] = {"kind": "object_shard", "path": self.url, "is": KIND_DESCRIPTIONS["object_shard"],
                                  "broker": self.broker}
        self.mark = shard_marks(self.store).get(self.broker) if self.marks is None else self.marks.get(self.broker)
        if numbers and self.mark is None:
            self.problems.append(f"{_url(self.store, f'{SHARDS_DIR}/{self.broker}')}: shard mark missing, but the "
                                 f"shard has versions: lookups and the tools skip the shard; `msgindex repair "
                                 f"{self.store.root}` puts the mark back")
        if newest is None:
            if self.mark is not None and not numbers and self.broker in self.store.missing_shards():
                self._damaged(_lost_shard(self.store, self.broker))
            report["note"] = ("no version: nothing committed" if not numbers else
                              "no version decodes: readers of the shard fail")
            state = ShardVersion()
        else:
            state = newest
            summary = _version_summary(newest, self.store)
            report["version"] = summary.pop("number")
            report["versions_kept"] = {"count": len(numbers), "oldest": numbers[0], "newest": numbers[-1]}
            report.update(summary)
            self._check_listed(newest, listing)
        writer = ObjectShardWriter(self.client, self.prefix, self.broker, tuning=self.store.tuning)
        self.unlisted = unlisted = writer.unlisted(state, listing)
        grace_ms = int(self.store.tuning.grace_s * 1000)
        report["removed_pending_collection"] = [
            {"name": self._name(info), "bytes": info.size, "removed_at": iso_time(at_ms),
             "collectable_from": iso_time(at_ms + grace_ms)} for info, at_ms in unlisted.removed]
        report["orphans"] = [{"name": self._name(info), "bytes": info.size, "written_at": iso_time(info.last_modified_ms)}
                             for info in unlisted.orphans]
        if self.undecodable_newest and unlisted.orphans:
            report["note"] = (f"{len(unlisted.orphans)} chunk object(s) no decodable version lists: the damaged "
                              f"version(s) may list them (they are orphans only once it is rolled back)")
        now_ms = int(time.time() * 1000)
        for info in unlisted.orphans if not self.undecodable_newest else ():
            age_s = max(0, now_ms - info.last_modified_ms) // 1000
            self.problems.append(
                f"{_url(self.store, info.key)}: orphan chunk: no version lists it (written {age_s} s ago by a writer "
                f"that did not commit it, or listed by a version deleted since) [no reader reads it; unless a version "
                f"object was deleted by hand (then restore it: this chunk holds its records), it is harmless: "
                f"collection deletes it {self.store.tuning.grace_s:g} s after it was written, `msgindex repair "
                f"{self.store.root} --collect-now` now]")
        if newest is not None and self.verify:
            self._verify_chunks(newest)
        report["problems"] = self.problems
        return report

    def _name(self, info: ObjectInfo) -> str:
        return info.key[len(self.prefix) + 1 :]

    def _newest(self, numbers: list[int]) -> ShardVersion | None:
        """The newest version that decodes (each newer one that does not is a problem); with
        `verify` every older version object is read too."""
        newest = None
        for at, number in enumerate(reversed(numbers)):
            try:
                version = self.versions.read(number)
            except CorruptFileError as error:
                self.undecodable_newest.append(number)
                self._damaged(f"{first_line(error)} [readers of the shard fail: restore the object, or `msgindex "
                              f"repair {self.store.root} --roll-back` to make the newest version that decodes the "
                              f"newest again]")
                continue
            if version is not None:
                newest = version
                older = numbers[: len(numbers) - at - 1]
                if self.verify and older:
                    self._read_all(older)
                break
        return newest

    def _read_all(self, numbers: list[int]) -> None:
        def read(number: int) -> str | None:
            try:
                self.versions.read(number)
            except CorruptFileError as error:
                return first_line(error)
            return None

        for number, line in zip(numbers, in_parallel(read, numbers)):
            if line is not None:  # no reader reads it: readers and writers read the newest
                self.undecodable_older.append(number)
                self.problems.append(f"{line} [an older version: readers read the newest; `msgindex repair "
                                     f"{self.store.root}` deletes it]")

    def _check_listed(self, version: ShardVersion, listing: list[ObjectInfo]) -> None:
        """Every chunk `version` lists exists at the size it records (the listing was taken
        before the version was read: what it lacks is listed again)."""
        sizes = {info.key: info.size for info in listing}
        keys = {ref.name: f"{self.prefix}/{ref.name}" for ref in version.chunks}
        if any(key not in sizes for key in keys.values()):
            sizes = {info.key: info.size for info in self.client.list(f"{self.prefix}/{CHUNKS_DIR}/")}
        for ref in version.chunks:
            size = sizes.get(keys[ref.name])
            where = _url(self.store, keys[ref.name])
            if size is None:
                self._damaged(f"{where}: chunk object listed by shard version {version.number} is missing: "
                                     f"restore it, or re-index its records (seqs {ref.base_seq}..{ref.next_seq - 1}) "
                                     f"from Kafka into a new store")
            elif size != ref.info.size:
                self._damaged(f"{where}: {size} bytes, but shard version {version.number} records "
                                     f"{ref.info.size}: the object was replaced or truncated")

    def _verify_chunks(self, version: ShardVersion) -> None:
        groups: list[list[ChunkRef]] = [[]]
        held = 0
        for ref in version.chunks:
            if groups[-1] and held + ref.info.size > VERIFY_BATCH_BYTES:
                groups.append([])
                held = 0
            groups[-1].append(ref)
            held += ref.info.size

        def check(ref: ChunkRef) -> list[str]:
            data = self.client.get(f"{self.prefix}/{ref.name}")
            if data is None:
                return []  # missing: said by _check_listed
            return check_chunk(data, _url(self.store, f"{self.prefix}/{ref.name}"), ref.info, ref.base_seq).problems

        for group in groups:
            for found in in_parallel(check, group):
                for line in found:
                    self._damaged(line)


def _version_summary(version: ShardVersion, store: ObjectStore) -> dict[str, Any]:
    by_kind = _sum_kinds(_chunk_kinds(ref.info) for ref in version.chunks)
    records = version.record_count - version.log_start_seq
    return {
        "number": version.number,
        "commit_id": version.commit_id,
        "committed_at": iso_time(version.committed_at_ms) if version.committed_at_ms else None,
        "compacted_at": iso_time(version.compacted_at_ms) if version.compacted_at_ms else None,
        "retained_at": iso_time(version.retained_at_ms) if version.retained_at_ms else None,
        "records": records,
        "log_start_seq": version.log_start_seq,
        "next_seq": version.record_count,
        "topics": list(version.topics),
        "source_ranges": version.source_ranges.to_json(),
        "fields": version.extra.get(fields.EXTRA_MEMBER, {}),  # definitions and coverage (fields.py)
        "chunks": [{"name": ref.name, "base_seq": ref.base_seq, "records": ref.info.records, "bytes": ref.info.size,
                    "hash_items": ref.info.hash_entries,
                    "time_range": time_range(ref.info.min_timestamp, ref.info.max_timestamp)}
                   for ref in version.chunks],
        "bytes": sum(ref.info.size for ref in version.chunks),
        "bytes_by_kind": by_kind,
        "bytes_per_record": _per_record(by_kind, records),
    }


def _chunk_kinds(info: ChunkInfo) -> dict[str, int]:
    """A chunk's bytes by kind: record batches, hash items, footer and trailer."""
    hash_bytes = info.hash_entries * HASH_ITEM_SIZE
    return {"log": info.footer_offset - hash_bytes, "hash": hash_bytes, "footer": info.size - info.footer_offset}


def _sum_kinds(parts) -> dict[str, int]:
    total = {"log": 0, "hash": 0, "footer": 0}
    for part in parts:
        for kind, size in (part or {}).items():
            total[kind] += size
    return total


def _per_record(by_kind: dict[str, int], records: int) -> dict[str, float] | None:
    """``bytes_per_record``: {log, hash, footer, total} (None without records)."""
    if not records:
        return None
    return {**{kind: round(size / records, 2) for kind, size in by_kind.items()},
            "total": round(sum(by_kind.values()) / records, 2)}


# --- one version object --------------------------------------------------------------------------
def _inspect_version(store: ObjectStore, broker: str, name: str, url: str, verify: bool) -> dict[str, Any]:
    number = version_number(name)
    versions = ShardVersions(store.client, store.shard_prefix(broker))
    report: dict[str, Any] = {"kind": "shard_version", "path": url, "is": KIND_DESCRIPTIONS["shard_version"],
                              "shard": _url(store, store.shard_prefix(broker)), "number": number}
    try:
        version = versions.read(number)
    except CorruptFileError as error:
        report["problems"] = [first_line(error)]
        return report
    if version is None:
        raise InvalidOptionError(f"{url}: no such object")
    numbers = versions.numbers()
    report.update(_version_summary(version, store))
    report["newest"] = numbers[-1] if numbers else number
    report["removed"] = [{"name": r.name, "removed_at": iso_time(r.at_ms)} for r in version.removed]
    problems: list[str] = []
    if number == report["newest"]:
        inspection = ShardInspection(store, broker, False)
        inspection._check_listed(version, store.client.list(f"{store.shard_prefix(broker)}/{CHUNKS_DIR}/"))
        problems = inspection.problems
    else:
        report["note"] = ("an older version: readers read the newest; the chunks it lists and the newest does not "
                          "are deleted after the grace period")
    report["problems"] = problems
    return report


# --- one chunk object ----------------------------------------------------------------------------
def _inspect_chunk(store: ObjectStore, broker: str, name: str, url: str, verify: bool) -> dict[str, Any]:
    prefix = store.shard_prefix(broker)
    version = ShardVersions(store.client, prefix).latest()
    ref = version.chunk_named(name)
    data = store.client.get(f"{prefix}/{name}")
    report: dict[str, Any] = {"kind": "chunk", "path": url, "is": KIND_DESCRIPTIONS["chunk"],
                              "shard": _url(store, prefix)}
    removed = {r.name: r.at_ms for r in version.removed}
    if ref is not None:
        report["status"] = (f"listed by shard version {version.number} (seqs {ref.base_seq}..{ref.next_seq - 1})")
    elif name in removed:
        report["status"] = (f"removed by the newest version at {iso_time(removed[name])}: deleted after the grace "
                            f"period ({store.tuning.grace_s:g} s)")
    else:
        report["status"] = (f"orphan: no version lists it (newest: {version.number}); collection deletes it after "
                            f"the grace period")
    if data is None:
        if ref is None:
            raise InvalidOptionError(f"{url}: no such object")
        report["problems"] = [f"{url}: chunk object listed by shard version {version.number} is missing: restore "
                              f"it, or re-index its records from Kafka into a new store"]
        return report
    checked = check_chunk(data, url, ref.info if ref is not None else None, ref.base_seq if ref is not None else 0,
                          deep=verify)
    report.update(checked.summary)
    report["problems"] = checked.problems
    return report


@dataclass
class ChunkCheck:
    """What ``check_chunk`` found: the chunk's facts (from its footer) and its problems."""

    summary: dict[str, Any]
    problems: list[str]


class _HeldChunk(BatchReads):
    """A chunk's batches read from its bytes in memory (verification decodes every record)."""

    def __init__(self, data: bytes, footer: ChunkFooter, name: str) -> None:
        self._data = memoryview(data)
        self._directory = footer.directory
        self.path = name
        self.base_seq, self.next_seq = 0, footer.records
        self.min_timestamp, self.max_timestamp = footer.min_timestamp, footer.max_timestamp

    def batches(self) -> BatchDirectory:
        return self._directory

    def read_bytes(self, position: int, length: int) -> bytes:
        piece = self._data[position : position + length]
        if len(piece) != length:
            raise CorruptFileError(f"{self.path}: {len(piece)} bytes at byte {position} where {length} were expected")
        return bytes(piece)


def check_chunk(data: bytes, name: str, info: ChunkInfo | None, base_seq: int = 0, *,
                deep: bool = True) -> ChunkCheck:
    """Check the chunk object whose bytes are `data` (module docstring): against what its shard
    version records (`info`, its records from `base_seq`), or alone (`info` None: an unlisted
    chunk, found by its trailer). `deep`: every batch, record and hash item, else the footer."""
    problems: list[str] = []
    summary: dict[str, Any] = {"bytes": len(data)}
    if info is not None and len(data) != info.size:
        problems.append(f"{name}: {len(data)} bytes, but its shard version records {info.size}: the object was "
                        f"replaced or truncated")
        return ChunkCheck(summary, problems)
    try:
        footer_length, footer_crc = read_trailer(data, name)
        footer_offset = len(data) - TRAILER_SIZE - footer_length
        if info is not None and (footer_offset, footer_length, footer_crc) != (
                info.footer_offset, info.footer_length, info.footer_crc):
            raise CorruptFileError(f"{name}: chunk trailer (footer of {footer_length} bytes at byte {footer_offset}, "
                                   f"checksum {footer_crc}) disagrees with its shard version")
        footer_bytes = memoryview(data)[footer_offset : footer_offset + footer_length]
        footer = (listed_footer(footer_bytes, info, name) if info is not None
                  else decode_footer(footer_bytes, footer_crc, name))
    except CorruptFileError as error:
        problems.append(f"{first_line(error)}: the chunk cannot be read; restore it, or re-index its records from "
                        f"Kafka into a new store")
        return ChunkCheck(summary, problems)
    directory = footer.directory
    summary.update(records=footer.records, batches=len(directory), hash_items=footer.hash_entries,
                   pages=footer.pages, time_range=time_range(footer.min_timestamp, footer.max_timestamp),
                   topics=sorted({arrow_text(decode_text(t)) for table in directory.topic_tables for t in table}))
    kinds = _chunk_kinds(ChunkInfo(footer.records, len(data), footer_offset, footer_length, footer.min_timestamp,
                                   footer.max_timestamp, footer.hash_entries, footer_crc))
    summary["bytes_per_record"] = _per_record(kinds, footer.records)
    if deep:
        _check_body(data, footer_bytes, footer, name, base_seq, problems)
    return ChunkCheck(summary, problems)


def _check_body(whole: bytes, footer_bytes: memoryview, footer: ChunkFooter, name: str, base_seq: int,
                problems: list[str]) -> None:
    """Batches, records and hash items of a chunk whose footer checked (``check_chunk``)."""
    data = memoryview(whole)
    directory = footer.directory
    head_at = FOOTER_SIZE + 8 * len(directory)
    good_batches = []
    for i, (position, length, rel) in enumerate(zip(directory.positions.tolist(), directory.lengths.tolist(),
                                                   directory.base_seqs.tolist())):
        checked = bf.check_batch(data, position, position + length, rel)
        head_length = bf.head_length_at(footer_bytes, head_at)
        copy = footer_bytes[head_at : head_at + head_length]
        head_at += head_length
        if isinstance(checked, bf.BatchProblem):
            problems.append(f"{name}: batch at byte {position} (seqs {base_seq + rel}..): {checked.reason}")
        elif data[position : position + checked.header.head_length] != copy:
            problems.append(f"{name}: batch at byte {position}: its head differs from the footer's copy")
        else:
            good_batches.append(i)
    reads = _HeldChunk(whole, footer, name)
    hashes, rel_seqs = [], []
    for i in good_batches:
        try:
            entries = index_entries_of(reads.decode(i, directory))
        except CorruptFileError as error:
            problems.append(first_line(error))
            continue
        hashes.append(entries.hashes)
        rel_seqs.append(entries.phys)
    items_bytes = data[footer.hash_offset : footer.hash_offset + footer.hash_entries * HASH_ITEM_SIZE]
    bad_pages = 0
    for page in range(footer.pages):
        try:
            footer.checked_items(items_bytes[page * PAGE_BYTES : (page + 1) * PAGE_BYTES], page, name)
        except CorruptFileError as error:
            problems.append(first_line(error))
            bad_pages += 1
    if bad_pages or len(good_batches) != len(directory):
        return  # the items cannot be told from the damage already named
    items = np.frombuffer(items_bytes, HASH_ITEM_DTYPE)
    keys = (items["key_hash"].astype(np.uint64) << np.uint64(32)) | items["rel_seq"].astype(np.uint64)
    if len(keys) > 1 and not bool(np.all(keys[1:] >= keys[:-1])):
        problems.append(f"{name}: hash items are not sorted by (key hash, seq): lookups would miss keys")
    if not np.array_equal(footer.fences, items["key_hash"][::PAGE_ITEMS]):
        problems.append(f"{name}: footer's page fences are not the first key hash of each page: lookups would miss keys")
    distinct = np.unique(items["key_hash"])
    if len(distinct) and not bool(footer.may_hold(distinct).all()):
        problems.append(f"{name}: bloom filter leaves out {int((~footer.may_hold(distinct)).sum())} key hashes of its "
                        f"items: lookups of them would skip the chunk")
    expected = sorted_items(np.concatenate(hashes).astype(np.uint32) if hashes else np.zeros(0, np.uint32),
                            np.concatenate(rel_seqs).astype(np.uint32) if rel_seqs else np.zeros(0, np.uint32))
    if np.array_equal(items, expected):
        return
    wanted = (expected["key_hash"].astype(np.uint64) << np.uint64(32)) | expected["rel_seq"].astype(np.uint64)
    stray = np.flatnonzero(~np.isin(keys, wanted))
    for at in stray[:LISTED_PROBLEMS].tolist():
        rel = int(items["rel_seq"][at])
        where = (f"seq {base_seq + rel}, past the chunk's {footer.records} records" if rel >= footer.records else
                 f"the record at seq {base_seq + rel}, which carries no key of that hash")
        problems.append(f"{name}: hash item {at} (key hash {int(items['key_hash'][at])}) points at {where}: the chunk "
                        f"is damaged")
    missing = np.flatnonzero(~np.isin(wanted, keys))
    for at in missing[:LISTED_PROBLEMS].tolist():
        problems.append(f"{name}: the record at seq {base_seq + int(expected['rel_seq'][at])} has a key (hash "
                        f"{int(expected['key_hash'][at])}) with no hash item: lookups of it miss")
    more = max(0, len(stray) - LISTED_PROBLEMS) + max(0, len(missing) - LISTED_PROBLEMS)
    if more:
        problems.append(f"{name}: ... and {more} more such hash items")
    if not len(stray) and not len(missing):
        problems.append(f"{name}: hash items are repeated or out of order")

