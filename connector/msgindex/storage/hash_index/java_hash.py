"""Java's ``String.hashCode`` and RocketMQ's index hash, exact for all of Unicode, scalar and vectorized.

Java hashes a string's UTF-16 code units: ``h = 31 * h + unit`` with wrapping 32-bit arithmetic.
A Python ``str`` is a sequence of code points, so astral characters count as two units (a surrogate
pair) and lone surrogates count as one, exactly as Java sees them.

The vectorized form avoids a per-key Python loop. Because 31 is odd it is invertible modulo 2**32,
so over one flat buffer of units ``u``::

    G(p) = sum_{j < p} u[j] * 31**-j            (a running sum, numpy ``cumsum``)
    hash(u[a:b]) = 31**(b-1) * (G(b) - G(a))     (mod 2**32)

which turns millions of Horner recurrences into a handful of whole-array operations.

The scalar form (one key per call: lookups) avoids a per-unit Python loop another way. A byte
``b`` is ``31 * (b // 31) + b % 31``, two base-31 digits (``b // 31 <= 8``), so over a key's bytes::

    sum_i b[i] * 31**(n-1-i) = int(low digits, 31) + 31 * int(high digits, 31)

(exact, not wrapped), where each digit string is one ``bytes.translate`` of the key: two C-level
passes and two C-level parses instead of one Python multiplication per unit (3-4x faster on
typical keys). A UTF-16 unit is ``256 * high byte + low byte``, so non-ASCII keys take four
parses over the two byte planes of their UTF-16 encoding.
"""

from __future__ import annotations

import sys
import threading
from array import array
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa

from msgindex.errors import InvalidKeyError
from msgindex.storage.int_limits import INT32_MIN

_MASK32 = (1 << 32) - 1
_MULTIPLIER = 31
_MULTIPLIER_INVERSE = pow(_MULTIPLIER, -1, 1 << 32)
_UTF16 = "utf-16-le"
# Lone surrogates are legal in a Java String and in msgindex keys (see message.decode_key_bytes).
_UTF16_ERRORS = "surrogatepass"
# Units hashed per vectorized chunk: small enough that the uint32 temporaries stay in L2 cache
# (measured ~20% faster than 4M-unit chunks), large enough that per-chunk overhead is noise.
_CHUNK_UNITS = 1 << 18
# Keys of a Python list hashed per block (see java_string_hashes).
_BLOCK_KEYS = 1 << 14

# Keys up to this many units are hashed without numpy (its per-call overhead dominates there).
# int() refuses numerals longer than sys.get_int_max_str_digits() (at least 640, default 4300)
# in non-power-of-two bases, and its cost grows quadratically: keep well below both.
_SHORT_KEY_UNITS = 256
# Base-31 digit of each byte value (low: b % 31) and of its quotient (high: b // 31 <= 8).
_BASE31_DIGITS = b"0123456789abcdefghijklmnopqrstu"
_LOW_DIGIT = bytes(_BASE31_DIGITS[b % _MULTIPLIER] for b in range(256))
_HIGH_DIGIT = bytes(_BASE31_DIGITS[b // _MULTIPLIER] for b in range(256))
_UTF16_BE = "utf-16-be"
_SIGN_BIT = 1 << 31

# (31**k, 31**-k mod 2**32) for k < size, shared by the process's threads: replaced whole, by a
# pair computed before it is published, so a thread never reads a table being filled.
_tables: tuple[np.ndarray, np.ndarray] = (np.ones(1, dtype=np.uint32), np.ones(1, dtype=np.uint32))
_tables_growing = threading.Lock()


def utf16_units(text: str) -> np.ndarray:
    """The UTF-16 code units Java stores for `text` (uint16, native order)."""
    return np.frombuffer(text.encode(_UTF16, _UTF16_ERRORS), dtype="<u2")


def java_string_hash(text: str) -> int:
    """``text.hashCode()`` as Java computes it: a signed 32-bit int."""
    value = _unsigned_hash(text)
    return value - (1 << 32) if value >= _SIGN_BIT else value


def _unsigned_hash(text: str) -> int:
    """``hashCode()`` as an unsigned 32-bit value (the bits Java's int holds)."""
    if text.__class__ is str and 0 < len(text) <= _SHORT_KEY_UNITS and text.isascii():
        # the hot path of every lookup: _byte_polynomial inlined (one byte per unit)
        data = text.encode()
        return (int(data.translate(_LOW_DIGIT), _MULTIPLIER)
                + _MULTIPLIER * int(data.translate(_HIGH_DIGIT), _MULTIPLIER)) & _MASK32
    if not isinstance(text, str):
        raise InvalidKeyError(f"index keys are str, not {type(text).__name__}: {text!r:.80}")
    if not text:
        return 0
    if len(text) <= _SHORT_KEY_UNITS and not text.isascii():
        units = text.encode(_UTF16_BE, _UTF16_ERRORS)
        if len(units) <= 2 * _SHORT_KEY_UNITS:  # astral characters take two units
            return ((_byte_polynomial(units[0::2]) << 8) + _byte_polynomial(units[1::2])) & _MASK32
    units = text.encode("ascii") if text.isascii() else _unit_array(text)
    powers, _ = _power_tables(len(units))
    # The same sum in numpy, every product and the sum wrapping in uint32 like Java's int.
    as_numpy = np.frombuffer(units, np.uint8 if isinstance(units, bytes) else np.uint16)
    return int(np.sum(np.multiply(as_numpy, powers[len(units) - 1 :: -1], dtype=np.uint32), dtype=np.uint32))


def _byte_polynomial(data: bytes) -> int:
    """``sum(data[i] * 31**(len(data)-1-i))`` exactly, for non-empty `data` (module docstring)."""
    return int(data.translate(_LOW_DIGIT), _MULTIPLIER) + _MULTIPLIER * int(data.translate(_HIGH_DIGIT), _MULTIPLIER)


def _unit_array(text: str) -> array:
    units = array("H", text.encode(_UTF16, _UTF16_ERRORS))
    if sys.byteorder == "big":
        units.byteswap()
    return units


def index_hash_from_java_hash(java_hash: int) -> int:
    """RocketMQ's ``indexKeyHashMethod`` applied to a ``String.hashCode``: ``Math.abs``, whose
    result for Integer.MIN_VALUE is itself (negative), which RocketMQ then maps to 0."""
    return 0 if java_hash == INT32_MIN else abs(java_hash)


def index_hash(key: str) -> int:
    """RocketMQ's index hash of `key` (a full ``topic#key`` string): in [0, 2**31 - 1]."""
    value = _unsigned_hash(key)
    if value < _SIGN_BIT:
        return value
    # a negative int: Math.abs is 2**32 - value, except for Integer.MIN_VALUE (mapped to 0)
    return (1 << 32) - value if value != _SIGN_BIT else 0


def slot_of(key_hash: int, hash_slot_num: int) -> int:
    """The hash slot RocketMQ files `key_hash` under."""
    return key_hash % hash_slot_num


def java_string_hashes(keys: Sequence[str] | pa.Array | pa.ChunkedArray | np.ndarray) -> np.ndarray:
    """``hashCode()`` of every key, vectorized: int32 array. Keys must not be null/None."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        ascii_units = _arrow_ascii_units(keys)
        if ascii_units is not None:
            return _hash_flat(*ascii_units).view(np.int32)
        keys = keys.to_pylist()
    keys = _as_str_list(keys)
    out = np.empty(len(keys), dtype=np.uint32)
    # Block by block: the joined text and its units stay small and cache-resident instead of
    # several fresh arrays the size of all keys (whose page faults cost more than the hashing).
    for first in range(0, len(keys), _BLOCK_KEYS):
        block = keys[first : first + _BLOCK_KEYS]
        separated = _separated_units(block)
        if separated is None:
            separated = _packed_units(block)
        out[first : first + len(block)] = _hash_flat(*separated)
    return out.view(np.int32)


def index_hashes(keys: Sequence[str] | pa.Array | pa.ChunkedArray | np.ndarray) -> np.ndarray:
    """RocketMQ's index hash of every key, vectorized: int32 array with values in [0, 2**31 - 1]."""
    return index_hashes_from_java_hashes(java_string_hashes(keys))


def index_hashes_from_java_hashes(java_hashes: np.ndarray) -> np.ndarray:
    """Vectorized ``index_hash_from_java_hash`` (int32 in, int32 out)."""
    h = np.asarray(java_hashes, dtype=np.int32)
    # np.abs wraps INT32_MIN to itself, exactly like Math.abs; RocketMQ then maps negatives to 0.
    out = np.abs(h)
    out[out < 0] = 0
    return out


def byte_string_hashes(values: pa.Array) -> np.ndarray:
    """``String.hashCode``'s polynomial over each binary (or string) value's *bytes*, vectorized:
    uint32 (Java's hash for ASCII values; a null value hashes as empty). A cheap way to group
    byte strings: equal values hash equal."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if not len(values):
        return np.zeros(0, dtype=np.uint32)
    data, offsets = _bytes_and_offsets(values)
    return _hash_flat(data, offsets[:-1], np.diff(offsets))


def _bytes_and_offsets(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Zero-copy bytes (uint8) and int64 offsets (one more than values) of a non-empty Arrow
    binary or string array."""
    wide = pa.types.is_large_binary(values.type) or pa.types.is_large_string(values.type)
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if wide else np.int32)[values.offset : values.offset + len(values) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return data, offsets.astype(np.int64)


def _power_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    """31**k and 31**-k (mod 2**32) for k < n, cached and grown on demand."""
    global _tables
    tables = _tables
    if tables[0].size >= n:
        return tables
    with _tables_growing:
        if _tables[0].size < n:
            size = max(n, 2 * _tables[0].size)
            powers = np.full(size, _MULTIPLIER, dtype=np.uint32)
            powers[0] = 1
            np.cumprod(powers, dtype=np.uint32, out=powers)
            inverse = np.full(size, _MULTIPLIER_INVERSE, dtype=np.uint32)
            inverse[0] = 1
            np.cumprod(inverse, dtype=np.uint32, out=inverse)
            _tables = (powers, inverse)
        return _tables


def _hash_flat(units: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """uint32 hashes of the keys at increasing, non-overlapping [start, start + length) ranges of
    the flat buffer `units`; units between keys (separators) must be 0 so that they add nothing."""
    n_keys = lengths.size
    out = np.zeros(n_keys, dtype=np.uint32)
    ends = starts + lengths
    first = 0
    while first < n_keys:
        # Whole keys per chunk (a single key longer than the chunk gets a chunk of its own).
        last = max(first + 1, int(np.searchsorted(ends, starts[first] + _CHUNK_UNITS, side="right")))
        base = int(starts[first])
        out[first:last] = _hash_chunk(units[base : int(ends[last - 1])], starts[first:last] - base,
                                      lengths[first:last])
        first = last
    return out


def _hash_chunk(units: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    size = units.size
    powers, inverse = _power_tables(size + 1)
    weighted = np.empty(size + 1, dtype=np.uint32)
    np.multiply(units, inverse[:size], out=weighted[:size], dtype=np.uint32)
    # reduceat sums each [start_i, start_{i+1}) (the zero gap units add nothing); the extra zero
    # lets an empty last key start at `size`. reduceat gives the element at a repeated index
    # instead of an empty sum, hence the fix-up for empty keys.
    weighted[size] = 0
    sums = np.add.reduceat(weighted, starts, dtype=np.uint32)
    sums[lengths == 0] = 0
    # An empty key's sum is 0, so clamping its exponent to 0 changes nothing.
    return sums * powers[np.maximum(starts + lengths - 1, 0)]


def _as_str_list(keys: Iterable[str] | np.ndarray) -> list[str]:
    if isinstance(keys, np.ndarray):
        return keys.tolist()
    return keys if isinstance(keys, list) else list(keys)


def _join(separator: str, keys: list[str]) -> str:
    try:
        return separator.join(keys)
    except TypeError:
        position, bad = next((i, k) for i, k in enumerate(keys) if not isinstance(k, str))
        raise InvalidKeyError(f"key #{position} is {type(bad).__name__}, not str: {bad!r:.80}") from None


def _encode_units(text: str) -> np.ndarray:
    if text.isascii():  # one byte per char is one UTF-16 unit per char: no need to widen
        return np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    return np.frombuffer(text.encode(_UTF16, _UTF16_ERRORS), dtype="<u2")


def _separated_units(keys: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The keys joined by NUL as units, with each key's start and length found by numpy from the
    NUL positions (no per-key Python work). None when a key itself contains NUL."""
    units = _encode_units(_join("\0", keys))
    separators = np.flatnonzero(units == 0)
    if separators.size != max(len(keys) - 1, 0):
        return None
    starts = np.empty(len(keys), dtype=np.int64)
    starts[:1] = 0
    starts[1:] = separators + 1
    ends = np.append(separators, units.size)
    return units, starts, ends - starts


def _packed_units(keys: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The keys' units back to back, with starts and lengths measured per key (keys may hold NUL)."""
    lengths = np.fromiter((len(k.encode(_UTF16, _UTF16_ERRORS)) >> 1 for k in keys), dtype=np.int64,
                          count=len(keys))
    return _encode_units(_join("", keys)), np.cumsum(lengths) - lengths, lengths


def _arrow_ascii_units(keys: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Zero-copy units, starts and lengths of an all-ASCII Arrow string array (its UTF-8 bytes
    are then the UTF-16 units); None for other arrays."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    if keys.null_count:
        raise InvalidKeyError(f"keys contain {keys.null_count} null value(s); every key must be a string")
    if not (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)) or len(keys) == 0:
        return None
    data, offsets = _bytes_and_offsets(keys)
    if offsets[-1] > offsets[0] and data[offsets[0] : offsets[-1]].max() >= 0x80:
        return None
    return data, offsets[:-1], np.diff(offsets)
