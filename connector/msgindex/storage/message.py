"""What msgindex stores about one message, and the Arrow shapes it travels in.

A message is identified by (topic, partition, offset) in its source. `keys` are every key the
message is indexed under (for Kafka records: the record key, the space-separated ``KEYS`` header
tokens and the ``UNIQ_KEY`` header; for RocketMQ metadata events: KEYS tokens and the unique
key); `key` is the message's own primary key (the Kafka record key, or None).

Keys are Python ``str``. Key bytes that are not valid UTF-8 are decoded with
``surrogateescape`` (lossless; see ``decode_key_bytes``) and everything on disk is encoded with
``surrogatepass`` so that any ``str`` round-trips exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

INDEX_KEY_SEPARATOR = "#"  # RocketMQ's index key is topic + "#" + key (not the KEYS property's separator)
# RocketMQ's property names of a message's keys, carried as Kafka record headers (DESIGN.md: input shapes)
KEYS_PROPERTY = "KEYS"
UNIQ_KEY_PROPERTY = "UNIQ_KEY"
NO_VALUE = -1  # commit_log_offset / size when the source has none
DISK_TEXT_ERRORS = "surrogatepass"

# The one rule for message timestamps (ms since the epoch): valid from 0001-01-01T00:00:00.000Z to
# 9999-12-31T23:59:59.999Z, the range that Python's datetime, ISO-8601 output and Spark's
# TimestampType can all show. Kafka's "no timestamp" (-1) is inside it. A record outside it is set
# aside with a reason by the pipeline and refused by appends: one such record (CreateTime 2^63-1
# exists in the wild) must never break the lookups, scans or output of the others.
MIN_TIMESTAMP_MS = -62_135_596_800_000
MAX_TIMESTAMP_MS = 253_402_300_799_999


def timestamp_problem(timestamp_ms: int) -> str | None:
    """Why `timestamp_ms` is not a valid message timestamp (see MIN/MAX_TIMESTAMP_MS), or None."""
    if MIN_TIMESTAMP_MS <= timestamp_ms <= MAX_TIMESTAMP_MS:
        return None
    return (f"timestamp {timestamp_ms} ms is outside the years 0001..9999 "
            f"[{MIN_TIMESTAMP_MS}, {MAX_TIMESTAMP_MS}] that msgindex can store and show")


# Stores written before the rule may hold timestamps outside it. Readers show each one as the
# nearest bound (never an overflow, never a wrapped date) and time windows see it as shown, so
# results read the same with and without a window pushed down to the store.
def shown_timestamps(timestamps_ms: np.ndarray) -> np.ndarray:
    """Stored timestamps (int64 ms) as results show them: clamped to [MIN, MAX]_TIMESTAMP_MS."""
    return np.clip(timestamps_ms, MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS)


def shown_timestamp(timestamp_ms: int) -> int:
    """``shown_timestamps`` of one timestamp, without numpy's per-call cost (a few us)."""
    return min(max(timestamp_ms, MIN_TIMESTAMP_MS), MAX_TIMESTAMP_MS)


def stored_window(begin_ms: int | None, end_ms: int | None) -> tuple[int | None, int | None] | None:
    """The window over *stored* timestamps that selects exactly the records whose *shown*
    timestamp is in [begin_ms, end_ms] (None: open), or None when no record can be in it. A bound
    at or past the rule's edge opens that side (a record stored beyond it shows as the edge)."""
    if (begin_ms is not None and (begin_ms > MAX_TIMESTAMP_MS or (end_ms is not None and begin_ms > end_ms))) or (
        end_ms is not None and end_ms < MIN_TIMESTAMP_MS
    ):
        return None
    return (None if begin_ms is None or begin_ms <= MIN_TIMESTAMP_MS else begin_ms,
            None if end_ms is None or end_ms >= MAX_TIMESTAMP_MS else end_ms)


def index_key(topic: str, key: str) -> str:
    """The string hashed into the index for `key` of a message in `topic` (RocketMQ's rule)."""
    return f"{topic}{INDEX_KEY_SEPARATOR}{key}"


def index_keys(topic: str, keys: Iterable[str]) -> list[str]:
    """``index_key(topic, key)`` of each of `keys` (a lookup of many keys makes thousands)."""
    prefix = index_key(topic, "")
    return [prefix + key for key in keys]


# A named field's value (storage/fields.py) is stored among a record's index terms as the *field
# term* FIELD_TERM_MARKER + encode_text(name) + NUL + encode_text(value): encode_text (UTF-8, lone
# surrogates passed through) never produces the byte 0xFF, so no key's bytes equal a field term.
# Its hash string is topic + NUL + name + NUL + value: the part before its first "#" holds a NUL,
# which no topic does (Kafka's [a-zA-Z0-9._-], RocketMQ's [%|a-zA-Z0-9_-]), so it never equals a
# key's topic#key either. Either way a lookup compares the stored bytes: no false hit.
FIELD_TERM_MARKER = b"\xff"
FIELD_NAME_END = b"\x00"
FIELD_HASH_SEPARATOR = "\x00"


def field_term(name: str, value: str) -> bytes:
    """The bytes the log stores for `value` of field `name` among a record's index terms."""
    return FIELD_TERM_MARKER + encode_text(name) + FIELD_NAME_END + encode_text(value)


def is_field_term(term: bytes) -> bool:
    return term[:1] == FIELD_TERM_MARKER


def split_field_term(term: bytes) -> tuple[str, str]:
    """(name, value) of a field term (``field_term``'s inverse; a name holds no NUL)."""
    name, _, value = bytes(term[1:]).partition(FIELD_NAME_END)
    return decode_text(name), decode_text(value)


def field_hash_string(topic: str, name: str, value: str) -> str:
    """The string hashed into the index for `value` of field `name` of a message in `topic`."""
    return f"{topic}{FIELD_HASH_SEPARATOR}{name}{FIELD_HASH_SEPARATOR}{value}"


def term_hash_string(topic: str, term: bytes) -> str:
    """The hash string of one stored term (encode_text bytes of a key, or a field term)."""
    if is_field_term(term):
        return field_hash_string(topic, *split_field_term(term))
    return index_key(topic, decode_text(term))


def split_terms(terms: Iterable[bytes]) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """A record's stored terms as (its keys, its (field, value) pairs)."""
    keys, fields = [], []
    for term in terms:
        if is_field_term(term):
            fields.append(split_field_term(term))
        else:
            keys.append(decode_text(term))
    return tuple(keys), tuple(fields)


def decode_key_bytes(raw: bytes) -> str:
    """A Kafka key's bytes as the ``str`` msgindex indexes: UTF-8, undecodable bytes kept as
    lone surrogates U+DC80..U+DCFF (Python's ``surrogateescape``), so no two byte strings collide."""
    return raw.decode("utf-8", "surrogateescape")


def encode_text(text: str) -> bytes:
    """The on-disk bytes of a topic or key: UTF-8, lone surrogates passed through."""
    return text.encode("utf-8", DISK_TEXT_ERRORS)


def decode_text(raw: bytes) -> str:
    """Inverse of ``encode_text``."""
    return raw.decode("utf-8", DISK_TEXT_ERRORS)


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """One message's metadata, as appended to a shard's metadata log."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    keys: tuple[str, ...]
    commit_log_offset: int = NO_VALUE
    size: int = NO_VALUE
    # (field name, value) pairs the message is also indexed under (storage/fields.py)
    fields: tuple[tuple[str, str], ...] = ()

    def index_strings(self) -> set[str]:
        """The strings the writer hashed into the index for this record: its keys' and fields'."""
        return {*(index_key(self.topic, key) for key in self.keys),
                *(field_hash_string(self.topic, name, value) for name, value in self.fields)}


# Appends may arrive as Arrow (the pipeline's task chunks, split by shard): one row per message.
APPEND_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp_ms", pa.int64(), nullable=False),
        pa.field("key", pa.string(), nullable=True),
        pa.field("keys", pa.list_(pa.field("item", pa.string(), nullable=False)), nullable=False),
        pa.field("commit_log_offset", pa.int64(), nullable=False),
        pa.field("size", pa.int32(), nullable=False),
    ]
)
# An appended table may also carry the records' field values (absent: none), as (name, value) pairs.
FIELD_PAIR = pa.struct([pa.field("name", pa.string(), nullable=False), pa.field("value", pa.string(), nullable=False)])
FIELDS_COLUMN = pa.field("fields", pa.list_(pa.field("item", FIELD_PAIR, nullable=False)), nullable=True)

# Query results (store lookups and scans, and the Spark data source's rows).
# Timestamps are timestamp[us, tz=UTC]: what Spark's TimestampType maps to in Arrow.
ROW_SCHEMA = pa.schema(
    [
        pa.field("broker", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("key", pa.string(), nullable=True),
        pa.field("keys", pa.list_(pa.field("element", pa.string(), nullable=False)), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("commit_log_offset", pa.int64(), nullable=True),
        pa.field("size", pa.int32(), nullable=True),
        pa.field("seq", pa.int64(), nullable=False),
    ]
)


# How results show texts (Arrow and Spark strings must be valid UTF-8), one to one, so that what a
# user sees finds exactly that message again (``where key = '<as shown>'``, the ``key`` option,
# ``msgindex lookup --key``):
# * key bytes that are not UTF-8 (held as lone surrogates, see decode_key_bytes) show as ``\xNN``,
#   two lowercase hex digits per byte;
# * a literal backslash that would read as such an escape (a ``\`` followed by ``x`` and two hex
#   digits) shows as ``\x5c``, the escape of the backslash byte itself;
# * everything else shows as itself (a Windows path ``C:\dir`` too).
# ``text_of_shown`` is the inverse. (A lone surrogate outside U+DC80..U+DCFF, which only the Python
# API can put into a key, shows as the bytes encode_text stores for it.)
_ESCAPE_LOOKALIKE = re.compile(r"\\(?=x[0-9a-fA-F]{2})")
_SHOWN_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def arrow_text(text: str) -> str:
    """`text` as results show it (see above): valid UTF-8, one to one; ``text_of_shown`` inverts it."""
    if "\\" in text:
        text = _ESCAPE_LOOKALIKE.sub(r"\\x5c", text)
    if text.isascii():  # (most texts: nothing to try encoding)
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # lone surrogates outside U+DC80..U+DCFF
        raw = encode_text(text)
    return raw.decode("utf-8", "backslashreplace")


def text_of_shown(shown: str) -> str:
    r"""The text that results show as `shown` (``arrow_text``'s inverse): ``\xNN`` escapes become
    their bytes again, decoded like Kafka key bytes (``decode_key_bytes``). A string no text is
    shown as (``\x41``, ``\xFF``) still gives the text its escapes spell; a caller that must
    match exactly compares ``arrow_text`` of what it finds with `shown`."""
    if "\\x" not in shown:
        return shown
    raw, position = bytearray(), 0
    for escape in _SHOWN_ESCAPE.finditer(shown):
        raw += shown[position : escape.start()].encode("utf-8", "surrogateescape")
        raw.append(int(escape.group(1), 16))
        position = escape.end()
    raw += shown[position:].encode("utf-8", "surrogateescape")
    return decode_key_bytes(bytes(raw))


def exactly_shown(shown: str) -> str | None:
    r"""The text that results show exactly as `shown`; None when none is shown so (``\x41``: a
    row shows ``A``; ``\x5c`` stands for a backslash only where one would read as an escape).
    What an exact comparison with a shown column must look up."""
    text = text_of_shown(shown)
    return text if text == shown or arrow_text(text) == shown else None
