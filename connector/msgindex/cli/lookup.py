"""``msgindex lookup``: find messages by key (or scan a time window) in a store, without Spark.

    msgindex lookup PATH --key K [--key K2 ...] [--topic T] [--begin B] [--end E] [--max N]
    msgindex lookup PATH --scan [--topic T] [--begin B] [--end E] [--max N]
    msgindex lookup STORE_ROOT --mode rocketmq --key K --topic T [--hash-slot-num S --index-num N]

With ``--mode rocketmq`` PATH is a RocketMQ broker's store root (the directory holding
``commitlog/`` and ``index/``): every hit of the broker's index is verified against its commit
log (real topic, keys and store time in ms), with no 64-message cap.

Keys are given as results show them (key bytes that are not UTF-8 as ``\\xNN``, README "Keys
that are not UTF-8"). Times are epoch milliseconds or ISO-8601 with a zone. Output: an aligned table (default), JSON
lines (one object per message) or CSV with a header.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from msgindex.cli.store_args import add_storage_options, open_store_of
from msgindex.errors import InvalidOptionError
from msgindex.spark.read.options import MODE_ROCKETMQ, MODE_STORE, MODES, parse_time_ms
from msgindex.storage.index_file import DEFAULT_HASH_SLOT_NUM, DEFAULT_INDEX_NUM

FORMATS = ("table", "json", "csv")
TABLE_COLUMN_MAX = 48  # longer cells are cut in table output (json/csv keep everything)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``lookup`` subcommand."""
    parser = subparsers.add_parser(
        "lookup", help="find messages by key, or scan a time window, in a msgindex store",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", metavar="PATH", help="the store root (msgindex's: a local path or s3://, gs://, az:// "
                        "URL; or a RocketMQ broker's store root)")
    add_storage_options(parser)
    parser.add_argument("--mode", choices=MODES, default=MODE_STORE,
                        help="store: a msgindex store (default); rocketmq: a RocketMQ broker's store root")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--key", action="append", metavar="K",
                      help="a key to find (repeatable), as results show it: key bytes that are not UTF-8 as \\xNN")
    what.add_argument("--scan", action="store_true", help="list every message in the time window")
    parser.add_argument("--topic", action="append", metavar="T", help="only this topic (repeatable)")
    parser.add_argument("--begin", metavar="TIME", help="window start, inclusive (epoch ms or ISO-8601 with zone)")
    parser.add_argument("--end", metavar="TIME", help="window end, inclusive")
    parser.add_argument("--broker", action="append", metavar="B", help="only this shard (repeatable)")
    parser.add_argument("--partition", action="append", type=int, metavar="P", help="only this partition (repeatable)")
    parser.add_argument("--max", type=int, metavar="N", help="at most N messages")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    rocketmq = parser.add_argument_group("--mode rocketmq")
    rocketmq.add_argument("--hash-slot-num", type=int, default=DEFAULT_HASH_SLOT_NUM, metavar="S",
                          help=f"the broker's maxHashSlotNum (default {DEFAULT_HASH_SLOT_NUM})")
    rocketmq.add_argument("--index-num", type=int, default=DEFAULT_INDEX_NUM, metavar="N",
                          help=f"the broker's maxIndexNum (default {DEFAULT_INDEX_NUM})")
    rocketmq.add_argument("--broker-name", metavar="B", help="the rows' broker (default: the store directory's name)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the messages found; exit code 0 (also when none are found)."""
    begin = parse_time_ms("--begin", args.begin) if args.begin is not None else None
    end = parse_time_ms("--end", args.end) if args.end is not None else None
    if begin is not None and end is not None and begin > end:
        raise InvalidOptionError(f"--begin {args.begin} is after --end {args.end}: the window holds no time "
                                 f"(both bounds are inclusive)")
    if args.max is not None and args.max <= 0:
        raise InvalidOptionError(f"--max {args.max}: must be a positive number")
    if args.mode == MODE_ROCKETMQ:
        table = _rocketmq(args, begin, end)
        write_rows(table, args.format, sys.stdout)
        return 0
    if args.broker_name is not None:
        raise InvalidOptionError("--broker-name is for --mode rocketmq (a msgindex store names its shards)")
    with open_store_of(args) as store:
        if args.scan:
            table = _scan(store, args, begin, end)
        else:
            table = _lookup(store, args, begin, end)
    write_rows(table, args.format, sys.stdout)
    return 0


def _lookup(store, args: argparse.Namespace, begin: int | None, end: int | None) -> pa.Table:
    from msgindex.storage.message import text_of_shown
    from msgindex.storage.query import sort_and_limit

    keys = [text_of_shown(key) for key in args.key]  # as shown in results (README: keys that are not UTF-8)
    tables = [
        store.lookup(keys, topic=topic, begin_ms=begin, end_ms=end, max_results=args.max,
                     brokers=args.broker, partitions=args.partition)
        for topic in (args.topic or [None])
    ]
    return sort_and_limit(tables, args.max)


def _rocketmq(args: argparse.Namespace, begin: int | None, end: int | None) -> pa.Table:
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
            return store.lookup(args.key, topic=args.topic, begin_ms=begin, end_ms=end, max_results=args.max,
                                partitions=args.partition)
        batches, rows = [], 0
        for batch in store.scan(begin_ms=begin, end_ms=end, topics=args.topic, partitions=args.partition):
            batches.append(batch if args.max is None else batch.slice(0, args.max - rows))
            rows += batches[-1].num_rows
            if args.max is not None and rows >= args.max:
                break
        return pa.Table.from_batches(batches, schema=row_schema(False))


def _scan(store, args: argparse.Namespace, begin: int | None, end: int | None) -> pa.Table:
    batches, rows = [], 0
    for batch in store.scan(begin_ms=begin, end_ms=end, brokers=args.broker, topics=args.topic,
                            partitions=args.partition):
        if args.max is not None and rows + batch.num_rows >= args.max:
            batches.append(batch.slice(0, args.max - rows))
            break
        batches.append(batch)
        rows += batch.num_rows
    from msgindex.storage.message import ROW_SCHEMA

    return pa.Table.from_batches(batches, schema=ROW_SCHEMA)


def _records(table: pa.Table) -> Iterator[dict[str, Any]]:
    for row in table.to_pylist():
        row["timestamp"] = row["timestamp"].isoformat(timespec="milliseconds").replace("+00:00", "Z")
        yield row


def write_rows(table: pa.Table, fmt: str, out) -> None:
    """Write result rows (ROW_SCHEMA, or RocketMQ's verified rows) to `out` as a table, JSON
    lines or CSV."""
    if fmt == "json":
        for row in _records(table):
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
        return
    names = table.schema.names
    if fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(names)
        for row in _records(table):
            writer.writerow([" ".join(v) if isinstance(v, list) else ("" if v is None else v)
                             for v in (row[n] for n in names)])
        return
    cells = [[_cell(row[n]) for n in names] for row in _records(table)]
    widths = [max([len(n)] + [len(r[i]) for r in cells]) for i, n in enumerate(names)]
    out.write("  ".join(n.ljust(w) for n, w in zip(names, widths)).rstrip() + "\n")
    for r in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")
    out.write(f"({table.num_rows} message{'s' if table.num_rows != 1 else ''})\n")


def _cell(value: Any) -> str:
    text = "" if value is None else ",".join(value) if isinstance(value, list) else str(value)
    return text if len(text) <= TABLE_COLUMN_MAX else text[: TABLE_COLUMN_MAX - 1] + "…"
