"""msgindex repair: rebuild a shard's lost or unreadable checkpoint from its files, remove damaged
derived files, and (when asked) forget shards whose directories are gone.

    msgindex repair PATH [--broker B ...] [--dry-run] [--forget-missing]
    msgindex repair URL [--broker B ...] [--dry-run] [--forget-missing] [--collect-now] [--roll-back]
                        [--min-age AGE] [--storage-option K=V ...]

Stop the indexing job first: a shard whose writer lock is held is refused. Nothing is written
unless the rebuilt checkpoint verifies against every file of the shard (as msgindex inspect
verifies); a shard that cannot be rebuilt safely is refused with the reason, exit code 2.

On an object store (s3://, gs://, az://) each shard is verified as msgindex inspect does; a
missing shard mark is put back; --collect-now deletes orphans and removed objects now instead of
after the grace period; --roll-back drops a damaged newest version (what it committed is lost:
index those offsets again); a missing or damaged chunk cannot be rebuilt (restore the object, or
re-index from Kafka into a new store). Nothing a version lists is deleted.
"""

from __future__ import annotations

import argparse
import sys

from msgindex.cli.retention import parse_duration_ms
from msgindex.cli.store_args import storage_options, store_subcommand
from msgindex.errors import InvalidOptionError

OBJECT_STORE_ONLY = ("collect_now", "roll_back", "min_age")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``repair`` subcommand."""
    parser = store_subcommand(subparsers, "repair", "rebuild a lost or damaged shard checkpoint from the shard's "
                              "files; tidy an object store", __doc__)
    parser.add_argument("--dry-run", action="store_true", help="say what would be done; write nothing")
    parser.add_argument("--forget-missing", action="store_true",
                        help="forget shards whose directories (object store: versions) are gone, accepting that "
                             "their records are lost; a replay from Kafka indexes them again")
    objects = parser.add_argument_group("object stores")
    objects.add_argument("--collect-now", action="store_true",
                         help="delete orphans and removed objects now, not after the grace period (only what "
                              "became garbage at least --min-age ago)")
    objects.add_argument("--roll-back", action="store_true",
                         help="when a shard's newest version is damaged, delete it so that the newest version that "
                              "decodes is the newest again (what the damaged one committed is lost: index it again)")
    objects.add_argument("--min-age", metavar="AGE",
                         help="with --collect-now and --forget-missing: leave what is younger (default 10m: a "
                              "writer between its chunk and its commit, a reader on an older version); 0 when "
                              "nothing reads or writes the store")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print what was done per shard; exit 2 when a shard was refused (its reason on stderr)."""
    from msgindex.storage.location import is_object_store_url, parse_location

    if is_object_store_url(args.path):
        from msgindex.storage.objects.repair import DEFAULT_MIN_AGE_MS, repair_object_store

        min_age = DEFAULT_MIN_AGE_MS if args.min_age is None else parse_duration_ms("--min-age", args.min_age)
        report = repair_object_store(args.path, storage_options(args), brokers=args.broker,
                                     forget_missing=args.forget_missing, collect_now=args.collect_now,
                                     roll_back=args.roll_back, min_age_ms=min_age, dry_run=args.dry_run)
    else:
        given = [name for name in OBJECT_STORE_ONLY if getattr(args, name) not in (None, False)]
        if given:
            raise InvalidOptionError(f"--{given[0].replace('_', '-')} is for stores on object storage (s3://, gs://, "
                                     f"az://); {args.path} is a local store")
        from msgindex.storage.maintenance.repair import repair_store

        local = parse_location(args.path, storage_options(args))  # an unknown scheme, options for a local path
        report = repair_store(local.local_path, brokers=args.broker, forget_missing=args.forget_missing,
                              dry_run=args.dry_run)
    for line in report.lines():
        print(line)
    for shard in report.refused:
        print(f"msgindex repair: broker={shard.broker}: {shard.action}", file=sys.stderr)
    return 2 if report.refused else 0
