"""Input shape ``records``: the indexed topics' own Kafka records.

A record is indexed under its key, every non-empty space-separated token of its ``KEYS``
header(s) and its ``UNIQ_KEY`` header(s) (RocketMQ's property names), each key once: the one rule
of ``storage.rocketmq.message_keys``, applied to the decoded header values. Null and
empty keys are not indexed (the record is still logged and counted as unkeyed). Key bytes that
are not UTF-8 are indexed as ``message.decode_key_bytes(raw)``: query them by passing the raw
``bytes`` to ``Store.lookup``. Payloads are never read, except for a record set aside: one whose
timestamp breaks the one timestamp rule (timestamp_rule.py) goes to the quarantine with its value
and the reason, exactly once by its offset, as malformed metadata events do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.spark.pipeline.field_values import field_columns, field_pairs, header_values, pairs_of_rows
from msgindex.spark.pipeline.quarantine import RAW_VALUE, REASON
from msgindex.spark.pipeline.timestamp_rule import timestamp_reason
from msgindex.storage.fields import FieldDefinition
from msgindex.storage.message import (
    APPEND_SCHEMA,
    FIELDS_COLUMN,
    KEYS_PROPERTY,
    NO_VALUE,
    UNIQ_KEY_PROPERTY,
    MessageRecord,
    decode_key_bytes,
)
from msgindex.storage.rocketmq.message_keys import message_keys

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

KEY_RAW, KEYS_HEADERS, UNIQ_HEADERS = "key_raw", "keys_headers", "uniq_headers"


def project_records(kafka_df: DataFrame, broker: Column, fields: Sequence[FieldDefinition] = ()) -> DataFrame:
    """Kafka source rows (read with includeHeaders=true) -> the metadata the index needs, with
    `broker` as the shard column (``record_columns``)."""
    return kafka_df.select(*record_columns(broker, fields))


def record_columns(broker: Column, fields: Sequence[FieldDefinition] = ()) -> list[Column]:
    """The columns ``project_records`` selects from Kafka source rows: the metadata the index
    needs, with `broker` as the shard column; header values travel as bytes, decoded on the
    executor. A record whose timestamp breaks the rule gets a ``reason`` and (only then) its
    value. The values of `fields` come as one column each (field_values.field_columns). Columns
    are expressions, not bound to a DataFrame: a job builds them once and selects them from every
    micro-batch (building them is ~370 Py4J round trips, 0.13-0.3 s of a 1 s trigger here)."""
    from pyspark.sql import functions as F

    timestamp_ms = F.expr("unix_millis(timestamp)")
    reason = timestamp_reason(timestamp_ms)
    return [
        broker.alias("broker"),
        F.col("topic"), F.col("partition"), F.col("offset"),
        timestamp_ms.alias("timestamp_ms"),
        F.col("key").alias(KEY_RAW),
        header_values(KEYS_PROPERTY).alias(KEYS_HEADERS),
        header_values(UNIQ_KEY_PROPERTY).alias(UNIQ_HEADERS),
        reason.alias(REASON),
        F.when(reason.isNotNull(), F.col("value")).alias(RAW_VALUE),
        *field_columns(fields),
    ]


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return decode_key_bytes(raw)


def _record_keys(key: str | None, keys_headers: list | None, uniq_headers: list | None) -> tuple[str, ...]:
    """A record's keys from its decoded key and raw header values (null header values carry none)."""
    return message_keys(key, (_decode(raw) for raw in keys_headers or () if raw is not None),
                        (_decode(raw) for raw in uniq_headers or () if raw is not None))


def records_to_append(table: pa.Table, fields: Sequence[FieldDefinition] = ()
                      ) -> tuple[pa.Table | list[MessageRecord], int, dict[str, list[int]]]:
    """One group of projected records -> (what to append, number of records whose own key is
    null or empty, per field its counts: field_values.field_pairs). Usually an Arrow table of
    ``APPEND_SCHEMA`` (and the ``fields`` column with fields) built with Arrow kernels (the
    shard's fast path); MessageRecords only when some key or header is not UTF-8, because keys
    decoded from such bytes hold lone surrogates, which Arrow strings cannot carry."""
    pairs, counts = field_pairs(table, fields) if fields else (None, {})
    try:
        primary = table.column(KEY_RAW).cast(pa.string()).combine_chunks()
        keys = _index_keys(table, primary)
    except (pa.ArrowInvalid, UnicodeEncodeError):
        records, unkeyed = _message_records(table)
        if pairs is not None:
            records = [replace(record, fields=carried) for record, carried in zip(records, pairs_of_rows(pairs))]
        return records, unkeyed, counts
    keyed = pc.fill_null(pc.greater(pc.binary_length(primary), 0), False)
    rows = table.num_rows
    columns = {
        "topic": table.column("topic"),
        "partition": table.column("partition").cast(pa.int32()),
        "offset": table.column("offset").cast(pa.int64()),
        "timestamp_ms": table.column("timestamp_ms").cast(pa.int64()),
        "key": primary,
        "keys": keys,
        "commit_log_offset": pa.array(np.full(rows, NO_VALUE, np.int64)),
        "size": pa.array(np.full(rows, NO_VALUE, np.int32)),
    }
    unkeyed = rows - pc.sum(keyed).as_py() if rows else 0
    if pairs is None:
        return pa.table(columns, schema=APPEND_SCHEMA), unkeyed, counts
    return pa.table({**columns, "fields": pairs}, schema=pa.schema([*APPEND_SCHEMA, FIELDS_COLUMN])), unkeyed, counts


def _index_keys(table: pa.Table, primary: pa.Array) -> pa.Array:
    """The ``keys`` column: the record's own non-empty key, then header tokens, each once. Rows
    without KEYS/UNIQ_KEY headers (the usual case) are built without per-row Python."""
    keys_type = APPEND_SCHEMA.field("keys").type
    with_headers = pc.or_(
        pc.fill_null(pc.greater(pc.list_value_length(table.column(KEYS_HEADERS)), 0), False),
        pc.fill_null(pc.greater(pc.list_value_length(table.column(UNIQ_HEADERS)), 0), False),
    ).combine_chunks() if table.num_rows else pa.array([], pa.bool_())
    if not pc.any(with_headers).as_py():
        keyed = pc.fill_null(pc.greater(pc.binary_length(primary), 0), False).to_numpy(zero_copy_only=False)
        offsets = np.concatenate([[0], np.cumsum(keyed, dtype=np.int32)]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), primary.filter(pa.array(keyed)), type=keys_type)
    header_rows = with_headers.to_numpy(zero_copy_only=False)
    key_list = primary.to_pylist()
    keys_headers = table.column(KEYS_HEADERS).to_pylist()
    uniq_headers = table.column(UNIQ_HEADERS).to_pylist()
    return pa.array(
        [list(_record_keys(key, keys_headers[row], uniq_headers[row])) if header_rows[row]
         else ([key] if key else []) for row, key in enumerate(key_list)],
        type=keys_type,
    )


def _decoded_keys(column: pa.ChunkedArray) -> list[str | None]:
    """Key bytes -> str, vectorized when the whole column is UTF-8 (the usual case)."""
    try:
        return column.cast(pa.string()).to_pylist()
    except pa.ArrowInvalid:  # some key is not UTF-8: decode one by one
        return [None if raw is None else _decode(raw) for raw in column.to_pylist()]


def _message_records(table: pa.Table) -> tuple[list[MessageRecord], int]:
    primary = _decoded_keys(table.column(KEY_RAW))
    names = ("topic", "partition", "offset", "timestamp_ms", KEYS_HEADERS, UNIQ_HEADERS)
    columns = [table.column(name).to_pylist() for name in names]
    records = [
        MessageRecord(topic, partition, offset, timestamp_ms, key,
                      _record_keys(key, keys_headers, uniq_headers) if keys_headers or uniq_headers
                      else ((key,) if key else ()))
        for key, (topic, partition, offset, timestamp_ms, keys_headers, uniq_headers) in zip(primary, zip(*columns))
    ]
    return records, sum(1 for key in primary if not key)
