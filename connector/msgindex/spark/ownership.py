"""Which streaming query feeds an index (``<index root>/pipeline-owner.json``).

Shards skip every batch id they already committed. That is what makes replays exactly once, and
it would silently drop data if a second query, whose batch ids start again at 0 (a new or
deleted checkpoint, or another job), wrote into the same index. So the first query to write
records its id (Spark keeps it in ``<checkpoint>/metadata``) and any other query is refused with
an error saying what to do.
"""

from __future__ import annotations

import json
from pathlib import Path

from msgindex.errors import CorruptFileError, InvalidOptionError
from msgindex.storage.durable import parse_versioned_json, versioned_json, write_atomically

FILE_NAME = "pipeline-owner.json"
FORMAT = "msgindex-pipeline-owner"
FORMAT_VERSION = 1
SPARK_CHECKPOINT_METADATA = "metadata"  # Spark's {"id": "<query id>"} file in a checkpoint


def spark_query_id(checkpoint: str | Path) -> str | None:
    """The id Spark recorded for the query of a local checkpoint directory (None when it has none yet)."""
    path = Path(checkpoint) / SPARK_CHECKPOINT_METADATA
    try:
        return str(json.loads(path.read_text(encoding="utf-8").splitlines()[0])["id"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise CorruptFileError(f"{path}: not a Spark checkpoint metadata file ({error})") from error


def claim_index(root: str | Path, query_id: str, checkpoint: str | Path) -> None:
    """Record `query_id` as the writer of the index at `root`, or refuse when another query is."""
    path = Path(root) / FILE_NAME
    if path.exists():
        owner = _read_owner(path)
        recorded = owner.get("query_id")
        if not isinstance(recorded, str):
            raise CorruptFileError(f"{path}: not a pipeline owner record (no query_id)")
        if recorded == query_id:
            return
        raise InvalidOptionError(
            f"--path {root} is fed by streaming query {recorded} (checkpoint {owner.get('checkpoint')}), "
            f"but --checkpoint {checkpoint} belongs to query {query_id}: their batch ids would collide "
            f"and shards would skip new data. Restart with the original checkpoint, or index into a new --path."
        )
    write_atomically(path, versioned_json(FORMAT, FORMAT_VERSION, {"query_id": query_id, "checkpoint": str(checkpoint)}))


def _read_owner(path: Path) -> dict:
    raw = path.read_bytes()
    try:
        legacy = json.loads(raw)
    except ValueError:
        legacy = None
    if isinstance(legacy, dict) and "format" not in legacy and "query_id" in legacy:
        return legacy  # written before msgindex's JSON files carried a format and version
    _, owner = parse_versioned_json(raw, source=path, what="pipeline owner record", format_name=FORMAT,
                                    versions=(FORMAT_VERSION,))
    return owner
