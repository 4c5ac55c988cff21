"""The shard checkpoint: the commit point of a shard.

A shard's files may hold bytes past what was committed (a writer killed mid-batch). The
checkpoint says exactly which prefix is real: the metadata log's committed position, the list of
hash index files with each one's committed header, and the set of topics. Readers use it as
their snapshot; the next writer rolls everything back to it. It also says which source offsets
the shard holds (``source_ranges.SourceRanges``), committed atomically with the data: appends
skip every record already in them.

Versions: 2 is current. Version 1 (msgindex before exactly-once-by-offsets) recorded the last
committed Spark batch id instead of source ranges; it is read as ``source_ranges=None``
("unknown"), which a writer refuses to append to until the ranges are rebuilt
(``ShardWriter.adopt_log_offsets``). A batch id is never read as anything else.

On disk it is one line of canonical JSON (sorted keys, no spaces) whose ``crc32`` member covers
the canonical JSON of all other members, so a torn or edited file is detected. It carries no
wall-clock fields: replaying the same batches gives a byte-identical checkpoint. It is replaced
atomically (``durable.write_atomically``).
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from msgindex.errors import CorruptFileError
from msgindex.storage.durable import FORMAT_FIELD, VERSION_FIELD, parse_versioned_json, write_atomically
from msgindex.storage.hash_index.index_file import IndexHeader
from msgindex.storage.log.metadata_log import LogPosition
from msgindex.storage.source_ranges import SourceRanges

CHECKPOINT_FILE = "checkpoint"
CHECKPOINT_FORMAT = "msgindex-shard-checkpoint"
CHECKPOINT_VERSION = 2
LEGACY_BATCH_ID_VERSION = 1  # committed a Spark batch id, not source offsets
# the six RocketMQ IndexHeader fields, in on-disk order
HEADER_FIELDS = tuple(field.name for field in dataclasses.fields(IndexHeader))


@dataclass(frozen=True)
class IndexFileState:
    """One hash index file as committed: its name, its RocketMQ header, and the true min/max
    timestamps (ms) of the records indexed in it (RocketMQ's header keeps the first/last put's
    times, which bound nothing when timestamps are not monotonic)."""

    name: str
    header: IndexHeader
    min_timestamp_ms: int
    max_timestamp_ms: int

    @property
    def index_count(self) -> int:
        return self.header.index_count

    def overlaps(self, begin_ms: int | None, end_ms: int | None) -> bool:
        """True when a record of this file may fall in [begin_ms, end_ms] (inclusive)."""
        if self.index_count <= 1:  # entry 0 is never written: the file is empty
            return False
        if begin_ms is not None and self.max_timestamp_ms < begin_ms:
            return False
        return end_ms is None or self.min_timestamp_ms <= end_ms


@dataclass(frozen=True)
class Checkpoint:
    """The committed state of a shard (see the module docstring)."""

    log_position: LogPosition | None = None  # None: an empty log
    log_start_seq: int = 0  # first sequence number still retained (retention moves it up)
    index_files: tuple[IndexFileState, ...] = ()  # oldest first; the last one is the active file
    topics: tuple[str, ...] = ()  # sorted
    record_count: int = 0  # records appended over the shard's life (= the log's next sequence number)
    # source offsets the shard holds; None: unknown (a version-1 checkpoint, see the module doc)
    source_ranges: SourceRanges | None = field(default_factory=SourceRanges)
    extra: dict[str, Any] = field(default_factory=dict)  # reserved for later format additions

    def to_dict(self) -> dict[str, Any]:
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        body["log_position"] = None if self.log_position is None else self.log_position.to_dict()
        body["index_files"] = [dataclasses.asdict(state) for state in self.index_files]
        body["topics"] = list(self.topics)
        body["source_ranges"] = None if self.source_ranges is None else self.source_ranges.to_json()
        return body

    @classmethod
    def from_dict(cls, body: dict[str, Any], *, source: Path | str = "<checkpoint>") -> Checkpoint:
        try:
            files = tuple(
                IndexFileState(
                    name=str(item["name"]),
                    header=IndexHeader(**{name: int(item["header"][name]) for name in HEADER_FIELDS}),
                    min_timestamp_ms=int(item["min_timestamp_ms"]),
                    max_timestamp_ms=int(item["max_timestamp_ms"]),
                )
                for item in body["index_files"]
            )
            ranges = body["source_ranges"]
            position = body["log_position"]
            checkpoint = cls(
                log_position=None if position is None else LogPosition.from_dict(position),
                log_start_seq=int(body["log_start_seq"]),
                index_files=files,
                topics=tuple(str(topic) for topic in body["topics"]),
                record_count=int(body["record_count"]),
                extra=dict(body.get("extra") or {}),
                source_ranges=None if ranges is None else SourceRanges.from_json(ranges, source=source),
            )
        except (KeyError, TypeError, ValueError, CorruptFileError) as bad:
            raise CorruptFileError(f"{source}: checkpoint is malformed ({bad!r})") from None
        checkpoint._validate(source)
        return checkpoint

    def _validate(self, source: Path | str) -> None:
        names = [state.name for state in self.index_files]
        problems = []
        if not 0 <= self.log_start_seq <= self.record_count:
            problems.append(f"log_start_seq {self.log_start_seq} outside [0, {self.record_count}]")
        if len(set(names)) != len(names) or any("/" in n or n.startswith(".") for n in names):
            problems.append(f"bad index file names {names}")
        if any(state.index_count < 1 for state in self.index_files):
            problems.append("an index file has index_count < 1")
        if problems:
            raise CorruptFileError(f"{source}: checkpoint is inconsistent: {'; '.join(problems)}")


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """The checkpoint file's bytes: canonical JSON with a CRC-32 of the rest, and a newline."""
    body = {FORMAT_FIELD: CHECKPOINT_FORMAT, VERSION_FIELD: CHECKPOINT_VERSION, **checkpoint.to_dict()}
    body["crc32"] = zlib.crc32(_canonical(body))
    return _canonical(body) + b"\n"


def decode_checkpoint(raw: bytes, *, source: Path | str = "<checkpoint>") -> Checkpoint:
    """Parse and verify checkpoint bytes; anything wrong is a CorruptFileError naming `source`."""
    version, body = parse_versioned_json(
        raw, source=source, what="shard checkpoint", format_name=CHECKPOINT_FORMAT,
        versions=(LEGACY_BATCH_ID_VERSION, CHECKPOINT_VERSION),
    )
    stored_crc = body.pop("crc32", None)
    if stored_crc != zlib.crc32(_canonical({FORMAT_FIELD: CHECKPOINT_FORMAT, VERSION_FIELD: version, **body})):
        raise CorruptFileError(f"{source}: checkpoint checksum mismatch (the file was altered or torn)")
    if version == LEGACY_BATCH_ID_VERSION:
        if "batch_id" not in body or "source_ranges" in body:
            raise CorruptFileError(f"{source}: version-1 checkpoint without its batch_id")
        del body["batch_id"]  # a Spark batch id says nothing about offsets: never read it as such
        body["source_ranges"] = None
    return Checkpoint.from_dict(body, source=source)


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint at `path`, or None when the shard has never committed (no file)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise CorruptFileError(f"{path}: checkpoint is a directory, not a file") from None
    return decode_checkpoint(raw, source=path)


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Replace the checkpoint at `path` atomically and durably: after this returns the new
    checkpoint survives a crash; if it does not return, the old one is intact."""
    write_atomically(Path(path), encode_checkpoint(checkpoint))


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
