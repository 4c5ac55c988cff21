"""`msgindex inspect PATH`: summarise any file, shard or store of msgindex (or a RocketMQ index file)
and verify it: every problem found is one line on stderr, and the exit code is then 2."""

from __future__ import annotations

import argparse
import sys

from msgindex.cli.store_args import add_storage_options, storage_options
from msgindex.storage.hash_index.rocketmq_sizing import DEFAULT_HASH_SLOT_NUM, DEFAULT_INDEX_NUM


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show what is in an index file, log segment, shard or store",
        description=(
            "Summarise PATH: a store (per-shard summaries), a shard directory (broker=<name>), any file "
            "of a store (manifest, checkpoint, log segment and its .index/.timeindex/.summary, hash "
            "index file, hash run, lock and job files) or a RocketMQ index file (header, counts, time "
            "range, slot fill, hash-chain lengths). Stores, shards and their files are verified against "
            "each other (every committed hash index entry against the log): each problem is printed as "
            "one line on stderr and the exit code is 2. On an object store (s3://, gs://, az://): the store, "
            "a shard, a shard version or a chunk object; the verification reads every version and chunk "
            "(checksums, batches, hash items against their records) and names each damaged or orphaned object."
        ),
    )
    parser.add_argument("path", metavar="PATH", help="index file, log segment, shard directory or store root; or an "
                        "object-store URL of a store, shard (.../broker=B), version or chunk object")
    add_storage_options(parser)
    parser.add_argument(
        "--hash-slots",
        type=int,
        default=None,
        help=f"hash slot count of an index file outside a store (default: RocketMQ's {DEFAULT_HASH_SLOT_NUM})",
    )
    parser.add_argument(
        "--index-num",
        type=int,
        default=None,
        help=f"entry capacity of an index file outside a store (default: RocketMQ's {DEFAULT_INDEX_NUM})",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--quick", action="store_true",
                        help="skip the deep verification (every hash index entry against the log; on an object "
                             "store every chunk read whole): only the checks every reader makes when it opens a "
                             "shard")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the summary; with problems, print them instead (one line each on stderr) and exit 2."""
    from msgindex.storage.maintenance.inspect import format_json, format_report, inspect_path, problems_of

    report = inspect_path(args.path, hash_slot_num=args.hash_slots, index_num=args.index_num, verify=not args.quick,
                          storage_options=storage_options(args))
    problems = problems_of(report)
    if problems:
        for problem in problems:
            print(f"msgindex inspect: {problem}", file=sys.stderr)
        return 2
    print(format_json(report) if args.json else format_report(report))
    return 0
