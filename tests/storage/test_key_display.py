"""How results show keys (issue 10, B6): one to one, so what a user sees finds exactly that row
(message.arrow_text / text_of_shown; the Spark side is in tests/adversarial/test_spark_sample.py)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from msgindex.cli import main
from msgindex.storage.message import MessageRecord, arrow_text, decode_key_bytes, text_of_shown

# keys as Kafka gives them: any bytes, decoded with surrogateescape; rich in backslashes and hex
KEY_BYTES = st.lists(st.sampled_from([b"\\", b"x", b"5", b"c", b"f", b"F", b"a", b"\xff", b"\x80", b"\xc3",
                                      "é".encode(), b"z"]), max_size=8).map(b"".join)


@given(KEY_BYTES, KEY_BYTES)
def test_shown_keys_are_one_to_one_and_valid_utf8(first, second):
    a, b = decode_key_bytes(first), decode_key_bytes(second)
    shown_a = arrow_text(a)
    shown_a.encode("utf-8")  # Arrow and Spark strings must be valid UTF-8
    assert text_of_shown(shown_a) == a
    assert (shown_a == arrow_text(b)) == (a == b)


def test_texts_without_escape_lookalikes_show_as_themselves():
    for text in ["plain", "ключ", "C:\\dir", "a\\", "\\xyz", "🔑"]:
        assert arrow_text(text) == text == text_of_shown(text)
    assert arrow_text(decode_key_bytes(b"\xff")) == "\\xff"
    assert arrow_text("\\xff") == "\\x5cxff"  # the 4-character text: no longer shown like the byte


def test_store_rows_and_the_cli_key_use_what_is_shown(stores, capsys):
    raw_keys = [b"\xff", b"\\xff", b"C:\\dir"]
    keys = [decode_key_bytes(raw) for raw in raw_keys]
    with stores.create("s") as store, store.writer("b") as writer:
        writer.append([MessageRecord("t", 0, n, 1_700_000_000_000, key, (key, "all")) for n, key in enumerate(keys)])
    with stores.open(stores.root("s")) as store:
        looked_up = store.lookup("all").to_pylist()
        scanned = [row for batch in store.scan() for row in batch.to_pylist()]
    expected = {n: arrow_text(key) for n, key in enumerate(keys)}
    assert {row["offset"]: row["key"] for row in looked_up} == expected
    assert {row["offset"]: row["key"] for row in scanned} == expected
    for offset, shown in expected.items():
        assert main(["lookup", *stores.cli_args(stores.root("s")), "--key", shown, "--format", "json"]) == 0
        found = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [(row["offset"], row["key"]) for row in found] == [(offset, shown)]
