"""How the indexing job reads Kafka: Spark's own ``kafka`` source, as the query's stream and, for
a batch that holds records Spark cannot read (sink.py), as batch reads of given offset ranges
with the same settings.

``KafkaSource`` is plain data (it travels pickled inside the foreachBatch function, also to a
Spark Connect server). Spark's Kafka options keep Spark's names; consumer settings are passed
as ``kafka.<name>``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import TYPE_CHECKING

from msgindex.kafka.admin import ISOLATION_LEVEL, READ_COMMITTED, READ_UNCOMMITTED

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KAFKA_OPTION_PREFIX = "kafka."
EARLIEST = -2  # Spark's JSON offsets: -2 is the partition's earliest offset


@dataclass(frozen=True)
class OffsetRange:
    """[start, end) of one Kafka partition; start None: the partition's earliest offset."""

    start: int | None
    end: int


@dataclass(frozen=True)
class KafkaSource:
    """The job's Kafka source settings (the CLI's flags of the same names)."""

    bootstrap_servers: str
    subscribe: tuple[str, ...] | None = None
    subscribe_pattern: str | None = None
    include_headers: bool = False
    consumer_options: Mapping[str, str] = field(default_factory=dict)  # --kafka-option, without "kafka."
    fail_on_data_loss: str = "true"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None

    @property
    def isolation_level(self) -> str:
        """What the job reads of transactions: read_committed unless ``--kafka-option
        isolation.level=...`` says otherwise (the index holds what consumers see: kafka/admin.py)."""
        return self.consumer_options.get(ISOLATION_LEVEL, READ_COMMITTED)

    def reading_every_record(self) -> KafkaSource:
        """This source reading every record of the log, aborted transactions' too: a re-read of
        records an index holds must see them whatever the index was built with (before
        read_committed was the default, indexes took aborted records too)."""
        return replace(self, consumer_options={**self.consumer_options, ISOLATION_LEVEL: READ_UNCOMMITTED})

    def _reader(self, reader):
        reader = (reader.format("kafka")
                  .option("kafka.bootstrap.servers", self.bootstrap_servers)
                  .option("failOnDataLoss", self.fail_on_data_loss)
                  .option("includeHeaders", str(self.include_headers).lower()))
        for key, value in {ISOLATION_LEVEL: self.isolation_level, **self.consumer_options}.items():
            reader = reader.option(KAFKA_OPTION_PREFIX + key, value)
        return reader

    def stream(self, spark: SparkSession) -> DataFrame:
        """The streaming DataFrame of the job's query."""
        reader = self._reader(spark.readStream).option("startingOffsets", self.starting_offsets)
        if self.subscribe is not None:
            reader = reader.option("subscribe", ",".join(self.subscribe))
        else:
            reader = reader.option("subscribePattern", self.subscribe_pattern)
        if self.max_offsets_per_trigger is not None:
            reader = reader.option("maxOffsetsPerTrigger", str(self.max_offsets_per_trigger))
        if self.min_partitions is not None:
            reader = reader.option("minPartitions", str(self.min_partitions))
        return reader.load()

    def read_pieces(self, spark: SparkSession,
                    pieces: Mapping[tuple[str, int], Sequence[OffsetRange]]) -> DataFrame | None:
        """One batch DataFrame of exactly these offset ranges (None when there are none): the
        union of one read per round, round i reading the i-th range of every partition that has
        one (a read takes one range per partition). Each range is its own Spark input partition."""
        rounds = max((len(ranges) for ranges in pieces.values()), default=0)
        frames = []
        for n in range(rounds):
            part = {tp: ranges[n] for tp, ranges in pieces.items() if len(ranges) > n}
            assign: dict[str, list[int]] = {}
            starts: dict[str, dict[str, int]] = {}
            ends: dict[str, dict[str, int]] = {}
            for (topic, partition), piece in sorted(part.items()):
                assign.setdefault(topic, []).append(partition)
                starts.setdefault(topic, {})[str(partition)] = EARLIEST if piece.start is None else piece.start
                ends.setdefault(topic, {})[str(partition)] = piece.end
            frames.append(self._reader(spark.read).option("assign", json.dumps(assign))
                          .option("startingOffsets", json.dumps(starts)).option("endingOffsets", json.dumps(ends)).load())
        return reduce(lambda a, b: a.union(b), frames) if frames else None
