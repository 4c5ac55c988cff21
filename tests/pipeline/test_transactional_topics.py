"""Transactional producers (Kafka Streams and Flink exactly once, the outbox pattern): a commit
marker takes an offset after every transaction, so nearly every micro-batch of a busy
transactional topic ends in an offset no record holds, and ``read_committed`` never delivers the
records of aborted transactions. Found by an attack run: each such gap stayed between the
shard's committed intervals, one more per partition and micro-batch, and every append carries
them all (the log's annotation is capped at 1 MiB: a shard on 32 such partitions at a 1 s trigger
refused appends after about half an hour). The offsets of completed micro-batches now close the
gaps (spark/pipeline/completed_batches.py): a partition stays one interval however many batches
and transactions, and the index holds exactly what a ``read_committed`` consumer reads."""

from __future__ import annotations

import warnings

import pytest
from kafka import KafkaProducer

import msgindex
from tests.pipeline.support import assert_index_equals, ground_truth, job_args, run_job_in_process

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

TRANSACTIONS = 60
PER_TRIGGER = 9  # small batches, so that many end next to a commit marker or inside an aborted transaction


def produce_transactions(bootstrap: str, topic: str) -> None:
    """TRANSACTIONS transactions of 2-5 records over both partitions, every fourth aborted, and
    a plain record between transactions now and then."""
    transactional = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"tx-{topic}", enable_idempotence=True)
    plain = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        transactional.init_transactions()
        for number in range(TRANSACTIONS):
            transactional.begin_transaction()
            for record in range(2 + number % 4):
                transactional.send(topic, key=f"order-{number % 7}".encode(), value=f"{number}-{record}".encode(),
                                   partition=record % 2)
            transactional.flush()
            if number % 4 == 3:
                transactional.abort_transaction()
            else:
                transactional.commit_transaction()
            if number % 5 == 0:
                plain.send(topic, key=b"plain", value=str(number).encode(), partition=number % 2).get(timeout=30)
    finally:
        transactional.close()
        plain.close()


def test_a_transactional_topic_is_indexed_as_read_committed_in_one_interval_a_partition(
        kafka_bootstrap, kafka_topic, spark, tmp_path):
    topic = kafka_topic(partitions=2, prefix="tx")
    produce_transactions(kafka_bootstrap, topic)
    truth = ground_truth(kafka_bootstrap, [topic], isolation_level="read_committed")
    everything = ground_truth(kafka_bootstrap, [topic])
    assert len(everything.messages) > len(truth.messages), "aborted transactions must leave records in the log"

    index = tmp_path / "index"
    history = run_job_in_process(job_args(kafka_bootstrap, [topic], index, "--available-now", "--quiet-spark",
                                          "--kafka-option", "isolation.level=read_committed",
                                          "--max-offsets-per-trigger", str(PER_TRIGGER)))
    assert len(history) >= 10, "the topic must span many micro-batches"
    assert sum(stats.appended for stats in history) == len(truth.messages)
    assert_index_equals(index, truth, topics=[topic])

    with msgindex.open(index) as store:
        for broker in store.brokers():
            with store.reader(broker) as reader:
                ranges = reader.committed_ranges.ranges
            # every micro-batch but the last is settled: at most the last one's gap is left open
            assert all(len(intervals) <= 2 for intervals in ranges.values()), ranges


def test_aborted_transactions_are_not_indexed_by_default(kafka_bootstrap, kafka_topic, spark, tmp_path):
    """Found by an attack run: the job read with Kafka's default read_uncommitted, so a key's
    messages included the records of aborted transactions (phantom duplicates after every
    producer failure). Without any --kafka-option it now reads what a read_committed consumer
    does; isolation.level=read_uncommitted still indexes everything in the log."""
    topic = kafka_topic(partitions=2, prefix="tx")
    produce_transactions(kafka_bootstrap, topic)
    committed = ground_truth(kafka_bootstrap, [topic], isolation_level="read_committed")
    everything = ground_truth(kafka_bootstrap, [topic])
    run_job_in_process(job_args(kafka_bootstrap, [topic], tmp_path / "default", "--available-now", "--quiet-spark"))
    assert_index_equals(tmp_path / "default", committed, topics=[topic])
    run_job_in_process(job_args(kafka_bootstrap, [topic], tmp_path / "all", "--available-now", "--quiet-spark",
                                "--kafka-option", "isolation.level=read_uncommitted"))
    assert_index_equals(tmp_path / "all", everything, topics=[topic])


def test_a_backfill_gives_values_to_the_aborted_records_an_index_holds(kafka_bootstrap, kafka_topic, spark, tmp_path):
    """An index built with read_uncommitted (every index before read_committed became the
    default) holds aborted transactions' records: a --backfill-fields re-read must see them too,
    or the field would cover them without their values (found by a review: a field lookup then
    silently missed them)."""
    import msgindex

    topic = kafka_topic(partitions=2, prefix="tx")
    produce_transactions(kafka_bootstrap, topic)
    everything = ground_truth(kafka_bootstrap, [topic])
    index = tmp_path / "index"
    run_job_in_process(job_args(kafka_bootstrap, [topic], index, "--available-now", "--quiet-spark",
                                "--kafka-option", "isolation.level=read_uncommitted"))
    run_job_in_process(job_args(kafka_bootstrap, [topic], index, "--available-now", "--quiet-spark",
                                "--index-field", "v=CAST(value AS STRING)", "--backfill-fields"))
    aborted = "3-1"  # transaction 3 (every fourth is aborted), its second record
    with msgindex.open(index) as store, warnings.catch_warnings():
        warnings.simplefilter("error")  # the field covers every offset the index holds
        found = store.lookup(fields={"v": [aborted, "0-0"]})
    assert sorted(found.column("key").to_pylist()) == ["order-0", "order-3"]
    assert_index_equals(index, everything, topics=[topic])
