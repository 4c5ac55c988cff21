"""Input shape ``metadata``: Kafka records whose values are RocketMQ-style message-metadata events.

One event per indexed message, a JSON object (field names follow RocketMQ's MessageExt /
DispatchRequest)::

    {"brokerName": "broker-a",        required, non-empty string: the shard the message goes to
     "topic": "TopicTest",            required, non-empty string
     "queueId": 3,                    required, int32 >= 0      (-> partition)
     "queueOffset": 1234,             required, int64 >= 0      (-> offset)
     "storeTimestamp": 1700000000000, required, int64 >= 0, epoch milliseconds, at most year 9999
     "keys": "order-1 order-2",       optional: space-separated keys (RocketMQ's KEYS), or a JSON list of strings
     "uniqKey": "7F0000016B3C...",    optional string: the message's unique key (RocketMQ's UNIQ_KEY)
     "commitLogOffset": 102400,       optional int64 >= 0 (-1 when absent)
     "msgSize": 245}                  optional int32 >= 0 (-1 when absent)

Every non-empty key token and the unique key are indexed (each once). Events are parsed by Spark
(``from_json``) in the JVM; an event that is not UTF-8, not a JSON object, has a field of the
wrong type, or misses/violates a required field gets a ``reason`` and is quarantined instead of
indexed (see quarantine.py). Unknown fields are ignored.

Types are checked as JSON has them: ``from_json`` would read any JSON value into a string field
(``"keys": 123`` as the key "123", ``["ok", 5]`` as the keys "ok" and "5"), so the text fields'
JSON types come from Spark's variant parser (``try_parse_json`` + ``schema_of_variant``). A
``storeTimestamp`` outside the one timestamp rule (timestamp_rule.py) is set aside with the
storage layer's own reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgindex.spark.pipeline.quarantine import RAW_VALUE, REASON, SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TIMESTAMP, SOURCE_TOPIC
from msgindex.spark.pipeline.timestamp_rule import timestamp_reason
from msgindex.storage.int_limits import INT32_MAX
from msgindex.storage.rocketmq.message_keys import KEYS_SEPARATOR  # RocketMQ's KEYS rule: split on U+0020 only
from msgindex.storage.shard import BROKER_NAME_FORBIDDEN_CHARACTERS, BROKER_NAME_RULE, RESERVED_BROKER_NAMES

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

BROKER_NAME = "brokerName"
TOPIC = "topic"
QUEUE_ID = "queueId"
QUEUE_OFFSET = "queueOffset"
STORE_TIMESTAMP = "storeTimestamp"
KEYS = "keys"
UNIQ_KEY = "uniqKey"
COMMIT_LOG_OFFSET = "commitLogOffset"
MSG_SIZE = "msgSize"

_CORRUPT = "_corrupt_record"
# queueId/msgSize are read as int64 and range-checked so that "out of range" is its own reason.
EVENT_DDL = (
    f"`{BROKER_NAME}` string, `{TOPIC}` string, `{QUEUE_ID}` bigint, `{QUEUE_OFFSET}` bigint, "
    f"`{STORE_TIMESTAMP}` bigint, `{KEYS}` string, `{UNIQ_KEY}` string, `{COMMIT_LOG_OFFSET}` bigint, "
    f"`{MSG_SIZE}` bigint, `{_CORRUPT}` string"
)
# The JSON types (schema_of_variant's names) a text field may have; absent or null is VOID/NULL.
_ABSENT = ("VOID", "NULL")
TEXT_TYPES = {
    BROKER_NAME: ("STRING", *_ABSENT),
    TOPIC: ("STRING", *_ABSENT),
    KEYS: ("STRING", "ARRAY<STRING>", "ARRAY<VOID>", *_ABSENT),
    UNIQ_KEY: ("STRING", *_ABSENT),
}
_TYPE = "_json_type_"  # + field name: the column with that field's JSON type (null: a string or absent)
# What from_json puts into a string field for a JSON value that is not a string: its JSON text.
# Only such texts need the variant parser's word (a string may look the same: "12345").
_MAYBE_NOT_A_STRING = r"^(\[|\{|true$|false$|-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$)"
_FIRST_CHARACTERS = tuple("[{-0123456789tf")  # of those texts: a cheap test before the regex


def _json_types(event: Column, raw_value: Column) -> list[Column]:
    """One column per text field: its JSON type as schema_of_variant names it, computed only for
    values whose text could be another JSON type (the variant parse costs about as much as
    from_json itself, and ordinary keys never need it); null for the others."""
    from pyspark.sql import functions as F

    variant = F.try_parse_json(raw_value.cast("string"))
    return [F.when(F.substring(event[name], 1, 1).isin(*_FIRST_CHARACTERS) & event[name].rlike(_MAYBE_NOT_A_STRING),
                   F.schema_of_variant(F.variant_get(variant, f"$.{name}", "variant"))).alias(_TYPE + name)
            for name in TEXT_TYPES]


def _type_problem(name: str) -> Column:
    from pyspark.sql import functions as F

    kind = F.col(_TYPE + name)
    expected = "a string or a list of strings" if name == KEYS else "a string"
    return F.when(kind.isNotNull() & ~kind.isin(*TEXT_TYPES[name]),
                  F.concat(F.lit(f"{name} is not {expected} (JSON "), kind, F.lit(")")))


def _reason(event: Column, value: Column) -> Column:
    """The first thing wrong with an event, or null when it can be indexed."""
    from pyspark.sql import functions as F

    def missing_text(name: str) -> Column:
        return event[name].isNull() | (event[name] == F.lit(""))

    checks = [
        (value.isNull(), "value is null"),
        (~F.expr(f"is_valid_utf8({RAW_VALUE})"), "value is not UTF-8 text"),
        (event.isNull() | event[_CORRUPT].isNotNull(),
         "not a JSON object of the event schema (malformed JSON or a field of the wrong type)"),
        *((_type_problem(name).isNotNull(), _type_problem(name)) for name in TEXT_TYPES),
        (missing_text(BROKER_NAME), f"missing {BROKER_NAME}"),
        # the shard's directory name: storage.shard's broker-name rule, checked here too so that
        # the raw event is kept with the reason
        (_breaks_broker_name_rule(event[BROKER_NAME]), f"{BROKER_NAME} cannot name a shard directory ({BROKER_NAME_RULE})"),
        (missing_text(TOPIC), f"missing {TOPIC}"),
        (event[QUEUE_ID].isNull(), f"missing {QUEUE_ID}"),
        ((event[QUEUE_ID] < 0) | (event[QUEUE_ID] > INT32_MAX), f"{QUEUE_ID} out of range [0, {INT32_MAX}]"),
        (event[QUEUE_OFFSET].isNull(), f"missing {QUEUE_OFFSET}"),
        (event[QUEUE_OFFSET] < 0, f"{QUEUE_OFFSET} is negative"),
        (event[STORE_TIMESTAMP].isNull(), f"missing {STORE_TIMESTAMP}"),
        (event[STORE_TIMESTAMP] < 0, f"{STORE_TIMESTAMP} is negative"),
        (timestamp_reason(event[STORE_TIMESTAMP]).isNotNull(), timestamp_reason(event[STORE_TIMESTAMP], STORE_TIMESTAMP)),
        (event[COMMIT_LOG_OFFSET] < 0, f"{COMMIT_LOG_OFFSET} is negative"),
        ((event[MSG_SIZE] < 0) | (event[MSG_SIZE] > INT32_MAX), f"{MSG_SIZE} out of range [0, {INT32_MAX}]"),
    ]
    def text(reason: str | Column) -> Column:
        return F.lit(reason) if isinstance(reason, str) else reason

    reason = F.when(checks[0][0], text(checks[0][1]))
    for condition, why in checks[1:]:
        reason = reason.when(condition, text(why))
    return reason.otherwise(F.lit(None).cast("string"))


def _keys(event: Column) -> Column:
    """KEYS tokens (space-separated string, or a JSON list) then uniqKey; non-empty, each once."""
    from pyspark.sql import functions as F

    raw = event[KEYS]
    is_list = F.coalesce(F.col(_TYPE + KEYS).startswith("ARRAY"), F.lit(False))
    tokens = F.when(is_list, F.from_json(raw, "array<string>")).otherwise(F.split(raw, KEYS_SEPARATOR))
    everything = F.concat(F.coalesce(tokens, F.array().cast("array<string>")),
                          F.array(event[UNIQ_KEY]))
    return F.array_distinct(F.filter(everything, lambda k: k.isNotNull() & (k != F.lit(""))))


def parse_metadata_events(kafka_df: DataFrame) -> DataFrame:
    """Kafka source rows -> one row per event: the append columns (broker, topic, partition,
    offset, timestamp_ms, key, keys, commit_log_offset, size; broker null when malformed) plus
    the quarantine columns (reason, source coordinates, and the raw value only when malformed,
    so good events never carry their payload further)."""
    from pyspark.sql import functions as F

    raw = kafka_df.select(
        F.col("topic").alias(SOURCE_TOPIC), F.col("partition").alias(SOURCE_PARTITION),
        F.col("offset").alias(SOURCE_OFFSET), F.expr("unix_millis(timestamp)").alias(SOURCE_TIMESTAMP),
        F.col("value").alias(RAW_VALUE),
    )
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
    parsed = raw.withColumn("event", F.from_json(F.col(RAW_VALUE).cast("string"), EVENT_DDL, options))
    parsed = parsed.select("*", *_json_types(F.col("event"), F.col(RAW_VALUE)))
    parsed = parsed.withColumn(REASON, _reason(F.col("event"), F.col(RAW_VALUE)))
    good = F.col(REASON).isNull()
    event = F.col("event")

    def when_good(column: Column, otherwise: Column | None = None) -> Column:
        return F.when(good, column).otherwise(otherwise if otherwise is not None else F.lit(None))

    return parsed.select(
        when_good(event[BROKER_NAME]).alias("broker"),
        when_good(event[TOPIC]).alias("topic"),
        when_good(event[QUEUE_ID].cast("int")).alias("partition"),
        when_good(event[QUEUE_OFFSET]).alias("offset"),
        when_good(event[STORE_TIMESTAMP]).alias("timestamp_ms"),
        F.lit(None).cast("string").alias("key"),
        when_good(_keys(event)).alias("keys"),
        when_good(F.coalesce(event[COMMIT_LOG_OFFSET], F.lit(-1).cast("bigint"))).alias("commit_log_offset"),
        when_good(F.coalesce(event[MSG_SIZE], F.lit(-1).cast("bigint")).cast("int")).alias("size"),
        F.col(REASON),
        F.col(SOURCE_TOPIC), F.col(SOURCE_PARTITION), F.col(SOURCE_OFFSET), F.col(SOURCE_TIMESTAMP),
        when_good(F.lit(None), F.col(RAW_VALUE)).alias(RAW_VALUE),
    )


def _breaks_broker_name_rule(name: Column) -> Column:
    broken = name.isin(*RESERVED_BROKER_NAMES)
    for character in BROKER_NAME_FORBIDDEN_CHARACTERS:
        broken = broken | name.contains(character)
    return broken
