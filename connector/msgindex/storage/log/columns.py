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
from msgindex.storage.int_limits import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN
from msgindex.storage.message import (
    APPEND_SCHEMA,
    FIELD_NAME_END,
    FIELD_TERM_MARKER,
    MessageRecord,
    encode_text,
    field_term,
)

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
    keys are list offsets into `items` (absolute positions in it), each record's keys followed by
    its field terms (``message.field_term``: the log and the hash index treat both as the record's
    index terms); `key` is null where there is no key. Build with ``LogColumns.of``."""

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
    if "fields" in table.schema.names:
        list_offsets, items = with_field_terms(list_offsets, items, column("fields"))
    return LogColumns(topic, key, list_offsets, items, ints)


def with_field_terms(list_offsets: np.ndarray, items: pa.Array, fields: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Each record's key items followed by the field terms of its `fields` (a list of (name,
    value) structs; a null list: none), as new list offsets into new items."""
    if not (pa.types.is_list(fields.type) or pa.types.is_large_list(fields.type)) or not pa.types.is_struct(
            fields.type.value_type) or {"name", "value"} - {f.name for f in fields.type.value_type}:
        raise InvalidAppendError(f"column 'fields' has type {fields.type}, expected a list of (name, value) structs")
    field_offsets = fields.offsets.to_numpy().astype(np.int64)
    if fields.null_count:  # a null list's offsets may still span items: count none for it
        valid = fields.is_valid().to_numpy(zero_copy_only=False)
        counts = np.where(valid, np.diff(field_offsets), 0)
        starts = field_offsets[:-1]
    else:
        counts, starts = np.diff(field_offsets), field_offsets[:-1]
    if not counts.any():
        return list_offsets, items
    owner, within = ranges_owner(counts)
    pairs = fields.values.take(pa.array(starts[owner] + within))
    names = _arrow_text(pairs.field("name"), "fields name", nullable=False)
    values = _arrow_text(pairs.field("value"), "fields value", nullable=False)
    for name in pc.unique(names).to_pylist():
        problem = _field_name_problem(name)
        if problem:
            record = int(owner[int(np.argmax(pc.equal(names, name).to_numpy(zero_copy_only=False)))])
            raise InvalidAppendError(f"record {record} of the batch: field name {name!r}: {problem}")
    empty = pc.equal(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)
    if empty.any():
        raise InvalidAppendError(f"record {int(owner[int(np.argmax(empty))])} of the batch: a field value is empty")
    named = pc.binary_join_element_wise(names, values, pa.scalar(FIELD_NAME_END, pa.large_binary()))
    terms = pc.binary_join_element_wise(pa.scalar(FIELD_TERM_MARKER, pa.large_binary()), named,
                                        pa.scalar(b"", pa.large_binary()))
    key_counts = np.diff(list_offsets)
    merged_offsets = np.zeros(len(key_counts) + 1, dtype=np.int64)
    np.cumsum(key_counts + counts, out=merged_offsets[1:])
    key_owner, key_within = ranges_owner(key_counts)
    take = np.empty(int(merged_offsets[-1]), dtype=np.int64)
    take[merged_offsets[key_owner] + key_within] = list_offsets[:-1][key_owner] + key_within
    take[merged_offsets[owner] + key_counts[owner] + within] = len(items) + np.arange(len(terms))
    return merged_offsets, pa.concat_arrays([items.cast(pa.large_binary()), terms]).take(pa.array(take))


def ranges_owner(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For consecutive ranges of `counts` items: each item's range number and place in it."""
    owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    return owner, np.arange(len(owner), dtype=np.int64) - starts[owner]


def _field_name_problem(name: bytes) -> str | None:
    """Why the log refuses a field name (its bytes), or None. A name ends its term at the first
    NUL, so it holds none; the full naming rule is the pipeline's (fields.name_problem)."""
    if not name:
        return "a field name is not empty"
    if FIELD_NAME_END in name:
        return "a field name holds no NUL"
    return None


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
    fields = [r.fields for r in records]
    with_fields = any(fields)
    items = list(chain.from_iterable(keys)) if plain and not with_fields else None
    if items is None or not set(map(type, items)) <= {str}:
        for i, record in enumerate(records):
            _check_record(record, f"record {i} of the batch")
        ints = {name: [operator.index(v) for v in values] for name, values in ints.items()}
        items = list(chain.from_iterable(keys))
    if with_fields:  # each record's keys, then its field terms (rare in Python input: one at a time)
        keys = [(*map(encode_text, k), *(field_term(n, v) for n, v in f)) for k, f in zip(keys, fields)]
        encoded = pa.array(list(chain.from_iterable(keys)), pa.large_binary())
    list_offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, keys), dtype=np.int64, count=len(keys)), out=list_offsets[1:])
    return LogColumns(_python_text(topic), _python_text(key), list_offsets,
                      encoded if with_fields else _python_text(items),
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
    if not isinstance(record.fields, (tuple, list)):
        raise InvalidAppendError(f"{where}: fields must be a sequence of (name, value) pairs, "
                                 f"got {type(record.fields).__name__}")
    for pair in record.fields:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise InvalidAppendError(f"{where}: a fields item must be a (name, value) pair of str, got {pair!r}")
        problem = _field_name_problem(encode_text(pair[0])) or (None if pair[1] else "a field value is empty")
        if problem:
            raise InvalidAppendError(f"{where}: field {pair[0]!r}: {problem}")
    for name, dtype in INT_FIELDS.items():
        value = getattr(record, name)
        lo, hi = _BOUNDS[dtype]
        try:
            valid = not isinstance(value, bool) and lo <= operator.index(value) <= hi
        except TypeError:
            valid = False
        if not valid:
            raise InvalidAppendError(f"{where}: {name}={value!r} is not an integer in [{lo}, {hi}]")

