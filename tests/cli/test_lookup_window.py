"""`msgindex lookup --begin B --end E` with B after E is an error naming both (issue 10); the
store itself keeps answering an empty window with nothing (the Spark pushdown relies on it)."""

from __future__ import annotations

import pytest

from msgindex.cli import main
from msgindex.storage.message import MessageRecord
from msgindex.storage.store import open_store
from tests.storage.shard_model import TINY

BASE = 1_700_000_000_000


@pytest.fixture
def store_path(tmp_path):
    with open_store(tmp_path / "s", create=True, settings=TINY) as store, store.writer("b") as writer:
        writer.append([MessageRecord("t", 0, i, BASE + i, "k", ("k",)) for i in range(3)])
    return tmp_path / "s"


@pytest.mark.parametrize("what", [["--key", "k"], ["--scan"]])
def test_begin_after_end_is_one_line_naming_both(store_path, capsys, what):
    assert main(["lookup", str(store_path), *what, "--begin", str(BASE + 2), "--end", "2023-11-14T22:13:20Z"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("msgindex lookup: --begin")
    assert str(BASE + 2) in err[0] and "2023-11-14T22:13:20Z" in err[0] and "after --end" in err[0]


def test_equal_bounds_are_one_instant(store_path, capsys):
    assert main(["lookup", str(store_path), "--key", "k", "--begin", str(BASE + 1), "--end", str(BASE + 1),
                 "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_the_store_still_answers_an_empty_window_with_nothing(store_path):
    with open_store(store_path) as store:
        assert store.lookup("k", begin_ms=BASE + 2, end_ms=BASE).num_rows == 0
        assert list(store.scan(begin_ms=BASE + 2, end_ms=BASE)) == []


def test_a_field_added_later_is_a_warning_naming_what_it_does_not_cover(tmp_path, capsys):
    """Offsets indexed before the field existed are named in a warning (the answer is not
    complete there); a field the index does not have at all is one line, like a topic."""
    from msgindex.storage.fields import FieldDefinition

    order = FieldDefinition("order", "expression", "get_json_object(CAST(value AS STRING), '$.order')", "single")
    with open_store(tmp_path / "s", create=True, settings=TINY) as store, store.writer("b") as writer:
        writer.append([MessageRecord("t", 0, i, BASE + i, "k", ("k",)) for i in range(3)])
        writer.append([MessageRecord("t", 0, i, BASE + i, "k", ("k",), fields=(("order", "o-1"),)) for i in range(3, 5)],
                      fields=[order])
    assert main(["lookup", str(tmp_path / "s"), "--field", "order=o-1", "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 3  # the header and offsets 3, 4
    assert err.splitlines() == ["msgindex lookup: warning: shard 'b': field 'order' does not cover t-0 offsets [0, 3) "
                                "(committed without the field: before it was indexed, or by an append that did not declare "
                                "it): records there may not be found by this field"]
    assert main(["lookup", str(tmp_path / "s"), "--field", "ordr=o-1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "msgindex lookup: --field ordr: the index has no such field (did you mean order? it has: order)"]
