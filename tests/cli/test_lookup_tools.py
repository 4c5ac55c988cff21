"""``msgindex lookup`` as an investigator uses it, through the real console script: relative
windows, dates in the output, a default limit that says what it left out, names the index does
not have, and payloads fetched from Kafka, with one-line errors when Kafka cannot give them."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from msgindex.cli.lookup import DEFAULT_LIMIT, render_header, render_value
from msgindex.storage.message import MessageRecord
from msgindex.storage.store import open_store
from msgindex.times import format_ms
from tests.cli.conftest import MSGINDEX

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def msgindex(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([MSGINDEX, *argv], capture_output=True, text=True, timeout=timeout)


def test_the_incident_order_in_the_last_hour_with_payloads(incident_index):
    done = msgindex("lookup", str(incident_index.path), "--key", "order-00321", "--since", "1h", "--values",
                    "--bootstrap-servers", incident_index.bootstrap)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.splitlines()[0].startswith("messages under order-00321, window ") and out.splitlines()[0].endswith(
        " .. any time (UTC)")
    assert "(6 messages)" in out
    assert '"reason": "issuer timeout"' in out and '"status": "captured"' in out and '"event": "shipped"' in out
    assert "value (json):" in out and "headers: UNIQ_KEY=pay-" in out and "headers: KEYS=customer-" in out
    # rows show their dates, in time order
    stamps = re.findall(r"^(\d{4}-\d\d-\d\dT[\d:.]+Z) ", out, re.MULTILINE)
    assert len(stamps) == 6 and stamps == sorted(stamps)


def test_json_lines_with_values(incident_index):
    done = msgindex("lookup", str(incident_index.path), "--key", "order-00321", "--format", "json", "--values",
                    "--bootstrap-servers", incident_index.bootstrap)
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(json.loads(r["value"])["order"] for r in rows) == ["order-00321"] * 6
    assert {r["value_format"] for r in rows} == {"json"} and all(ISO.match(r["timestamp"]) for r in rows)
    assert sorted(json.loads(r["value"]).get("status", "") for r in rows) == sorted(
        v.get("status", "") for v in incident_index.values_of("order-00321"))
    assert all(r["headers"][0]["key"] in ("KEYS", "UNIQ_KEY") for r in rows)


def test_relative_windows(incident_index):
    story = sorted(incident_index.of_key("order-00321"), key=lambda m: m.timestamp_ms)
    everything = msgindex("lookup", str(incident_index.path), "--key", "order-00321", "--format", "json")
    assert len(everything.stdout.splitlines()) == 6
    # since a minute before the last event ("shipped", 9 minutes after "packed"), as "<n>ms" ago
    ago = time.time_ns() // 1_000_000 - story[-1].timestamp_ms + 60_000
    recent = msgindex("lookup", str(incident_index.path), "--key", "order-00321", "--since", f"{ago}ms",
                      "--format", "json")
    (row,) = [json.loads(line) for line in recent.stdout.splitlines()]
    assert row["topic"] == incident_index.orders and row["timestamp"] == format_ms(story[-1].timestamp_ms)
    # up to a few seconds after "confirmed", the second event (the next comes 20 minutes later)
    ago = time.time_ns() // 1_000_000 - story[1].timestamp_ms - 5_000
    older = msgindex("lookup", str(incident_index.path), "--key", "order-00321", "--end", f"-{ago}ms",
                     "--format", "json")
    assert len(older.stdout.splitlines()) == 2


def test_the_default_limit_says_how_many_more(incident_index):
    hits = len(incident_index.of_key("order-00000"))
    assert hits > DEFAULT_LIMIT
    done = msgindex("lookup", str(incident_index.path), "--key", "order-00000")
    lines = done.stdout.splitlines()
    assert lines[-2:] == [f"({DEFAULT_LIMIT} messages)",
                          f"({hits - DEFAULT_LIMIT:,} more messages not shown: --limit 0 shows all)"]
    as_json = msgindex("lookup", str(incident_index.path), "--key", "order-00000", "--format", "json")
    assert len(as_json.stdout.splitlines()) == DEFAULT_LIMIT and "more messages not shown" in as_json.stderr
    everything = msgindex("lookup", str(incident_index.path), "--key", "order-00000", "--format", "csv", "--limit", "0")
    assert len(everything.stdout.splitlines()) == hits + 1
    scan = msgindex("lookup", str(incident_index.path), "--scan", "--limit", "7", "--format", "csv")
    assert len(scan.stdout.splitlines()) == 8 and "the scan stopped after 7 messages" in scan.stderr


@pytest.mark.parametrize(("option", "given"), [("--topic", "orders-typo"), ("--broker", "broker-9")])
def test_names_the_index_does_not_have_are_named_with_those_it_has(incident_index, option, given):
    typo = incident_index.orders[:-1] + ("x" if incident_index.orders[-1] != "x" else "y")
    given = typo if option == "--topic" else given
    done = msgindex("lookup", str(incident_index.path), "--key", "order-00321", option, given)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    if option == "--topic":
        assert line.startswith(f"msgindex lookup: --topic {typo}: the index has no such topic (did you mean "
                               f"{incident_index.orders}? it has: ")
        assert incident_index.payments in line
    else:
        assert line.startswith("msgindex lookup: --broker broker-9: the index has no such shard (") and "broker-" in line


def test_payloads_from_a_broker_that_does_not_answer_is_one_line_within_seconds(incident_index):
    started = time.monotonic()
    done = msgindex("lookup", str(incident_index.path), "--key", "order-00321", "--values",
                    "--bootstrap-servers", "127.0.0.1:1")
    assert time.monotonic() - started < 20
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "msgindex lookup: --bootstrap-servers = '127.0.0.1:1': no Kafka broker answered within 5 s (KafkaTimeoutError)"]


def test_payloads_of_a_topic_kafka_does_not_have_is_one_line_naming_it(kafka_bootstrap, tmp_path):
    with open_store(tmp_path / "store", create=True) as store, store.writer("b0") as writer:
        writer.append([MessageRecord("deleted-topic", 0, 5, 1_700_000_000_000, "k", ("k",))])
    started = time.monotonic()
    done = msgindex("lookup", str(tmp_path / "store"), "--key", "k", "--values", "--bootstrap-servers", kafka_bootstrap)
    assert time.monotonic() - started < 20
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"msgindex lookup: Kafka at {kafka_bootstrap} has no topic 'deleted-topic', which the index holds messages "
        f"of (deleted since, or another cluster?)"]
    missing = msgindex("lookup", str(tmp_path / "store"), "--key", "k", "--values")
    assert missing.returncode == 2 and "--values needs --bootstrap-servers" in missing.stderr


def test_values_are_shown_as_json_text_or_hex():
    assert render_value(b'{"a": [1, 2]}') == ("json", '{\n  "a": [\n    1,\n    2\n  ]\n}')
    assert render_value("plain text é".encode()) == ("text", "plain text é")
    assert render_value(b"\xff\x00\x01") == ("hex", "ff 00 01")
    assert render_value(b'{"a": 1}', "text") == ("text", '{"a": 1}')
    assert render_value(b"abc", "hex") == ("hex", "61 62 63")
    assert render_value(None)[0] == "missing"


# (value as sent, how it must be shown): found by an attack run; json.loads guessed UTF-16/32,
# and indenting re-serialized repeated members, long numbers and lone surrogate escapes
SENT_AS_IS = [
    ((55).to_bytes(4, "big"), ("hex", "00 00 00 37")),  # Kafka's IntegerSerializer: NULs are UTF-8, not text
    ('{"a": 1}'.encode("utf-32"), ("hex", '{"a": 1}'.encode("utf-32").hex(" "))),
    (b"\x1b[31mred", ("hex", "1b 5b 33 31 6d 72 65 64")),  # an escape sequence never reaches the terminal
    (b'{"status":"ok","status":"declined"}', ("json", '{"status":"ok","status":"declined"}')),
    (b'{"amount": 12345678901234567890.12}', ("json", '{"amount": 12345678901234567890.12}')),
    (b'{"x": 1e400, "y": -0}', ("json", '{"x": 1e400, "y": -0}')),
    (b'"\\ud800"', ("json", '"\\ud800"')),
    (b"NaN", ("text", "NaN")),
    (b'{"n": Infinity}', ("text", '{"n": Infinity}')),
    (b"tab\tand\nlines", ("text", "tab\tand\nlines")),
]


@pytest.mark.parametrize("value, shown", SENT_AS_IS)
def test_values_are_shown_as_sent(value, shown):
    assert render_value(value) == shown


def test_headers_are_shown_as_keys_are():
    """The byte ff and the text "0xff" showed alike; now bytes that are not UTF-8 are \\xNN
    escapes, a text that looks like one is escaped itself, and --key would read each back."""
    from msgindex.storage.message import text_of_shown

    shown = {value: render_header(value) for value in (b"\xff", b"0xff", b"\\xff", b"a\x1bb", b"ok")}
    assert shown == {b"\xff": "\\xff", b"0xff": "0xff", b"\\xff": "\\x5cxff", b"a\x1bb": "a\\x1bb", b"ok": "ok"}
    assert len(set(shown.values())) == len(shown)
    assert text_of_shown(shown[b"\\xff"]) == "\\xff" and text_of_shown(shown[b"a\x1bb"]) == "a\x1bb"
    assert render_header(None) == "null"


def test_payloads_as_sent_through_the_cli(kafka_bootstrap, kafka_topic, tmp_path):
    """The values above produced to the real broker, indexed, then shown by `--values`: each as
    render_value says, the process exits 0 (a lone surrogate escape used to fail it)."""
    from kafka import KafkaProducer

    topic = kafka_topic(partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    records = []
    for i, (value, _) in enumerate(SENT_AS_IS):
        meta = producer.send(topic, key=f"k{i}".encode(), value=value).get(timeout=30)
        records.append(MessageRecord(topic, meta.partition, meta.offset, meta.timestamp, f"k{i}", (f"k{i}", "all")))
    producer.close()
    with open_store(tmp_path / "store", create=True) as store, store.writer("b0") as writer:
        writer.append(records)
    done = msgindex("lookup", str(tmp_path / "store"), "--key", "all", "--values", "--limit", "0",
                    "--bootstrap-servers", kafka_bootstrap)
    assert done.returncode == 0, done.stderr
    for _, (shown, text) in SENT_AS_IS:
        assert f"value ({shown}):" in done.stdout and text.splitlines()[0] in done.stdout
    assert "\x1b" not in done.stdout


def test_a_topic_given_twice_is_asked_once(tmp_path):
    with open_store(tmp_path / "store", create=True) as store, store.writer("b0") as writer:
        writer.append([MessageRecord("orders", 0, i, 1_700_000_000_000 + i, "k", ("k",)) for i in range(3)])
    done = msgindex("lookup", str(tmp_path / "store"), "--key", "k", "--topic", "orders", "--topic", "orders",
                    "--format", "json")
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(line)["offset"] for line in done.stdout.splitlines()) == [0, 1, 2]


@pytest.mark.parametrize("bound", ["--end 253402300800000", "--end 9223372036854775807",
                                   "--begin 0001-01-01T00:00:00+01:00", "--end 9999-12-31T23:59:59.999-01:00"])
def test_bounds_beyond_the_calendar_are_open_ends(tmp_path, bound):
    """Long.MAX_VALUE is a common "no end"; a bound past year 9999 (or before year 1 in UTC) is
    shown as epoch ms, not a crash."""
    with open_store(tmp_path / "store", create=True) as store, store.writer("b0") as writer:
        writer.append([MessageRecord("orders", 0, 0, 1_700_000_000_000, "k", ("k",))])
    done = msgindex("lookup", str(tmp_path / "store"), "--key", "k", *bound.split())
    assert done.returncode == 0, done.stderr
    assert "(1 message)" in done.stdout


def test_a_bound_no_kafka_timestamp_holds_is_one_line(tmp_path):
    with open_store(tmp_path / "store", create=True) as store, store.writer("b0") as writer:
        writer.append([MessageRecord("orders", 0, 0, 1_700_000_000_000, "k", ("k",))])
    done = msgindex("lookup", str(tmp_path / "store"), "--key", "k", "--begin", "99999999999999999999")
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "msgindex lookup: option '--begin' = '99999999999999999999' is beyond any time a Kafka timestamp holds "
        "(epoch ms in a Java long: -9223372036854775808 .. 9223372036854775807)"]
