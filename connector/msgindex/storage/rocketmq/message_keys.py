"""Which keys a RocketMQ message is found under: the one place this rule lives in msgindex.

RocketMQ's IndexService indexes a message under its ``UNIQ_KEY`` property and under every
non-empty token of its ``KEYS`` property split on U+0020 (``String.split(" ")``: tabs, U+3000 and
every other character belong to the key). A key may repeat within one message; the broker then
writes one index entry per repetition. Both properties may be absent.

Kafka records carry the same two names as headers (see ``msgindex.kafka.admin``); their path can
call ``message_keys`` with the record key as ``primary_key``.
"""

from __future__ import annotations

from collections.abc import Iterable

KEYS_PROPERTY = "KEYS"
UNIQ_KEY_PROPERTY = "UNIQ_KEY"
TAGS_PROPERTY = "TAGS"
KEYS_SEPARATOR = " "  # MessageConst.KEY_SEPARATOR, between the tokens of the KEYS property: U+0020 only


def keys_tokens(keys_value: str | None) -> list[str]:
    """The tokens of one ``KEYS`` value the broker puts into its index, in order, repetitions
    kept (each is an index entry); empty tokens (from leading, trailing or doubled spaces) dropped."""
    if not keys_value:
        return []
    return [token for token in keys_value.split(KEYS_SEPARATOR) if token]


def message_keys(primary_key: str | None = None, keys_values: Iterable[str | None] = (),
                 uniq_keys: Iterable[str | None] = ()) -> tuple[str, ...]:
    """Every distinct key a message is found under, in a stable order: its own primary key (a
    Kafka record key; RocketMQ messages have none), then the tokens of each ``KEYS`` value, then
    each non-empty ``UNIQ_KEY``."""
    found: dict[str, None] = {}
    if primary_key:
        found[primary_key] = None
    for value in keys_values:
        for token in keys_tokens(value):
            found[token] = None
    for uniq in uniq_keys:
        if uniq:
            found[uniq] = None
    return tuple(found)
