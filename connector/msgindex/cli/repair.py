"""msgindex repair: rebuild a shard's lost or unreadable checkpoint from its files, remove damaged
derived files, and (when asked) forget shards whose directories are gone.

    msgindex repair PATH [--broker B ...] [--dry-run] [--forget-missing]

Stop the indexing job first: a shard whose writer lock is held is refused. Nothing is written
unless the rebuilt checkpoint verifies against every file of the shard (as msgindex inspect
verifies); a shard that cannot be rebuilt safely is refused with the reason, exit code 2.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``repair`` subcommand."""
    parser = subparsers.add_parser(
        "repair", help="rebuild a lost or damaged shard checkpoint from the shard's files",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", metavar="PATH", help="the store root (the directory holding msgindex.json)")
    parser.add_argument("--broker", action="append", metavar="B", help="only this shard (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be done; write nothing")
    parser.add_argument("--forget-missing", action="store_true",
                        help="remove shards whose directories are gone from the store manifest (accepting that "
                             "their records are lost; a replay from Kafka indexes them again)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print what was done per shard; exit 2 when a shard was refused (its reason on stderr)."""
    from msgindex.storage.repair import repair_store

    report = repair_store(args.path, brokers=args.broker, forget_missing=args.forget_missing, dry_run=args.dry_run)
    for line in report.lines():
        print(line)
    for shard in report.refused:
        print(f"msgindex repair: broker={shard.broker}: {shard.action}", file=sys.stderr)
    return 2 if report.refused else 0
