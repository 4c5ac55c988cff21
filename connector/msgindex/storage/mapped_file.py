"""Memory-mapping with the size checked first and the space allocated for real.

Two ways a mapped page can kill the process with SIGBUS, and how every mapping here avoids them:
* touching a page past the end of the file: the file's real size is compared with what the
  format needs *before* mmap;
* writing into a page of a sparse file (a "hole") when the filesystem is full: the kernel cannot
  allocate the block at the moment of the write and has no way to report it but a signal. So a
  file that will be written through a mapping gets its blocks allocated up front
  (``posix_fallocate``; glibc writes zeros itself on filesystems without it): a full disk is then
  a StorageFullError naming the file when it is created, opened or grown, never a signal later.
  A file that grows (``grow_mapping``: a hash index file follows its writer in bounded steps) has
  the blocks of its new bytes allocated before it is mapped at its new length, so a writer only
  ever writes into allocated pages, and the bytes on disk follow the data.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

from msgindex.errors import CorruptFileError, StorageFullError


def raise_if_storage_full(error: OSError, path: Path, doing: str) -> None:
    """Raise the StorageFullError naming `path` that `error` is when the filesystem ran out of
    room (disk full, quota); return otherwise (the caller re-raises `error`). Every write of
    msgindex reports a full disk this way."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        raise StorageFullError(f"{path}: no space left on its filesystem while {doing} (free some space)") from error


def preallocate(path: Path, size: int) -> None:
    """Create `path` (must not exist) with `size` zero bytes whose blocks are really allocated;
    StorageFullError (and no file left behind) when they do not fit."""
    with open(path, "xb") as f:
        try:
            allocate(f.fileno(), size, path)
        except BaseException:
            Path(path).unlink(missing_ok=True)
            raise


def allocate(fd: int, size: int, path: Path, *, grown_from: int = 0) -> None:
    """Make sure bytes [grown_from, size) of the open file `fd` have disk blocks (growing the file
    to `size` if shorter): StorageFullError naming `path` when the filesystem has no room. A file
    `grown_from` bytes long is then cut back to that length: a failed allocation may have
    extended it part of the way, and nobody maps past its old end yet."""
    if size <= grown_from:
        return
    try:
        os.posix_fallocate(fd, grown_from, size - grown_from)
    except OSError as error:
        if grown_from and os.fstat(fd).st_size > grown_from:
            os.ftruncate(fd, grown_from)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageFullError(
                f"{path}: no space left to allocate {size - grown_from:,} bytes on its filesystem (free some space; "
                f"nothing was written)"
            ) from None
        raise


def grow_mapping(path: Path, old_size: int, new_size: int) -> mmap.mmap:
    """Grow `path` from `old_size` to `new_size` bytes, their blocks allocated (``allocate``),
    and map it whole, writable."""
    fd = os.open(path, os.O_RDWR)
    try:
        allocate(fd, new_size, path, grown_from=old_size)
        return mmap.mmap(fd, new_size, access=mmap.ACCESS_WRITE)
    finally:
        os.close(fd)


def map_file(path: Path, *, writable: bool = False) -> mmap.mmap:
    """Map `path` whole (its length checked by the caller: the format knows what it may be)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    except FileNotFoundError:
        raise CorruptFileError(f"{path}: file does not exist") from None
    except IsADirectoryError:
        raise CorruptFileError(f"{path}: is a directory, not a file") from None
    except OSError as error:  # permissions, a file where a directory was expected, ...
        raise CorruptFileError(f"{path}: cannot open ({error.strerror})") from None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise CorruptFileError(f"{path}: file is empty (0 bytes)")
        if writable:
            allocate(fd, size, path)  # no holes under a writable mapping (see the module docstring)
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        return mmap.mmap(fd, size, access=access)
    finally:
        os.close(fd)
