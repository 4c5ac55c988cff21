"""`msgindex inspect PATH`: summarise an index file, a log segment, a shard or a whole store."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show what is in an index file, log segment, shard or store",
        description=(
            "Summarise PATH: a store (per-shard summaries), a shard directory (broker=<name>), a "
            "metadata-log segment (.log/.index/.timeindex) or a RocketMQ index file (header, counts, "
            "time range, slot fill, hash-chain lengths)."
        ),
    )
    parser.add_argument("path", metavar="PATH", help="index file, log segment, shard directory or store root")
    parser.add_argument(
        "--hash-slots",
        type=int,
        default=None,
        help="hash slot count of an index file outside a store (default: RocketMQ's 5000000)",
    )
    parser.add_argument(
        "--index-num",
        type=int,
        default=None,
        help="entry capacity of an index file outside a store (default: RocketMQ's 20000000)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from msgindex.storage.inspect import format_json, format_report, inspect_path

    report = inspect_path(args.path, hash_slot_num=args.hash_slots, index_num=args.index_num)
    print(format_json(report) if args.json else format_report(report))
    return 0
