"""What msgindex reads from Spark's own streaming checkpoint: the Kafka offsets of a micro-batch.

Spark's offset log ``<checkpoint>/offsets/<batch id>`` holds a version line, the batch's metadata,
then one JSON line per source (for Kafka: topic -> partition -> end offset); the Kafka source's
initial offsets are in ``<checkpoint>/sources/0/0``. The files are read directly when the
checkpoint is local to the driver, with msgindex's own object-store client when it is in a bucket
(``s3a://`` is the ``s3://`` bucket msgindex reads; no Spark job per progress line), else through
Spark (any Hadoop filesystem).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from msgindex.errors import MsgIndexError
from msgindex.spark.pipeline.kafka_source import OffsetRange
from msgindex.storage.location import parse_location
from msgindex.storage.root_files import RootFiles, root_files

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def local_path(location: str | Path) -> Path | None:
    """A checkpoint location as a local path: a plain path or a ``file:`` URI (None otherwise)."""
    text = str(location)
    parsed = urlparse(text)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme and len(parsed.scheme) > 1:  # hdfs://, s3a://, ... (not a Windows drive)
        return None
    return Path(text)


def _checkpoint_text(spark: SparkSession | None, checkpoint: str, relative: str,
                     storage_options: Mapping[str, str] | None = None) -> str | None:
    """A file of Spark's checkpoint as text: read directly when local to the driver, with
    msgindex's client when in an object store, else through Spark (any Hadoop filesystem); None
    when it does not exist."""
    directory = local_path(checkpoint)
    if directory is not None:
        try:
            return (directory / relative).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    try:  # hdfs:// and the like are no store location: Spark's filesystem reads them
        data = _bucket_files(str(checkpoint), tuple(sorted((storage_options or {}).items()))).read(relative)
        return None if data is None else data.decode("utf-8", errors="replace")
    except MsgIndexError:  # unreachable or refused: Spark's own filesystem may still read it
        pass
    if spark is None:
        return None
    try:
        rows = spark.read.text(f"{str(checkpoint).rstrip('/')}/{relative}", wholetext=True).collect()
    except Exception:  # missing file: Spark's AnalysisException (its class differs under Connect)
        return None
    return rows[0][0] if rows else None


@functools.lru_cache(maxsize=8)
def _bucket_files(checkpoint: str, storage_options: tuple[tuple[str, str], ...]) -> RootFiles:
    """The files of a checkpoint in a bucket, through one client per process: the driver reads
    the offset log twice a micro-batch (its partitions, its lag), and a new client costs a
    connection and ~8 ms of set-up each time."""
    return root_files(parse_location(checkpoint, dict(storage_options) or None))


def _source_offsets(text: str | None) -> dict[tuple[str, int], int]:
    """The Kafka offsets of the job's one source in an offset-log or initial-offsets file: the
    last line that is a JSON object of topic -> partition -> offset."""
    offsets: dict[tuple[str, int], int] = {}
    for line in (text or "").splitlines():
        start = line.find("{")
        try:
            source = json.loads(line[start:]) if start >= 0 else None
        except ValueError:
            continue
        if isinstance(source, dict) and source and all(isinstance(v, dict) for v in source.values()):
            try:
                offsets = {(topic, int(p)): int(o) for topic, parts in source.items() for p, o in parts.items()}
            except (TypeError, ValueError):
                continue
    return offsets


def batch_end_offsets(checkpoint: str, batch_id: int, spark: SparkSession | None = None,
                      storage_options: Mapping[str, str] | None = None) -> dict[tuple[str, int], int]:
    """The Kafka end offsets of micro-batch `batch_id` from Spark's offset log (``offsets/<id>``:
    a version line, the batch metadata, then one JSON line per source); empty when unreadable."""
    return _source_offsets(_checkpoint_text(spark, checkpoint, f"offsets/{batch_id}", storage_options))


def batch_start_offsets(checkpoint: str, batch_id: int, spark: SparkSession | None = None,
                        storage_options: Mapping[str, str] | None = None) -> dict[tuple[str, int], int]:
    """Where micro-batch `batch_id` starts in each partition: the previous batch's end offsets
    (batch 0: the query's initial offsets, ``sources/0/0``); empty when unreadable."""
    if batch_id > 0:
        return batch_end_offsets(checkpoint, batch_id - 1, spark, storage_options)
    return _source_offsets(_checkpoint_text(spark, checkpoint, "sources/0/0", storage_options))


def batch_ranges(spark: SparkSession | None, checkpoint: str, batch_id: int) -> dict[tuple[str, int], OffsetRange]:
    """Each partition's [start, end) in micro-batch `batch_id`: ends from its offset-log entry,
    starts from the previous entry (batch 0: the query's initial offsets); a partition in
    neither starts at its earliest offset, as Spark's source starts new partitions."""
    ends = batch_end_offsets(checkpoint, batch_id, spark)
    previous = batch_start_offsets(checkpoint, batch_id, spark)
    return {tp: OffsetRange(previous.get(tp), end) for tp, end in ends.items() if previous.get(tp, -1) < end}


# Spark writes each offset-log entry as a hidden temporary file (``.<batch>.<uuid>.tmp``, beside
# it Hadoop's ``..<batch>.<uuid>.tmp.crc``) renamed to ``<batch>`` once whole.
_SPARK_TEMPORARY = re.compile(r"^\.{1,2}\d+\.[0-9a-f-]+\.tmp(\.crc)?$")


def clear_interrupted_first_batch(checkpoint: str) -> list[str]:
    """The temporary files a job killed while writing its first offset-log entry left in a local
    checkpoint's ``offsets/``, removed; their names. Spark refuses to start a query whose offset
    log holds no batch yet but whose directory is not empty (STATE_STORE_CHECKPOINT_LOCATION_NOT_
    EMPTY): without this, a job SIGKILLed at that moment could never be restarted on its
    checkpoint. Nothing is removed once an entry exists (Spark then ignores temporary files
    itself) or when anything else is in the directory; the job holds the index's claim, so no
    other query of it is writing there."""
    directory = local_path(checkpoint)
    if directory is None:
        return []
    offsets = directory / "offsets"
    try:
        names = [entry.name for entry in offsets.iterdir()]
    except OSError:
        return []
    if not names or not all(_SPARK_TEMPORARY.match(name) for name in names):
        return []
    for name in names:
        (offsets / name).unlink(missing_ok=True)
    return sorted(names)
