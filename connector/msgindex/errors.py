"""Every error msgindex raises on purpose derives from MsgIndexError.

Each message names the file, option, offset or record at fault so a user can act on it.
"""

from __future__ import annotations

import difflib


class MsgIndexError(Exception):
    """Base class of msgindex's own errors."""


class CorruptFileError(MsgIndexError):
    """A file on disk is truncated, the wrong size, or holds bytes that fail validation."""


class ForeignCheckpointError(CorruptFileError):
    """A shard's checkpoint commits a log extent its log segments do not have at a batch boundary:
    another shard's checkpoint, or an old copy. The error names the checkpoint; ``msgindex repair``
    rebuilds it from the shard's files."""


class StorageFullError(MsgIndexError, OSError):
    """The filesystem has no room for a file msgindex must allocate or grow (disk full, quota)."""


class IndexFullError(MsgIndexError):
    """An index file or sparse index has no room for another entry."""


class InvalidAppendError(MsgIndexError):
    """An append would break an ordering invariant (e.g. a sparse index offset that does not grow)."""


class OutOfRangeError(MsgIndexError, IndexError):
    """A sequence number, entry or position outside what a log, segment or index file holds."""


class InvalidArgumentError(MsgIndexError, ValueError):
    """A call whose arguments break the called function's contract (a caller's mistake, not bad
    data on disk): e.g. truncating a sparse index to more entries than it holds."""


class InvalidKeyError(MsgIndexError, TypeError):
    """A key that is not text (None, bytes, a number) where msgindex needs a key string."""


class LegacyCheckpointError(MsgIndexError):
    """A shard's checkpoint predates exactly-once-by-offsets (it recorded batch ids) and cannot be
    appended to as it is; the message says how to upgrade or what to do instead."""


class IndexPathError(MsgIndexError):
    """The index path is not usable where it must be (e.g. an executor does not see it)."""


class IndexInUseError(MsgIndexError):
    """Another indexing job is writing the same index right now."""


class ShardLockedError(MsgIndexError):
    """Another process holds the shard's writer lock."""


class StoreNotFoundError(MsgIndexError):
    """A path given as an index store is missing or is not a msgindex store."""


class UpgradeRequiredError(MsgIndexError):
    """A store (or shard) was written in an older on-disk format: `msgindex upgrade PATH` converts it."""


class InvalidOptionError(MsgIndexError, ValueError):
    """A user-supplied option or argument is unknown, malformed or contradicts another."""


class ToolMissingError(MsgIndexError):
    """An external tool (java, mvn) that an operation needs is not installed."""


class ConnectorJarsError(MsgIndexError):
    """Jars Spark needs for a path or source (a Hadoop object-store connector such as hadoop-aws
    for an ``s3a://`` checkpoint) could not be staged from Maven Central or are not on its classpath."""


class BrokerError(MsgIndexError):
    """The local Kafka broker could not be started, reached or stopped."""


class KafkaUnreachableError(BrokerError):
    """No Kafka broker answers at the bootstrap address given (unresolvable host, nothing
    listening, or no answer in time)."""


class TopicNotFoundError(InvalidOptionError):
    """A Kafka topic named by the user (or matched by a pattern) does not exist."""


class ConnectServerError(MsgIndexError):
    """A local Spark Connect server could not be started or reached."""


class WorkerPythonError(MsgIndexError):
    """Spark would start its Python workers with an interpreter that cannot import msgindex."""


class ObjectStoreError(MsgIndexError):
    """A request to an object store (s3://, gs://, az://) failed for a reason the user must fix
    or wait out: a missing bucket, wrong credentials, an endpoint that does not answer. The
    message names the store URL and the endpoint or bucket at fault."""


class CommitConflictError(MsgIndexError):
    """An object-store shard's commit lost its version to other writers more often than a
    writer retries (each loss re-reads what won and tries the next version)."""


class SourceMismatchError(MsgIndexError):
    """Records re-read from Kafka are not the ones the index holds at their offsets (a topic
    deleted and created again under its name): a backfill of them would give old records new
    records' values, so nothing of it is committed."""


class FieldCoverageWarning(UserWarning):
    """A field lookup over offsets the field does not cover (indexed before it existed): the
    answer may miss records there (storage/fields.py)."""


def unknown_name(subject: str, what: str, name: str, have: list[str]) -> str:
    """``<subject>: the index has no such <what> (did you mean <close>? it has: ...)``: the message
    for a topic, shard or field name a user gave that the index does not have."""
    close = difflib.get_close_matches(name, have, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    listed = ", ".join(have[:20]) + (f", ... ({len(have)} in all)" if len(have) > 20 else "")
    return f"{subject}: the index has no such {what} ({hint}it has: {listed or 'none'})"
