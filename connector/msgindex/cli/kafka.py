"""`msgindex kafka start|stop|status|jars`: the local single-node KRaft broker, and the jars of
Spark's Kafka connector and Avro functions (with ``--object-store s3a``, also of Hadoop's connector
for a checkpoint on that store).

Exit codes: 0 success (for `status`: running), 1 `status` says not running, 2 an error (port
taken, java/mvn missing, ...), printed on stderr by the console script.
"""

from __future__ import annotations

import argparse
import sys

from msgindex.cli import checked_seconds
from msgindex.errors import InvalidOptionError
from msgindex.kafka.broker import (
    CONTROLLER_PORT_ENV,
    DATA_DIR_ENV,
    DEFAULT_CONTROLLER_PORT,
    DEFAULT_PORT,
    PORT_ENV,
    LocalBroker,
    broker_jars,
)

EXIT_NOT_RUNNING = 1


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `kafka` and its actions to the console script."""
    parser = subparsers.add_parser(
        "kafka", help="run a local single-node Kafka broker (KRaft, jars from Maven Central)",
        description="A local single-node Kafka (KRaft) on 127.0.0.1, assembled from Maven Central "
                    "jars; no Docker needed.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, handler, text in (
        ("start", _start, "start the broker (or report the running one) and print its bootstrap address"),
        ("stop", _stop, "stop the broker (SIGTERM, then SIGKILL after --timeout seconds)"),
        ("status", _status, "say whether the broker runs and where; exit 0 only when it runs"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        _broker_options(action)
        action.set_defaults(handler=handler)
    jars = actions.add_parser(
        "jars", help="stage the broker's jars, Spark's Kafka connector and spark-avro; print Spark's "
                     "jars comma-separated (for spark-submit --jars)",
        description="Stage the local broker's jars, Spark's Kafka connector and Spark's Avro functions "
                    "(spark-avro: from_avro in --index-field) from Maven Central; print Spark's jars "
                    "comma-separated, for spark-submit --jars. With --object-store, also Hadoop's connector "
                    "for a checkpoint on that store.")
    jars.add_argument("--object-store", action="append", default=[], metavar="SCHEME",
                      help="also Hadoop's connector for Spark paths (the checkpoint) with this scheme: s3a "
                           "(hadoop-aws + the AWS SDK bundle), gs, abfss; a URL names its scheme; repeatable")
    jars.set_defaults(handler=_jars)


def _broker_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=None,
                        help=f"client port (default ${PORT_ENV} or {DEFAULT_PORT})")
    parser.add_argument("--controller-port", type=int, default=None,
                        help=f"KRaft controller port (default ${CONTROLLER_PORT_ENV} or {DEFAULT_CONTROLLER_PORT})")
    parser.add_argument("--data-dir", default=None,
                        help=f"broker data directory (default ${DATA_DIR_ENV} or <msgindex home>/kafka)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds to wait for readiness (start, default 120) or shutdown (stop, default 30)")


def _broker(args: argparse.Namespace) -> LocalBroker:
    return LocalBroker(args.data_dir, port=args.port, controller_port=args.controller_port)


def _start(args: argparse.Namespace) -> int:
    broker = _broker(args)
    timeout = 120.0 if args.timeout is None else checked_seconds("--timeout", args.timeout)
    print(broker.start(timeout=timeout), flush=True)
    return 0


def _stop(args: argparse.Namespace) -> int:
    broker = _broker(args)
    if broker.stop(timeout=30.0 if args.timeout is None else checked_seconds("--timeout", args.timeout)):
        print(f"stopped the broker in {broker.data_dir}")
    else:
        print(f"no broker running in {broker.data_dir}")
    return 0


def _status(args: argparse.Namespace) -> int:
    status = _broker(args).status()
    print(status.describe())
    return 0 if status.running else EXIT_NOT_RUNNING


def _jars(args: argparse.Namespace) -> int:
    from msgindex.spark.runtime.session import HADOOP_CONNECTORS, hadoop_connector, kafka_connector_jars, object_store_jars

    urls = [store if "://" in store else f"{store.strip().lower()}://" for store in args.object_store]
    for given, url in zip(args.object_store, urls):
        if hadoop_connector(url) is None:
            known = ", ".join(scheme for connector in HADOOP_CONNECTORS for scheme in connector.schemes)
            raise InvalidOptionError(f"--object-store {given!r}: Spark's Hadoop needs no extra connector for it, or "
                                     f"none is known (connectors: {known}; write s3:// checkpoints as s3a://)")
    broker_jars()
    jars = [*kafka_connector_jars(), *object_store_jars(urls)]
    print(",".join(str(jar) for jar in jars))
    sys.stdout.flush()
    return 0
