"""msgindex retention: delete a store's expired log segments and the hash index files that
only point into them, now (the indexing job does the same between appends when given
--retention-ms / --retention-bytes).

    msgindex retention PATH --max-age 7d [--max-bytes 50GiB] [--dry-run]

Never the active segment or index file of a shard, and never an index file that a retained
record needs (every record a scan returns stays findable by its keys). On an object store
(s3://, gs://, az://) the oldest whole chunks of each shard leave its newest version (never the
newest chunk); their objects are deleted after the grace period, when no reader needs them.
"""

from __future__ import annotations

import argparse
import re

from msgindex.cli.store_args import PATH_HELP, add_storage_options, open_store_of
from msgindex.errors import InvalidOptionError
from msgindex.times import parse_duration_ms

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``retention`` subcommand."""
    parser = subparsers.add_parser(
        "retention", help="delete a store's expired log segments and index files now",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", metavar="PATH", help=PATH_HELP)
    add_storage_options(parser)
    parser.add_argument("--max-age", metavar="AGE",
                        help="delete segments whose newest record is older than this: 7d, 12h, 30m, 45s, 500ms, "
                             "or milliseconds")
    parser.add_argument("--max-bytes", metavar="SIZE",
                        help="shrink each shard to at most this size: 50GiB, 500MB, 10g, or bytes")
    parser.add_argument("--dry-run", action="store_true", help="print what would be deleted; delete nothing")
    parser.set_defaults(handler=run)


def parse_size_bytes(option: str, text: str) -> int:
    """Bytes of a size such as ``50GiB``, ``500MB``, ``10g`` or ``1048576`` (K/M/G/T are powers of
    1024 with or without the ``i``: disk sizes of index files, not marketing units)."""
    match = _SIZE.match(text)
    if not match:
        raise InvalidOptionError(f"{option} {text!r} is not a size: use e.g. 50GiB, 500MB, 10g or bytes")
    unit = (match.group(2) or "b").lower()[0]
    return _bounded(option, text, float(match.group(1)) * 1024 ** "bkmgt".index(unit))


def _bounded(option: str, text: str, value: float) -> int:
    """`value` as an int, or InvalidOptionError naming the option when it is past a Java long
    (a string of digits long enough becomes ``inf`` as a float)."""
    if not value < 2**63:
        raise InvalidOptionError(f"{option} {text!r} is too large")
    return int(value)


def run(args: argparse.Namespace) -> int:
    """Apply (or with --dry-run, plan) retention and print what went; exit code 0."""
    from msgindex.storage.store import Store

    if args.max_age is None and args.max_bytes is None:
        raise InvalidOptionError("give --max-age and/or --max-bytes (nothing to do otherwise)")
    max_age = None if args.max_age is None else parse_duration_ms("--max-age", args.max_age)
    max_bytes = None if args.max_bytes is None else parse_size_bytes("--max-bytes", args.max_bytes)
    with open_store_of(args) as store:
        report = store.apply_retention(max_age_ms=max_age, max_bytes=max_bytes, dry_run=args.dry_run)
    if not isinstance(store, Store):  # on an object store: whole chunks leave the newest versions
        verb = "would remove" if args.dry_run else "removed"
        for path in report.deleted_segments:
            print(f"{verb} {path}")
        print(f"{verb} {len(report.deleted_segments)} chunk(s), {report.bytes_freed:,} bytes, from the shards' newest "
              f"versions; their objects are deleted after the grace period ({store.tuning.grace_s:g} s)")
        return 0
    verb = "would delete" if args.dry_run else "deleted"
    for path in (*report.deleted_segments, *report.deleted_index_files):
        print(f"{verb} {path}")
    print(f"{verb} {len(report.deleted_segments)} log segment(s) and {len(report.deleted_index_files)} hash index "
          f"file(s), {report.bytes_freed:,} bytes")
    return 0
