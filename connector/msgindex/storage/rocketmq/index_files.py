"""A broker's ``index/`` directory: its IndexFiles (``msgindex.storage.hash_index.index_file``), oldest first.

The files do not record their sizing; the broker's ``maxHashSlotNum`` / ``maxIndexNum`` must be
given (RocketMQ's defaults otherwise), and a file of any other size is an error that says which
sizings would fit. Files are named ``yyyyMMddHHmmssSSS`` (their creation time); the name sorts
them in the order the broker filled them, which is also commit-log order.
"""

from __future__ import annotations

import os
from pathlib import Path

from msgindex.errors import InvalidOptionError, StoreNotFoundError
from msgindex.storage.hash_index.index_file import (
    DEFAULT_HASH_SLOT_NUM,
    DEFAULT_INDEX_NUM,
    ENTRY_SIZE,
    HEADER_SIZE,
    SLOT_SIZE,
    IndexFile,
    check_sizing,
    parse_index_file_name,
)

INDEX_DIR = "index"
# RocketMQ's default maxIndexNum is 4 x maxHashSlotNum; brokers that change one usually keep it
DEFAULT_ENTRIES_PER_SLOT = 4


class IndexFileSet:
    """The IndexFiles of one directory, all of one sizing."""

    def __init__(self, directory: str | os.PathLike, hash_slot_num: int = DEFAULT_HASH_SLOT_NUM,
                 index_num: int = DEFAULT_INDEX_NUM) -> None:
        self.directory = Path(directory)
        check_sizing(self.directory, hash_slot_num, index_num)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num

    @property
    def file_size(self) -> int:
        return IndexFile.file_size(self.hash_slot_num, self.index_num)

    def paths(self, *, allow_empty: bool = False) -> list[Path]:
        """The index files, oldest first. A missing directory, no index files (unless
        `allow_empty`) or a file of another size than the sizing gives are errors."""
        if not self.directory.is_dir():
            raise StoreNotFoundError(f"{self.directory}: no such index directory")
        files = sorted(Path(entry.path) for entry in os.scandir(self.directory)
                       if parse_index_file_name(entry.name) is not None and entry.is_file())
        if not files and not allow_empty:
            raise StoreNotFoundError(f"{self.directory}: no RocketMQ index files (named yyyyMMddHHmmssSSS) in it")
        for path in files:
            size = path.stat().st_size
            if size != self.file_size:
                raise InvalidOptionError(
                    f"{path}: {size} bytes, but options 'hashSlotNum' = {self.hash_slot_num} and "
                    f"'indexNum' = {self.index_num} make {self.file_size}; give the sizing the "
                    f"broker used (its maxHashSlotNum / maxIndexNum){_sizing_hint(size)}"
                )
        return files

    def open(self, path: Path) -> IndexFile:
        """One of the files, read-only."""
        return IndexFile.open(path, self.hash_slot_num, self.index_num, read_only=True)


def _sizing_hint(size: int) -> str:
    per_slot = SLOT_SIZE + DEFAULT_ENTRIES_PER_SLOT * ENTRY_SIZE
    if size > HEADER_SIZE and (size - HEADER_SIZE) % per_slot == 0:
        slots = (size - HEADER_SIZE) // per_slot
        return (f"; with RocketMQ's 1:{DEFAULT_ENTRIES_PER_SLOT} ratio this size is hashSlotNum = "
                f"{slots}, indexNum = {slots * DEFAULT_ENTRIES_PER_SLOT}")
    return ""
