"""What a shard's hash index needs of an appended batch, as columns, and the index entries made of it.

Appends are the indexing pipeline's hot path (an Arrow table per micro-batch and broker), so the
entries are computed by Arrow and numpy kernels, never by Python code per record. Both inputs
(Arrow, MessageRecords) are validated and brought into columns ONCE, as the log's ``LogColumns``,
which the log encodes and from which these columns are taken without copying texts.

Texts travel as ``large_string``. Python keys may hold lone surrogates (``decode_key_bytes``),
which Arrow strings cannot: such a batch travels as ``large_binary`` in ``encode_text``'s
encoding, which is injective and concatenates like the strings it encodes, so joins and
equality tests mean the same; only the final index keys are decoded back to ``str``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.storage.int_limits import INT32_MAX
from msgindex.storage.log.columns import LogColumns
from msgindex.storage.message import (
    FIELD_HASH_SEPARATOR,
    FIELD_TERM_MARKER,
    INDEX_KEY_SEPARATOR,
    MessageRecord,
    decode_text,
    encode_text,
)

IndexKeys: TypeAlias = "pa.Array | list[str]"
# (index keys ``topic#key``, phyOffsets = log seqs, store timestamps): IndexFile.put_keys' arguments
IndexEntries: TypeAlias = "tuple[IndexKeys, np.ndarray, np.ndarray]"

TEXT = pa.large_string()
RAW_TEXT = pa.large_binary()  # encode_text bytes: texts Arrow strings cannot hold
# Up to this many keys in a record, repeats are found by comparing neighbours (see _first_occurrences).
MAX_LAG_PASSES = 8
_SEPARATORS = {TEXT: pa.scalar(INDEX_KEY_SEPARATOR, TEXT), RAW_TEXT: pa.scalar(encode_text(INDEX_KEY_SEPARATOR), RAW_TEXT)}


@dataclass(frozen=True)
class AppendColumns:
    """A batch's topics, timestamps and keys, the keys flattened: item i of `items` is a key of
    record `parents[i]` (non-decreasing). `topic` and `items` are both TEXT or both RAW_TEXT.
    Built from records the metadata log has already accepted, so nothing is validated here."""

    topic: pa.Array
    timestamp_ms: np.ndarray  # int64, one per record
    items: pa.Array
    parents: np.ndarray  # int64, one per item

    @classmethod
    def of(cls, records: pa.Table | pa.RecordBatch | Sequence[MessageRecord] | LogColumns) -> AppendColumns:
        return cls.from_log_columns(LogColumns.of(records))

    @classmethod
    def from_log_columns(cls, columns: LogColumns) -> AppendColumns:
        """The columns of a validated batch: its encoded texts are read as TEXT where they are
        UTF-8 (zero-copy cast), else the whole batch stays RAW_TEXT."""
        counts = np.diff(columns.list_offsets)
        used = slice(int(columns.list_offsets[0]), int(columns.list_offsets[-1]))
        items = columns.items.slice(used.start, used.stop - used.start)
        topic = columns.topic
        try:
            topic, items = topic.cast(TEXT), items.cast(TEXT)
        except pa.ArrowInvalid:
            topic, items = topic.cast(RAW_TEXT), items.cast(RAW_TEXT)
        parents = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        return cls(topic, columns.timestamps.astype(np.int64, copy=False), items, parents)

    def topics(self) -> set[str]:
        return set(_python_strs(pc.unique(self.topic)))

    def index_entries(self, first_seq: int) -> IndexEntries:
        """One entry per distinct key of each record, in record then key order, for records
        stored from seq `first_seq` on (a key's phyOffset is its record's seq). A field term's
        entry is of its ``message.field_hash_string``."""
        items, parents = self.items, self.parents
        keep = self._first_occurrences()
        if keep is not None:
            items, parents = items.take(pa.array(keep)), parents[keep]
        separator = _SEPARATORS[items.type]
        if items.type == RAW_TEXT:  # field terms are never UTF-8: a batch holding one is RAW_TEXT
            is_term = pc.equal(pc.binary_slice(items, 0, 1), pa.scalar(FIELD_TERM_MARKER, RAW_TEXT)).to_numpy(
                zero_copy_only=False)
            if is_term.any():  # a field term 0xFF name NUL value hashes as topic NUL name NUL value
                # (binary_slice: an explicit stop below 2^63, as pyarrow 26 overflows on sliced input)
                items = pc.if_else(pa.array(is_term), pc.binary_slice(items, 1, INT32_MAX), items)
                separator = pc.if_else(pa.array(is_term), pa.scalar(encode_text(FIELD_HASH_SEPARATOR), RAW_TEXT),
                                       separator)
        joined = pc.binary_join_element_wise(self.topic.take(pa.array(parents)), items, separator)
        if joined.type == RAW_TEXT:
            try:  # RAW_TEXT only for its field terms: their hash strings are UTF-8, and so Arrow strings
                joined = joined.cast(TEXT)
            except pa.ArrowInvalid:  # a lone surrogate somewhere: Python strs
                pass
        keys = joined if joined.type == TEXT else _python_strs(joined)
        return keys, parents + first_seq, self.timestamp_ms[parents]

    def _first_occurrences(self) -> np.ndarray | None:
        """Positions of the items that are not a repeat of an earlier key of the same record
        (a lookup returns a message once however often it carries the key), or None if all are."""
        parents = self.parents
        if parents.size < 2:
            return None
        widest = int(np.bincount(parents).max())  # the most keys one record has
        if widest > MAX_LAG_PASSES:
            repeat = self._repeats_by_sorting()
        else:
            # Records have few keys: compare each key with the 1, 2, ... keys before it in C,
            # cheaper than hashing or sorting all of them.
            repeat = np.zeros(parents.size, dtype=bool)
            for lag in range(1, widest):
                same = pc.equal(self.items[lag:], self.items[:-lag]).to_numpy(zero_copy_only=False)
                repeat[lag:] |= same & (parents[lag:] == parents[:-lag])
        return np.flatnonzero(~repeat) if repeat.any() else None

    def _repeats_by_sorting(self) -> np.ndarray:
        ids = pc.dictionary_encode(self.items).indices.to_numpy().astype(np.int64)
        pairs = self.parents * (int(ids.max()) + 1) + ids
        _, first = np.unique(pairs, return_index=True)  # return_index gives first occurrences
        repeat = np.ones(pairs.size, dtype=bool)
        repeat[first] = False
        return repeat


def _python_strs(array: pa.Array) -> list[str]:
    if array.type == RAW_TEXT:
        return [decode_text(raw) for raw in array.to_pylist()]
    return array.to_pylist()
