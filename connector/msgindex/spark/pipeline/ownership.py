"""One indexing job per index at a time: the driver holds ``<index root>/pipeline.lock``.

Exactly once no longer depends on which Spark query writes an index (shards commit Kafka source
offsets, so a new or deleted checkpoint, or another job, converges to the same index). What
must not happen is two jobs writing one index AT THE SAME TIME: their tasks would contend for
every shard lock, and their partition -> broker assignments could race. So the driver of a job
takes an exclusive ``flock`` on the lock file for the life of its query (released when the
process ends, however it ends) and writes who it is to ``pipeline-owner.json``; a second
driver fails at once with a message naming the holder. It works whatever the checkpoint
location is (a local path or any URI): the lock lives with the index, on the shared filesystem
the index requires anyway (flock works on NFS v4, EFS, CephFS).

On an object store there is no lock to hold (a lease would need a clock every job trusts), and
none is needed: shards commit without locks, exactly once by Kafka offsets, and the partition ->
shard map is recorded put-if-absent, so two jobs writing one index at once are both exact (each
record indexed once; their progress lines count what each found already committed). The claim
only records who runs (``_jobs/<host>-<pid>-<start>.json``), for people looking at the bucket.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from msgindex.errors import CorruptFileError, IndexInUseError
from msgindex.storage.durable import parse_versioned_json, versioned_json, write_atomically
from msgindex.storage.file_lock import try_lock, unlock
from msgindex.storage.location import parse_location
from msgindex.storage.root_files import root_files

LOCK_FILE = "pipeline.lock"
FILE_NAME = "pipeline-owner.json"
FORMAT = "msgindex-pipeline-owner"
FORMAT_VERSION = 2  # 1 recorded a Spark query id that other queries were refused for
JOBS_DIR = "_jobs"  # object stores: who ran jobs on the index


@dataclass(frozen=True)
class JobIdentity:
    """Who runs an indexing job (what a refused second job is told)."""

    host: str
    pid: int
    query_name: str
    checkpoint: str
    started_ms: int

    @classmethod
    def current(cls, query_name: str, checkpoint: str) -> JobIdentity:
        return cls(socket.gethostname(), os.getpid(), query_name, str(checkpoint), int(time.time() * 1000))

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started_ms / 1000))
        return f"host {self.host} pid {self.pid}, query {self.query_name!r}, checkpoint {self.checkpoint}, since {started}"


class IndexClaim:
    """The driver's hold on an index for the life of its query (a context manager)."""

    def __init__(self, root: str | os.PathLike[str], identity: JobIdentity,
                 storage_options: Mapping[str, str] | None = None) -> None:
        self.location = parse_location(root, storage_options)
        self.root = Path(root) if self.location.is_local else None
        self.identity = identity
        self._fd: int | None = None

    def __enter__(self) -> IndexClaim:
        if self.root is None:  # an object store: recorded, not locked (module docstring)
            i = self.identity
            root_files(self.location).replace(f"{JOBS_DIR}/{i.host}-{i.pid}-{i.started_ms}.json",
                                              versioned_json(FORMAT, FORMAT_VERSION, vars(i)))
            return self
        fd = try_lock(self.root / LOCK_FILE)
        if fd is None:
            raise _in_use(self.root)
        self._fd = fd
        write_atomically(self.root / FILE_NAME, versioned_json(FORMAT, FORMAT_VERSION, vars(self.identity)))
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._fd is not None:
            unlock(self._fd)
            self._fd = None


def require_free(root: str | os.PathLike[str], storage_options: Mapping[str, str] | None = None) -> None:
    """IndexInUseError naming the holder when a job holds the index right now (a check only:
    the job that goes on takes an IndexClaim). Always free on an object store."""
    if not parse_location(root, storage_options).is_local:
        return
    fd = try_lock(Path(root) / LOCK_FILE)
    if fd is None:
        raise _in_use(Path(root))
    unlock(fd)


def _in_use(root: Path) -> IndexInUseError:
    holder = read_owner(root)
    who = holder.describe() if holder is not None else "a job that has not recorded itself yet"
    return IndexInUseError(f"--path {root} is being indexed by another job right now ({who}); "
                           f"stop that job first, or index into another --path")


def read_owner(root: str | os.PathLike[str]) -> JobIdentity | None:
    """The job that last claimed the index (None when none did, or its record is unreadable:
    it is informational only, the lock decides)."""
    path = Path(root) / FILE_NAME
    try:
        _, body = parse_versioned_json(path.read_bytes(), source=path, what="pipeline owner record",
                                       format_name=FORMAT, versions=(FORMAT_VERSION,))
        return JobIdentity(str(body["host"]), int(body["pid"]), str(body["query_name"]),
                           str(body["checkpoint"]), int(body["started_ms"]))
    except (OSError, CorruptFileError, KeyError, TypeError, ValueError):
        return None
