"""What a lookup or scan asks (``Query``, validated once), result order and limits: shared by
shard and store queries and produced by the Spark data source's pushdown."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from msgindex.errors import InvalidArgumentError, InvalidOptionError
from msgindex.storage.message import (
    NO_VALUE,
    ROW_SCHEMA,
    MessageRecord,
    arrow_text,
    decode_key_bytes,
    shown_timestamp,
    stored_window,
)
from msgindex.times import TimeArg, to_epoch_ms

KeysArg = str | bytes | Iterable[str | bytes]
# field values to look up: {name: value or values}, or (name, value) pairs
FieldsArg = Mapping[str, str | Iterable[str]] | Iterable[tuple[str, str]]

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


def normalize_fields(fields: FieldsArg) -> tuple[tuple[str, str], ...]:
    """`fields` as duplicate-free (name, value) pairs; a single str value is one value. Names are
    as given (each shard spells them as it indexed them, ``fields.FieldCoverage.spelled``)."""
    if isinstance(fields, (str, bytes)):
        raise InvalidOptionError(f"fields must be a mapping of a field name to its values (such as "
                                 f"{{'order': 'o-42'}}), got {type(fields).__name__} {fields!r}")
    items = fields.items() if isinstance(fields, Mapping) else fields
    pairs: dict[tuple[str, str], None] = {}
    try:
        items = list(items)
    except TypeError:
        raise InvalidOptionError(f"fields must be a mapping of a field name to its values, got "
                                 f"{type(fields).__name__}") from None
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidOptionError(f"a field lookup is (name, value or values), got {item!r}")
        name, values = item
        if not isinstance(name, str) or not name or "\x00" in name:
            raise InvalidOptionError(f"a field name must be a non-empty str, got {name!r}")
        if not isinstance(values, str) and (isinstance(values, bytes) or not isinstance(values, Iterable)):
            raise InvalidOptionError(f"field {name!r}: the values to look up must be a str or a list of str, got "
                                     f"{type(values).__name__}: {values!r}")
        for value in (values,) if isinstance(values, str) else values:
            if not isinstance(value, str):
                raise InvalidOptionError(f"field {name!r}: a value to look up must be a str, got "
                                         f"{type(value).__name__}: {value!r}")
            if value:  # an empty value is never indexed (fields.py)
                pairs[(name, value)] = None
    return tuple(pairs)


def validate_window(begin_ms: int | None, end_ms: int | None, max_results: int | None) -> None:
    """Reject arguments that are not what they claim (a bool or float as a timestamp...)."""
    for name, value in (("begin_ms", begin_ms), ("end_ms", end_ms), ("max_results", max_results)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidOptionError(f"{name} must be an int (milliseconds) or None, got {value!r}")
    if max_results is not None and max_results < 0:
        raise InvalidOptionError(f"max_results must be >= 0 or None, got {max_results}")


@dataclass(frozen=True)
class Query:
    """What one lookup or scan asks of a store: validated once (``Query.of``), then handed down
    unchanged from the store to each shard reader. None in a field means "no restriction";
    ``keys`` None means a scan of the window rather than a key lookup; ``fields`` (name, value)
    pairs are looked up as well as the keys (a record carrying any of them is found; a lookup of
    fields alone has ``keys`` ()). ``begin_ms``/``end_ms``
    bound the message timestamp, inclusive, in ms; ``max_results`` keeps the first rows in
    RESULT_ORDER (lookups only)."""

    keys: tuple[str, ...] | None = None
    topics: frozenset[str] | None = None
    brokers: frozenset[str] | None = None
    partitions: frozenset[int] | None = None
    begin_ms: int | None = None
    end_ms: int | None = None
    max_results: int | None = None
    fields: tuple[tuple[str, str], ...] = ()
    # fields shown as columns after ROW_SCHEMA's: (name, shape) (``batch_format.field_columns``)
    field_columns: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        validate_window(self.begin_ms, self.end_ms, self.max_results)

    @classmethod
    def of(
        cls,
        keys: KeysArg | None = None,
        *,
        topic: str | None = None,
        topics: Iterable[str] | None = None,
        brokers: Iterable[str] | None = None,
        partitions: Iterable[int] | None = None,
        begin: TimeArg | None = None,
        end: TimeArg | None = None,
        begin_ms: int | None = None,
        end_ms: int | None = None,
        max_results: int | None = None,
        fields: FieldsArg | None = None,
        field_columns: Iterable[tuple[str, str]] = (),
    ) -> Query:
        """The query of the public lookup/scan arguments: keys as ``normalize_keys`` takes them,
        `topic` (one) or `topics`, a single str wherever names are asked for. `begin`/`end`: the
        window as people type times (``msgindex.times``: epoch ms, ISO-8601 with or without a
        zone (none: UTC), ``-1h``, ``now``, a datetime); `begin_ms`/`end_ms`: epoch ms only.
        `fields`: field values to find, ``{"order": ["o-42"]}`` (``normalize_fields``);
        `field_columns`: (name, shape) of the fields whose values the rows show as columns."""
        if topic is not None and topics is not None:
            raise InvalidArgumentError("give topic or topics, not both")
        begin_ms = _bound("begin", begin, begin_ms)
        end_ms = _bound("end", end, end_ms)
        pairs = () if fields is None else normalize_fields(fields)
        return cls(
            keys=(() if fields is not None else None) if keys is None else tuple(normalize_keys(keys)),
            fields=pairs,
            topics=_names("topic", topic if topic is not None else topics),
            brokers=_names("broker", brokers),
            partitions=None if partitions is None else frozenset(_partition(p) for p in partitions),
            begin_ms=begin_ms,
            end_ms=end_ms,
            max_results=max_results,
            field_columns=tuple(field_columns),
        )

    @property
    def looks_up_nothing(self) -> bool:
        """A lookup with neither keys nor field values (it finds nothing)."""
        return not self.keys and not self.fields

    def stored_window(self) -> tuple[int | None, int | None] | None:
        """The window over stored timestamps (``message.stored_window``); None: nothing can match."""
        return stored_window(self.begin_ms, self.end_ms)

    def topics_among(self, present: Iterable[str]) -> list[str]:
        """The topics of `present` the query asks for, in their order."""
        return [topic for topic in present if self.topics is None or topic in self.topics]


def as_query(keys_or_query: KeysArg | Query | None, **restrictions) -> Query:
    """A Query passed as is (with no other argument), or the one the arguments describe."""
    if isinstance(keys_or_query, Query):
        given = sorted(name for name, value in restrictions.items() if value is not None)
        if given:
            raise InvalidArgumentError(f"a Query already holds every restriction; also given: {', '.join(given)}")
        return keys_or_query
    return Query.of(keys_or_query, **restrictions)


def _bound(name: str, value: TimeArg | None, ms: int | None) -> int | None:
    if value is None:
        return ms
    if ms is not None:
        raise InvalidArgumentError(f"give {name} or {name}_ms, not both")
    return to_epoch_ms(name, value)


def _names(what: str, names: str | Iterable[str] | None) -> frozenset[str] | None:
    if names is None:
        return None
    if isinstance(names, str):
        return frozenset((names,))
    names = frozenset(names)
    bad = [name for name in names if not isinstance(name, str)]
    if bad:
        raise InvalidOptionError(f"a {what} name must be a str, got {type(bad[0]).__name__}: {bad[0]!r}")
    return names


def _partition(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidOptionError(f"a partition must be an int, got {type(value).__name__}: {value!r}")
    return int(value)


# One struct conversion costs about a third of ten column conversions for the few rows a key
# lookup returns (pyarrow's per-call overhead dominates there), and the same for many rows.
ROW_STRUCT = pa.struct(list(ROW_SCHEMA))


def rows_from_records(broker: str, seqs: list[int], records: list[MessageRecord]) -> pa.Table:
    """ROW_SCHEMA rows of `records` (stored at `seqs`), exactly as the log's read_rows renders
    them (texts through arrow_text, -1 commit-log offset / size as null), one record at a time:
    for tools holding MessageRecords, and the tests' reference for the log's vectorized rendering."""
    shown_broker = arrow_text(broker)
    topics = {topic: arrow_text(topic) for topic in {r.topic for r in records}}
    rows = [
        (
            shown_broker,
            topics[r.topic],
            r.partition,
            r.offset,
            None if r.key is None else arrow_text(r.key),
            [arrow_text(k) for k in r.keys],
            shown_timestamp(r.timestamp_ms) * 1000,
            None if r.commit_log_offset == NO_VALUE else r.commit_log_offset,
            None if r.size == NO_VALUE else r.size,
            seq,
        )
        for seq, r in zip(seqs, records)
    ]
    return rows_table(rows)


def rows_table(rows: list[tuple]) -> pa.Table:
    """ROW_SCHEMA rows given as tuples of their shown values (ROW_SCHEMA's order; timestamps in us)."""
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
