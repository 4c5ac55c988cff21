"""Issue 22 end to end: JSON payload fields and repeated headers indexed by the real pipeline (Spark's
Kafka source, the real broker), every field value's lookup checked against ground truth computed
in Python from the records read back from Kafka; a key never finds a field value nor the reverse;
bad declarations refused in one line through the real CLI before any query starts."""

from __future__ import annotations

import json
import random
import subprocess
import warnings
from collections import defaultdict

import pytest

import msgindex
from msgindex.errors import FieldCoverageWarning, InvalidOptionError
from msgindex.kafka.admin import create_topics
from msgindex.kafka.loadgen import Message, produce
from tests.pipeline.support import consume_all, forget_commit, job_args, run_job_in_process
from tests.pipeline.test_cli_failures import MSGINDEX, assert_one_line, run_cli

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

ORDER = "order=get_json_object(CAST(value AS STRING), '$.order.id')"
SKU = "sku=from_json(CAST(value AS STRING), 'struct<items:array<struct<sku:string>>>').items.sku"
# fails on 'abc' under Spark's ANSI mode: the job evaluates fields leniently (null: counted)
QTY = "qty=CAST(CAST(get_json_object(CAST(value AS STRING), '$.qty') AS INT) AS STRING)"
FIELD_FLAGS = ["--index-field", ORDER, "--index-field", SKU, "--index-field", QTY, "--index-header", "trace",
               "--index-header", "tenant=x-tenant"]


def _payloads(topic: str, rng: random.Random, count: int) -> list[Message]:
    messages = []
    for n in range(count):
        shape = rng.randrange(8)
        order = f"o-{rng.randrange(40)}"
        skus = [f"s-{rng.randrange(15)}" for _ in range(rng.randrange(4))]
        body: dict = {"order": {"id": order}, "items": [{"sku": s} for s in skus], "qty": rng.choice(["3", "12", "abc"])}
        if shape == 0:
            value = b"{not json"  # invalid JSON: no value, never fatal
        elif shape == 1:
            value = json.dumps({"items": [{"sku": s} for s in skus]}).encode()  # no order
        elif shape == 2:
            value = None  # a tombstone
        elif shape == 3:
            value = json.dumps({"order": {"id": ""}, "items": [{"sku": ""}, {"nosku": 1}]}).encode()  # empty values
        else:
            value = json.dumps(body).encode()
        headers = []
        for _ in range(rng.randrange(3)):  # a header may repeat
            headers.append(("trace", f"t-{rng.randrange(30)}".encode()))
        if rng.random() < 0.05:
            headers.append(("trace", b"\xff\xfe"))  # not UTF-8: set aside, counted
        if rng.random() < 0.5:
            headers.append(("x-tenant", rng.choice([b"acme", b"globex"])))
        # keys spelled like field values and field terms: never found by a field, nor they by a key
        key = rng.choice([None, f"k{n}".encode(), b"o-1", b"order=o-1", b"t-1", f"{topic}\x00order\x00o-2".encode()])
        if key is None and value is None:
            key = b"tombstone"  # (a record needs one of them)
        messages.append(Message(topic, key, value, tuple(headers)))
    return messages


def _expected(record) -> dict[str, set[str]]:
    """The field values issue 22 defines for a record, computed without the pipeline's code."""
    found: dict[str, set[str]] = defaultdict(set)
    try:
        body = json.loads(record.value) if record.value is not None else None
    except ValueError:
        body = None
    if isinstance(body, dict):
        order = (body.get("order") or {}).get("id")
        if order:
            found["order"].add(order)
        found["sku"].update(item["sku"] for item in body.get("items") or () if item.get("sku"))
        if str(body.get("qty", "")).isdigit():
            found["qty"].add(str(int(body["qty"])))
    for name, value in record.headers or ():
        field = {"trace": "trace", "x-tenant": "tenant"}.get(name)
        if field is None or not value:
            continue
        try:
            found[field].add(value.decode("utf-8"))
        except UnicodeDecodeError:
            pass
    return found


def test_json_fields_and_headers_are_indexed_and_found_like_keys(kafka_bootstrap, kafka_topic, spark, tmp_path):
    topics = [kafka_topic(partitions=2, prefix="fields")]
    rng = random.Random(22)
    produce(kafka_bootstrap, _payloads(topics[0], rng, 600))
    truth: dict[tuple[str, str], set[tuple[str, int, int]]] = defaultdict(set)
    keys: dict[str, set[tuple[str, int, int]]] = defaultdict(set)
    without = defaultdict(int)
    records = list(consume_all(kafka_bootstrap, topics))
    for record in records:
        where = (record.topic, record.partition, record.offset)
        values = _expected(record)
        for name in ("order", "sku", "qty", "trace", "tenant"):
            without[name] += not values.get(name)
            for value in values.get(name, ()):
                truth[(name, value)].add(where)
        if record.key:
            keys[record.key.decode()].add(where)

    index = tmp_path / "index"
    ansi = spark.conf.get("spark.sql.ansi.enabled")
    history = run_job_in_process(job_args(kafka_bootstrap, topics, index, "--available-now", "--quiet-spark",
                                          "--max-offsets-per-trigger", "250", *FIELD_FLAGS))
    assert spark.conf.get("spark.sql.ansi.enabled") == ansi  # the job's lenient evaluation is undone
    assert len(history) >= 2 and sum(s.appended for s in history) == len(records)
    counts = {name: [sum(s.field_counts[name][i] for s in history) for i in range(3)]
              for name in ("order", "sku", "qty", "trace", "tenant")}
    assert {name: c[1] for name, c in counts.items()} == without  # records without a value, per field
    assert counts["trace"][2] > 0 and counts["order"][2] == 0  # values that are not UTF-8, set aside
    assert "fields order" in history[0].line() and "without" in history[0].line()

    def found(table) -> set[tuple[str, int, int]]:
        return {(r["topic"], r["partition"], r["offset"]) for r in table.select(["topic", "partition", "offset"]).to_pylist()}

    with msgindex.open(index) as store:
        for (name, value), expected in sorted(truth.items()):
            assert found(store.lookup(fields={name: value})) == expected, (name, value)
        assert found(store.lookup(fields={"sku": ["s-1", "s-2"], "order": "o-3"})) == (
            truth[("sku", "s-1")] | truth[("sku", "s-2")] | truth[("order", "o-3")])
        for key in ("o-1", "order=o-1", "t-1", f"{topics[0]}\x00order\x00o-2"):  # keys find keys only
            assert found(store.lookup(key)) == keys[key] and keys[key]
        assert found(store.lookup(fields={"order": "order=o-1"})) == set()
        shown = {k for ks in store.lookup(fields={"tenant": "acme"}).column("keys").to_pylist() for k in ks}
        assert shown <= set(keys) and not any("\x00" in k and "acme" in k for k in shown)

    # a replayed batch indexes nothing twice and keeps every field covered (no warning)
    forget_commit(index, history[-1].batch_id)
    replay = run_job_in_process(job_args(kafka_bootstrap, topics, index, "--available-now", "--quiet-spark",
                                         *FIELD_FLAGS))
    assert [s.appended for s in replay] == [0]
    with msgindex.open(index) as store, warnings.catch_warnings():
        warnings.simplefilter("error", FieldCoverageWarning)
        assert found(store.lookup(fields={"order": "o-5"})) == truth[("order", "o-5")]

    # the real CLI finds field values too (every offset covered: no warning), and names a field
    # the index does not have in one line
    lookup = subprocess.run([MSGINDEX, "lookup", str(index), "--field", "order=o-5", "--field", "trace=t-3",
                             "--format", "json", "--limit", "0"], capture_output=True, text=True, timeout=120)
    assert lookup.returncode == 0 and not lookup.stderr.strip(), lookup.stderr
    rows = [json.loads(line) for line in lookup.stdout.splitlines()]
    assert {(r["topic"], r["partition"], r["offset"]) for r in rows} == truth[("order", "o-5")] | truth[("trace", "t-3")]
    unknown = subprocess.run([MSGINDEX, "lookup", str(index), "--field", "order=o-5", "--field", "color=red"],
                             capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and unknown.stderr.splitlines() == [
        "msgindex lookup: --field color: the index has no such field (it has: order, qty, sku, tenant, trace)"]
    # a field keeps its definition: the same name redefined is refused before the query starts
    done, _ = run_cli(job_args(kafka_bootstrap, topics, index, "--available-now",
                               "--index-field", "order=get_json_object(CAST(value AS STRING), '$.id')"))
    assert_one_line(done, "--index-field order=", "a field keeps its definition")


def test_bad_field_declarations_are_one_line(kafka_bootstrap, tmp_path):
    topic = f"fields-bad-{random.randrange(10**9)}"
    create_topics(kafka_bootstrap, {topic: 1})
    args = job_args(kafka_bootstrap, [topic], tmp_path / "index", "--available-now")
    for flag, fragment in ((["--index-field", "1x=value"], "field name '1x' is not allowed"),
                           (["--index-field", "keys=value"], "is a column of every row already"),
                           (["--index-field", "order"], "is not NAME=EXPRESSION"),
                           (["--index-header", "a=trace", "--index-field", "A=key"], "differ only in case")):
        done, _ = run_cli([*args, *flag])
        assert_one_line(done, fragment)
    # Spark's analysis: an unknown function, refused before the query
    done, _ = run_cli([*args, "--index-field", "bad=no_such_function(value)"])
    line = assert_one_line(done, "--index-field bad=no_such_function(value)", "Spark refuses the expression")
    assert "no_such_function" in line.split("refuses the expression", 1)[1]


# --- Avro payloads (spark-avro's from_avro), plain and in Confluent's wire format -----------------

ORDER_SCHEMA = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "string"},
    {"name": "skus", "type": {"type": "array", "items": "string"}},
    {"name": "note", "type": ["null", "string"], "default": None}]}
SCHEMA_ID = 7  # the Schema Registry id Confluent's framing carries (from_avro ignores it: substring skips it)


def _avro_payloads(rng: random.Random, count: int, framed: bool) -> list[tuple[bytes | None, dict | None]]:
    """(payload, the record it encodes or None) pairs: valid records of ORDER_SCHEMA, one payload
    that is not Avro of it, a tombstone; framed: Confluent's magic byte 0 and 4-byte schema id first."""
    import io
    import struct

    import fastavro

    parsed = fastavro.parse_schema(ORDER_SCHEMA)
    out: list[tuple[bytes | None, dict | None]] = []
    for _ in range(count):
        record = {"order_id": f"o-{rng.randrange(25)}", "skus": [f"s-{rng.randrange(10)}" for _ in range(rng.randrange(3))],
                  "note": rng.choice([None, "gift"])}
        body = io.BytesIO()
        fastavro.schemaless_writer(body, parsed, record)
        out.append((body.getvalue(), record))
    out[5] = (b"\x02\xff\xff\xff\xff", None)  # not Avro of the schema (a string whose length runs past the end)
    out[9] = (None, None)  # a tombstone
    prefix = b"\x00" + struct.pack(">i", SCHEMA_ID)
    return [(prefix + payload if framed and payload is not None else payload, record) for payload, record in out]


def test_avro_fields_plain_and_confluent_framed_are_indexed_and_found(kafka_bootstrap, kafka_topic, spark, tmp_path):
    schema = json.dumps(ORDER_SCHEMA)
    rng = random.Random(2222)
    cases = {  # topic -> (the payload of each offset with what it encodes, the flags that index it)
        kafka_topic(partitions=1, prefix="avro-plain"): (
            _avro_payloads(rng, 120, framed=False),
            [f"order=from_avro(value, '{schema}').order_id", f"sku=from_avro(value, '{schema}').skus"]),
        kafka_topic(partitions=1, prefix="avro-confluent"): (
            _avro_payloads(rng, 120, framed=True),
            [f"order=from_avro(substring(value, 6), '{schema}').order_id",
             f"sku=from_avro(substring(value, 6), '{schema}').skus"]),
    }
    for topic, (payloads, fields) in cases.items():
        produce(kafka_bootstrap, [Message(topic, f"k{n}".encode(), payload) for n, (payload, _) in enumerate(payloads)])
        truth: dict[tuple[str, str], set[int]] = defaultdict(set)
        for offset, (_, record) in enumerate(payloads):  # one partition, produced in order: offset = position
            if record is not None:
                truth[("order", record["order_id"])].add(offset)
                for sku in record["skus"]:
                    truth[("sku", sku)].add(offset)
        without = {"order": sum(record is None for _, record in payloads),
                   "sku": sum(record is None or not record["skus"] for _, record in payloads)}

        index = tmp_path / topic
        flags = [arg for field in fields for arg in ("--index-field", field)]
        history = run_job_in_process(job_args(kafka_bootstrap, [topic], index, "--available-now", "--quiet-spark",
                                              *flags))
        assert sum(s.appended for s in history) == len(payloads)
        # the payload that is not Avro and the tombstone: counted per field, never fatal
        assert {name: sum(s.field_counts[name][1] for s in history) for name in without} == without, topic
        with msgindex.open(index) as store:
            for (name, value), offsets in sorted(truth.items()):
                got = store.lookup(fields={name: value}).select(["topic", "offset"]).to_pylist()
                assert {(r["topic"], r["offset"]) for r in got} == {(topic, o) for o in offsets}, (topic, name, value)

    # a schema that is not JSON: Avro's parser refuses it at analysis (a Py4J error, not one of Spark's),
    # still in one line naming the flag, before any query starts (the CLI prints InvalidOptionErrors as
    # one line: test_bad_field_declarations_are_one_line)
    flag = "bad=from_avro(value, '{\"type\": record}').order_id"
    with pytest.raises(InvalidOptionError) as refused:
        run_job_in_process(job_args(kafka_bootstrap, [topic], tmp_path / "bad", "--available-now", "--index-field", flag))
    line = str(refused.value)
    assert "\n" not in line and len(line) < 600, line
    assert line.startswith(f"--index-field {flag}: Spark refuses the expression: org.apache.avro.SchemaParseException"), line
    assert not (tmp_path / "bad" / "_checkpoint" / "offsets").exists()
