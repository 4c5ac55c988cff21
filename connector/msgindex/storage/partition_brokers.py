"""The format of ``<index root>/partition-brokers.json``: which shard each Kafka partition of an
index fed by Kafka records goes to (the indexing job's ``spark/pipeline/partition_brokers.py``
keeps it; ``msgindex inspect`` checks it). Stated here, below both, so that both read it alike.

A versioned JSON document (``durable.versioned_json``)::

    {"format": "msgindex-partition-brokers", "version": 1,
     "topics": {"<topic>": {"<partition>": "<broker>", ...}, ...}}

Partitions are non-negative integers, brokers valid shard names (``shard.validate_broker_name``).
An index on an object store keeps the same documents as numbered versions,
``partition-brokers/<20-digit number>.json`` (``VERSIONS_DIR``; why: the pipeline's module).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from msgindex.errors import CorruptFileError
from msgindex.storage.durable import parse_versioned_json, versioned_json
from msgindex.storage.shard import validate_broker_name

FILE_NAME = "partition-brokers.json"
VERSIONS_DIR = "partition-brokers"  # object stores: the map's numbered versions
VERSION_DIGITS = 20
FORMAT = "msgindex-partition-brokers"
FORMAT_VERSION = 1


def read_partition_brokers(path: Path) -> dict[tuple[str, int], str]:
    """The (topic, partition) -> broker map in the file at `path` ({} when there is none); a file
    that is not one (torn, zeroed, edited, a directory) is a CorruptFileError naming it."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return {}
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise CorruptFileError(f"{path}: is a directory, not the partition -> broker map") from None
    except OSError as error:
        raise CorruptFileError(f"{path}: cannot be read ({error.strerror or error})") from None
    return decode_partition_brokers(raw, source=path)


def decode_partition_brokers(raw: bytes, *, source: object) -> dict[tuple[str, int], str]:
    """The map in `raw` (a file's or an object's bytes); CorruptFileError naming `source`."""
    _, document = parse_versioned_json(raw, source=source, what="partition -> broker map", format_name=FORMAT,
                                       versions=(FORMAT_VERSION,), legacy_version_field="format_version")
    try:
        found = {}
        for topic, partitions in document["topics"].items():
            for partition, broker in partitions.items():
                number = int(partition)
                if number < 0 or str(number) != partition or not isinstance(broker, str) or not isinstance(topic, str):
                    raise ValueError(f"topic {topic!r} partition {partition!r} -> {broker!r}")
                validate_broker_name(broker)
                found[(topic, number)] = broker
        return found
    except (ValueError, KeyError, TypeError, AttributeError) as error:  # InvalidOptionError is a ValueError
        raise CorruptFileError(f"{source}: not a valid partition -> broker map ({error})") from None


def encode_partition_brokers(brokers: Mapping[tuple[str, int], str]) -> bytes:
    """The file's bytes for `brokers`."""
    topics: dict[str, dict[str, str]] = {}
    for (topic, partition), broker in sorted(brokers.items()):
        topics.setdefault(topic, {})[str(partition)] = broker
    return versioned_json(FORMAT, FORMAT_VERSION, {"topics": topics})
