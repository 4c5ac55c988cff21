"""Retention: delete a shard's oldest whole hash index files and log segments.

Files go oldest first and only as a prefix (like Kafka's log cleaner for deletion: the first file
that must stay stops the walk), never the active index file nor the active log segment. An index
file's age is the true newest timestamp it indexes (kept in the checkpoint); a segment's is its
largest record timestamp. The removal is committed through the checkpoint before any file is
deleted (ShardWriter.drop_oldest), so a crash in between only leaves files the next open deletes.
Lookups skip index entries that point below the log's retained start.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from msgindex.errors import InvalidOptionError

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


def apply_shard_retention(
    writer: ShardWriter, *, max_age_ms: int | None = None, max_bytes: int | None = None, now_ms: int | None = None
) -> RetentionReport:
    """Apply retention to the shard of `writer` (which holds the shard's lock)."""
    for name, value in (("max_age_ms", max_age_ms), ("max_bytes", max_bytes), ("now_ms", now_ms)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise InvalidOptionError(f"retention {name} must be an int >= 0 or None, got {value!r}")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    index_pieces, segment_pieces = _index_pieces(writer), _segment_pieces(writer)
    drop_index, drop_segments = 0, 0
    if max_age_ms is not None:
        cutoff = now_ms - max_age_ms
        drop_index = _expired_prefix(index_pieces, cutoff)
        drop_segments = _expired_prefix(segment_pieces, cutoff)
    if max_bytes is not None:
        drop_index, drop_segments = _shrink_to(
            index_pieces, segment_pieces, drop_index, drop_segments, _shard_bytes(writer), max_bytes
        )
    if not drop_index and not drop_segments:
        return RetentionReport()
    log_start = segment_pieces[drop_segments - 1].next_base_seq if drop_segments else 0
    doomed = index_pieces[:drop_index] + segment_pieces[:drop_segments]
    writer.drop_oldest(drop_index, log_start)
    return RetentionReport(
        deleted_index_files=tuple(str(p) for piece in index_pieces[:drop_index] for p in piece.paths),
        deleted_segments=tuple(str(piece.paths[0]) for piece in segment_pieces[:drop_segments]),
        bytes_freed=sum(piece.size for piece in doomed),
    )


def _index_pieces(writer: ShardWriter) -> list[_Piece]:
    """The deletable index files: all but the active (last) one."""
    states = writer.checkpoint.index_files
    paths = writer.index_file_paths()
    return [
        _Piece(state.max_timestamp_ms, _size(path), (path,)) for state, path in zip(states[:-1], paths[:-1])
    ]


def _segment_pieces(writer: ShardWriter) -> list[_Piece]:
    """The deletable log segments: all but the active (last) one."""
    segments = writer.log.segments()
    pieces = []
    for segment, following in zip(segments, segments[1:]):
        # the .log and its .index / .timeindex / .summary companions
        paths = (segment.path, *sorted(p for p in segment.path.parent.glob(segment.path.stem + ".*") if p != segment.path))
        newest = EMPTY_SEGMENT_MS if segment.max_timestamp is None else segment.max_timestamp
        pieces.append(_Piece(newest, sum(map(_size, paths)), paths, following.base_seq))
    return pieces


def _expired_prefix(pieces: list[_Piece], cutoff_ms: int) -> int:
    count = 0
    for piece in pieces:
        if piece.newest_ms >= cutoff_ms:
            break
        count += 1
    return count


def _shrink_to(
    index_pieces: list[_Piece],
    segment_pieces: list[_Piece],
    drop_index: int,
    drop_segments: int,
    total: int,
    max_bytes: int,
) -> tuple[int, int]:
    """Extend the two prefixes, always taking the older of the two next candidates, until the
    shard's total size (active files included) is at most max_bytes or nothing else may go."""
    total -= sum(p.size for p in index_pieces[:drop_index]) + sum(p.size for p in segment_pieces[:drop_segments])
    while total > max_bytes:
        next_index = index_pieces[drop_index] if drop_index < len(index_pieces) else None
        next_segment = segment_pieces[drop_segments] if drop_segments < len(segment_pieces) else None
        if next_index is None and next_segment is None:
            break
        if next_segment is None or (next_index is not None and next_index.newest_ms <= next_segment.newest_ms):
            total -= next_index.size
            drop_index += 1
        else:
            total -= next_segment.size
            drop_segments += 1
    return drop_index, drop_segments


def _shard_bytes(writer: ShardWriter) -> int:
    """Bytes of every file of the shard's log and index directories (active files included)."""
    return sum(_size(path) for folder in writer.data_directories() for path in folder.iterdir())


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
