"""Roll a hash index file back to its committed state after a writer died mid-batch.

`IndexFile.rollback_to` trusts the on-disk header's indexCount. A writer killed inside a put can
leave entries and slots written while the header still shows the old count (a put writes entry,
slot, header in that order), or entries half-written. This repair works from the committed count
alone:

* the uncommitted entries are the ones from the committed count up to the last non-zero entry
  (a batch's entries are written contiguously; a run of ZERO_RUN_ENTRIES all-zero entries ends
  the search, so recovery reads only what a batch could have written);
* newest first, an uncommitted entry i whose slot points at it gets back its prevIndex (the slot's
  value before the put); a slot that does not point at i was never updated for i (a put writes
  the entry before the slot), so it is left alone;
* the uncommitted entries are zeroed and the committed header written back.

The file is then byte-identical to one that never saw the lost batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from msgindex.storage.checkpoint import HEADER_FIELDS, IndexFileState
from msgindex.storage.index_file import (
    ENTRY_DTYPE,
    HEADER_SIZE,
    HEADER_STRUCT,
    SLOT_DTYPE,
    SLOT_SIZE,
    IndexFile,
)
from msgindex.storage.mapped_file import map_file

ZERO_RUN_ENTRIES = 4096


def repair_index_file(path: Path, hash_slot_num: int, index_num: int, state: IndexFileState) -> bool:
    """Roll `path` back to `state` (its committed header). True when anything had to change."""
    mm = map_file(path, expected_size=IndexFile.file_size(hash_slot_num, index_num), writable=True)
    try:
        slots = np.frombuffer(mm, SLOT_DTYPE, hash_slot_num, HEADER_SIZE)
        entries = np.frombuffer(mm, ENTRY_DTYPE, index_num, HEADER_SIZE + hash_slot_num * SLOT_SIZE)
        committed = state.index_count
        end = _end_of_written(entries, committed)
        committed_header = tuple(state.header[name] for name in HEADER_FIELDS)
        changed = end > committed or HEADER_STRUCT.unpack_from(mm, 0) != committed_header
        for index in range(end - 1, committed - 1, -1):
            slot = int(entries["key_hash"][index]) % hash_slot_num
            if slots[slot] == index:
                slots[slot] = entries["prev_index"][index]
        entries[committed:end] = np.zeros(1, dtype=ENTRY_DTYPE)
        HEADER_STRUCT.pack_into(mm, 0, *committed_header)
        if changed:
            mm.flush()
        del slots, entries
        return changed
    finally:
        mm.close()


def _end_of_written(entries: np.ndarray, committed: int) -> int:
    """One past the last non-zero entry at or after `committed`, found chunk by chunk."""
    raw = entries.view(np.uint8).reshape(len(entries), ENTRY_DTYPE.itemsize)
    end = committed
    start = committed
    while start < len(entries):
        chunk = raw[start : start + ZERO_RUN_ENTRIES]
        nonzero = np.flatnonzero(chunk.any(axis=1))
        if nonzero.size == 0:
            break
        end = start + int(nonzero[-1]) + 1
        start += ZERO_RUN_ENTRIES
    return end
