"""Exclusive ``flock`` locks on lock files: msgindex's one way of saying "one writer at a time".

Used for a shard's writer (``broker=<name>/lock``), the quarantine directory, and the indexing
job's hold on an index (``pipeline.lock``). An flock belongs to the open file description: it is
released when the descriptor is closed or the process dies, however it dies, and two descriptors
of one process exclude each other like two processes do. On a shared filesystem it needs one
where flock works across hosts (NFS v4, EFS, CephFS).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from msgindex.errors import CorruptFileError, InvalidArgumentError

POLL_FIRST_S = 0.01  # a waiter polls, backing off to
POLL_MAX_S = 0.5


def try_lock(path: str | os.PathLike[str]) -> int | None:
    """The descriptor holding an exclusive lock on `path` (created when missing), or None when
    someone else holds it. Release with ``unlock``."""
    try:
        fd = os.open(Path(path), os.O_RDWR | os.O_CREAT, 0o644)
    except IsADirectoryError:
        raise CorruptFileError(f"{path}: a directory where a lock file belongs; remove it (lock files hold "
                               f"no data)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def wait_for_lock(path: str | os.PathLike[str], timeout_s: float) -> int | None:
    """``try_lock`` until it succeeds or `timeout_s` passed (then None), backing off (``inf``:
    no limit; nan is refused: it would wait forever while meaning no number)."""
    if not timeout_s >= 0:
        raise InvalidArgumentError(f"{path}: lock timeout must be a number of seconds >= 0, got {timeout_s!r}")
    deadline = time.monotonic() + timeout_s
    pause = POLL_FIRST_S
    while True:
        fd = try_lock(path)
        if fd is not None:
            return fd
        if time.monotonic() + pause > deadline:
            return None
        time.sleep(pause)
        pause = min(pause * 2, POLL_MAX_S)


def unlock(fd: int) -> None:
    os.close(fd)  # closing the descriptor releases the flock
