"""How every subcommand that opens a store takes its location: PATH is a local directory or an
object-store URL (s3://, gs://, az://; ``storage.location``), and ``--storage-option K=V``
(repeatable) configures an object store's client beyond the environment (AWS_ENDPOINT_URL, ...)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from msgindex.errors import InvalidOptionError

if TYPE_CHECKING:
    from msgindex.storage.objects.store import ObjectStore
    from msgindex.storage.store import Store

PATH_HELP = "the store: a local directory, or s3://bucket/prefix, gs://bucket/prefix, az://container/prefix"


def store_subcommand(subparsers: argparse._SubParsersAction, name: str, summary: str,
                     description: str) -> argparse.ArgumentParser:
    """A subcommand's parser taking a store (PATH, ``--storage-option``) and ``--broker`` (repeatable)."""
    parser = subparsers.add_parser(name, help=summary, description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", metavar="PATH", help=PATH_HELP)
    add_storage_options(parser)
    parser.add_argument("--broker", action="append", metavar="B", help="only this shard (repeatable)")
    return parser


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--storage-option K=V`` to `parser`."""
    parser.add_argument("--storage-option", action="append", metavar="K=V", default=[],
                        help="an object store client option, e.g. endpoint=http://127.0.0.1:9000, "
                             "allow_http=true, region=eu-west-1 (repeatable; the AWS_* / GOOGLE_* / AZURE_* "
                             "environment variables are read too)")


def storage_options(args: argparse.Namespace) -> dict[str, str] | None:
    """The ``--storage-option`` values as a dict (None when none were given)."""
    options: dict[str, str] = {}
    for item in getattr(args, "storage_option", None) or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise InvalidOptionError(f"--storage-option {item!r}: write it as NAME=VALUE, e.g. endpoint=http://host:9000")
        options[name.strip()] = value
    return options or None


def open_store_of(args: argparse.Namespace, *, create: bool = False) -> Store | ObjectStore:
    """``msgindex.open(args.path, storage_options=...)``."""
    import msgindex

    return msgindex.open(args.path, create=create, storage_options=storage_options(args))
