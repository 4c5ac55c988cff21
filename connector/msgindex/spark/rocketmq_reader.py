"""A RocketMQ broker's index directory (``store/index/``) read as raw entries.

A RocketMQ IndexFile maps hash(``topic#key``) to a commit-log offset and keeps no key strings,
so nothing found in it can be verified: every row carries ``verified = false``, and a key lookup
returns every entry whose hash equals the key's (hash collisions included). Times are the file's
beginTimestamp plus whole seconds, as RocketMQ stores them.
"""

from __future__ import annotations

import os
from itertools import compress
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa

from msgindex.errors import InvalidOptionError, StoreNotFoundError
from msgindex.storage.index_file import FIRST_INDEX, TIME_DIFF_UNIT_MS, IndexFile, parse_index_file_name
from msgindex.storage.message import index_key

MICROS_PER_MS = 1000
BATCH_ENTRIES = 1 << 20

# the rows of ``spark.read.format("msgindex").option("mode", "rocketmq")``
ROCKETMQ_ENTRY_SCHEMA = pa.schema([
    pa.field("file", pa.string(), nullable=False),          # index file name (yyyyMMddHHmmssSSS)
    pa.field("entry", pa.int32(), nullable=False),          # entry number inside the file
    pa.field("key_hash", pa.int32(), nullable=False),       # abs(String.hashCode(topic#key))
    pa.field("phy_offset", pa.int64(), nullable=False),     # commit-log offset of the message
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),  # second granularity
    pa.field("prev_index", pa.int32(), nullable=False),     # previous entry of the hash chain
    pa.field("lookup_key", pa.string(), nullable=True),     # the topic#key whose hash matched
    pa.field("verified", pa.bool_(), nullable=False),       # always false: hashes only
])


class RocketMQIndexDirectory:
    """The IndexFiles of one directory, all of one sizing (RocketMQ's hashSlotNum/indexNum)."""

    def __init__(self, path: str | os.PathLike, hash_slot_num: int, index_num: int) -> None:
        self.path = Path(path)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num

    def files(self) -> list[Path]:
        """The index files, oldest first; a missing directory, no index files or a file of another
        size than the sizing gives are errors naming the option at fault."""
        if not self.path.is_dir():
            raise StoreNotFoundError(f"option 'path' = {str(self.path)!r}: no such directory")
        files = sorted(p for p in self.path.iterdir()
                       if p.is_file() and parse_index_file_name(p.name) is not None)
        if not files:
            raise StoreNotFoundError(
                f"option 'path' = {str(self.path)!r}: no RocketMQ index files (named yyyyMMddHHmmssSSS) in it"
            )
        expected = IndexFile.file_size(self.hash_slot_num, self.index_num)
        for file in files:
            if file.stat().st_size != expected:
                raise InvalidOptionError(
                    f"{file}: {file.stat().st_size} bytes, but options 'hashSlotNum' = "
                    f"{self.hash_slot_num} and 'indexNum' = {self.index_num} make {expected}; "
                    f"give the sizing the broker used"
                )
        return files

    def read_file(self, name: str, *, keys: Iterable[str] | None = None, topics: Iterable[str] | None = None,
                  begin_ms: int | None = None, end_ms: int | None = None) -> Iterator[pa.RecordBatch]:
        """Entries of file `name`: all of them, or those of `keys` in `topics`; in the window."""
        with IndexFile.open(self.path / name, self.hash_slot_num, self.index_num, read_only=True) as index:
            if keys is None:
                end = FIRST_INDEX + index.entry_count
                for start in range(FIRST_INDEX, end, BATCH_ENTRIES):  # a full file is 20M entries
                    numbers = np.arange(start, min(start + BATCH_ENTRIES, end), dtype=np.int64)
                    yield from _entry_batch(index, name, numbers, None, begin_ms, end_ms)
            else:
                full_keys = [index_key(topic, key) for topic in (topics or ()) for key in keys]
                numbers, matched = _matching_entries(index, full_keys)
                yield from _entry_batch(index, name, numbers, matched, begin_ms, end_ms)


def _entry_batch(index: IndexFile, name: str, numbers: np.ndarray, lookup_keys: list[str] | None,
                 begin_ms: int | None, end_ms: int | None) -> Iterator[pa.RecordBatch]:
    """Entries `numbers` of `index` in the window as one ROCKETMQ_ENTRY_SCHEMA batch (copied out
    of the mapping), if any."""
    entries = index.entry_array()[numbers]
    stamps = index.begin_timestamp + entries["time_diff"].astype(np.int64) * TIME_DIFF_UNIT_MS
    keep = np.ones(entries.size, dtype=bool)
    if begin_ms is not None:
        keep &= stamps >= begin_ms
    if end_ms is not None:
        keep &= stamps <= end_ms
    rows = int(keep.sum())
    if rows == 0:
        return
    matched_keys = (pa.nulls(rows, pa.string()) if lookup_keys is None
                    else pa.array(list(compress(lookup_keys, keep)), pa.string()))
    yield pa.RecordBatch.from_arrays([
        pa.array([name] * rows, pa.string()),
        pa.array(numbers[keep].astype(np.int32)),
        pa.array(entries["key_hash"][keep].astype(np.int32)),
        pa.array(entries["phy_offset"][keep].astype(np.int64)),
        pa.array(stamps[keep] * MICROS_PER_MS, pa.timestamp("us", tz="UTC")),
        pa.array(entries["prev_index"][keep].astype(np.int32)),
        matched_keys,
        pa.array(np.zeros(rows, dtype=bool)),
    ], schema=ROCKETMQ_ENTRY_SCHEMA)


def _matching_entries(index: IndexFile, full_keys: list[str]) -> tuple[np.ndarray, list[str]]:
    """Entry numbers whose hash equals one of `full_keys`' (each chain walked to its end)."""
    numbers: list[int] = []
    matched: list[str] = []
    for full_key, chain in zip(full_keys, index.candidates_many(full_keys)):
        for entry_number, _phy, _stamp in chain:
            numbers.append(entry_number)
            matched.append(full_key)
    return np.asarray(numbers, dtype=np.int64), matched
