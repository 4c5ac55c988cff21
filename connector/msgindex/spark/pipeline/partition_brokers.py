"""The partition -> broker map of an index fed by Kafka records (``<index root>/partition-brokers.json``).

A Kafka partition's messages go to the shard of the broker that led the partition when the
pipeline first saw it. Leaders move (restarts, reassignments), but a replayed or restarted batch
must write every message to the same shard it went to the first time: shards skip the source
offsets THEY hold, so a record sent to another shard on replay would be indexed twice. So the
first answer is recorded here, by the driver, before any write of the batch that needs it, and an
entry is never changed or removed: the file only grows.

On an object store there is no file to replace under a lock: the map is kept as numbered
versions (``partition-brokers/<20 digits>.json``, each the whole map), each created only if
absent. A driver adding partitions reads the newest, adds what is new, and creates the next; if
another job created it first, the first answer for each partition is the one already recorded
(the other job's) and the driver merges and tries again. Two jobs on one index so agree on every
partition's shard, and both are exact.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from msgindex.errors import MsgIndexError
from msgindex.storage.location import parse_location
from msgindex.storage.partition_brokers import (
    FILE_NAME,
    VERSION_DIGITS,
    VERSIONS_DIR,
    decode_partition_brokers,
    encode_partition_brokers,
)
from msgindex.storage.root_files import RootFiles, root_files

__all__ = ["FILE_NAME", "PartitionBrokerMap"]
MAX_ATTEMPTS = 32


class PartitionBrokerMap:
    """The recorded (topic, partition) -> broker name assignments of one index root (the file's
    format: ``msgindex.storage.partition_brokers``)."""

    def __init__(self, root: str | os.PathLike[str], storage_options: Mapping[str, str] | None = None) -> None:
        self.files: RootFiles = root_files(parse_location(root, storage_options))
        self.path = self.files.url(FILE_NAME)
        self._versioned = not self.files.location.is_local
        self._version = 0
        self._brokers: dict[tuple[str, int], str] = self._load()

    def _load(self) -> dict[tuple[str, int], str]:
        if not self._versioned:
            from msgindex.storage.partition_brokers import read_partition_brokers

            return read_partition_brokers(self.files.path(FILE_NAME))
        numbers = [int(name[:VERSION_DIGITS]) for name in self.files.names(VERSIONS_DIR)
                   if name[:VERSION_DIGITS].isdigit() and name.endswith(".json")]
        if not numbers:
            return {}
        self._version = max(numbers)
        name = self._version_name(self._version)
        return decode_partition_brokers(self.files.read(name) or b"", source=self.files.url(name))

    @staticmethod
    def _version_name(number: int) -> str:
        return f"{VERSIONS_DIR}/{number:0{VERSION_DIGITS}d}.json"

    def as_dict(self) -> dict[tuple[str, int], str]:
        """A copy of every recorded assignment."""
        return dict(self._brokers)

    def missing(self, partitions: set[tuple[str, int]] | list[tuple[str, int]]) -> set[tuple[str, int]]:
        """The given partitions that have no recorded broker yet."""
        return {tp for tp in partitions if tp not in self._brokers}

    def extend(self, leaders: Mapping[tuple[str, int], str]) -> dict[tuple[str, int], str]:
        """Record the leaders of partitions not seen before (known ones keep their first broker)
        and persist atomically; returns the assignments this call added."""
        for _ in range(MAX_ATTEMPTS):
            added = {tp: str(b) for tp, b in leaders.items() if tp not in self._brokers}
            if not added:
                return {}
            mapping = {**self._brokers, **added}
            if not self._versioned:
                self.files.replace(FILE_NAME, encode_partition_brokers(mapping))
            elif not self.files.create(self._version_name(self._version + 1), encode_partition_brokers(mapping)):
                self._brokers = self._load()  # another job recorded first: its answers stand
                continue
            else:
                self._version += 1
            self._brokers = mapping
            return added
        raise MsgIndexError(f"{self.path}: could not record new partitions' shards in {MAX_ATTEMPTS} attempts "
                            f"(other jobs keep adding partitions at the same time)")
