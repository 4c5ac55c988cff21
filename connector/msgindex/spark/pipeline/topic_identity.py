"""Which incarnation of each Kafka topic an index holds: a topic deleted and created again under
its name starts its offsets at 0 again, and the index skips offsets it holds (exactly once by
offsets), so the new topic's records would be taken for the old one's and never indexed, and the
old rows' payloads fetched by offset would be the new records'. Found by an attack run: after
Spark refused the old checkpoint ("Some data may have been lost"), deleting it and starting
again indexed nothing and reported the new records as already committed.

Kafka gives every topic an id (KIP-516, Kafka 2.8+), new when the topic is created again. The job
records each topic's id the first time it starts on it, in ``topic-ids/<topic>-<crc>.json``
beside the shards (``RootFiles.create``), and refuses to start when a topic's id is not the
recorded one while the index holds offsets of it: a SourceMismatchError naming the topic and what
to do (a topic recorded but never indexed just gets its new id). Topics a pattern subscription
matches while the job runs are recorded when a later run starts.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping

from msgindex.errors import CorruptFileError, SourceMismatchError
from msgindex.storage.location import parse_location
from msgindex.storage.root_files import root_files

DIRECTORY = "topic-ids"


def record_name(topic: str) -> str:
    """Where `topic`'s id is recorded: its name and a checksum of it, so that topics whose names
    differ only in case (both legal in Kafka) never share a file on a case-insensitive disk."""
    return f"{DIRECTORY}/{topic}-{zlib.crc32(topic.encode('utf-8')):08x}.json"


def check_topic_identity(root: str, storage_options: Mapping[str, str] | None, found: Mapping[str, str],
                         held: Iterable[str]) -> None:
    """Record the id of each topic in `found` (topic -> Kafka's topic id) the index has none
    for; SourceMismatchError when one has another id recorded and the index holds offsets of it
    (`held`: the topics its shards hold offsets of). A topic recorded but never indexed (a first
    run that failed) gets its new id."""
    files = root_files(parse_location(root, storage_options or None))
    held = set(held)
    for topic, topic_id in sorted(found.items()):
        name = record_name(topic)
        body = json.dumps({"topic": topic, "topic_id": topic_id}).encode("utf-8")
        if files.create(name, body):
            continue
        recorded = _recorded_id(files.read(name), files.url(name))
        if recorded == topic_id:
            continue
        if topic not in held:
            files.replace(name, body)
            continue
        raise SourceMismatchError(
            f"topic {topic!r} was deleted and created again since this index was built from it (Kafka's topic id "
            f"was {recorded}, it is {topic_id} now): its new records reuse offsets the index holds for the old "
            f"topic's and would be skipped as already indexed. Index it into a new --path (a new Spark "
            f"checkpoint alone does not help)")


def _recorded_id(raw: bytes | None, url: str) -> str:
    try:
        return str(json.loads(raw or b"")["topic_id"])
    except (ValueError, KeyError, TypeError):
        raise CorruptFileError(f"{url}: not a topic id record (the indexing job writes it; remove it only if the "
                               f"topic was never deleted and created again)") from None
