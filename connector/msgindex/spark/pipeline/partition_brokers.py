"""The partition -> broker map of an index fed by Kafka records (``<index root>/partition-brokers.json``).

A Kafka partition's messages go to the shard of the broker that led the partition when the
pipeline first saw it. Leaders move (restarts, reassignments), but a replayed or restarted batch
must write every message to the same shard it went to the first time: shards skip the source
offsets THEY hold, so a record sent to another shard on replay would be indexed twice. So the
first answer is recorded here, by the driver, before any write of the batch that needs it, and an
entry is never changed or removed: the file only grows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from msgindex.storage.durable import write_atomically
from msgindex.storage.partition_brokers import FILE_NAME, encode_partition_brokers, read_partition_brokers

__all__ = ["FILE_NAME", "PartitionBrokerMap"]


class PartitionBrokerMap:
    """The recorded (topic, partition) -> broker name assignments of one index root (the file's
    format: ``msgindex.storage.partition_brokers``)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.path = Path(root) / FILE_NAME
        self._brokers: dict[tuple[str, int], str] = read_partition_brokers(self.path)

    def as_dict(self) -> dict[tuple[str, int], str]:
        """A copy of every recorded assignment."""
        return dict(self._brokers)

    def missing(self, partitions: set[tuple[str, int]] | list[tuple[str, int]]) -> set[tuple[str, int]]:
        """The given partitions that have no recorded broker yet."""
        return {tp for tp in partitions if tp not in self._brokers}

    def extend(self, leaders: Mapping[tuple[str, int], str]) -> dict[tuple[str, int], str]:
        """Record the leaders of partitions not seen before (known ones keep their first broker)
        and persist atomically; returns the assignments that were added."""
        added = {tp: str(b) for tp, b in leaders.items() if tp not in self._brokers}
        if added:
            self._brokers.update(added)
            write_atomically(self.path, encode_partition_brokers(self._brokers))
        return added
