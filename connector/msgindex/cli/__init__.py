"""The `msgindex` console script. Each subcommand lives in its own module of this package and
exposes ``register(subparsers)``, which adds its parser and sets ``handler`` (args -> exit code)."""

from __future__ import annotations

import argparse
import importlib
import sys

from msgindex.errors import MsgIndexError

# module names in this package, in the order `msgindex --help` lists them
SUBCOMMAND_MODULES = ["demo", "index", "lookup", "inspect", "upgrade", "kafka"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="msgindex", description="Find Kafka messages by key and time window, exactly and fast."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"msgindex.cli.{name}")
        except ModuleNotFoundError as missing:
            if missing.name == f"msgindex.cli.{name}":
                continue  # subcommand not built (yet)
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script: exit code 0 on success, 2 on a usage or msgindex error."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except MsgIndexError as error:
        print(f"msgindex {args.command}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
