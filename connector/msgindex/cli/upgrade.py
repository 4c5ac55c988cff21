"""`msgindex upgrade PATH`: convert a store written by an older msgindex to the current format."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "upgrade",
        help="convert a store written by an older msgindex to the current on-disk format, in place",
        description=(
            "Convert the store at PATH to the current format (format 1 row-per-record metadata logs -> "
            "format 2 compressed columnar record batches). Each shard's new log is built beside the old "
            "one, verified record by record, then swapped in; a crash at any point leaves the store "
            "readable by re-running this command. Stop the indexing job first (it holds the shard locks)."
        ),
    )
    parser.add_argument("path", metavar="PATH", help="store root (the directory holding msgindex.json)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from msgindex.storage.upgrade import upgrade_store

    for line in upgrade_store(args.path).lines():
        print(line)
    return 0
