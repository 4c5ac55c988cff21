"""Query helpers shared by shard and store lookups: key arguments, result order and limits."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from msgindex.errors import InvalidOptionError
from msgindex.storage.message import NO_VALUE, ROW_SCHEMA, MessageRecord, arrow_text, decode_key_bytes, shown_timestamps

KeysArg = str | bytes | Iterable[str | bytes]

# The stable order of query results; seq last so that equal rows (a message appended twice)
# still come out in one order.
RESULT_ORDER = [
    ("timestamp", "ascending"),
    ("broker", "ascending"),
    ("topic", "ascending"),
    ("partition", "ascending"),
    ("offset", "ascending"),
    ("seq", "ascending"),
]


def normalize_keys(keys: KeysArg) -> list[str]:
    """`keys` as a duplicate-free list of str. bytes are Kafka key bytes (decoded losslessly,
    the way the pipeline indexes them); a single str or bytes is one key, not an iterable."""
    if isinstance(keys, (str, bytes, bytearray, memoryview)):
        keys = [keys]
    result: dict[str, None] = {}
    try:
        items = list(keys)
    except TypeError:
        raise InvalidOptionError(f"keys must be a str, bytes or an iterable of them, got {type(keys).__name__}") from None
    for key in items:
        if isinstance(key, str):
            result[key] = None
        elif isinstance(key, (bytes, bytearray, memoryview)):
            result[decode_key_bytes(bytes(key))] = None
        else:
            raise InvalidOptionError(f"a lookup key must be str or bytes, got {type(key).__name__}: {key!r}")
    return list(result)


def validate_window(begin_ms: int | None, end_ms: int | None, max_results: int | None) -> None:
    """Reject arguments that are not what they claim (a bool or float as a timestamp...)."""
    for name, value in (("begin_ms", begin_ms), ("end_ms", end_ms), ("max_results", max_results)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidOptionError(f"{name} must be an int (milliseconds) or None, got {value!r}")
    if max_results is not None and max_results < 0:
        raise InvalidOptionError(f"max_results must be >= 0 or None, got {max_results}")


# One struct conversion costs about a third of ten column conversions for the few rows a key
# lookup returns (pyarrow's per-call overhead dominates there), and the same for many rows.
ROW_STRUCT = pa.struct(list(ROW_SCHEMA))


def rows_from_records(broker: str, seqs: list[int], records: list[MessageRecord]) -> pa.Table:
    """ROW_SCHEMA rows of `records` (stored at `seqs`), exactly as the log's read_rows renders
    them (texts through arrow_text, -1 commit-log offset / size as null), one record at a time:
    for tools holding MessageRecords, and the tests' reference for the log's vectorized rendering."""
    shown_broker = arrow_text(broker)
    rows = [
        (
            shown_broker,
            arrow_text(r.topic),
            r.partition,
            r.offset,
            None if r.key is None else arrow_text(r.key),
            [arrow_text(k) for k in r.keys],
            int(shown_timestamps(np.int64(r.timestamp_ms))) * 1000,
            None if r.commit_log_offset == NO_VALUE else r.commit_log_offset,
            None if r.size == NO_VALUE else r.size,
            seq,
        )
        for seq, r in zip(seqs, records)
    ]
    batch = pa.RecordBatch.from_struct_array(pa.array(rows, type=ROW_STRUCT))
    return pa.Table.from_batches([batch], schema=ROW_SCHEMA)


_EMPTY_ROWS = ROW_SCHEMA.empty_table()  # building one costs ~0.1 ms; Arrow tables are immutable


def empty_rows() -> pa.Table:
    return _EMPTY_ROWS


def sort_and_limit(tables: list[pa.Table], max_results: int | None) -> pa.Table:
    """Merge result tables that are each in RESULT_ORDER, keeping the first `max_results`. The
    result may hold several record batches: copying a big result into one costs as much as
    building it."""
    tables = [table for table in tables if table.num_rows]
    if not tables:
        return empty_rows()
    if len(tables) == 1:
        table = tables[0]
    else:
        table = pa.concat_tables(tables).sort_by(RESULT_ORDER)
    if max_results is not None and table.num_rows > max_results:
        table = table.slice(0, max_results)
    return table if table.num_rows else empty_rows()
