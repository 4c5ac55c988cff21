"""``msgindex lookup`` shows the values of the fields an index indexes (``--index-field``,
``--index-header``) as columns of each message, in every output format and for a key, a field
or a scan, so an investigator sees a message's status without fetching its payload."""

from __future__ import annotations

import csv
import io
import json

import pytest

from msgindex.cli import main
from msgindex.storage.fields import FieldDefinition
from msgindex.storage.message import MessageRecord
from msgindex.storage.store import open_store
from tests.storage.shard_model import TINY

BASE = 1_700_000_000_000
STATUS = FieldDefinition("status", "expression", "get_json_object(CAST(value AS STRING), '$.status')", "single")
SKU = FieldDefinition("sku", "expression", "from_json(CAST(value AS STRING), 'struct<sku:array<string>>').sku", "array")


@pytest.fixture
def index(tmp_path):
    """Offsets 0-2 carry no field (indexed before they were declared), 3 a status, 4 a status
    and two skus, 5 a sku with a comma and a status with a line break."""
    path = tmp_path / "index"
    with open_store(path, create=True, settings=TINY) as store, store.writer("b") as writer:
        writer.append([MessageRecord("t", 0, i, BASE + i, "k", ("k",)) for i in range(3)])
        writer.append([
            MessageRecord("t", 0, 3, BASE + 3, "k", ("k",), fields=(("status", "paid"),)),
            MessageRecord("t", 0, 4, BASE + 4, "k", ("k",), fields=(("status", "declined"), ("sku", "s-1"), ("sku", "s-2"))),
            MessageRecord("t", 0, 5, BASE + 5, "k", ("k",), fields=(("status", "on\nhold"), ("sku", "a,b"))),
        ], fields=[STATUS, SKU])
    return path


EXPECTED = [  # (offset, status, sku) of each message under k
    (0, None, None), (1, None, None), (2, None, None),
    (3, "paid", None), (4, "declined", ["s-1", "s-2"]), (5, "on\nhold", ["a,b"])]


@pytest.mark.parametrize("what", [["--key", "k"], ["--scan"]])
def test_json_lines_carry_every_field(index, capsys, what):
    assert main(["lookup", str(index), *what, "--format", "json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["offset"], r["status"], r["sku"]) for r in rows] == EXPECTED


def test_csv_has_a_column_per_field(index, capsys):
    assert main(["lookup", str(index), "--key", "k", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(int(r["offset"]), r["status"], r["sku"]) for r in rows] == [
        (offset, status or "", " ".join(sku or ())) for offset, status, sku in EXPECTED]


def test_the_table_shows_the_fields_its_messages_carry(index, capsys):
    assert main(["lookup", str(index), "--field", "status=declined"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["timestamp", "topic", "partition", "offset", "key", "keys", "broker", "sku", "status"]
    assert lines[2].split()[-2:] == ["s-1,s-2", "declined"] and lines[3] == "(1 message)"
    assert main(["lookup", str(index), "--key", "k", "--limit", "3"]) == 0  # offsets 0-2: none carries a field
    assert capsys.readouterr().out.splitlines()[1].split()[-1] == "broker"
    assert main(["lookup", str(index), "--scan"]) == 0
    out = capsys.readouterr().out
    assert "on\\x0ahold" in out and "a\\x2cb" in out  # a line break and a list's comma stay unmistakable
