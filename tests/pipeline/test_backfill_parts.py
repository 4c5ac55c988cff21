"""The job side of ``--backfill-fields`` without Kafka or Spark: which offsets a shard's
coverage may grow by, given what it asked Kafka for and what came back."""

from __future__ import annotations

from msgindex.spark.pipeline.backfill import received_within, retained
from msgindex.storage.source_ranges import SourceRanges, SourceRows


def _rows(*coords: tuple[str, int, int]) -> SourceRows:
    return SourceRows.of([c[0] for c in coords], [c[1] for c in coords], [c[2] for c in coords])


def test_coverage_grows_only_over_what_kafka_returned_from_its_first_offset_on():
    asked = SourceRanges({("t", 0): ((0, 100),), ("t", 1): ((0, 50), (80, 90)), ("t", 2): ((0, 10),)})
    back = _rows(("t", 0, 40), ("t", 0, 41), ("t", 0, 99),  # retention took 0..39 after the earliest offsets were read
                 ("t", 1, 0), ("t", 1, 7),  # gaps after the first offset: Kafka's own (markers, compaction)
                 ("u", 0, 5))  # not asked: ignored
    assert received_within(asked, back) == SourceRanges({("t", 0): ((40, 100),), ("t", 1): ((0, 50),)})


def test_what_kafka_no_longer_retains_is_not_asked_for():
    held = SourceRanges({("t", 0): ((0, 100),), ("t", 1): ((0, 50),), ("gone", 0): ((0, 5),)})
    assert retained(held, {("t", 0): 40, ("t", 1): 50}) == SourceRanges({("t", 0): ((40, 100),)})
