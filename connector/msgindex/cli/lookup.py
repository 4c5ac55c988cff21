"""msgindex lookup: find messages by key (or scan a time window) in an index, without Spark.

examples:
  msgindex lookup ./index --key order-00321 --since 1h
  msgindex lookup ./index --key order-00321 --values --bootstrap-servers 127.0.0.1:9092
  msgindex lookup ./index --key a --key b --topic orders --begin '2026-11-25 10:00' --end now
  msgindex lookup ./index --scan --since 15m --limit 20
  msgindex lookup STORE_ROOT --mode rocketmq --key K --topic T

A key finds every message indexed under it: the record key, each token of its KEYS header and
its UNIQ_KEY header (or the keys of a metadata event). Give keys as results show them: key bytes
that are not UTF-8 as \\xNN (lowercase hex), a literal backslash before x and two hex digits as
\\x5c.

Times (--begin, --end, --since): epoch milliseconds; ISO-8601 with a zone (2026-11-25T10:00:00Z,
2026-11-25 11:00+01:00) or without one, which is read as UTC (2026-11-25 10:00); or relative to
now: now, -15m, 1h (= 1h ago), 2d ago, now-1h30m. Both bounds are inclusive. Times are shown
in UTC, ISO-8601, which these options take back as they are.

At most --limit messages are shown (100 unless given; 0: all), the first in time order, and
the output says how many more there are. With --values each message's value (pretty JSON,
text, or hex when it is not UTF-8) and headers are fetched from Kafka by topic, partition and
offset; --bootstrap-servers names the cluster the index was built from.

With --mode rocketmq, PATH is a RocketMQ broker's store root (the directory holding commitlog/
and index/): every hit of the broker's index is verified against its commit log (real topic,
keys and store time in ms), with no 64-message cap.

Output: a table (default), JSON lines (one object per message) or CSV with a header. Each
field the index indexes (msgindex index --index-field/--index-header) is a column too, after the
message's own: a value, a list of them for an array field, empty where a message carries none (a
table leaves out a field no message shown carries).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

import pyarrow as pa

from msgindex.cli.store_args import add_storage_options, open_store_of
from msgindex.errors import FieldCoverageWarning, InvalidOptionError, unknown_name
from msgindex.spark.read.options import MODE_ROCKETMQ, MODE_STORE, MODES
from msgindex.storage.fields import store_fields
from msgindex.storage.hash_index.index_file import DEFAULT_HASH_SLOT_NUM, DEFAULT_INDEX_NUM
from msgindex.storage.query import Query
from msgindex.times import current_ms, format_ms, format_window, read_time

if TYPE_CHECKING:
    from msgindex.storage.objects.store import ObjectStore
    from msgindex.storage.store import Store

FORMATS = ("table", "json", "csv")
VALUE_FORMATS = ("auto", "json", "text", "hex")
DEFAULT_LIMIT = 100
TABLE_COLUMN_MAX = 48  # longer cells are cut in table output (json/csv keep everything)
# the table's columns, in this order; the RocketMQ metadata columns only when a row has them
TABLE_COLUMNS = ("timestamp", "topic", "partition", "offset", "key", "keys", "broker")
OPTIONAL_TABLE_COLUMNS = ("commit_log_offset", "size", "verified")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``lookup`` subcommand."""
    parser = subparsers.add_parser(
        "lookup", help="find messages by key (with their payloads), or scan a time window",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", metavar="PATH", help="the index: a local path or an s3://, gs://, az:// URL (or, with "
                        "--mode rocketmq, a RocketMQ store root)")
    add_storage_options(parser)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--key", action="append", metavar="K", help="a key to find (repeatable)")
    what.add_argument("--field", action="append", metavar="NAME=VALUE",
                      help="a value of a field the index indexes (msgindex index --index-field/--index-header) to "
                           "find (repeatable)")
    what.add_argument("--scan", action="store_true", help="list every message in the time window")
    parser.add_argument("--topic", action="append", metavar="T", help="only this topic (repeatable)")
    window = parser.add_mutually_exclusive_group()
    window.add_argument("--since", metavar="TIME", help="window start: 1h (= 1h ago), 15m, or any time --begin takes")
    window.add_argument("--begin", metavar="TIME", help="window start, inclusive (see times above)")
    parser.add_argument("--end", metavar="TIME", help="window end, inclusive (default: no end)")
    parser.add_argument("--broker", action="append", metavar="B", help="only this shard (repeatable)")
    parser.add_argument("--partition", action="append", type=int, metavar="P", help="only this partition (repeatable)")
    parser.add_argument("--limit", type=int, metavar="N", default=DEFAULT_LIMIT,
                        help=f"show at most N messages, the first in time (default {DEFAULT_LIMIT}; 0: all)")
    parser.add_argument("--max", type=int, dest="limit", help=argparse.SUPPRESS)  # the old name of --limit
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    values = parser.add_argument_group("payloads")
    values.add_argument("--values", action="store_true",
                        help="also show each message's value and headers, fetched from Kafka")
    values.add_argument("--bootstrap-servers", metavar="HOST:PORT",
                        help="the Kafka cluster to fetch values from (needed with --values)")
    values.add_argument("--value-format", choices=VALUE_FORMATS, default="auto",
                        help="auto (default): pretty JSON if the value is JSON, else text if UTF-8, else hex")
    rocketmq = parser.add_argument_group("--mode rocketmq")
    rocketmq.add_argument("--mode", choices=MODES, default=MODE_STORE,
                          help="store: a msgindex index (default); rocketmq: a RocketMQ broker's store root")
    rocketmq.add_argument("--hash-slot-num", type=int, default=DEFAULT_HASH_SLOT_NUM, metavar="S",
                          help=f"the broker's maxHashSlotNum (default {DEFAULT_HASH_SLOT_NUM})")
    rocketmq.add_argument("--index-num", type=int, default=DEFAULT_INDEX_NUM, metavar="N",
                          help=f"the broker's maxIndexNum (default {DEFAULT_INDEX_NUM})")
    rocketmq.add_argument("--broker-name", metavar="B", help="the rows' broker (default: the store directory's name)")
    parser.set_defaults(handler=run)


@dataclass(frozen=True)
class Found:
    """What a lookup or scan found: the rows shown (at most the limit) and how many more there
    are (`more_at_least`: a scan stops at the limit, so it knows there is more, not how much)."""

    rows: pa.Table
    more: int = 0
    more_at_least: bool = False


def run(args: argparse.Namespace) -> int:
    """Print the messages found; exit code 0 (also when none are found)."""
    begin, end = window_of(args)
    if args.topic:  # a topic given twice is asked once (its rows come once, the header names it once)
        args.topic = list(dict.fromkeys(args.topic))
    if args.limit < 0:
        raise InvalidOptionError(f"--limit {args.limit}: must be 0 (all) or a positive number")
    limit = args.limit or None
    shown_fields: tuple[tuple[str, str], ...] = ()
    if args.values and not args.bootstrap_servers:
        raise InvalidOptionError("--values needs --bootstrap-servers HOST:PORT: the Kafka cluster the index "
                                 "was built from (the index keeps metadata, not payloads)")
    if args.mode == MODE_ROCKETMQ:
        if args.field:
            raise InvalidOptionError("--field is for msgindex indexes (a RocketMQ store indexes keys only)")
        found = _rocketmq(args, begin, end, limit)
    else:
        if args.broker_name is not None:
            raise InvalidOptionError("--broker-name is for --mode rocketmq (a msgindex index names its shards)")
        with open_store_of(args) as store:
            check_names(store, args.topic, args.broker)
            shown_fields = store_fields(store)  # every field the index has is a column of its rows
            check_field_names(shown_fields, [name for name, _ in field_values(args.field or ())])
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", FieldCoverageWarning)
                found = (_scan(store, args, begin, end, limit, shown_fields) if args.scan
                         else _lookup(store, args, begin, end, limit, shown_fields))
            for message in dict.fromkeys(str(w.message) for w in caught if w.category is FieldCoverageWarning):
                sys.stderr.write(f"msgindex lookup: warning: {message}\n")
    values = None
    if args.values and args.mode == MODE_STORE:
        values = fetch_payloads(args.bootstrap_servers, found.rows)
    elif args.values:  # the RocketMQ store holds the bodies itself
        values = {(r["topic"], r["partition"], r["offset"]): Payload(r["value"], _properties(r))
                  for r in found.rows.to_pylist()}
    out = sys.stdout
    if args.format == "table":
        what = "every message" if args.scan else "messages under " + ", ".join(args.key or args.field)
        out.write(f"{what}{' in ' + ', '.join(args.topic) if args.topic else ''}, "
                  f"window {format_window(begin, end)} (UTC)\n")
    write_rows(found.rows, args.format, out, values=values, value_format=args.value_format,
               fields=[name for name, _ in shown_fields])
    note = more_note(found, limit)
    if note:
        (out if args.format == "table" else sys.stderr).write(note + "\n")
    return 0


def window_of(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """(begin_ms, end_ms) of --since/--begin and --end, relative times counted from one now."""
    now = current_ms()
    option, text = ("--since", args.since) if args.since is not None else ("--begin", args.begin)
    begin = None if text is None else read_time(option, text).resolve(now_ms=now)
    end = None if args.end is None else read_time("--end", args.end).resolve(now_ms=now)
    if begin is not None and end is not None and begin > end:
        raise InvalidOptionError(f"{option} {text} is after --end {args.end}: the window holds no time "
                                 f"(both bounds are inclusive; {format_ms(begin)} > {format_ms(end)})")
    return begin, end


def index_topics(store: Store | ObjectStore) -> list[str]:
    """Every topic the index holds messages of (the shards' committed topic lists)."""
    topics: set[str] = set()
    for broker in store.brokers():
        with store.reader(broker) as reader:
            topics.update(reader.topics)
    return sorted(topics)


def check_names(store: Store | ObjectStore, topics: list[str] | None, brokers: list[str] | None) -> None:
    """InvalidOptionError naming a --topic or --broker the index does not have, and the ones it has."""
    for option, given, present in (("--broker", brokers, lambda: store.brokers()),
                                   ("--topic", topics, lambda: index_topics(store))):
        if not given:
            continue
        have = present()
        unknown = [name for name in given if name not in have]
        if unknown:
            raise InvalidOptionError(unknown_name_message(option, unknown[0], have))


def check_field_names(indexed: tuple[tuple[str, str], ...], names: list[str]) -> None:
    """InvalidOptionError naming a --field none of the `indexed` fields is, and the fields there
    are (``fields.check_field_names``)."""
    from msgindex.storage.fields import check_field_names as check_indexed

    if names:
        check_indexed(indexed, names, lambda name: f"--field {name}")


def unknown_name_message(option: str, name: str, have: list[str]) -> str:
    """``--topic demo-ordrs: the index has no such topic (did you mean demo-orders? it has: ...)``"""
    what = "field" if "field" in option else "topic" if "topic" in option else "shard"
    return unknown_name(f"{option} {name}", what, name, have)


def _lookup(store, args: argparse.Namespace, begin: int | None, end: int | None, limit: int | None,
            field_columns: tuple[tuple[str, str], ...]) -> Found:
    from msgindex.storage.message import text_of_shown

    keys = [text_of_shown(key) for key in args.key or ()]
    fields = field_values(args.field or ())
    table = store.lookup(Query.of(keys if args.key else None, fields=fields or None, topics=args.topic,
                                  begin_ms=begin, end_ms=end, brokers=args.broker, partitions=args.partition,
                                  field_columns=field_columns))
    return _limited(table, limit)


def field_values(items: Iterable[str]) -> list[tuple[str, str]]:
    """--field NAME=VALUE flags as (name, value) pairs (a value shown with escapes: as keys are)."""
    from msgindex.storage.message import text_of_shown

    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise InvalidOptionError(f"--field {item!r} is not NAME=VALUE")
        pairs.append((name, text_of_shown(value)))
    return pairs


def _limited(table: pa.Table, limit: int | None) -> Found:
    if limit is None or table.num_rows <= limit:
        return Found(table)
    return Found(table.slice(0, limit), more=table.num_rows - limit)


def _scan(store, args: argparse.Namespace, begin: int | None, end: int | None, limit: int | None,
          field_columns: tuple[tuple[str, str], ...]) -> Found:
    from msgindex.storage.log.batch_format import field_schema

    query = Query.of(begin_ms=begin, end_ms=end, brokers=args.broker, topics=args.topic, partitions=args.partition,
                     field_columns=field_columns)
    return _first_of(store.scan(query), field_schema([(name, name, shape) for name, shape in field_columns]), limit)


def _first_of(batches: Iterator[pa.RecordBatch], schema: pa.Schema, limit: int | None) -> Found:
    """The first `limit` rows of a scan, reading no further than one batch past them."""
    kept, rows = [], 0
    for batch in batches:
        if limit is not None and rows + batch.num_rows > limit:
            kept.append(batch.slice(0, limit - rows))
            return Found(pa.Table.from_batches(kept, schema=schema), more=1, more_at_least=True)
        kept.append(batch)
        rows += batch.num_rows
    return Found(pa.Table.from_batches(kept, schema=schema))


def _rocketmq(args: argparse.Namespace, begin: int | None, end: int | None, limit: int | None) -> Found:
    from msgindex.storage.rocketmq.broker_store import is_broker_store, open_rocketmq, row_schema

    if not is_broker_store(args.path):
        raise InvalidOptionError(
            f"{args.path}: --mode rocketmq needs a broker's store root (the directory holding commitlog/ and index/)"
        )
    if args.broker is not None:
        raise InvalidOptionError("--broker selects msgindex shards; a RocketMQ store root is one broker (see --broker-name)")
    with open_rocketmq(args.path, hash_slot_num=args.hash_slot_num, index_num=args.index_num,
                       broker_name=args.broker_name) as store:
        if not args.scan:
            if not args.topic:
                raise InvalidOptionError("--mode rocketmq --key needs --topic: RocketMQ hashes topic + '#' + key")
            return _limited(store.lookup(args.key, topic=args.topic, begin_ms=begin, end_ms=end,
                                         partitions=args.partition, fetch_values=args.values), limit)
        return _first_of(store.scan(begin_ms=begin, end_ms=end, topics=args.topic, partitions=args.partition,
                                    fetch_values=args.values), row_schema(args.values), limit)


def more_note(found: Found, limit: int | None) -> str:
    """What the output leaves out, and how to see it ('' when nothing)."""
    if not found.more:
        return ""
    if found.more_at_least:
        return (f"(the scan stopped after {limit:,} messages; more follow in the window: --limit 0 shows all, "
                f"--end or a --topic narrows it)")
    return f"({found.more:,} more message{'s' if found.more != 1 else ''} not shown: --limit 0 shows all)"


# --- payloads -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Payload:
    """A message's value and headers as Kafka returned them (None: the log no longer has it)."""

    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None


def fetch_payloads(bootstrap_servers: str, rows: pa.Table) -> dict[tuple[str, int, int], Payload]:
    """The value and headers of every row, fetched from Kafka (missing: no longer in the log)."""
    from msgindex.spark.read.kafka_values import fetch_messages

    ids = list(zip(rows["topic"].to_pylist(), rows["partition"].to_pylist(), rows["offset"].to_pylist()))
    found = fetch_messages(bootstrap_servers, ids, what="--bootstrap-servers") if ids else {}
    return {id_: Payload(record.value, list(record.headers or [])) for id_, record in found.items()}


def _properties(row: dict[str, Any]) -> list[tuple[str, bytes | None]]:
    return [(name, None if value is None else value.encode()) for name, value in (row.get("properties") or [])]


def render_value(value: bytes | None, fmt: str = "auto") -> tuple[str, str]:
    """(how it is shown: json | text | hex | missing, the text) of a message value. Only UTF-8
    without control characters (but tabs and line ends) is text: JSON parsers also guess UTF-16
    and UTF-32, and four bytes of Kafka's IntegerSerializer are valid UTF-8 (NULs), yet neither is
    text, and control characters would reach the terminal. JSON is shown indented when that keeps
    every member and number exactly as sent, else as sent."""
    if value is None:
        return "missing", "(no longer in Kafka: retention or compaction removed it)"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "hex", value.hex(" ")
    if _CONTROL.search(text):
        return "hex", value.hex(" ")
    if fmt in ("auto", "json"):
        shown = _json_shown(text)
        if shown is not None:
            return "json", shown
        if fmt == "json":
            return "hex", value.hex(" ")
    if fmt in ("auto", "text", "json"):
        return "text", text
    return "hex", value.hex(" ")


_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]|\r(?!\n)")


def _json_shown(text: str) -> str | None:
    """`text` indented when it is strict JSON (no NaN or Infinity) that re-serializes without
    loss; `text` itself when re-serializing would change it (a repeated member, a number written
    another way, a lone surrogate escape); None when it is not JSON."""
    faithful = True

    def members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal faithful
        faithful &= len({name for name, _ in pairs}) == len(pairs)
        return dict(pairs)

    def number(kind: type) -> Callable[[str], Any]:
        def parse(written: str) -> Any:
            nonlocal faithful
            parsed = kind(written)
            faithful &= json.dumps(parsed) == written
            return parsed
        return parse

    def not_json(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    try:
        parsed = json.loads(text, object_pairs_hook=members, parse_float=number(float), parse_int=number(int),
                            parse_constant=not_json)
    except (ValueError, RecursionError):
        return None
    if not faithful:
        return text
    shown = json.dumps(parsed, indent=2, ensure_ascii=False)
    try:
        shown.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape ("\ud800"): shown as sent
        return text
    return shown


def render_header(value: bytes | None) -> str:
    """A header value as keys are shown (``message.arrow_text`` of its bytes read as Kafka key
    bytes): UTF-8 as it is, other bytes as \\xNN escapes that cannot be mistaken for text (a text
    "\\xff" shows as "\\x5cxff"), control characters escaped the same way."""
    if value is None:
        return "null"
    from msgindex.storage.message import arrow_text, decode_key_bytes

    return _unmistakable_controls(arrow_text(decode_key_bytes(value)))


# --- output -------------------------------------------------------------------------------------
def _records(table: pa.Table) -> Iterator[dict[str, Any]]:
    """Rows as dicts, each timestamp as ISO-8601 UTC text (``times.format_ms``)."""
    micros = table["timestamp"].cast(pa.int64()).to_pylist()
    for row, stamp in zip(table.to_pylist(), micros):
        row["timestamp"] = None if stamp is None else format_ms(stamp // 1000)
        yield row


def write_rows(table: pa.Table, fmt: str, out: TextIO, *, values: dict | None = None,
               value_format: str = "auto", fields: Iterable[str] = ()) -> None:
    """Write result rows (ROW_SCHEMA, or RocketMQ's verified rows) to `out` as a table, JSON
    lines or CSV; with `values` (``fetch_payloads``), each message's value and headers too.
    `fields`: the rows' field columns (a table shows those some row has a value of)."""
    names = [name for name in table.schema.names if name not in ("value", "properties")]
    records = list(_records(table))
    if values is not None:
        for row in records:
            payload = values.get((row["topic"], row["partition"], row["offset"])) or Payload(None, None)
            shown, text = render_value(payload.value, value_format)
            row["value"] = None if payload.value is None else text
            row["value_format"] = shown
            row["headers"] = None if payload.headers is None else [
                {"key": key, "value": render_header(value)} for key, value in payload.headers]
    if fmt == "json":
        for row in records:
            row.pop("properties", None)
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
        return
    if fmt == "csv":
        columns = names + (["value", "value_format", "headers"] if values is not None else [])
        writer = csv.writer(out)
        writer.writerow(columns)
        for row in records:
            writer.writerow([_csv_cell(row[n]) for n in columns])
        return
    shown = [n for n in TABLE_COLUMNS if n in names] + [
        n for n in (*fields, *OPTIONAL_TABLE_COLUMNS) if n in names and any(r[n] is not None for r in records)]
    after_row = None if values is None else (lambda row: _write_payload(row, out))
    _write_table(records, shown, out, after_row)
    out.write(f"({len(records)} message{'s' if len(records) != 1 else ''})\n")


def _write_table(records: list[dict[str, Any]], names: list[str], out: TextIO, after_row=None) -> None:
    """An aligned table of `records`; `after_row(row)` writes what follows each row (its payload)."""
    cells = [[_cell(row[n]) for n in names] for row in records]
    widths = [max([len(n)] + [len(r[i]) for r in cells]) for i, n in enumerate(names)]
    out.write("  ".join(n.ljust(w) for n, w in zip(names, widths)).rstrip() + "\n")
    for row, r in zip(records, cells):
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")
        if after_row is not None:
            after_row(row)


def _write_payload(row: dict[str, Any], out: TextIO) -> None:
    if row["headers"] is not None:
        out.write("  headers: " + (", ".join(f"{h['key']}={h['value']}" for h in row["headers"]) or "none") + "\n")
    body = row["value"] if row["value"] is not None else render_value(None)[1]
    out.write(f"  value ({row['value_format']}):\n")
    out.write("".join(f"    {line}\n" for line in body.splitlines() or [""]))


def _csv_cell(value: Any) -> Any:
    if isinstance(value, list):
        return " ".join(f"{v['key']}={v['value']}" if isinstance(v, dict) else str(v) for v in value)
    return "" if value is None else value


def _cell(value: Any) -> str:
    if value is None:
        text = ""
    elif isinstance(value, list):
        text = ",".join(_unmistakable(item, in_list=True) for item in value)
    else:
        text = _unmistakable(value) if isinstance(value, str) else str(value)
    return text if len(text) <= TABLE_COLUMN_MAX else text[: TABLE_COLUMN_MAX - 1] + "…"


# what a table cell escapes (as \xNN, which --key reads back: message.text_of_shown): control
# characters (a line end would break the row, an ANSI escape would reach the terminal), spaces at
# either end (a key "k1 " would look like "k1", " " like no key) and, in a list, commas
_TABLE_ESCAPED = re.compile("[\x00-\x1f\x7f-\x9f]|^ +| +$")
_LIST_ESCAPED = re.compile("[\x00-\x1f\x7f-\x9f,]|^ +| +$")
_CONTROLS_ONLY = re.compile("[\x00-\x1f\x7f-\x9f]")


def _unmistakable_controls(text: str) -> str:
    """`text` with its control characters as \\xNN escapes (what --key reads back)."""
    return _CONTROLS_ONLY.sub(_as_escapes, text)


def _unmistakable(text: str, *, in_list: bool = False) -> str:
    """`text` as a table cell shows it so that no other text looks the same."""
    return (_LIST_ESCAPED if in_list else _TABLE_ESCAPED).sub(_as_escapes, text)


def _as_escapes(found: re.Match[str]) -> str:
    return "".join(f"\\x{ord(c):02x}" for c in found.group())
