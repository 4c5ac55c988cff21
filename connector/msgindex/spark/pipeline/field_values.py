"""Fields of the indexing job (storage/fields.py): declared by ``--index-field NAME=EXPR`` and
``--index-header [NAME=]HEADER``, evaluated by Spark over each micro-batch's Kafka rows (the
same projection that takes the keys, before the tasks write), turned into (name, value) pairs by
Arrow kernels on the executors.

* An expression is any Spark SQL expression over the Kafka source's columns (``key``, ``value``,
  ``headers``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``). A string
  (or any atomic value, cast to a string) gives a record one value, an array each element. It is
  analysed against the streaming source before the query starts: an expression Spark refuses, or
  one of another type (a struct, a map), is an InvalidOptionError in one line naming the flag.
* A header field takes every value of that header (a header may repeat), as UTF-8.
* Avro payloads through Spark's ``from_avro(value, '<schema json>')`` (spark-avro is on the
  session's jars); Confluent's wire format (a magic byte and a 4-byte schema id before the Avro
  body) through ``from_avro(substring(value, 6), ...)``. ``from_avro`` fails the query on the first
  payload that is not Avro of the schema unless its options say ``mode`` PERMISSIVE (then: null),
  and Spark has no setting for that default: a call written without an options map runs with
  ``map('mode', 'PERMISSIVE')`` (`permissive_avro`), one with its own map runs as written.
* Per field and batch the progress line counts the values indexed, the records that gave none
  (null, empty, a payload the expression could not parse: Spark's JSON functions give null for
  invalid JSON, from_avro for invalid Avro as above) and the values set aside because they are not
  UTF-8. None of these is fatal.
* An expression that fails on a record under Spark's ANSI mode (a cast of ``'abc'`` to INT, an
  index past an array's end, a division by zero) would fail the query: while a job with fields
  runs, its session evaluates with ``spark.sql.ansi.enabled=false`` (`lenient_expressions`), where
  those give null, counted as "without". A user's ``--conf spark.sql.ansi.enabled=...`` wins.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import InvalidOptionError
from msgindex.storage.fields import (
    SHAPE_ARRAY,
    SHAPE_SINGLE,
    SOURCE_EXPRESSION,
    SOURCE_HEADER,
    FieldDefinition,
    check_name,
    check_unique,
)
from msgindex.storage.message import FIELD_PAIR, FIELDS_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

COLUMN_PREFIX = "msgindex_field_"  # the projected column of field i: COLUMN_PREFIX + str(i)
MAX_ERROR_CHARS = 300
# per field: values indexed, records without a value, values that are not UTF-8
VALUES, NONE, NOT_UTF8 = 0, 1, 2


@dataclass(frozen=True)
class DeclaredField:
    """A field as the flags give it, before Spark says its shape."""

    name: str
    source: str  # fields.SOURCE_EXPRESSION or SOURCE_HEADER
    text: str  # the expression, or the header's name

    @property
    def flag(self) -> str:
        if self.source == SOURCE_HEADER:
            return f"--index-header {self.name}={self.text}"
        return f"--index-field {self.name}={self.text}"


def declared_fields(index_fields: Sequence[str], index_headers: Sequence[str]) -> tuple[DeclaredField, ...]:
    """The flags' fields, names checked (fields.name_problem) and unique; InvalidOptionError
    naming the flag otherwise."""
    declared = []
    for item in index_fields:
        name, sep, text = item.partition("=")
        if not sep or not text.strip():
            raise InvalidOptionError(f"--index-field {item!r} is not NAME=EXPRESSION")
        declared.append(DeclaredField(check_name(name.strip(), f"--index-field {item!r}"), SOURCE_EXPRESSION,
                                      text.strip()))
    for item in index_headers:
        name, sep, header = item.partition("=")
        if not sep:
            name, header = item, item
        if not header:
            raise InvalidOptionError(f"--index-header {item!r} names no header")
        declared.append(DeclaredField(check_name(name.strip(), f"--index-header {item!r}"), SOURCE_HEADER, header))
    check_unique([field.name for field in declared], "--index-field/--index-header")
    return tuple(declared)


def field_columns(fields: Sequence[DeclaredField | FieldDefinition]) -> list[Column]:
    """Each field's values as a column of the Kafka rows (array<string>, array<binary> for
    headers), named ``COLUMN_PREFIX + i``."""
    from pyspark.sql import functions as F

    columns = []
    for i, field in enumerate(fields):
        if field.source == SOURCE_HEADER:
            values = header_values(field.text)
        else:
            values = F.expr(permissive_avro(field.text))
            if getattr(field, "shape", SHAPE_ARRAY) == SHAPE_SINGLE:
                values = F.array(values.cast("string"))
            else:
                values = values.cast("array<string>")
        columns.append(values.alias(f"{COLUMN_PREFIX}{i}"))
    return columns


PERMISSIVE_AVRO = "map('mode', 'PERMISSIVE')"
_FROM_AVRO_CALL = re.compile(r"(?<![\w`.$])from_avro\s*$", re.IGNORECASE)


def permissive_avro(expression: str) -> str:
    """`expression` (Spark SQL) with ``map('mode', 'PERMISSIVE')`` as the options of each
    ``from_avro`` call that has only its data and schema arguments, so that a payload which is
    not Avro of the schema gives null instead of failing the query (from_avro's default mode is
    FAILFAST). Commas, parentheses and function names inside string literals, backquoted names
    and comments are not Spark's syntax and are skipped; everything else is left as written."""
    calls: list[list] = []  # per open parenthesis: [a from_avro call?, top-level commas]
    insert_at: list[int] = []
    n, size = 0, len(expression)
    while n < size:
        char = expression[n]
        if char in "'\"`":
            raw = char != "`" and n > 0 and expression[n - 1] in "rR" and (n < 2 or not (
                expression[n - 2].isalnum() or expression[n - 2] == "_"))
            n += 1
            while n < size and expression[n] != char:
                n += 2 if expression[n] == "\\" and char != "`" and not raw else 1
        elif expression.startswith("--", n):
            n = expression.find("\n", n)
            n = size if n < 0 else n
        elif expression.startswith("/*", n):
            n = expression.find("*/", n + 2)
            n = size if n < 0 else n + 1
        elif char == "(":
            calls.append([bool(_FROM_AVRO_CALL.search(expression, 0, n)), 0])
        elif char == "," and calls:
            calls[-1][1] += 1
        elif char == ")" and calls:
            is_from_avro, commas = calls.pop()
            if is_from_avro and commas == 1:
                insert_at.append(n)
        n += 1
    for at in sorted(insert_at, reverse=True):
        expression = f"{expression[:at]}, {PERMISSIVE_AVRO}{expression[at:]}"
    return expression


def header_values(name: str) -> Column:
    """Every value of header `name` of a Kafka row (binary; a header may repeat)."""
    from pyspark.sql import functions as F

    return F.transform(F.filter("headers", lambda h: h["key"] == F.lit(name)), lambda h: h["value"])


def analysed_definitions(kafka_df: DataFrame, declared: Sequence[DeclaredField]) -> tuple[FieldDefinition, ...]:
    """The definitions of `declared` with the shape Spark's analysis of each expression over
    `kafka_df` (the streaming source) gives; InvalidOptionError naming the flag for an
    expression Spark refuses or whose type is not a string, atomic value or array of them."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException
    from pyspark.sql.types import ArrayType, AtomicType, BinaryType, StringType

    definitions = []
    for field in declared:
        if field.source == SOURCE_HEADER:
            definitions.append(FieldDefinition(field.name, SOURCE_HEADER, field.text, SHAPE_ARRAY))
            continue
        from pyspark.sql import functions as F

        try:
            with _quiet_query_context_logs():
                kind = kafka_df.select(F.expr(permissive_avro(field.text))).schema.fields[0].dataType
        except (PySparkException, Py4JJavaError) as error:  # Py4J: e.g. from_avro's schema does not parse
            raise InvalidOptionError(f"{field.flag}: Spark refuses the expression: {short_error(error)}") from None
        if isinstance(kind, ArrayType) and isinstance(kind.elementType, AtomicType) and not isinstance(
                kind.elementType, BinaryType):
            shape = SHAPE_ARRAY
        elif isinstance(kind, (StringType, AtomicType)) and not isinstance(kind, BinaryType):
            shape = SHAPE_SINGLE
        else:
            raise InvalidOptionError(f"{field.flag}: the expression is {kind.simpleString()}; a field is a string (or "
                                     f"another atomic value) or an array of them (binary: CAST(... AS STRING))")
        definitions.append(FieldDefinition(field.name, SOURCE_EXPRESSION, field.text, shape))
    return tuple(definitions)


@contextmanager
def _quiet_query_context_logs() -> Iterator[None]:
    """pyspark logs every analysis error with its query context (a multi-line JSON record on
    stderr) before raising it; the flag's one-line error says it here."""
    from pyspark.logger import PySparkLogger

    loggers = [PySparkLogger.getLogger(name) for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def short_error(error: Exception) -> str:
    """Spark's analysis or parse error in one line: its first line, without the query plan (of a
    Py4J error, whose own text only names the call, the first line of the JVM's exception)."""
    text = str(error)
    java = getattr(error, "java_exception", None)
    if java is not None:
        try:
            text = str(java.toString())
        except Exception:  # the JVM may be gone: the Python text is all there is
            pass
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    return first if len(first) <= MAX_ERROR_CHARS else first[: MAX_ERROR_CHARS - 3] + "..."


def field_pairs(table: pa.Table, definitions: Sequence[FieldDefinition]) -> tuple[pa.Array, dict[str, list[int]]]:
    """The ``fields`` column of the append (storage FIELDS_COLUMN: each record's (name, value)
    pairs, in field order) from the projected field columns of `table`, and per field the
    counts [values, records without a value, values not UTF-8]."""
    rows = table.num_rows
    parents, names, values, counts = [], [], [], {}
    for i, definition in enumerate(definitions):
        column = table.column(f"{COLUMN_PREFIX}{i}").combine_chunks()
        flat = pc.list_flatten(column)
        owner = pc.list_parent_indices(column).to_numpy().astype(np.int64)
        text, not_utf8 = _as_text(flat)
        kept = pc.and_(pc.is_valid(text), pc.greater(pc.binary_length(text), 0)).fill_null(False)
        kept = kept.to_numpy(zero_copy_only=False)
        owner, text = owner[kept], text.filter(pa.array(kept))
        with_value = np.zeros(rows, dtype=bool)
        with_value[owner] = True
        counts[definition.name] = [len(text), int(rows - with_value.sum()), not_utf8]
        parents.append(owner)
        names.append(pa.repeat(pa.scalar(definition.name, pa.string()), len(text)))
        values.append(text)
    owner = np.concatenate(parents) if parents else np.zeros(0, np.int64)
    order = np.argsort(owner, kind="stable")  # each record's pairs together, in field order
    pairs = pa.StructArray.from_arrays(
        [pa.concat_arrays(names).take(pa.array(order)) if names else pa.array([], pa.string()),
         pa.concat_arrays(values).take(pa.array(order)) if values else pa.array([], pa.string())],
        fields=list(FIELD_PAIR))
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(np.bincount(owner, minlength=rows), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pairs, type=FIELDS_COLUMN.type), counts


def _as_text(values: pa.Array) -> tuple[pa.Array, int]:
    """`values` as valid UTF-8 strings (a value that is not: null), and how many were not."""
    try:
        text = values.cast(pa.string())
        text.validate(full=True)
        return text, 0
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    decoded = []
    for raw in values.cast(pa.binary()).to_pylist():
        try:
            decoded.append(None if raw is None else raw.decode("utf-8"))
        except UnicodeDecodeError:
            decoded.append(False)
    bad = sum(1 for value in decoded if value is False)
    return pa.array([None if value is False else value for value in decoded], pa.string()), bad


def pairs_of_rows(pairs: pa.Array) -> list[tuple[tuple[str, str], ...]]:
    """Each record's (name, value) pairs (for appends of MessageRecords)."""
    return [tuple((p["name"], p["value"]) for p in row) if row else () for row in pairs.to_pylist()]


def merged_counts(left: str, right: str) -> str:
    """Two tasks' per-field counts (JSON text, "" for none) summed."""
    if not left or not right:
        return left or right
    total = json.loads(left)
    for name, counts in json.loads(right).items():
        have = total.setdefault(name, [0, 0, 0])
        total[name] = [a + b for a, b in zip(have, counts)]
    return json.dumps(total, sort_keys=True)


def describe_counts(counts: dict[str, list[int]]) -> str:
    """`` | fields order 950 (50 without), sku 2,100 (12 without, 1 not UTF-8)`` for progress lines."""
    if not counts:
        return ""
    parts = []
    for name, (indexed, without, not_utf8) in sorted(counts.items()):
        notes = [f"{without:,} without"] + ([f"{not_utf8:,} not UTF-8"] if not_utf8 else [])
        parts.append(f"{name} {indexed:,} ({', '.join(notes)})")
    return " | fields " + ", ".join(parts)


ANSI_MODE = "spark.sql.ansi.enabled"


@contextmanager
def lenient_expressions(spark: SparkSession, fields: Sequence[object], user_conf: dict[str, str]) -> Iterator[None]:
    """While the job runs: its session's ANSI mode off when it evaluates fields (module docstring),
    unless the user set it; restored afterwards (a session may outlive the job)."""
    if not fields or ANSI_MODE in user_conf:
        yield
        return
    before = spark.conf.get(ANSI_MODE, None)
    spark.conf.set(ANSI_MODE, "false")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(ANSI_MODE)
        else:
            spark.conf.set(ANSI_MODE, before)
