"""Memory-mapping with the size checked first.

Touching a mapped page past the end of a file kills the process with SIGBUS, so every mapping
goes through here: the file's real size is compared with what the format needs *before* mmap.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from msgindex.errors import CorruptFileError


def preallocate(path: Path, size: int) -> None:
    """Create `path` (must not exist) with `size` zero bytes, sparse where the filesystem allows."""
    with open(path, "xb") as f:
        f.truncate(size)


def map_file(path: Path, *, expected_size: int | None = None, writable: bool = False) -> mmap.mmap:
    """Map `path` whole. With `expected_size`, a file of any other length is a CorruptFileError."""
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
        if expected_size is not None and size != expected_size:
            raise CorruptFileError(
                f"{path}: file is {size} bytes, the format needs exactly {expected_size} "
                f"(truncated, or opened with the wrong sizing)"
            )
        if size == 0:
            raise CorruptFileError(f"{path}: file is empty (0 bytes)")
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        return mmap.mmap(fd, size, access=access)
    finally:
        os.close(fd)
