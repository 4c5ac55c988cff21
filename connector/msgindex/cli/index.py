"""`msgindex index`: the continuous indexing pipeline (Kafka -> Spark -> per-broker shards)."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    """Add the `index` subcommand (flags: streaming_jobs/index_job.py)."""
    from streaming_jobs.index_job import add_arguments

    parser = subparsers.add_parser(
        "index", help="index Kafka topics continuously (or --available-now)",
        description="Index Kafka messages by key: Spark Structured Streaming reads the topics and "
                    "appends each micro-batch to per-broker msgindex shards, exactly once.",
    )
    add_arguments(parser)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from streaming_jobs.index_job import options_from_args, run

    return run(options_from_args(args))
