"""``--backfill-fields`` end to end on the real broker: an index built without fields gets them
declared later; the backfill re-reads what Kafka retains and every field lookup then equals ground
truth computed in Python from the records read back from Kafka, with no coverage warning except
for the offsets Kafka deleted (named in the job's line and in the lookup's warning); a second run
backfills nothing twice."""

from __future__ import annotations

import random
import warnings
from collections import defaultdict

import pytest
from kafka import KafkaAdminClient, TopicPartition

import msgindex
from msgindex.errors import FieldCoverageWarning
from msgindex.kafka.loadgen import produce
from tests.pipeline.support import consume_all, job_args, run_job_in_process
from tests.pipeline.test_cli_failures import assert_one_line, run_cli
from tests.pipeline.test_fields_pipeline import _expected, _payloads

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

ORDER = "order=get_json_object(CAST(value AS STRING), '$.order.id')"
SKU = "sku=from_json(CAST(value AS STRING), 'struct<items:array<struct<sku:string>>>').items.sku"
FLAGS = ["--index-field", ORDER, "--index-field", SKU, "--index-header", "trace"]
DELETED_BELOW = 40  # partition 0's records below this offset are deleted from Kafka before the backfill


def _found(table) -> set[tuple[str, int, int]]:
    return {(r["topic"], r["partition"], r["offset"]) for r in table.select(["topic", "partition", "offset"]).to_pylist()}


def _lookup(store, name: str, value: str):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = _found(store.lookup(fields={name: value}))
    return found, [str(w.message) for w in caught if issubclass(w.category, FieldCoverageWarning)]


def test_fields_declared_later_are_backfilled_from_what_kafka_retains(kafka_bootstrap, kafka_topic, capsys, tmp_path):
    topic = kafka_topic(partitions=2, prefix="backfill")
    rng = random.Random(23)
    produce(kafka_bootstrap, _payloads(topic, rng, 400))
    index = tmp_path / "index"
    first = run_job_in_process(job_args(kafka_bootstrap, [topic], index, "--available-now", "--quiet-spark"))
    assert sum(s.appended for s in first) == 400

    produce(kafka_bootstrap, _payloads(topic, rng, 200))  # indexed by the job with the fields, from its batches
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 0): DELETED_BELOW})
    finally:
        admin.close()
    records = list(consume_all(kafka_bootstrap, [topic]))  # what Kafka still has: the truth
    truth: dict[tuple[str, str], set] = defaultdict(set)
    for record in records:
        for name, values in _expected(record).items():
            for value in values:
                if name in ("order", "sku", "trace"):
                    truth[(name, value)].add((record.topic, record.partition, record.offset))

    capsys.readouterr()
    second = run_job_in_process(job_args(kafka_bootstrap, [topic], index, "--available-now", "--quiet-spark",
                                         "--backfill-fields", *FLAGS))
    said = capsys.readouterr().out
    assert sum(s.appended for s in second) == 200
    assert f"Kafka no longer retains {topic}-0 offsets [0, {DELETED_BELOW})" in said, said
    assert "values added to" in said, said

    with msgindex.open(index) as store:
        for (name, value), expected in sorted(truth.items()):
            found, warned = _lookup(store, name, value)
            assert found == expected, (name, value)
            # only what Kafka deleted is not covered, and the warning names exactly that
            assert warned and all(f"{topic}-0 offsets [0, {DELETED_BELOW})" in w and f"{topic}-1" not in w
                                  for w in warned), warned
        assert sum(b.num_rows for b in store.scan()) == 600  # the rebuild lost and doubled nothing
        by_key = defaultdict(set)
        for record in records:
            if record.key:
                by_key[record.key.decode()].add((record.topic, record.partition, record.offset))
        for key in ("o-1", "t-1", "order=o-1"):
            assert by_key[key] <= _found(store.lookup(key))  # keys still find their records (and field values never)

    # again: nothing left to backfill, nothing indexed twice
    third = run_job_in_process(job_args(kafka_bootstrap, [topic], index, "--available-now", "--quiet-spark",
                                        "--backfill-fields", *FLAGS))
    said = capsys.readouterr().out
    assert [s.appended for s in third] in ([], [0])
    assert "values added" not in said and "no longer retains" in said
    with msgindex.open(index) as store:
        order = sorted(k for k in truth if k[0] == "order")[0]
        assert _lookup(store, *order)[0] == truth[order]


def test_backfill_fields_without_fields_is_one_line(kafka_bootstrap, tmp_path):
    done, _ = run_cli(job_args(kafka_bootstrap, ["any-topic"], tmp_path / "index", "--available-now",
                               "--backfill-fields"))
    assert_one_line(done, "--backfill-fields", "declare the fields")


def test_an_object_store_index_is_backfilled_exactly_once(kafka_bootstrap, kafka_topic, s3, capsys, tmp_path):
    from msgindex.kafka.loadgen import keyed_records
    from tests.pipeline.support import ground_truth

    slot = "slot=CAST(offset % 7 AS STRING)"  # a field from a Kafka column: its truth is the offsets
    options = [arg for name, value in s3.options.items() for arg in ("--storage-option", f"{name}={value}")]
    topics = [kafka_topic(partitions=3, prefix="backfill-s3")]
    produce(kafka_bootstrap, keyed_records(topics, 3_000, key_pool=300, seed=24))
    truth = ground_truth(kafka_bootstrap, topics)
    url = s3.url("index")
    checkpoint = str(tmp_path / "checkpoint")
    run_job_in_process(job_args(kafka_bootstrap, topics, url, "--available-now", "--quiet-spark", "--checkpoint",
                                checkpoint, "--max-offsets-per-trigger", "1000", *options))
    capsys.readouterr()
    run_job_in_process(job_args(kafka_bootstrap, topics, url, "--available-now", "--quiet-spark", "--checkpoint",
                                checkpoint, "--backfill-fields", "--index-field", slot, *options))
    assert "values added to" in capsys.readouterr().out
    with msgindex.open(url, storage_options=s3.options) as store:
        for value in ("0", "3"):
            found, warned = _lookup(store, "slot", value)
            assert found == {where for where in truth.messages if where[2] % 7 == int(value)} and not warned
        assert sum(b.num_rows for b in store.scan()) == len(truth.messages)
    run_job_in_process(job_args(kafka_bootstrap, topics, url, "--available-now", "--quiet-spark", "--checkpoint",
                                checkpoint, "--backfill-fields", "--index-field", slot, *options))
    assert "every field already covers every offset" in capsys.readouterr().out
