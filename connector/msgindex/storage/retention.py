"""Retention: delete a shard's oldest whole log segments, and the hash index files that only
point into them.

The log decides, the index follows. Segments go oldest first and only as a prefix (like Kafka's
deletion policy: the first segment that must stay stops the walk), never the active one; a
segment's age is its largest record timestamp. A hash index file goes only when every entry in it
points below the new start of the log (its header's endPhyOffset, the seq of its last put, is the
largest: puts follow the log's order) and it is not the active file. So after any retention pass
every record a scan returns is still found by a lookup of each of its keys — deleting an index
file by its own age instead would strand records that a scan still shows, because timestamps are
not in seq order (a catch-up batch over several partitions mixes old and new times).

The removal is committed through the checkpoint before any file is deleted
(ShardWriter.drop_oldest), so a crash in between only leaves files the next open deletes. Lookups
skip index entries that point below the log's retained start.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from msgindex.errors import InvalidOptionError
from msgindex.storage.hash_index import entry_sums, hash_run

if TYPE_CHECKING:
    from msgindex.storage.shard import ShardWriter

EMPTY_SEGMENT_MS = -(1 << 63)  # a sealed segment without records is older than anything


@dataclass(frozen=True)
class RetentionReport:
    """What a retention pass deleted (paths of the files removed and the bytes they held)."""

    deleted_index_files: tuple[str, ...] = ()
    deleted_segments: tuple[str, ...] = ()
    bytes_freed: int = 0

    def merge(self, other: RetentionReport) -> RetentionReport:
        return RetentionReport(
            self.deleted_index_files + other.deleted_index_files,
            self.deleted_segments + other.deleted_segments,
            self.bytes_freed + other.bytes_freed,
        )


@dataclass(frozen=True)
class _Piece:
    """One deletable unit: an index file or a log segment, with its newest timestamp and size."""

    newest_ms: int
    size: int
    paths: tuple[Path, ...]
    next_base_seq: int = 0  # segments: the base of the following segment
    last_seq: int = 0  # index files: the largest log seq an entry points at


def apply_shard_retention(
    writer: ShardWriter,
    *,
    max_age_ms: int | None = None,
    max_bytes: int | None = None,
    now_ms: int | None = None,
    dry_run: bool = False,
) -> RetentionReport:
    """Apply retention to the shard of `writer` (which holds the shard's lock): `max_age_ms`
    drops segments whose newest record is older than now_ms - max_age_ms, `max_bytes` drops the
    oldest segments until the shard (log and index files) is at most that big. With `dry_run`,
    report what would go and delete nothing."""
    check_retention_arguments(max_age_ms=max_age_ms, max_bytes=max_bytes, now_ms=now_ms)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    segments, index_files = _segment_pieces(writer), _index_pieces(writer)
    drop_segments = 0
    if max_age_ms is not None:
        cutoff = now_ms - max_age_ms
        while drop_segments < len(segments) and segments[drop_segments].newest_ms < cutoff:
            drop_segments += 1
    if max_bytes is not None:
        total = _shard_bytes(writer)
        while total - _freed(segments, index_files, drop_segments) > max_bytes and drop_segments < len(segments):
            drop_segments += 1
    drop_index = _stranded_index_files(index_files, _log_start(segments, drop_segments))
    if not drop_index and not drop_segments:
        return RetentionReport()
    if not dry_run:
        writer.drop_oldest(drop_index, _log_start(segments, drop_segments))
    return RetentionReport(
        deleted_index_files=tuple(str(p) for piece in index_files[:drop_index] for p in piece.paths),
        deleted_segments=tuple(str(piece.paths[0]) for piece in segments[:drop_segments]),
        bytes_freed=_freed(segments, index_files, drop_segments),
    )


def check_retention_arguments(*, max_age_ms: int | None, max_bytes: int | None, now_ms: int | None) -> None:
    """InvalidOptionError naming the first argument that is not an int >= 0 or None (shards of
    both kinds check before they drop anything: a negative age would drop everything)."""
    for name, value in (("max_age_ms", max_age_ms), ("max_bytes", max_bytes), ("now_ms", now_ms)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise InvalidOptionError(f"retention {name} must be an int >= 0 or None, got {value!r}")


def _log_start(segments: list[_Piece], dropped: int) -> int:
    return segments[dropped - 1].next_base_seq if dropped else 0


def _stranded_index_files(index_files: list[_Piece], log_start: int) -> int:
    """How many of the oldest index files point only below `log_start` (a prefix: files are
    filled in seq order)."""
    count = 0
    while count < len(index_files) and index_files[count].last_seq < log_start:
        count += 1
    return count


def _freed(segments: list[_Piece], index_files: list[_Piece], drop_segments: int) -> int:
    drop_index = _stranded_index_files(index_files, _log_start(segments, drop_segments))
    return sum(p.size for p in segments[:drop_segments]) + sum(p.size for p in index_files[:drop_index])


def _index_pieces(writer: ShardWriter) -> list[_Piece]:
    """The deletable index files: all but the active (last) one."""
    states = writer.checkpoint.index_files
    paths = writer.index_file_paths()
    pieces = []
    for state, path in zip(states[:-1], paths[:-1]):
        # the file and its derived sidecars (hash runs, entry checksums), which go with it
        sidecars = sorted(p for p in path.parent.glob(path.name + ".*")
                          if hash_run.is_sidecar_of(p.name, [path.name]) or entry_sums.is_sums_of(p.name, [path.name]))
        files = (path, *sidecars)
        pieces.append(_Piece(state.max_timestamp_ms, sum(map(_size, files)), files,
                             last_seq=state.header.end_phy_offset))
    return pieces


def _segment_pieces(writer: ShardWriter) -> list[_Piece]:
    """The deletable log segments: all but the active (last) one."""
    segments = writer.log.segments()
    pieces = []
    for segment, following in zip(segments, segments[1:]):
        # the .log and its .index / .timeindex / .summary companions
        paths = (segment.path, *sorted(p for p in segment.path.parent.glob(segment.path.stem + ".*") if p != segment.path))
        newest = EMPTY_SEGMENT_MS if segment.max_timestamp is None else segment.max_timestamp
        pieces.append(_Piece(newest, sum(map(_size, paths)), paths, next_base_seq=following.base_seq))
    return pieces


def _shard_bytes(writer: ShardWriter) -> int:
    """Bytes of every file of the shard's log and index directories (active files included)."""
    return sum(_size(path) for folder in writer.data_directories() for path in folder.iterdir())


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
