"""Java String.hashCode and RocketMQ's index hash: scalar and vectorized, exact for all of Unicode."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msgindex.storage.hash_index import java_hash
from msgindex.storage.hash_index.java_hash import (
    INT32_MIN,
    index_hash,
    index_hashes,
    java_string_hash,
    java_string_hashes,
    slot_of,
)

# Strings whose hashCode is Integer.MIN_VALUE (FACTS.md): Math.abs leaves them negative.
MIN_VALUE_STRINGS = ["polygenelubricants", "GydZG_", "DESIGNING WORKHOUSES"]

# Any str Python can hold, lone surrogates and astral characters included.
any_text = st.lists(
    st.one_of(
        st.characters(),
        st.integers(0xD800, 0xDFFF).map(chr),
        st.sampled_from(["\U0001F600", "\U0001D11E", "\U0010FFFF", "é", "中"]),
    ),
    max_size=40,
).map("".join)


def reference_hash(text: str) -> int:
    """The JLS definition, written out: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units."""
    raw = text.encode("utf-16-be", "surrogatepass")
    units = [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]
    h = 0
    for unit in units:
        h = (31 * h + unit) % 2**32
    return h - 2**32 if h >= 2**31 else h


def test_known_java_values() -> None:
    # Values printed by the JVM ("".hashCode() etc.).
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("TopicTest#OrderID188") == reference_hash("TopicTest#OrderID188")


@pytest.mark.parametrize("text", MIN_VALUE_STRINGS)
def test_integer_min_value_strings_hash_to_zero(text: str) -> None:
    assert java_string_hash(text) == INT32_MIN
    assert index_hash(text) == 0
    assert slot_of(index_hash(text), 5_000_000) == slot_of(index_hash(""), 5_000_000) == 0
    assert java_string_hashes([text]).tolist() == [INT32_MIN]
    assert index_hashes([text]).tolist() == [0]


def test_astral_and_lone_surrogates_count_as_utf16_units() -> None:
    # U+1F600 is the pair D83D DE00 in Java: hash = 0xD83D * 31 + 0xDE00.
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00
    assert java_string_hash("\ud83d\ude00") == java_string_hash("\U0001F600")
    assert java_string_hash("\udc80") == 0xDC80
    assert java_string_hash("x\ud800") == ord("x") * 31 + 0xD800


@settings(max_examples=300, deadline=None)
@given(any_text)
def test_scalar_matches_the_definition(text: str) -> None:
    assert java_string_hash(text) == reference_hash(text)
    expected = reference_hash(text)
    assert index_hash(text) == (0 if expected == INT32_MIN else abs(expected))


@settings(max_examples=150, deadline=None)
@given(st.lists(any_text, max_size=30))
def test_vectorized_matches_scalar(keys: list[str]) -> None:
    expected = [java_string_hash(k) for k in keys]
    assert java_string_hashes(keys).tolist() == expected
    assert index_hashes(keys).tolist() == [index_hash(k) for k in keys]
    assert java_string_hashes(np.array(keys, dtype=object)).tolist() == expected
    if all(not any(0xD800 <= ord(c) <= 0xDFFF for c in k) for k in keys):  # Arrow needs valid UTF-8
        assert java_string_hashes(pa.array(keys, pa.string())).tolist() == expected
        assert java_string_hashes(pa.array(keys, pa.large_string())).tolist() == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abcXYZ#09_", max_size=25), min_size=1, max_size=40), st.integers(0, 10))
def test_arrow_ascii_fast_path_on_sliced_and_chunked_arrays(keys: list[str], cut: int) -> None:
    array = pa.array(keys)
    tail = array.slice(min(cut, len(keys)))
    assert java_string_hashes(tail).tolist() == [java_string_hash(k) for k in keys[min(cut, len(keys)):]]
    chunked = pa.chunked_array([array, array.slice(0, min(cut, len(keys)))])
    assert java_string_hashes(chunked).tolist() == [java_string_hash(k) for k in keys + keys[: min(cut, len(keys))]]


def test_chunk_boundaries_and_keys_longer_than_a_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(java_hash, "_CHUNK_UNITS", 7)
    keys = ["", "abc", "x" * 20, "é\U0001F600" * 5, "", "hello world", "\udc80" * 9, "q"]
    assert java_string_hashes(keys).tolist() == [reference_hash(k) for k in keys]


def test_keys_containing_nul_take_the_packed_path() -> None:
    keys = ["a\x00b", "\x00", "", "x\x00\U0001F600", "plain"]
    assert java_string_hashes(keys).tolist() == [reference_hash(k) for k in keys]


def test_one_mebibyte_key() -> None:
    key = "topic#" + "\u00e9k\U0001F600" * (1 << 18)
    expected = reference_hash(key)
    assert java_string_hash(key) == expected
    assert java_string_hashes([key, "a", key]).tolist() == [expected, 97, expected]


def test_many_keys_vectorized() -> None:
    keys = [f"topic-{i % 7}#key-{i}" for i in range(20_000)]
    assert java_string_hashes(keys).tolist() == [java_string_hash(k) for k in keys]


def test_rejects_non_strings_naming_the_position() -> None:
    with pytest.raises(TypeError, match="key #1 is bytes"):
        java_string_hashes(["a", b"b"])
    with pytest.raises(TypeError, match="null"):
        java_string_hashes(pa.array(["a", None]))


# Around the scalar path's limits: its base-31 numerals (one digit per UTF-16 unit), the numpy
# path past _SHORT_KEY_UNITS units, and the byte values whose high base-31 digit is largest.
edge_text = st.lists(
    st.sampled_from(["\x00", "\x1e", "\x1f", "\xff", "\u0100", "\uffff", "\ud800", "\udfff", "\U0001F600", "a", "#"]),
    min_size=java_hash._SHORT_KEY_UNITS - 3,
    max_size=java_hash._SHORT_KEY_UNITS + 3,
).map("".join)


@settings(max_examples=80, deadline=None)
@given(st.one_of(edge_text, edge_text.map(lambda t: t.encode("latin-1", "replace").decode("ascii", "replace"))))
def test_scalar_matches_the_definition_at_the_length_limits(text: str) -> None:
    assert java_string_hash(text) == reference_hash(text)


def test_scalar_path_is_safe_under_the_lowest_int_digit_limit() -> None:
    # int() refuses numerals longer than sys.get_int_max_str_digits(); 640 is the lowest setting
    import sys

    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        for key in ["x" * java_hash._SHORT_KEY_UNITS, "\U0001F600" * (java_hash._SHORT_KEY_UNITS // 2), "é" * 300]:
            assert java_string_hash(key) == reference_hash(key)
    finally:
        sys.set_int_max_str_digits(old)


def test_threads_hashing_while_the_power_tables_grow(monkeypatch: pytest.MonkeyPatch) -> None:
    """The power tables are shared by the process and grown on demand: threads hashing at once
    (an object store's shards are looked up, and its chunks verified, in parallel) must each get
    whole tables, never one being filled or a pair of different sizes."""
    from concurrent.futures import ThreadPoolExecutor

    keys = [[f"t#{'k' * (5 + 97 * n + m)}" for m in range(20)] for n in range(12)]
    wanted = [[java_hash.index_hash(k) for k in group] for group in keys]
    for _ in range(30):
        monkeypatch.setattr(java_hash, "_tables", (np.ones(1, np.uint32), np.ones(1, np.uint32)))
        with ThreadPoolExecutor(len(keys)) as pool:
            got = list(pool.map(lambda group: java_hash.index_hashes(group).tolist(), keys))
        assert got == wanted
