"""Which source offsets a shard holds: per source (topic, partition), sorted disjoint half-open
offset intervals. This is what makes the pipeline exactly once by Kafka offsets.

An append commits, atomically with its data, the interval ``[min offset, max offset + 1)`` of
every contiguous slice of a source partition it wrote (``SourceSlices``). Invariant relied on
everywhere: *every record of the source partition inside a committed interval that belongs to
this shard is in the shard.* It holds because Spark's Kafka source hands each task a contiguous
offset range of a partition, and the task writes every row of that range that belongs to the
shard; gaps inside the range (transaction markers, compacted records) hold no records, so
covering them is exact. Touching or overlapping intervals merge. Nothing ever removes an
interval: retention deletes records, not the fact that they were indexed (a replay from
``earliest`` must not bring them back).

Gaps *between* two tasks' ranges stay open: an offset no record holds at either end of a range
(a transaction's commit marker is the last offset of most micro-batches on a transactional topic;
aborted records under ``read_committed``) is in neither slice. So an append may also commit
*settled* offsets (``appended_ranges``): those of micro-batches that have completed, every one of
whose records that belongs to the shard is therefore committed, which closes those gaps. Without
them the intervals, and the log annotation and checkpoint that carry them, grow by one per
partition and micro-batch.

JSON form (the only place it is a dict): ``{"topic": {"partition": [[start, end], ...]}}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import CorruptFileError, InvalidAppendError

SourcePartition = tuple[str, int]  # (topic, partition)
LAST_OFFSET = (1 << 63) - 1  # Long.MAX_VALUE: no interval [offset, offset + 1) of it fits an int64
Interval = tuple[int, int]  # [start, end)


def merge_intervals(intervals: list[Interval]) -> tuple[Interval, ...]:
    """Sorted, disjoint, non-touching intervals covering exactly the union of `intervals`."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return tuple((start, end) for start, end in merged)


@dataclass(frozen=True)
class SourceRanges:
    """Committed source offsets: (topic, partition) -> sorted disjoint [start, end) intervals."""

    ranges: Mapping[SourcePartition, tuple[Interval, ...]] = field(default_factory=dict)

    # --- JSON boundary --------------------------------------------------------------------------
    def to_json(self) -> dict[str, dict[str, list[list[int]]]]:
        out: dict[str, dict[str, list[list[int]]]] = {}
        for (topic, partition), intervals in sorted(self.ranges.items()):
            out.setdefault(topic, {})[str(partition)] = [[start, end] for start, end in intervals]
        return out

    @classmethod
    def from_json(cls, body: Any, *, source: object = "<source ranges>") -> SourceRanges:
        try:
            ranges = {}
            for topic, partitions in body.items():
                for partition, intervals in partitions.items():
                    pairs = [(int(start), int(end)) for start, end in intervals]
                    if any(start < 0 or end <= start for start, end in pairs) or merge_intervals(pairs) != tuple(pairs):
                        raise ValueError(f"{topic}-{partition}: intervals must be sorted, disjoint and non-empty")
                    ranges[(str(topic), int(partition))] = tuple(pairs)
        except (AttributeError, TypeError, ValueError) as bad:
            raise CorruptFileError(f"{source}: committed source offset ranges are malformed ({bad})") from None
        return cls(ranges)

    # --- algebra --------------------------------------------------------------------------------
    def union(self, other: SourceRanges) -> SourceRanges:
        if not other.ranges:
            return self
        merged = dict(self.ranges)
        for source, intervals in other.ranges.items():
            merged[source] = merge_intervals([*merged.get(source, ()), *intervals])
        return SourceRanges(merged)

    def minus(self, other: SourceRanges) -> SourceRanges:
        """The offsets of these intervals that `other`'s do not hold."""
        left: dict[SourcePartition, tuple[Interval, ...]] = {}
        for source, intervals in self.ranges.items():
            holes = other.ranges.get(source, ())
            kept: list[Interval] = []
            for start, end in intervals:
                for hole_start, hole_end in holes:
                    if hole_end <= start or hole_start >= end:
                        continue
                    if hole_start > start:
                        kept.append((start, hole_start))
                    start = max(start, hole_end)
                    if start >= end:
                        break
                if start < end:
                    kept.append((start, end))
            if kept:
                left[source] = tuple(kept)
        return SourceRanges(left)

    def restricted(self, topics: Iterable[str] | None = None, partitions: Iterable[int] | None = None) -> SourceRanges:
        """Only the source partitions of `topics` and `partitions` (None: every one)."""
        if topics is None and partitions is None:
            return self
        topics = None if topics is None else set(topics)
        partitions = None if partitions is None else set(partitions)
        return SourceRanges({(topic, partition): intervals for (topic, partition), intervals in self.ranges.items()
                             if (topics is None or topic in topics) and (partitions is None or partition in partitions)})

    def covers(self, other: SourceRanges) -> bool:
        """True when every interval of `other` lies inside this one's (committing it changes nothing)."""
        return self.union(other) == self

    def partitions(self) -> Iterator[SourcePartition]:
        return iter(sorted(self.ranges))

    def offsets(self) -> int:
        """How many offsets the intervals span (records plus gaps)."""
        return sum(end - start for intervals in self.ranges.values() for start, end in intervals)

    def interval_count(self) -> int:
        return sum(len(intervals) for intervals in self.ranges.values())

    def contains(self, topic: str, partition: int, offset: int) -> bool:
        return any(start <= offset < end for start, end in self.ranges.get((topic, partition), ()))

    def covered(self, rows: SourceRows) -> np.ndarray:
        """Boolean mask: which rows' (topic, partition, offset) lie in a committed interval."""
        mask = np.zeros(len(rows), dtype=bool)
        if not self.ranges or not len(rows):
            return mask
        for (topic, partition), where in rows.groups():
            intervals = self.ranges.get((topic, partition))
            if not intervals:
                continue
            starts = np.fromiter((s for s, _ in intervals), np.int64, len(intervals))
            ends = np.fromiter((e for _, e in intervals), np.int64, len(intervals))
            offsets = rows.offset[where]
            slot = np.searchsorted(starts, offsets, side="right") - 1
            inside = (slot >= 0) & (offsets < ends[np.maximum(slot, 0)])
            mask[where] = inside
        return mask


def appended_ranges(sources: SourceRows, committed: SourceRanges, settled: SourceRanges | None) -> SourceRanges:
    """What an append commits: the ranges of its rows' slices and, of `settled` (offsets whose
    every record that belongs to the shard is committed, see the module docstring), those the
    shard does not hold yet: offsets holding no record of this shard, so a field declared by the
    append covers them too (storage/fields.py)."""
    appended = sources.ranges()
    return appended if settled is None else appended.union(settled.minus(committed))


@dataclass(frozen=True)
class SourceRows:
    """The source coordinates of appended rows, one per row, and which contiguous source slice
    each came from (rows of one slice and one (topic, partition) span a contiguous offset range of
    that partition; ``slice_id`` None: all rows of a (topic, partition) are one slice)."""

    topic: pa.Array  # string
    partition: np.ndarray  # int64
    offset: np.ndarray  # int64
    slice_id: np.ndarray | None = None  # int64

    def __post_init__(self) -> None:
        n = len(self.topic)
        if len(self.partition) != n or len(self.offset) != n or (self.slice_id is not None and len(self.slice_id) != n):
            raise InvalidAppendError("source coordinates: topic, partition, offset and slice columns differ in length")

    def __len__(self) -> int:
        return len(self.topic)

    @classmethod
    def of(cls, topic, partition, offset, slice_id=None) -> SourceRows:
        """From Arrow arrays / chunked arrays, numpy arrays or lists."""
        def ints(values) -> np.ndarray:
            if isinstance(values, pa.ChunkedArray):
                values = values.combine_chunks()
            if isinstance(values, pa.Array):
                if values.null_count:
                    raise InvalidAppendError("source coordinates: a partition, offset or slice is null")
                values = values.to_numpy(zero_copy_only=False)
            return np.asarray(values, dtype=np.int64)

        if isinstance(topic, pa.ChunkedArray):
            topic = topic.combine_chunks()
        if not isinstance(topic, pa.Array):
            topic = pa.array(topic, pa.string())
        if pa.types.is_dictionary(topic.type):
            topic = topic.dictionary_decode()
        if topic.null_count:
            raise InvalidAppendError("source coordinates: a topic is null")
        return cls(topic, ints(partition), ints(offset), None if slice_id is None else ints(slice_id))

    def take(self, indices: np.ndarray) -> SourceRows:
        return SourceRows(self.topic.take(pa.array(indices)), self.partition[indices], self.offset[indices],
                          None if self.slice_id is None else self.slice_id[indices])

    def groups(self) -> Iterator[tuple[SourcePartition, np.ndarray]]:
        """((topic, partition), row indices) for each source partition present."""
        if not len(self):
            return
        topics = pc.dictionary_encode(self.topic)
        names = topics.dictionary.to_pylist()
        codes = topics.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        keys = codes * (int(self.partition.max()) + 1) + self.partition if self.partition.min() >= 0 else None
        if keys is None:
            raise InvalidAppendError(f"source coordinates: negative partition {int(self.partition.min())}")
        order = np.argsort(keys, kind="stable")
        bounds = np.flatnonzero(np.diff(keys[order])) + 1
        for where in np.split(order, bounds):
            first = int(where[0])
            yield (names[codes[first]], int(self.partition[first])), where

    def first_occurrences(self) -> np.ndarray:
        """Indices of the rows whose (topic, partition, offset) did not occur earlier in the input."""
        keep = np.ones(len(self), dtype=bool)
        for _, where in self.groups():
            offsets = self.offset[where]
            _, first = np.unique(offsets, return_index=True)
            repeated = np.ones(len(where), dtype=bool)
            repeated[first] = False
            keep[where[repeated]] = False
        return np.flatnonzero(keep)

    def ranges(self) -> SourceRanges:
        """The intervals these rows commit: [min, max + 1) per (slice, topic, partition)."""
        found: dict[SourcePartition, list[Interval]] = {}
        for source, where in self.groups():
            offsets = self.offset[where]
            if np.any(offsets < 0):
                raise InvalidAppendError(f"source coordinates: negative offset in {source[0]}-{source[1]}")
            if np.any(offsets == LAST_OFFSET):  # its interval would end at 2**63, past every int64 that holds it
                raise InvalidAppendError(f"source coordinates: offset {LAST_OFFSET} in {source[0]}-{source[1]}: "
                                         f"the largest Java long is no offset Kafka gives, and past what a range can end at")
            if self.slice_id is None:
                found.setdefault(source, []).append((int(offsets.min()), int(offsets.max()) + 1))
                continue
            slices = self.slice_id[where]
            order = np.argsort(slices, kind="stable")
            bounds = np.flatnonzero(np.diff(slices[order])) + 1
            for part in np.split(order, bounds):
                found.setdefault(source, []).append((int(offsets[part].min()), int(offsets[part].max()) + 1))
        return SourceRanges({source: merge_intervals(intervals) for source, intervals in found.items()})
