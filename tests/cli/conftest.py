"""An index the way users get one: the demo's workload (an hour of orders and payments with an
incident, ``loadgen.incident_records``) produced to the session's real broker and indexed by the
real pipeline with the demo's field (the payloads' ``status``), once per test session."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from msgindex.cli.demo import STATUS_FIELD  # the field make demo indexes

MSGINDEX = str(Path(sys.executable).with_name("msgindex"))  # the console script of this environment
RECORDS = 3000


@dataclass(frozen=True)
class IncidentIndex:
    """The index, where its messages came from, and every message as produced (the truth)."""

    path: Path
    bootstrap: str
    orders: str
    payments: str
    messages: tuple  # loadgen.Message, as sent

    def of_key(self, key: str) -> list:
        return [m for m in self.messages if m.key == key.encode() or any(
            v.decode() == key for _, v in m.headers)]

    def values_of(self, key: str) -> list[dict]:
        return [json.loads(m.value) for m in self.of_key(key)]

    def of_status(self, status: str) -> list:
        return [m for m in self.messages if json.loads(m.value).get("status") == status]


@pytest.fixture(scope="session")
def incident_index(kafka_bootstrap, kafka_topic, spark, tmp_path_factory) -> IncidentIndex:
    from msgindex.cli import index
    from msgindex.kafka.loadgen import incident_records, produce
    from msgindex.spark.pipeline.job import index_kafka

    orders, payments = kafka_topic(partitions=3, prefix="orders"), kafka_topic(partitions=2, prefix="payments")
    messages = tuple(incident_records(orders, payments, RECORDS))
    produce(kafka_bootstrap, messages)
    path = tmp_path_factory.mktemp("incident") / "index"
    args = ["--bootstrap-servers", kafka_bootstrap, "--subscribe", f"{orders},{payments}", "--path", str(path),
            "--available-now", "--quiet-spark", "--index-field", STATUS_FIELD]
    index_kafka(index.options_from_args(index.build_parser().parse_args(args)))
    return IncidentIndex(path, kafka_bootstrap, orders, payments, messages)
