"""Bulk key lookups: every message indexed under any key of a DataFrame column, found by Spark
tasks with the store's many-key lookup, where a user would otherwise join the keys with a full
scan of the topic.

    found = lookup_keys(incident_ids, "/data/index", key_col="order_id", topic="orders")
    found.groupBy("lookup_key").count()
    incident_ids.join(found, incident_ids.order_id == found.lookup_key)   # back to the callers' rows

How it runs: up to ``max_collected_keys`` non-null keys of at most ``MAX_COLLECTED_BYTES`` (the
usual case) are collected to the driver when ``lookup_keys`` is called and shipped with the
lookup function to every task, like the small side of a broadcast join: one stage, no shuffle of
the keys. Task i of n looks up the keys whose position is i modulo n (``spark.range`` numbers the
tasks; Spark's default parallelism picks n, ``num_partitions`` fixes it) in every shard at once
(``Store.lookup``), then pairs each found message with the asked keys it is indexed under. Keys
are split, not the store's files: each key's hash chains are walked once in all, a task needs no
listing of the store (the driver may not see it: Spark Connect), and each key is answered from one
snapshot even while the store commits. Above the cap (or for a streaming keys DataFrame) the
distinct keys are hash-partitioned by Spark instead (adaptive query execution sizes the
partitions; ``num_partitions`` fixes their number) and each task looks its keys up the same way.
Both are plain DataFrame API (``mapInArrow``), so they run the same in a classic session and over
Spark Connect; the executors need msgindex installed and the index path reachable, as for
``format("msgindex")``.

Result columns: ``lookup_key`` (string, the asked key), then the data source's columns
(``msgindex.storage.message.ROW_SCHEMA``), or those of them named by ``columns``. One row per
(asked key, message): a message indexed under two asked keys appears twice, once under each. Keys:

* a ``string`` column of keys as rows show them (``\\xNN`` escapes are a key's bytes that are
  not UTF-8, ``\\x5c`` a backslash that would read as one: ``message.arrow_text``), as ``where
  key = ...`` takes them, so ``lookup_key`` is the asked string; or ``binary`` (raw Kafka key
  bytes, looked up exactly as the pipeline indexes them, ``lookup_key`` showing them as rows do);
* null keys are skipped (they match nothing, as in a join) and duplicates are looked up once;
* any other column type is an error naming the column and its type.

From SQL, register the result as a temporary view (see the README, "Bulk lookups")::

    lookup_keys(spark.table("incident_ids"), "/data/index", key_col="order_id") \\
        .createOrReplaceTempView("incident_messages")
    spark.sql("SELECT lookup_key, topic, partition, offset FROM incident_messages")
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import InvalidOptionError, StoreNotFoundError
from msgindex.spark.read.options import SESSION_TIME_ZONE_CONF, parse_names
from msgindex.storage.fields import SHAPE_SINGLE, check_field_names, store_fields
from msgindex.storage.message import ROW_SCHEMA, arrow_text, decode_key_bytes, exactly_shown
from msgindex.storage.query import Query
from msgindex.times import TimeArg, to_epoch_ms

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

LOOKUP_KEY = "lookup_key"
RESULT_SCHEMA = pa.schema([pa.field(LOOKUP_KEY, pa.string(), nullable=False), *ROW_SCHEMA])
KEY_TYPES = ("string", "binary")
# Keys per store lookup inside a task: bounds the lookup's working set (candidate lists, decoded
# records) while keeping the per-call cost (one hash pass, one walk per index file) amortised.
KEYS_PER_STORE_LOOKUP = 50_000
_KEY_COLUMN = "key"  # the single column of the repartitioned keys
# Keys collected to the driver and pickled with the task function (Spark broadcasts a big one once
# per executor; Connect sends it in the plan, whose gRPC limit is 128 MiB): a million short keys
# are ~15 MiB. More go the shuffle path, which never holds them in one process.
MAX_COLLECTED_KEYS = 1_000_000
MAX_COLLECTED_BYTES = 16 << 20
# Key slices when Spark's default parallelism sets the task count: each task takes the slices of
# its range of ids, so the split follows whatever parallelism the cluster has, up to this.
DEFAULT_KEY_SLICES = 1024


@dataclass(frozen=True)
class BulkLookup:
    """What one bulk lookup asks of the store, validated on the caller's side. It is also the
    function Spark runs in each task (``mapInArrow``), so it stays small and picklable."""

    path: str
    topic: str | None = None
    begin_ms: int | None = None
    end_ms: int | None = None
    brokers: tuple[str, ...] | None = None
    storage_options: tuple[tuple[str, str], ...] = ()  # an object store's client options
    field: str | None = None  # look the values up as this field's (storage/fields.py), not as keys
    columns: tuple[str, ...] | None = None  # ROW_SCHEMA's columns to return after lookup_key (None: all)

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from self.answer(_distinct_keys(batches))

    def answer(self, keys: list[str]) -> Iterator[pa.RecordBatch]:
        """RESULT_SCHEMA batches of every message indexed under `keys` (distinct str)."""
        if not keys:
            return
        from msgindex.storage.store import open_store

        try:
            store = open_store(self.path, storage_options=dict(self.storage_options) or None)
        except StoreNotFoundError as missing:
            raise StoreNotFoundError(f"lookup_keys: path {self.path!r}: {missing}") from None
        with store:
            brokers = self._brokers(store)
            indexed = None  # the field's (name, shape) as the store indexes it
            if self.field is not None:
                indexed, = check_field_names(store_fields(store), [self.field],
                                             lambda name: f"lookup_keys: field = {name!r}")
            for start in range(0, len(keys), KEYS_PER_STORE_LOOKUP):
                chunk = keys[start : start + KEYS_PER_STORE_LOOKUP]
                if self.field is not None:
                    query = Query.of(fields={self.field: chunk}, topic=self.topic, begin_ms=self.begin_ms,
                                     end_ms=self.end_ms, brokers=brokers, field_columns=[indexed])
                    found = store.lookup(query)
                    if found.num_rows:
                        name, shape = indexed
                        yield from with_lookup_keys(found, chunk, name, single=shape == SHAPE_SINGLE,
                                                    columns=self.columns).to_batches()
                    continue
                found = store.lookup(chunk, topic=self.topic, begin_ms=self.begin_ms,
                                     end_ms=self.end_ms, brokers=brokers)
                if found.num_rows:
                    yield from with_lookup_keys(found, chunk, columns=self.columns).to_batches()

    @property
    def schema(self) -> pa.Schema:
        """The schema of the batches ``answer`` yields."""
        return result_schema(self.columns)

    def _brokers(self, store) -> list[str] | None:
        if self.brokers is None:
            return None
        present = store.brokers()
        unknown = sorted(set(self.brokers) - set(present))
        if unknown:
            raise InvalidOptionError(
                f"lookup_keys: brokers = {','.join(self.brokers)!r}: no shard named {unknown[0]!r} "
                f"in {self.path} (shards: {', '.join(present)})"
            )
        return list(self.brokers)


@dataclass(frozen=True)
class CollectedKeysLookup:
    """The task function of the collected-keys path: its task's ids (``spark.range``) pick the key
    slices it answers, slice s holding the keys at positions s, s + slices, ... of `keys`."""

    lookup: BulkLookup
    keys: pa.Array  # distinct, non-null; string or binary (Kafka key bytes)
    slices: int

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ids = [batch.column(0).to_numpy() for batch in batches if batch.num_rows]
        if not ids:
            return
        mine = np.isin(np.arange(len(self.keys)) % self.slices, np.concatenate(ids))
        yield from self.lookup.answer(_as_lookup_keys(self.keys.filter(pa.array(mine))))


def lookup_keys(
    keys_df: DataFrame,
    path: str,
    key_col: str = "key",
    *,
    topic: str | None = None,
    begin: TimeArg | None = None,
    end: TimeArg | None = None,
    brokers: str | Iterable[str] | None = None,
    num_partitions: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    field: str | None = None,
    columns: Iterable[str] | None = None,
    max_collected_keys: int = MAX_COLLECTED_KEYS,
) -> DataFrame:
    """Every message of the index at `path` indexed under a key of ``keys_df[key_col]``, as a
    DataFrame of ``lookup_key`` + the data source's columns (see the module doc).

    `topic`: only messages of this topic (the index hashes ``topic#key``); `begin`/`end`: an
    inclusive time window, as people type times (``msgindex.times``: epoch ms, ISO-8601, ``-1h``,
    ``now``, a datetime; without a zone: in the session's time zone);
    `brokers`: only these shards; `num_partitions`: the number of lookup tasks (default: Spark's
    adaptive choice); `storage_options`: an object store's client options (``msgindex.open``'s);
    `field`: the column holds values of this indexed field (``msgindex index --index-field``), not
    keys: every message carrying one, ``lookup_key`` the value it carries.
    `columns`: only these of the data source's columns after ``lookup_key`` (default: all). Spark
    prunes a Parquet scan to the columns a query reads but cannot prune what a Python function
    returns: naming them spares Spark converting the rest of every row (BENCHMARKS.md).
    `max_collected_keys`: up to this many non-null keys (and MAX_COLLECTED_BYTES of them) are
    collected to the driver (a job, when lookup_keys is called) and shipped to the tasks, no
    shuffle; more, or 0, hash-partitions them instead (the keys DataFrame is then computed twice:
    cache an expensive one) (see the module doc). Bad arguments raise
    InvalidOptionError naming the argument and value; WorkerPythonError when Spark's local Python
    workers cannot import msgindex."""
    zone = keys_df.sparkSession.conf.get(SESSION_TIME_ZONE_CONF) if begin is not None or end is not None else None
    query = BulkLookup(
        path=_path(path),
        topic=_topic(topic),
        begin_ms=_time_ms("begin", begin, zone),
        end_ms=_time_ms("end", end, zone),
        brokers=_brokers(brokers),
        storage_options=tuple(sorted((storage_options or {}).items())),
        field=_field(field),
        columns=_columns(columns),
    )
    if query.begin_ms is not None and query.end_ms is not None and query.begin_ms > query.end_ms:
        raise InvalidOptionError(f"lookup_keys: begin = {begin!r} is after end = {end!r}")
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from msgindex.spark.runtime.worker_python import check_worker_python

    column = _key_column(keys_df, key_col)
    limit = _non_negative("max_collected_keys", max_collected_keys)
    if num_partitions is not None:
        _positive("num_partitions", num_partitions)
    check_worker_python(keys_df.sparkSession)
    keys = keys_df.select(column.alias(_KEY_COLUMN)).where(F.col(_KEY_COLUMN).isNotNull())
    schema = from_arrow_schema(query.schema)
    collected = _collected_keys(keys, limit)
    if collected is not None:
        slices = num_partitions or max(1, min(len(collected), DEFAULT_KEY_SLICES))
        tasks = keys_df.sparkSession.range(0, slices, 1, num_partitions)
        return tasks.mapInArrow(CollectedKeysLookup(query, collected, slices), schema)
    if num_partitions is None:
        keys = keys.repartition(F.col(_KEY_COLUMN))
    else:
        keys = keys.repartition(num_partitions, F.col(_KEY_COLUMN))
    return keys.mapInArrow(query, schema)


def _collected_keys(keys: DataFrame, limit: int) -> pa.Array | None:
    """The distinct keys of `keys` (its one non-null column), collected in one job when there are
    at most `limit` rows of them and MAX_COLLECTED_BYTES (at most limit + 1 rows reach the driver);
    None: more, or a stream."""
    if limit == 0 or keys.isStreaming:
        return None
    # Spark runs a limit before an Arrow collect as a shuffle into one partition: 0.1-0.15 s of a
    # 100,000-key lookup (BENCHMARKS.md). Where Spark's own size estimate (an upper bound for
    # local data, projections and filters: what its broadcast joins trust) says the keys are
    # small, they are collected without it; the checks below still apply.
    estimate = _estimated_bytes(keys)
    small = estimate is not None and estimate <= MAX_COLLECTED_BYTES
    column = (keys if small else keys.limit(limit + 1)).toArrow().column(0)
    column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if len(column) > limit or column.nbytes > MAX_COLLECTED_BYTES:
        return None
    return pc.unique(column)


def _estimated_bytes(keys: DataFrame) -> int | None:
    """Spark's estimate of `keys`' size in bytes (its optimized plan's statistics); None where
    the session does not expose it (Spark Connect) or cannot tell."""
    try:
        estimate = keys._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()
    except Exception:  # noqa: BLE001 - Connect has no JVM side (AttributeError); an estimate only picks how to collect
        return None
    return estimate if isinstance(estimate, int) and estimate >= 0 else None


def with_lookup_keys(found: pa.Table, asked: list[str], column: str = "keys", *, single: bool = False,
                     columns: tuple[str, ...] | None = None) -> pa.Table:
    """`found` (ROW_SCHEMA rows of a lookup of `asked`, maybe with field columns after them) with
    the asked keys each row is indexed under in front, one row per (asked key, row), in
    RESULT_SCHEMA (`columns`: only these after lookup_key). The asked key a row carries is read
    from `column` (``asked_positions``: the keys, or the looked-up field's column as the lookup
    rendered it, ``Query.field_columns``)."""
    wanted = shown_keys(asked)
    row, which = asked_positions(found, wanted, column, single=single)
    # a key repeated inside one message (RocketMQ KEYS may repeat; a repeated header's value) pairs once; order kept
    _, first = np.unique(row * len(wanted) + which, return_index=True)
    first.sort()
    row, which = row[first], which[first]
    names = [f.name for f in ROW_SCHEMA] if columns is None else list(columns)
    if found.column_names != names:
        found = found.select(names)
    # one asked key per row, the usual case: the rows as they are (a take copies every column)
    rows = found if np.array_equal(row, np.arange(found.num_rows)) else found.take(pa.array(row))
    return pa.Table.from_arrays([wanted.take(pa.array(which)), *rows.columns], schema=result_schema(columns))


def result_schema(columns: tuple[str, ...] | None = None) -> pa.Schema:
    """RESULT_SCHEMA, or lookup_key and `columns` of it (ROW_SCHEMA's names)."""
    if columns is None:
        return RESULT_SCHEMA
    return pa.schema([RESULT_SCHEMA.field(name) for name in (LOOKUP_KEY, *columns)])


def shown_keys(asked: list[str]) -> pa.Array:
    """The asked keys as rows show them (``arrow_text``), positions kept. Valid UTF-8 without a
    backslash shows as itself: such keys (nearly all) skip the call per key (~1 us each)."""
    try:
        plain = pa.array(asked, pa.string())
    except (pa.ArrowException, UnicodeError):  # a lone surrogate (only the Python API makes one)
        plain = None
    if plain is not None and not pc.any(pc.match_substring(plain, "\\")).as_py():
        return plain
    return pa.array([arrow_text(key) for key in asked], pa.string())


def asked_positions(found: pa.Table, wanted: pa.Array, column: str = "keys", *,
                    single: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(row, position in `wanted`) of every key of every row of `found` that is in `wanted`
    (shown keys). The store does not say which asked key found a row, so it is read back from
    the row's ``keys``, which hold every key the message is indexed under, as rows show them
    (or from the list `column`: an array field's values; `single`: a string column, a single
    field's value)."""
    keys = found[column].combine_chunks()
    if single:
        flat, row = keys, np.arange(len(keys))
    else:
        flat, row = pc.list_flatten(keys), pc.list_parent_indices(keys).to_numpy()
    which = pc.index_in(flat, value_set=wanted).to_numpy(zero_copy_only=False)  # NaN: not asked
    hit = ~np.isnan(which)
    return row[hit], which[hit].astype(np.int64)


def first_asked(found: pa.Table, wanted: pa.Array, column: str = "keys") -> np.ndarray:
    """For each row of `found`, the position in `wanted` of the first wanted key it is indexed
    under (-1: none; `column`: as ``asked_positions``)."""
    row, which = asked_positions(found, wanted, column)
    first = np.full(found.num_rows, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, row, which)
    first[first == np.iinfo(np.int64).max] = -1
    return first


def _distinct_keys(batches: Iterable[pa.RecordBatch]) -> list[str]:
    """The task's keys as the store's lookup wants them (str; bytes decoded losslessly), once each."""
    chunks = [batch.column(0) for batch in batches if batch.num_rows]
    if not chunks:
        return []
    return _as_lookup_keys(pc.unique(pa.chunked_array(chunks).drop_null()))


def _as_lookup_keys(keys: pa.Array | pa.ChunkedArray) -> list[str]:
    """Distinct keys (string: as rows show them; binary: Kafka key bytes decoded losslessly) as
    the store's lookup takes them. A string no row shows (``\\x41``: a row shows ``A``) finds
    nothing, as in a ``where``: the rows found must show the asked key, ``lookup_key``."""
    if pa.types.is_binary(keys.type) or pa.types.is_large_binary(keys.type):
        return [decode_key_bytes(raw) for raw in keys.to_pylist()]
    return [text for text in map(exactly_shown, keys.to_pylist()) if text is not None]


def _key_column(keys_df: DataFrame, key_col: str):
    from pyspark.sql import functions as F

    if not isinstance(key_col, str):
        raise InvalidOptionError(f"lookup_keys: key_col = {key_col!r} is not a column name")
    fields = {field.name: field for field in keys_df.schema.fields}
    if key_col not in fields:
        raise InvalidOptionError(
            f"lookup_keys: key_col = {key_col!r} is not a column of the keys DataFrame "
            f"(its columns: {', '.join(fields) or 'none'})"
        )
    type_name = fields[key_col].dataType.simpleString()
    if type_name not in KEY_TYPES:
        raise InvalidOptionError(
            f"lookup_keys: key column {key_col!r} is {type_name}; keys must be string or binary "
            f"(e.g. keys_df.withColumn({key_col!r}, keys_df[{key_col!r}].cast('string')))"
        )
    return F.col("`" + key_col.replace("`", "``") + "`")


def _path(path: object) -> str:
    if isinstance(path, os.PathLike):  # a pathlib.Path, as msgindex.open takes
        path = os.fspath(path)
    if not isinstance(path, str) or not path.strip():
        raise InvalidOptionError(f"lookup_keys: path = {path!r} is not a path")
    return path


def _topic(topic: object) -> str | None:
    if topic is None:
        return None
    if not isinstance(topic, str) or not topic or "," in topic:
        raise InvalidOptionError(f"lookup_keys: topic = {topic!r} is not one topic name")
    return topic


def _brokers(brokers: object) -> tuple[str, ...] | None:
    if brokers is None:
        return None
    if isinstance(brokers, str):
        return parse_names("brokers", brokers)
    names = tuple(brokers)  # type: ignore[arg-type]
    if not names or not all(isinstance(name, str) and name for name in names):
        raise InvalidOptionError(f"lookup_keys: brokers = {brokers!r} is not a list of shard names")
    return names


def _time_ms(name: str, value: TimeArg | None, zone: str | None) -> int | None:
    try:
        return to_epoch_ms(name, value, zone=zone)
    except InvalidOptionError as bad:
        raise InvalidOptionError(f"lookup_keys: {str(bad).replace('option ', '', 1)}") from None


def _non_negative(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidOptionError(f"lookup_keys: {name} = {value!r} is not an integer >= 0")
    return value


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidOptionError(f"lookup_keys: {name} = {value!r} is not a positive integer")
    return value


def _columns(columns: object) -> tuple[str, ...] | None:
    if columns is None:
        return None
    try:
        names = (columns,) if isinstance(columns, str) else tuple(columns)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidOptionError(f"lookup_keys: columns = {columns!r} is not a list of column names") from None
    known = [field.name for field in ROW_SCHEMA]
    for name in names:
        if name not in known and name != LOOKUP_KEY:
            raise InvalidOptionError(f"lookup_keys: columns: {name!r} is not a column of the result "
                                     f"({LOOKUP_KEY} always comes first; the others: {', '.join(known)})")
    if len(set(names)) != len(names):
        raise InvalidOptionError(f"lookup_keys: columns = {list(names)!r} names a column twice")
    return tuple(name for name in names if name != LOOKUP_KEY)


def _field(field: object) -> str | None:
    if field is None:
        return None
    if not isinstance(field, str) or not field or "\x00" in field:
        raise InvalidOptionError(f"lookup_keys: field = {field!r} is not a field name")
    return field
