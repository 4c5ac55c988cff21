"""`msgindex demo`: local Kafka, a realistic workload, the indexing pipeline, then lookups."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    """Add the `demo` subcommand (flags: streaming_jobs/demo.py)."""
    from streaming_jobs.demo import add_arguments

    parser = subparsers.add_parser(
        "demo", help="run the whole pipeline on a local broker and look keys up (a few minutes)",
        description="Start a local Kafka broker (unless --bootstrap-servers), produce a realistic workload, "
                    "index it with the streaming pipeline until caught up, then run lookups and print timings.",
    )
    add_arguments(parser)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from streaming_jobs.demo import run

    return run(args)
