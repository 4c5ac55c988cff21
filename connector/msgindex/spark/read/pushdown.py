"""Which Spark filters the index answers exactly, and the query they add up to.

A filter is accepted only when the rows the index returns for it are exactly the rows Spark's
own evaluation would keep; everything else goes back to Spark, which re-checks it.

* ``broker``, ``topic``, ``partition`` ``=`` / ``IN``: select shards, index keys (the index hashes
  ``topic#key``) and partitions; exact.
* ``timestamp`` ``>``, ``>=``, ``<``, ``<=``, ``=``: the index keeps milliseconds and Spark
  microseconds, so each bound is turned into the inclusive millisecond bound that selects the
  same rows (e.g. ``timestamp > 10.0005 s`` -> ``begin_ms = 10001``); exact.
* ``key`` ``=`` / ``IN`` / ``<=>``: the ``key`` column is the message's *primary* key, while the
  index finds a message under *any* of its ``keys``. A non-empty primary key is always one of
  the keys (a shard refuses a record otherwise: ``shard.refuse_unindexed_keys``), so the index
  lookup returns a superset and the reader then keeps only rows whose ``key`` equals one of the
  values: exact, and still never a scan. An empty key is indexed under nothing (the pipeline
  logs a record with an empty Kafka key unkeyed): a filter asking for ``''`` goes to Spark.
* ``any_key`` ``=`` / ``IN`` / ``<=>``: "indexed under this key", whatever the primary key: the
  hash index lookup itself, exact. ``any_key`` is a column of the pushdown source only
  (``enable_pushdown``): in each row found by a key lookup it holds the first asked key the
  message is indexed under (so ``any_key IN ('a', 'b')`` returns a message under both once, and
  Spark's own check of the condition on that row agrees); outside key lookups it is null.

* a field column (``msgindex.storage.fields``: one per field the store indexes) ``=`` / ``IN`` /
  ``<=>``, for a field of shape ``single``; ``any_<name>`` ``=`` / ``IN`` / ``<=>`` for one of
  shape ``array`` (its column is an array; ``any_<name>`` is its lookup column, as ``any_key`` is
  of ``keys``): the hash index lookup of those values, exact (a row shows a field's values from
  the record's stored field terms, the very terms the lookup finds: a record indexed before the
  field existed shows null there and is not found, and the storage layer warns of that range).
  Filters on several fields (and with ``any_key`` / ``key``) intersect: one field's values drive
  the lookup, the found rows are then kept where the other conditions hold on their columns.
  ``any_<name>`` holds, in rows found by a filter on it, the first asked value the record
  carries; null otherwise (so a scan never satisfies it: use ``IN``, not ``OR``).

Why a column and not ``array_contains(keys, v)``: Spark hands a Python data source only
comparisons of a column with literals (``EqualTo``, ``In``, ``GreaterThan``..., ``IsNull``,
``StringStartsWith``...: ``pyspark.sql.datasource``); for ``array_contains(keys, 'x')`` it passes
``IsNotNull(keys)`` and nothing else, so that condition is always a scan. Nor does Spark turn
``any_key = 'a' OR any_key = 'b'`` into ``IN``: an OR is evaluated by Spark over a scan, where
``any_key`` is null, and finds nothing; write ``any_key IN ('a', 'b')``.

Several filters on one column intersect, as Spark ANDs them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

from msgindex.spark.read.options import ReadOptions, session_zone
from msgindex.storage.fields import LOOKUP_COLUMN_PREFIX, SHAPE_SINGLE
from msgindex.storage.message import exactly_shown, text_of_shown
from msgindex.storage.query import Query
from msgindex.times import micros_since_epoch

STRING_COLUMNS = ("broker", "topic", "key")
ANY_KEY_COLUMN = "any_key"
INT_COLUMNS = ("partition",)
TIME_COLUMN = "timestamp"
MICROS_PER_MS = 1000


@dataclass(frozen=True)
class IndexQuery:
    """What one read asks of the store: the options and the accepted filters, combined.

    ``lookup_keys`` are looked up in the hash index (None: no key, so a scan): the key options
    and ``any_key`` filters, intersected; ``primary_keys`` restrict the ``key`` column afterwards.
    None in any field means "no restriction"."""

    lookup_keys: tuple[str, ...] | None = None
    primary_keys: frozenset[str] | None = None
    topics: frozenset[str] | None = None
    brokers: frozenset[str] | None = None
    partitions: frozenset[int] | None = None
    begin_ms: int | None = None
    end_ms: int | None = None
    max_results: int | None = None
    fields: tuple[tuple[str, str], ...] | None = None  # field values to look up (the field.<name> options)
    # the store's fields as columns: (name, shape) in name order (``batch_format.field_columns``)
    field_columns: tuple[tuple[str, str], ...] = ()
    # pushed filters on field columns: (field name, values a row's field must hold one of), a
    # field at most once (several filters on it intersect), in the order pushed
    field_filters: tuple[tuple[str, frozenset[str]], ...] = ()

    @classmethod
    def from_options(cls, options: ReadOptions, field_columns: tuple[tuple[str, str], ...] = ()) -> IndexQuery:
        """The query the options alone ask for (rows showing the fields `field_columns`)."""
        return cls(
            field_columns=field_columns,
            fields=options.fields,
            lookup_keys=options.keys,
            topics=_set(options.topics),
            brokers=_set(options.brokers),
            partitions=_set(options.partitions),
            begin_ms=options.begin_ms,
            end_ms=options.end_ms,
            max_results=options.max_num,
        )

    @property
    def is_lookup(self) -> bool:
        """True when the hash index drives the read (a key is known); else a (time) scan."""
        return self.lookup_keys is not None or self.primary_keys is not None or self.by_fields

    @property
    def by_fields(self) -> bool:
        """True when field values drive the lookup (options or pushed filters on field columns)."""
        return self.fields is not None or bool(self.field_filters)

    def field_pairs(self) -> tuple[tuple[str, str], ...]:
        """The (field, value) pairs a field-driven lookup asks the index for: the ``field.<name>``
        options, else the values of the pushed field filter with the fewest (the other pushed
        conditions are checked on the rows found, ``field_filters``)."""
        if self.fields is not None:
            return self.fields
        name, values = min(self.field_filters, key=lambda item: len(item[1]))
        return tuple((name, text_of_shown(value)) for value in sorted(values))

    @property
    def keys_to_look_up(self) -> tuple[str, ...]:
        """Index keys to look up: the key options, else the ``key`` column's wanted values (as
        rows show them: ``message.text_of_shown`` gives the keys; the rows found are then kept
        only where their shown ``key`` is a wanted value, so the answer is exact either way)."""
        if self.lookup_keys is not None:
            return self.lookup_keys
        return tuple(sorted({text_of_shown(key) for key in self.primary_keys or ()}))

    @property
    def is_empty(self) -> bool:
        """True when the restrictions contradict each other: no row can match."""
        empty_set = any(
            values is not None and not values
            for values in (self.primary_keys, self.topics, self.brokers, self.partitions)
        )
        empty_keys = self.lookup_keys is not None and not self.lookup_keys
        empty_set = empty_set or any(not values for _, values in self.field_filters)
        empty_window = (self.begin_ms is not None and self.end_ms is not None
                        and self.begin_ms > self.end_ms)
        return empty_set or empty_keys or empty_window

    def store_query(self, keys: Iterable[str] | None, brokers: Iterable[str]) -> Query:
        """The storage Query that reads `keys` (None: a scan) from the shards `brokers` under
        this query's restrictions (``primary_keys`` are the reader's to apply afterwards)."""
        return Query.of(keys, topics=self.topics, brokers=brokers, partitions=self.partitions,
                        begin_ms=self.begin_ms, end_ms=self.end_ms, max_results=self.max_results,
                        fields=self.field_pairs() if keys is not None and self.by_fields else None,
                        field_columns=self.field_columns)

    def within(self, begin_ms: int | None, end_ms: int | None) -> IndexQuery:
        """This query with its window narrowed to [begin_ms, end_ms] (None: no bound)."""
        return replace(self, begin_ms=_tighter(self.begin_ms, begin_ms, max), end_ms=_tighter(self.end_ms, end_ms, min))

    def restrict(self, filter_: Filter) -> IndexQuery | None:
        """This query narrowed by `filter_`, or None when the index cannot apply it exactly."""
        path = getattr(filter_, "attribute", ())  # Not(...) has none: never accepted
        column = path[0] if len(path) == 1 else None
        field = self._filtered_field(column)
        if field is not None:
            values = _equality_values(filter_, str)
            if values is None:
                return None
            values = _exactly_shown(values)
            current = dict(self.field_filters)
            current[field] = values if field not in current else current[field] & values
            return replace(self, field_filters=tuple(current.items()))
        if column == ANY_KEY_COLUMN:
            values = _equality_values(filter_, str)
            if values is None:
                return None
            wanted = {text_of_shown(value) for value in _exactly_shown(values)}
            current = self.lookup_keys
            return replace(self, lookup_keys=tuple(sorted(wanted)) if current is None
                           else tuple(key for key in current if key in wanted))
        if column in STRING_COLUMNS or column in INT_COLUMNS:
            values = _equality_values(filter_, str if column in STRING_COLUMNS else int)
            if values is None or (column == "key" and "" in values):
                return None  # (an empty key is logged but indexed under nothing: only a scan finds it)
            field = {"key": "primary_keys", "topic": "topics", "broker": "brokers",
                     "partition": "partitions"}[column]
            current = getattr(self, field)
            return replace(self, **{field: values if current is None else current & values})
        if column == TIME_COLUMN:
            bounds = _time_bounds(filter_)
            if bounds is None:
                return None
            return self.within(*bounds)
        return None


    def _filtered_field(self, column: str | None) -> str | None:
        """The field whose values a filter on `column` asks for: the column of a ``single``
        field, ``any_<name>`` of an ``array`` one (Spark resolves names case-insensitively)."""
        if column is None:
            return None
        wanted = column.lower()
        for name, shape in self.field_columns:
            shown = name if shape == SHAPE_SINGLE else lookup_column(name)
            if shown.lower() == wanted:
                return name
        return None


def _exactly_shown(values: set[str]) -> set[str]:
    """The values some row can show: a lookup column holds a value as rows show it, so a spelling
    no row shows (``\x41`` for ``A``) matches nothing (``message.exactly_shown``)."""
    return {value for value in values if exactly_shown(value) is not None}


def lookup_column(field: str) -> str:
    """The lookup column of an array field (``any_<name>``, as ``any_key`` is of ``keys``)."""
    return LOOKUP_COLUMN_PREFIX + field


def task_query(query: IndexQuery, options: ReadOptions) -> IndexQuery:
    """`query` as a task runs it: a ``begin``/``end`` option without a zone, planned over every
    instant it can stand for, is read here in the session's zone (which only tasks see)."""
    if not options.window_needs_zone:
        return query
    return query.within(*options.window_in(session_zone()))


def push(query: IndexQuery, filters: Iterable[Filter]) -> tuple[IndexQuery, list[Filter]]:
    """Apply every filter the index answers exactly; return the new query and the rejected
    filters (the very objects Spark passed, as pushFilters must return them). With ``maxNum``
    (max_results) nothing is pushed: the cap applies to what the options ask and Spark's filters
    to the rows it kept, as in a session without pushdown (a filter the index applied would
    otherwise come before the cap, and the primary key's after it)."""
    if query.max_results is not None:
        return query, list(filters)
    rejected = []
    for filter_ in filters:
        narrowed = query.restrict(filter_)
        if narrowed is None:
            rejected.append(filter_)
        else:
            query = narrowed
    return query, rejected


def _set(values: Iterable[Any] | None) -> frozenset | None:
    return None if values is None else frozenset(values)


def _tighter(current: int | None, new: int | None, pick) -> int | None:
    if new is None:
        return current
    return new if current is None else pick(current, new)


def _is_type(value: Any, kind: type) -> bool:
    # bool is an int subclass; a boolean literal is never a partition number
    return isinstance(value, kind) and not isinstance(value, bool)


def _equality_values(filter_: Filter, kind: type) -> frozenset | None:
    if isinstance(filter_, (EqualTo, EqualNullSafe)):
        return frozenset([filter_.value]) if _is_type(filter_.value, kind) else None
    if isinstance(filter_, In):
        # a NULL in the list never makes a row pass (x IN (.., NULL) is NULL or true), so it
        # can be dropped; any other foreign value means a cast we do not model: reject
        values = [value for value in filter_.value if value is not None]
        return frozenset(values) if all(_is_type(v, kind) for v in values) else None
    return None


def _time_bounds(filter_: Filter) -> tuple[int | None, int | None] | None:
    """Inclusive [begin_ms, end_ms] selecting exactly the rows whose microsecond timestamp
    (a whole number of milliseconds) passes `filter_`."""
    value = getattr(filter_, "value", None)
    if not isinstance(value, datetime) or value.tzinfo is None:
        return None  # a naive datetime's zone is unknown here: let Spark compare
    micros = micros_since_epoch(value)
    floor_ms = micros // MICROS_PER_MS
    ceil_ms = -(-micros // MICROS_PER_MS)
    if isinstance(filter_, GreaterThan):
        return floor_ms + 1, None
    if isinstance(filter_, GreaterThanOrEqual):
        return ceil_ms, None
    if isinstance(filter_, LessThan):
        return None, ceil_ms - 1
    if isinstance(filter_, LessThanOrEqual):
        return None, floor_ms
    if isinstance(filter_, (EqualTo, EqualNullSafe)):
        return ceil_ms, floor_ms  # empty (begin > end) unless micros is a whole millisecond
    return None
