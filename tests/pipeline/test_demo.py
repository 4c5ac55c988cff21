"""`msgindex demo` against the session's broker (the README's main command; its own local broker
start is the same LocalBroker the fixtures use): produces, indexes both input shapes, looks up."""

from __future__ import annotations

import argparse
import re

import pytest

import msgindex
from msgindex.cli import demo

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_demo_indexes_and_finds_keys(kafka_bootstrap, spark, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(["--bootstrap-servers", kafka_bootstrap, "--records", "3000", "--events", "600",
                              "--path", str(tmp_path / "demo")])
    assert demo.run(args) == 0
    out = capsys.readouterr().out
    found = dict(re.findall(r"lookup of (.+?): ([\d,]+) messages in", out))
    assert len(found) == 6, out
    hottest = next(n for title, n in found.items() if "hottest" in title)
    assert int(hottest.replace(",", "")) > 0
    assert int(next(n for title, n in found.items() if "metadata events" in title).replace(",", "")) > 0
    assert "broker=broker-" in out and "commitLogOffset=" in out
    # the payload field the demo indexes: the declines of the payment stall, all of them payments
    declined = next(n for title, n in found.items() if "status 'declined'" in title)
    assert int(declined.replace(",", "")) > 0, out
    with msgindex.open(tmp_path / "demo" / "records") as store:
        rows = store.lookup(fields={"status": ["declined"]})
        assert set(rows.column("topic").to_pylist()) == {"demo-payments"}
        assert not store.lookup("declined").num_rows  # a field value is not a key
