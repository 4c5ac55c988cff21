"""The `msgindex` console script. Each subcommand lives in its own module of this package and
exposes ``register(subparsers)``, which adds its parser and sets ``handler`` (args -> exit code).

Every failure ends in one line on stderr (``failure.py``): exit 2 for msgindex's own errors (bad
input, a corrupt or locked store: something the user can act on), 1 for anything else; the whole
traceback goes to a log file under ``<msgindex home>/logs`` (named in the line), or to stderr with
``--verbose``."""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import traceback

from msgindex.errors import InvalidOptionError, MsgIndexError

# module names in this package, in the order `msgindex --help` lists them
SUBCOMMAND_MODULES = [
    "demo", "index", "lookup", "serve", "doctor", "inspect", "repair", "retention", "compact", "upgrade", "kafka",
]


def checked_seconds(option: str, value: float) -> float:
    """`value` of a seconds option (argparse ``type=float``), or InvalidOptionError naming the
    option unless it is a finite number > 0: ``float`` also parses ``nan`` and ``inf``, and a wait
    of nan seconds never ends (every comparison with it is false)."""
    if not math.isfinite(value) or value <= 0:
        raise InvalidOptionError(f"{option} must be a finite number of seconds > 0, got {value}")
    return value


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
    for subparser in subparsers.choices.values():
        subparser.add_argument("--verbose", action="store_true",
                               help="on failure, print the whole traceback (default: one line; the "
                                    "traceback goes to a log file)")
    return parser


# options whose values may start with "-" (relative times: --since -15m, --end -1h), which
# argparse would otherwise take for an option of their own
NEGATIVE_VALUE_OPTIONS = ("--since", "--begin", "--end")


def attach_negative_values(argv: list[str]) -> list[str]:
    """`argv` with ``--end -15m`` written as ``--end=-15m``, which argparse reads as meant."""
    joined: list[str] = []
    index = 0
    while index < len(argv):
        item = argv[index]
        following = argv[index + 1] if index + 1 < len(argv) else ""
        if item in NEGATIVE_VALUE_OPTIONS and following[:1] == "-" and following[1:2].isdigit():
            joined.append(f"{item}={following}")
            index += 2
        else:
            joined.append(item)
            index += 1
    return joined


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script: exit code 0 on success, 2 on a usage or msgindex error."""
    args = build_parser().parse_args(attach_negative_values(sys.argv[1:] if argv is None else list(argv)))
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `msgindex lookup ... | head`: the reader had enough; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as error:
        return _report(args, error)


def _report(args: argparse.Namespace, error: Exception) -> int:
    from msgindex.cli.failure import explain, write_log

    failure = explain(error)
    if getattr(args, "verbose", False):
        traceback.print_exception(error, file=sys.stderr)
        where = ""
    elif isinstance(error, MsgIndexError):
        where = ""  # raised by msgindex on this side: its message is the whole story
    else:
        from msgindex.jvm import msgindex_home

        log = write_log(args.command, error, msgindex_home() / "logs")
        where = f" (details: {log})" if log else ""
    print(f"msgindex {args.command}: {failure.line}{where}", file=sys.stderr)
    return 2 if failure.raised_by_msgindex else 1


if __name__ == "__main__":
    sys.exit(main())
