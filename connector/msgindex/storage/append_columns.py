"""What a shard's hash index needs of an appended batch, as columns, and the index entries made of it.

Appends are the indexing pipeline's hot path (an Arrow table per micro-batch and broker), so the
entries are computed by Arrow and numpy kernels, never by Python code per record. MessageRecord
input is brought into the same columns once, so both inputs share one code path and give the same
bytes on disk.

Texts travel as ``large_string``. Python keys may hold lone surrogates (``decode_key_bytes``),
which Arrow strings cannot: such a batch travels as ``large_binary`` in ``encode_text``'s
encoding, which is injective and concatenates like the strings it encodes, so joins and
equality tests mean the same; only the final index keys are decoded back to ``str``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.storage.message import KEY_SEPARATOR, MessageRecord, decode_text, encode_text

IndexKeys: TypeAlias = "pa.Array | list[str]"
# (index keys ``topic#key``, phyOffsets = log seqs, store timestamps): IndexFile.put_keys' arguments
IndexEntries: TypeAlias = "tuple[IndexKeys, np.ndarray, np.ndarray]"

TEXT = pa.large_string()
RAW_TEXT = pa.large_binary()  # encode_text bytes: texts Arrow strings cannot hold
# Up to this many keys in a record, repeats are found by comparing neighbours (see _first_occurrences).
MAX_LAG_PASSES = 8
_SEPARATORS = {TEXT: pa.scalar(KEY_SEPARATOR, TEXT), RAW_TEXT: pa.scalar(encode_text(KEY_SEPARATOR), RAW_TEXT)}


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
    def of(cls, records: pa.Table | pa.RecordBatch | Sequence[MessageRecord]) -> AppendColumns:
        if isinstance(records, (pa.Table, pa.RecordBatch)):
            return cls.from_arrow(records)
        return cls.from_records(records)

    @classmethod
    def from_arrow(cls, table: pa.Table | pa.RecordBatch) -> AppendColumns:
        """Columns of an APPEND_SCHEMA table (zero-copy where Arrow allows)."""
        keys = _column(table, "keys")
        parents = pc.list_parent_indices(keys).to_numpy().astype(np.int64, copy=False)
        timestamps = _column(table, "timestamp_ms").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        return cls(_text(_column(table, "topic")), timestamps, _text(pc.list_flatten(keys)), parents)

    @classmethod
    def from_records(cls, records: Sequence[MessageRecord]) -> AppendColumns:
        """Columns of MessageRecords, one comprehension per field."""
        keys = [r.keys for r in records]
        counts = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
        topic, items = _python_texts([r.topic for r in records], list(chain.from_iterable(keys)))
        timestamps = np.array([r.timestamp_ms for r in records], dtype=np.int64)
        return cls(topic, timestamps, items, np.repeat(np.arange(len(keys), dtype=np.int64), counts))

    def topics(self) -> set[str]:
        return set(_python_strs(pc.unique(self.topic)))

    def index_entries(self, first_seq: int) -> IndexEntries:
        """One entry per distinct key of each record, in record then key order, for records
        stored from seq `first_seq` on (a key's phyOffset is its record's seq)."""
        items, parents = self.items, self.parents
        keep = self._first_occurrences()
        if keep is not None:
            items, parents = items.take(pa.array(keep)), parents[keep]
        joined = pc.binary_join_element_wise(self.topic.take(pa.array(parents)), items, _SEPARATORS[items.type])
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


def _column(table: pa.Table | pa.RecordBatch, name: str) -> pa.Array:
    array = table.column(name)
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array


def _text(array: pa.Array) -> pa.Array:
    """An Arrow string column (plain, large, view or dictionary) as TEXT."""
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array if array.type == TEXT else array.cast(TEXT)


def _python_texts(*columns: list[str]) -> tuple[pa.Array, ...]:
    """The columns as TEXT arrays, or all as RAW_TEXT when any text holds a lone surrogate."""
    try:
        return tuple(pa.array(column, TEXT) for column in columns)
    except (UnicodeEncodeError, pa.ArrowException):
        return tuple(pa.array([encode_text(text) for text in column], RAW_TEXT) for column in columns)


def _python_strs(array: pa.Array) -> list[str]:
    if array.type == RAW_TEXT:
        return [decode_text(raw) for raw in array.to_pylist()]
    return array.to_pylist()
