"""The source offsets of the micro-batches a job has completed: committed with the next batch's
appends as *settled* offsets (storage/source_ranges.py), they close the gaps no record fills.

A shard commits the offset range of each slice of rows it appends, ``[first, last + 1)``. An
offset that holds no record at either end of a task's range is in no slice: on a transactional
topic the commit marker ends nearly every micro-batch, and ``read_committed`` never delivers
aborted records. Each such gap splits a partition's committed intervals, and every append
carries all of them (the log's annotation, the checkpoint), so a 1 s trigger on 32 transactional
partitions reached the annotation's 1 MiB in about half an hour and the shard refused appends.

Spark runs micro-batches one after another: batch B is planned only once B - 1 has committed,
so when B runs, every record of the batches before it that belongs to a shard is in that shard.
The offsets from where this process's first batch started to where B starts are therefore
settled, in every partition, for every shard they belong to: B's appends commit them too. Only
this process's batches count (its first batch's start is the floor): an earlier run's ranges,
and what a checkpoint started elsewhere read, are not known to be complete.

Which shard a partition's offsets are settled for: its own (``--input records``: the partition's
broker); every shard a task writes for metadata events, whose partitions' events go to many.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from msgindex.storage.source_ranges import SourcePartition, SourceRanges

ANY_SHARD = ""  # settled for every shard a task writes (metadata events: no partition has one shard)


@dataclass
class CompletedBatches:
    """Where each partition stood when this process's first micro-batch (of it) started: the
    floor of what later batches may count as settled."""

    floor: dict[SourcePartition, int] = field(default_factory=dict)

    def settled(self, starts: Mapping[SourcePartition, int],
                shard_of: Mapping[SourcePartition, str] | None) -> dict[str, SourceRanges]:
        """Per shard, the settled offsets for the batch starting at `starts` (each partition's
        start offset, Spark's offset log): [floor, start) of each partition, for its shard in
        `shard_of` (None: ANY_SHARD). A partition seen for the first time only sets its floor."""
        per_shard: dict[str, dict[SourcePartition, tuple[tuple[int, int], ...]]] = {}
        for partition, start in starts.items():
            if start < 0:  # (Spark's -2/-1, "earliest"/"latest": resolved in its offset log, never a start)
                continue
            floor = self.floor.setdefault(partition, start)
            shard = ANY_SHARD if shard_of is None else shard_of.get(partition)
            if shard is None or not floor < start:  # (a topic created again starts below its floor)
                continue
            per_shard.setdefault(shard, {})[partition] = ((floor, start),)
        return {shard: SourceRanges(ranges) for shard, ranges in per_shard.items()}


def settled_for(settled: Mapping[str, SourceRanges], shard: str) -> SourceRanges | None:
    """What a task's append to `shard` commits as settled (``CompletedBatches.settled``)."""
    return settled.get(shard, settled.get(ANY_SHARD))
