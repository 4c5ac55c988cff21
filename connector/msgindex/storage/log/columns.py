"""A batch of messages as validated columns: what the metadata log encodes and the hash index keys.

Appends are the indexing pipeline's hot path, so nothing here runs Python code per field:
Arrow input keeps its buffers, MessageRecords are read column by column. ``LogColumns.of`` is
called ONCE per appended batch; the log's batch encoder and the shard's hash-index entries
(``index_entries``) both use that one object.

Validation happens before any byte is produced, so a bad record leaves the log untouched; the
error names the record's place in the batch and the field.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import InvalidAppendError
from msgindex.storage.message import APPEND_SCHEMA, MessageRecord, encode_text
from msgindex.storage.int_limits import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN

INT32 = (INT32_MIN, INT32_MAX)
INT64 = (INT64_MIN, INT64_MAX)
MAX_TOPIC_BYTES = 0xFFFF
# The integer fields of a message, with the numpy type they are stored as.
INT_FIELDS = {
    "partition": np.int32,
    "offset": np.int64,
    "timestamp_ms": np.int64,
    "commit_log_offset": np.int64,
    "size": np.int32,
}
_BOUNDS = {np.int32: INT32, np.int64: INT64}


@dataclass(frozen=True)
class LogColumns:
    """A validated batch as columns. Texts are encoded (``encode_text``) large_binary arrays; the
    keys are list offsets into `items` (absolute positions in it); `key` is null where there is
    no key. Build with ``LogColumns.of``."""

    topic: pa.Array
    key: pa.Array
    list_offsets: np.ndarray
    items: pa.Array
    ints: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.list_offsets) - 1

    @classmethod
    def of(cls, records: pa.Table | pa.RecordBatch | Iterable[MessageRecord] | LogColumns) -> LogColumns:
        """Validated columns of Arrow input (APPEND_SCHEMA's columns, extra ones ignored) or of
        MessageRecords; InvalidAppendError naming the record and field otherwise."""
        if isinstance(records, LogColumns):
            return records
        if isinstance(records, (pa.Table, pa.RecordBatch)):
            columns = _columns_from_arrow(records)
        else:
            columns = _columns_from_records(records if isinstance(records, list) else list(records))
        bad = _lengths(columns.topic) > MAX_TOPIC_BYTES
        if bad.any():
            i = int(np.argmax(bad))
            raise InvalidAppendError(f"record {i} of the batch: topic is {int(_lengths(columns.topic)[i])} bytes, "
                                     f"at most {MAX_TOPIC_BYTES} allowed")
        return columns

    @property
    def timestamps(self) -> np.ndarray:
        return self.ints["timestamp_ms"]

    def keys_array(self) -> pa.Array:
        """The keys as a large_list of the encoded texts (list offsets made relative)."""
        offsets = self.list_offsets - self.list_offsets[0]
        items = self.items.slice(int(self.list_offsets[0]), int(offsets[-1]))
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), items)

    def slice(self, start: int, stop: int) -> LogColumns:
        # list_offsets stay absolute positions in `items`, which is shared whole.
        return LogColumns(self.topic.slice(start, stop - start), self.key.slice(start, stop - start),
                        self.list_offsets[start : stop + 1], self.items,
                        {name: values[start:stop] for name, values in self.ints.items()})


def _lengths(array: pa.Array) -> np.ndarray:
    """Byte length of each element, 0 for nulls."""
    return pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


# ---- Arrow input ------------------------------------------------------------------------------
def records_from_table(table: pa.Table | pa.RecordBatch) -> list[MessageRecord]:
    """Rows of an APPEND_SCHEMA table (extra columns ignored) as MessageRecords, converted a
    column at a time. Values are not checked here (nulls become None): appending the records
    reports bad ones. Appends themselves take the table directly, which is much faster."""
    _require_append_columns(table)
    return list(map(MessageRecord, *(_python_values(_column(table, name)) for name in APPEND_SCHEMA.names)))


def _python_values(array: pa.Array) -> list:
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        items = _python_values(array.values)
        offsets = array.offsets.to_numpy().tolist()
        lists = [tuple(items[a:b]) for a, b in zip(offsets, offsets[1:])]
        if array.null_count:
            lists = [v if valid else None for v, valid in zip(lists, array.is_valid().to_pylist())]
        return lists
    if array.null_count and not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        return array.to_pylist()  # numpy would turn null integers into NaN floats
    return array.to_numpy(zero_copy_only=False).tolist()


def _require_append_columns(table: pa.Table | pa.RecordBatch) -> None:
    missing = [name for name in APPEND_SCHEMA.names if name not in table.schema.names]
    if missing:
        raise InvalidAppendError(f"appended table lacks column(s) {missing}; expected {APPEND_SCHEMA}")


def _column(table: pa.Table | pa.RecordBatch, name: str) -> pa.Array:
    array = table.column(name)
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array


def _columns_from_arrow(table: pa.Table | pa.RecordBatch) -> LogColumns:
    _require_append_columns(table)

    def column(name: str) -> pa.Array:
        return _column(table, name)

    topic = _arrow_text(column("topic"), "topic", nullable=False)
    key = _arrow_text(column("key"), "key", nullable=True)
    keys = column("keys")
    if not (pa.types.is_list(keys.type) or pa.types.is_large_list(keys.type)):
        raise InvalidAppendError(f"column 'keys' has type {keys.type}, expected a list of strings")
    _reject_nulls(keys, "keys", "a list of str")
    list_offsets = keys.offsets.to_numpy().astype(np.int64)
    items = keys.values
    used = items.slice(int(list_offsets[0]), int(list_offsets[-1] - list_offsets[0]))
    if used.null_count:
        first = int(np.argmax(~used.is_valid().to_numpy(zero_copy_only=False))) + int(list_offsets[0])
        record = int(np.searchsorted(list_offsets, first, side="right")) - 1
        raise InvalidAppendError(f"record {record} of the batch: keys item must be str, got None")
    items = _arrow_text(items, "keys item", nullable=True)
    ints = {name: _arrow_int(column(name), name, dtype) for name, dtype in INT_FIELDS.items()}
    return LogColumns(topic, key, list_offsets, items, ints)


def _reject_nulls(array: pa.Array, field: str, expected: str) -> None:
    if array.null_count:
        i = int(np.argmax(~array.is_valid().to_numpy(zero_copy_only=False)))
        raise InvalidAppendError(f"record {i} of the batch: {field} must be {expected}, got None")


def _arrow_text(array: pa.Array, field: str, *, nullable: bool) -> pa.Array:
    """A string column as encoded bytes (UTF-8 is what ``encode_text`` gives for Arrow's valid
    UTF-8 strings). Arrow does not promise valid UTF-8 in buffers it was handed, and a record
    that does not decode would make the log unreadable, so validity is checked."""
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if nullable and pa.types.is_null(array.type):  # e.g. an all-None key column built without a schema
        return pa.nulls(len(array), pa.large_binary())
    kind = array.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise InvalidAppendError(f"column for {field} has type {kind}, expected string")
    if not nullable:
        _reject_nulls(array, field, "str")
    try:
        array.validate(full=True)
    except pa.ArrowInvalid as e:
        raise InvalidAppendError(f"column for {field} holds invalid UTF-8: {e}") from None
    return array.cast(pa.large_binary())


def _arrow_int(array: pa.Array, field: str, dtype: type) -> np.ndarray:
    if not pa.types.is_integer(array.type):
        raise InvalidAppendError(f"column {field!r} has type {array.type}, expected an integer type")
    _reject_nulls(array, field, "an integer")
    try:
        return array.cast(pa.from_numpy_dtype(dtype), safe=True).to_numpy()
    except pa.ArrowInvalid:
        lo, hi = _BOUNDS[dtype]
        for i, value in enumerate(array.to_pylist()):
            if not lo <= value <= hi:
                raise InvalidAppendError(
                    f"record {i} of the batch: {field}={value!r} is not an integer in [{lo}, {hi}]"
                ) from None
        raise


# ---- MessageRecord input ----------------------------------------------------------------------
def _columns_from_records(records: list[MessageRecord]) -> LogColumns:
    if set(map(type, records)) - {MessageRecord}:
        for i, record in enumerate(records):
            if not isinstance(record, MessageRecord):
                raise InvalidAppendError(f"record {i} of the batch is a {type(record).__name__}, not a MessageRecord")

    # One comprehension per field: the cheapest way found to read attributes of many objects.
    topic = [r.topic for r in records]
    key = [r.key for r in records]
    keys = [r.keys for r in records]
    ints = {
        "partition": [r.partition for r in records],
        "offset": [r.offset for r in records],
        "timestamp_ms": [r.timestamp_ms for r in records],
        "commit_log_offset": [r.commit_log_offset for r in records],
        "size": [r.size for r in records],
    }
    # Fast path: C-level scans of the value types. Anything unusual (numpy integers, str
    # subclasses, or an invalid value) goes through the per-record check, which names the culprit.
    plain = (
        set(map(type, topic)) <= {str}
        and set(map(type, key)) <= {str, type(None)}
        and set(map(type, keys)) <= {tuple, list}
        and all(set(map(type, values)) <= {int} for values in ints.values())
    )
    items = list(chain.from_iterable(keys)) if plain else None
    if items is None or not set(map(type, items)) <= {str}:
        for i, record in enumerate(records):
            _check_record(record, f"record {i} of the batch")
        ints = {name: [operator.index(v) for v in values] for name, values in ints.items()}
        items = list(chain.from_iterable(keys))
    list_offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, keys), dtype=np.int64, count=len(keys)), out=list_offsets[1:])
    return LogColumns(_python_text(topic), _python_text(key), list_offsets, _python_text(items),
                    {name: _python_int(values, name, INT_FIELDS[name]) for name, values in ints.items()})


def _python_text(values: list) -> pa.Array:
    """Encoded texts (None stays null). Arrow refuses lone surrogates, which ``encode_text``
    keeps, so such a batch is encoded one text at a time."""
    try:
        return pa.array(values, pa.large_string()).cast(pa.large_binary())
    except (UnicodeEncodeError, pa.ArrowException):
        return pa.array([None if v is None else encode_text(v) for v in values], pa.large_binary())


def _python_int(values: list, field: str, dtype: type) -> np.ndarray:
    lo, hi = _BOUNDS[dtype]
    try:
        array = np.array(values, dtype=np.int64)
    except OverflowError:
        array = None
    if array is None or (dtype is np.int32 and len(array) and (array.min() < lo or array.max() > hi)):
        i = next(i for i, v in enumerate(values) if not lo <= v <= hi)
        raise InvalidAppendError(f"record {i} of the batch: {field}={values[i]!r} is not an integer in [{lo}, {hi}]")
    return array.astype(dtype, copy=False)


def _check_record(record: MessageRecord, where: str) -> None:
    """Raise InvalidAppendError naming the first field of `record` that cannot be stored."""
    for name, value in (("topic", record.topic), ("key", record.key)):
        if not isinstance(value, str) and not (name == "key" and value is None):
            raise InvalidAppendError(f"{where}: {name} must be str, got {type(value).__name__}")
    if not isinstance(record.keys, (tuple, list)):
        raise InvalidAppendError(f"{where}: keys must be a sequence of str (tuple or list), "
                                 f"got {type(record.keys).__name__}")
    for item in record.keys:
        if not isinstance(item, str):
            raise InvalidAppendError(f"{where}: keys item must be str, got {type(item).__name__}")
    for name, dtype in INT_FIELDS.items():
        value = getattr(record, name)
        lo, hi = _BOUNDS[dtype]
        try:
            valid = not isinstance(value, bool) and lo <= operator.index(value) <= hi
        except TypeError:
            valid = False
        if not valid:
            raise InvalidAppendError(f"{where}: {name}={value!r} is not an integer in [{lo}, {hi}]")

