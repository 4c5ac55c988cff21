"""`msgindex upgrade PATH`: convert a store written by an older msgindex to the current format."""

from __future__ import annotations

import argparse

from msgindex.cli.store_args import PATH_HELP, add_storage_options, open_store_of, storage_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "upgrade",
        help="convert a store written by an older msgindex to the current on-disk format, in place",
        description=(
            "Convert the store at PATH to the current format (format 1 row-per-record metadata logs -> "
            "format 2 compressed columnar record batches). Each shard's new log is built beside the old "
            "one, verified record by record, then swapped in; a crash at any point leaves the store "
            "readable by re-running this command. Stop the indexing job first (it holds the shard locks). "
            "A store on object storage (s3://, gs://, az://) is always in the current format."
        ),
    )
    parser.add_argument("path", metavar="PATH", help=PATH_HELP)
    add_storage_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from msgindex.storage.location import is_object_store_url, parse_location
    from msgindex.storage.maintenance.upgrade import upgrade_store

    if is_object_store_url(args.path):
        with open_store_of(args) as store:  # a missing store or bucket is an error naming it
            print(f"{store.root}: a store on object storage is always in the current format (it was written in it): "
                  f"nothing to upgrade")
        return 0
    for line in upgrade_store(parse_location(args.path, storage_options(args)).local_path).lines():
        print(line)
    return 0
