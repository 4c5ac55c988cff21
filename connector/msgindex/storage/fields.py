"""Fields: what a message carries (a header's values, a payload field) indexed beside its keys.

The indexing job declares fields (``--index-field NAME=EXPR``, ``--index-header [NAME=]HEADER``)
and evaluates them in Spark; the storage layer sees, per record, the (field name, value) pairs to
index, and per append the definitions it evaluated (``FieldDefinition``). This module is the one
place that says what a field name may be, how a field value is told apart from a key on disk and
in the hash index, and which source offsets a field covers.

**Names**: ``[A-Za-z_][A-Za-z0-9_]*``, at most 64 characters, unique case-insensitively (Spark
resolves column names case-insensitively and hands a data source its options lower-cased), never
a column the data source already has (``RESERVED_NAMES``) and never starting with ``any_`` (the
pushdown source's lookup columns of array fields are ``any_<name>``, as its ``any_key`` is of keys).

**Values**: non-empty strings, each (field, value) pair of a record once. A string field gives a
record at most one value, an array field any number (``SHAPES``).

**Terms and hash strings** (``message.field_term``, ``message.field_hash_string``). A record's
index terms are its keys and its field values. The metadata log keeps them in one list per record,
keys first, each field value stored as the *field term* ``0xFF + name + 0x00 + value``:
``encode_text`` never produces the byte 0xFF, so no key's bytes can ever equal a field term, and a
lookup compares bytes: a key ``order=o-1`` (or any other) never finds a field value, nor a field
value a key. A field value is hashed as ``topic + NUL + name + NUL + value``: the part before its
first ``#`` holds a NUL, which no topic holds, so no ``topic#key`` of RocketMQ's rule equals it;
two strings may still share a 32-bit hash, which the comparison of stored terms resolves. The
entries are RocketMQ IndexFile entries like any key's (phyOffset = the record's seq): the files stay
byte-identical to RocketMQ's ``putKey`` of these strings. The ``keys`` column of results shows keys
only; a query's ``field_columns`` show fields as columns of their own (``batch_format.field_columns``:
a string for SHAPE_SINGLE, a list for SHAPE_ARRAY, null where a record carries no value), which is
how ``spark.read.format("msgindex")`` gives each field a column.

**Coverage.** A shard records, per field, its definition and the source offsets whose records were
evaluated for it (``IndexedField``: ``SourceRanges``, committed atomically with the data, exactly as
the shard's own source ranges are). Offsets a shard holds that a field does not cover were indexed
before the field existed (or by a job without it): a lookup of that field says so
(``uncovered``) instead of answering as if complete.

Records whose offsets a shard committed before a field existed are not indexed under it by a
later job (exactly once by offsets: it skips them); ``--backfill-fields`` re-reads them from Kafka
for the fields and gives them the field's terms (backfill.py), growing the coverage by what it
evaluated.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import (
    CorruptFileError,
    FieldCoverageWarning,
    InvalidAppendError,
    InvalidOptionError,
    unknown_name,
)
from msgindex.storage.source_ranges import SourceRanges

MAX_NAME_LENGTH = 64
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LOOKUP_COLUMN_PREFIX = "any_"
# Columns the data source's rows already have (storage ROW_SCHEMA, fetchValues, the RocketMQ mode,
# the pushdown source's any_key, lookup_keys' lookup_key): a field may not take their names.
RESERVED_NAMES = frozenset({
    "broker", "topic", "partition", "offset", "key", "keys", "timestamp", "commit_log_offset", "size", "seq",
    "fields", "value", "headers", "properties", "verified", "any_key", "lookup_key",
})
SOURCE_EXPRESSION = "expression"  # a Spark SQL expression over the Kafka source's columns
SOURCE_HEADER = "header"  # every value of one record header
SOURCES = (SOURCE_EXPRESSION, SOURCE_HEADER)
SHAPE_SINGLE = "single"  # at most one value a record: a string column
SHAPE_ARRAY = "array"  # any number of values a record: an array column
SHAPES = (SHAPE_SINGLE, SHAPE_ARRAY)



def name_problem(name: object) -> str | None:
    """Why `name` cannot name a field (module docstring), or None."""
    if not isinstance(name, str) or not _NAME.match(name):
        return "a field name is letters, digits and _, not starting with a digit"
    if len(name) > MAX_NAME_LENGTH:
        return f"a field name has at most {MAX_NAME_LENGTH} characters"
    if name.lower() in RESERVED_NAMES:
        return f"{name!r} is a column of every row already"
    if name.lower().startswith(LOOKUP_COLUMN_PREFIX):
        return f"names starting with {LOOKUP_COLUMN_PREFIX!r} are the lookup columns of array fields"
    return None


def check_name(name: object, where: str) -> str:
    """`name` if it can name a field, else InvalidOptionError naming `where` and the rule."""
    problem = name_problem(name)
    if problem is not None:
        raise InvalidOptionError(f"{where}: field name {name!r} is not allowed ({problem})")
    return name


def check_unique(names: Iterable[str], where: str) -> None:
    """InvalidOptionError when two of `names` are equal case-insensitively."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.get(name.lower())
        if other == name:
            raise InvalidOptionError(f"{where}: field {name!r} is declared twice")
        if other is not None:
            raise InvalidOptionError(f"{where}: fields {other!r} and {name!r} differ only in case")
        seen[name.lower()] = name


# ---- definitions and coverage -----------------------------------------------------------------
@dataclass(frozen=True)
class FieldDefinition:
    """What a field is: its name, where its values come from (`source`: a Spark SQL expression's
    text, or a header's name) and how many values a record has (`shape`)."""

    name: str
    source: str
    text: str
    shape: str

    def __post_init__(self) -> None:
        check_name(self.name, "field definition")
        if self.source not in SOURCES or self.shape not in SHAPES or not isinstance(self.text, str) or not self.text:
            raise InvalidOptionError(f"field {self.name!r}: malformed definition ({self.source!r}, {self.text!r}, "
                                     f"{self.shape!r})")

    def same_values(self, other: FieldDefinition) -> bool:
        """True when both compute the same values (names compared case-insensitively)."""
        return (self.name.lower(), self.source, self.text, self.shape) == (
            other.name.lower(), other.source, other.text, other.shape)

    def describe(self) -> str:
        """The definition as the job's flags give it."""
        if self.source == SOURCE_HEADER:
            return f"--index-header {self.name}={self.text}"
        return f"--index-field {self.name}={self.text}"

    def to_json(self) -> dict[str, str]:
        return {"source": self.source, "text": self.text, "shape": self.shape}

    @classmethod
    def from_json(cls, name: str, body: Any) -> FieldDefinition:
        return cls(name, body["source"], body["text"], body["shape"])


@dataclass(frozen=True)
class IndexedField:
    """A field as a shard committed it: its definition and the source offsets it covers."""

    definition: FieldDefinition
    ranges: SourceRanges = field(default_factory=SourceRanges)

    @property
    def name(self) -> str:
        return self.definition.name


@dataclass(frozen=True)
class FieldCoverage:
    """Every field a shard indexes (by name, in name order), with what each covers."""

    fields: tuple[IndexedField, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.fields)

    def get(self, name: str) -> IndexedField | None:
        """The field named `name` (case-insensitively), or None."""
        wanted = name.lower()
        return next((f for f in self.fields if f.name.lower() == wanted), None)

    def spelled(self, name: str) -> str:
        """`name` as this shard indexed it (names match case-insensitively), or as given."""
        indexed = self.get(name)
        return name if indexed is None else indexed.name

    def definitions(self) -> tuple[FieldDefinition, ...]:
        return tuple(f.definition for f in self.fields)

    def extended(self, definitions: Sequence[FieldDefinition], ranges: SourceRanges) -> FieldCoverage:
        """This coverage after an append that evaluated `definitions` over `ranges` (a field the
        shard does not have yet joins; one redefined is an InvalidOptionError: ``check_compatible``)."""
        if not definitions or not ranges.ranges:
            return self if not definitions else self._with(definitions)
        by_name = {f.name.lower(): f for f in self._with(definitions).fields}
        for definition in definitions:
            have = by_name[definition.name.lower()]
            by_name[definition.name.lower()] = IndexedField(have.definition, have.ranges.union(ranges))
        return FieldCoverage(tuple(sorted(by_name.values(), key=lambda f: f.name.lower())))

    def _with(self, definitions: Sequence[FieldDefinition]) -> FieldCoverage:
        check_compatible(self.definitions(), definitions, "shard", spelling=True)
        known = {f.name.lower() for f in self.fields}
        added = [IndexedField(d) for d in definitions if d.name.lower() not in known]
        if not added:
            return self
        return FieldCoverage(tuple(sorted((*self.fields, *added), key=lambda f: f.name.lower())))

    def to_json(self) -> dict[str, Any]:
        return {f.name: {**f.definition.to_json(), "ranges": f.ranges.to_json()} for f in self.fields}

    @classmethod
    def from_json(cls, body: Any, *, source: object = "<fields>") -> FieldCoverage:
        if not body:
            return cls()
        try:
            fields = tuple(IndexedField(FieldDefinition.from_json(name, item),
                                        SourceRanges.from_json(item["ranges"], source=source))
                           for name, item in body.items())
        except (AttributeError, KeyError, TypeError, InvalidOptionError) as bad:
            raise CorruptFileError(f"{source}: the indexed fields are malformed ({bad})") from None
        names = [f.name.lower() for f in fields]
        if len(set(names)) != len(names):
            raise CorruptFileError(f"{source}: the indexed fields name one field twice")
        return cls(tuple(sorted(fields, key=lambda f: f.name.lower())))


def store_fields(store: Any) -> tuple[tuple[str, str], ...]:
    """The fields any shard of `store` (a local or object store) indexes, as (name, shape) in name
    order: a name as its first shard spells it; shards that define one name differently are an
    InvalidOptionError, as the indexing job refuses them."""
    seen: dict[str, FieldDefinition] = {}
    for broker in store.brokers():
        with store.reader(broker) as reader:
            definitions = reader.field_coverage.definitions()
        check_compatible(seen.values(), definitions, f"store (shard {broker!r} and another)")
        for definition in definitions:
            seen.setdefault(definition.name.lower(), definition)
    return tuple((d.name, d.shape) for d in sorted(seen.values(), key=lambda d: d.name.lower()))


def check_compatible(existing: Iterable[FieldDefinition], declared: Iterable[FieldDefinition], where: str, *,
                     spelling: bool = False) -> None:
    """InvalidOptionError when a declared field redefines one the `where` (a shard, the store)
    already indexes: its old values were computed otherwise, so one name would find two things.
    With `spelling` (what a shard writes its terms with), also when it spells the name otherwise."""
    have = {d.name.lower(): d for d in existing}
    for definition in declared:
        old = have.get(definition.name.lower())
        if old is not None and not old.same_values(definition):
            raise InvalidOptionError(
                f"{definition.describe()}: the {where} indexes field {old.name!r} as {old.describe()} "
                f"({old.shape}); a field keeps its definition: give the new one another name")
        if spelling and old is not None and old.name != definition.name:
            # a record's terms hold the name as written and lookups ask the shard's spelling: another
            # spelling's values would never be found (the job respells declared fields: ``respelled``)
            raise InvalidOptionError(f"{definition.describe()}: the {where} indexes this field as {old.name!r}; "
                                     f"use the name {old.name!r}")


def respelled(definitions: Sequence[FieldDefinition], existing: Iterable[FieldDefinition]) -> tuple[FieldDefinition, ...]:
    """`definitions` with each name spelled as `existing` spells it (names are case-insensitive
    to users, as Spark's columns are; the store keeps one spelling)."""
    spelling = {d.name.lower(): d.name for d in existing}
    return tuple(dataclasses.replace(d, name=spelling.get(d.name.lower(), d.name)) for d in definitions)


def uncovered(name: str, held: SourceRanges, coverage: FieldCoverage, *, topics: Iterable[str] | None = None,
              partitions: Iterable[int] | None = None) -> SourceRanges:
    """The offsets of `held` (what a shard holds) that field `name` does not cover, restricted
    to `topics` / `partitions` (None: all)."""
    indexed = coverage.get(name)
    missing = held.minus(indexed.ranges) if indexed is not None else held
    return missing.restricted(topics, partitions)


def describe_ranges(ranges: SourceRanges, limit: int = 4) -> str:
    """``orders-0 offsets [0, 1200), orders-1 offsets [0, 980) and 3 more`` for messages."""
    parts = [f"{topic}-{partition} offsets " + ", ".join(f"[{start}, {end})" for start, end in intervals)
             for (topic, partition), intervals in sorted(ranges.ranges.items())]
    more = f" and {len(parts) - limit} more" if len(parts) > limit else ""
    return ", ".join(parts[:limit]) + more


def warn_uncovered(where: str, held: SourceRanges, coverage: FieldCoverage, names: Iterable[str], *,
                   topics: Iterable[str] | None = None, partitions: Iterable[int] | None = None) -> None:
    """A FieldCoverageWarning per field of `names` that does not cover every offset of `held`
    (in `topics` / `partitions`): its lookup cannot be complete there."""
    for name in dict.fromkeys(names):
        missing = uncovered(name, held, coverage, topics=topics, partitions=partitions)
        if missing.ranges:
            indexed = coverage.get(name)
            why = "committed without the field: before it was indexed, or by an append that did not declare it" \
                if indexed is not None else "the shard does not index that field"
            warnings.warn(FieldCoverageWarning(
                f"{where}: field {name!r} does not cover {describe_ranges(missing)} ({why}): records there may not "
                f"be found by this field"), stacklevel=5)


# ---- where a shard keeps its coverage ------------------------------------------------------------
# The shard's committed state (a local checkpoint, an object-store version) keeps its coverage in
# its ``extra`` member under this name: committed atomically with the data it describes.
EXTRA_MEMBER = "fields"


def coverage_in(extra: Mapping[str, Any], *, source: object) -> FieldCoverage:
    """The coverage a committed state's `extra` holds (none: no field)."""
    return FieldCoverage.from_json(extra.get(EXTRA_MEMBER), source=source)


def cached_coverage(cached: tuple[object, FieldCoverage] | None, state: object, extra: Mapping[str, Any], *,
                    source: object) -> tuple[object, FieldCoverage]:
    """(`state`, the coverage its `extra` holds), reusing `cached` when it is of the same state
    object: a committed state never changes, and parsing its ranges on every field lookup cost
    ~0.1-0.3 ms of a ~0.7 ms lookup (32 topic-partitions; it grows with them)."""
    if cached is not None and cached[0] is state:
        return cached
    return state, coverage_in(extra, source=source)


def check_carried(records: pa.Table | pa.RecordBatch | Sequence[Any], definitions: Sequence[FieldDefinition],
                  where: str) -> None:
    """What an append refuses before it writes anything: two `definitions` of one field
    (InvalidOptionError), and (InvalidAppendError) a record carrying a value under another
    spelling of a declared field's name (lookups ask for the declared spelling: it would never
    be found) or two values of a single-valued field. A value under a name the append does not
    declare at all is kept and found under that name; no coverage describes it."""
    check_unique([definition.name for definition in definitions], f"{where}: the append's fields")
    declared = {definition.name: definition.shape for definition in definitions}
    if isinstance(records, (pa.Table, pa.RecordBatch)):
        if "fields" not in records.schema.names:
            return
        column = records.column("fields")
        column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        try:
            names = pc.list_flatten(column).field("name")
            carried = [name for name in pc.unique(names).to_pylist() if name is not None]
            owners = pc.list_parent_indices(column).to_numpy()
        except (pa.ArrowException, KeyError, TypeError):
            return  # not a list of (name, value) structs: the append's validation names it (LogColumns.of)
        record_of = {name: owners[pc.equal(names, name).to_numpy(zero_copy_only=False)] for name in carried}
    else:
        record_of = {}
        for at, record in enumerate(records):
            for pair in getattr(record, "fields", None) or ():
                if isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], str):
                    record_of.setdefault(pair[0], []).append(at)  # (other shapes: LogColumns.of names them)
        record_of = {name: np.array(ats, dtype=np.int64) for name, ats in record_of.items()}
    spellings = {known.lower(): known for known in declared}
    for name, owners in record_of.items():
        if name not in declared:
            spelled = spellings.get(str(name).lower())
            if spelled is not None:
                raise InvalidAppendError(f"{where}: {_record_named(records, int(owners[0]))} carries field {name!r}, "
                                         f"which the append declares as {spelled!r} (lookups ask for that spelling)")
            continue
        if declared[name] == SHAPE_SINGLE and len(np.unique(owners)) < len(owners):
            twice = owners[np.flatnonzero(np.diff(np.sort(owners)) == 0)[0]]
            raise InvalidAppendError(f"{where}: {_record_named(records, int(twice))} carries two values of field "
                                     f"{name!r}, which holds one a record (shape {SHAPE_SINGLE!r})")


def _record_named(records: pa.Table | pa.RecordBatch | Sequence[Any], at: int) -> str:
    if isinstance(records, (pa.Table, pa.RecordBatch)):
        row = records.slice(at, 1).select(["topic", "partition", "offset"]).to_pylist()[0]
        return f"record {at} ({row['topic']}-{row['partition']} offset {row['offset']})"
    record = records[at]
    return f"record {at} ({record.topic}-{record.partition} offset {record.offset})"


def extra_after_append(extra: Mapping[str, Any], definitions: Sequence[FieldDefinition], committed: SourceRanges,
                       appended: SourceRanges, *, source: object) -> dict[str, Any]:
    """`extra` after an append that evaluated `definitions` over the slices `appended` of which
    the shard held `committed` before: each field covers the newly committed offsets (records it
    held already were skipped, so not evaluated)."""
    if not definitions:
        return dict(extra)
    coverage = coverage_in(extra, source=source).extended(definitions, appended.minus(committed))
    return {**extra, EXTRA_MEMBER: coverage.to_json()}


def check_field_names(indexed: Iterable[tuple[str, str]], names: Iterable[str],
                      subject: Callable[[str], str]) -> list[tuple[str, str]]:
    """The field of `indexed` (``store_fields``: (name, shape)) each of `names` spells,
    case-insensitively as lookups compare; InvalidOptionError for the first that none spells,
    with the fields there are (`subject`: how the message names what the user gave, e.g.
    ``--field nope``). A field some shards index and others not, or not over every offset, is a
    lookup's coverage warning instead: never an error."""
    indexed = list(indexed)
    known = {name.lower(): (name, shape) for name, shape in indexed}
    spelled = []
    for name in names:
        if name.lower() not in known:
            raise InvalidOptionError(unknown_name(subject(name), "field", name, [have for have, _ in indexed]))
        spelled.append(known[name.lower()])
    return spelled
