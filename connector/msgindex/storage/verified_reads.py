"""Hash candidates verified against the log: the heart of every lookup, whatever holds the shard.

A hash index (RocketMQ IndexFiles in a local shard, hash sections of chunk objects in an
object-store shard) only says "a key of this hash may be at record seq s". Verification reads
those records from the metadata log and keeps the ones that really are in the topic, carry the
key and lie in the millisecond window: hash collisions and RocketMQ's second-granularity times end
here, and a committed entry pointing at a record that carries no key of its hash is damage, an
error naming the file (never a silently missed message).

``VerifiedReads`` is that step for any reader that has a ``LogReads`` (``_log``), a ``broker`` and
a way to name the index file behind an entry (``_file_pointing_at``): ``shard.ShardReader`` and
``objects.shard.ObjectShardReader``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import CorruptFileError
from msgindex.storage.fields import FieldCoverage
from msgindex.storage.hash_index.java_hash import index_hash, index_hashes
from msgindex.storage.log import batch_format as bf
from msgindex.storage.log.metadata_log import LogReads
from msgindex.storage.message import (
    MAX_TIMESTAMP_MS,
    MIN_TIMESTAMP_MS,
    NO_VALUE,
    MessageRecord,
    arrow_text,
    decode_text,
    encode_text,
    field_hash_string,
    field_term,
    index_keys,
    shown_timestamp,
    term_hash_string,
)
from msgindex.storage.query import ROW_SCHEMA, Query, empty_rows, rows_from_records, rows_table
from msgindex.storage.result_order import OrderColumns, Part, result_order, topic_ranks
from msgindex.storage.sorted_runs import run_starts

try:  # compiled where it was built (setup.py); _plain_few, its oracle, answers without it
    from msgindex.storage import _result_rows as compiled_rows
except ImportError:
    compiled_rows = None

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_SHOWN_TOPICS: dict[bytes, bytes] = {}  # a topic as the log stores it -> as results show it (UTF-8)
_SHOWN_TOPICS_KEPT = 4096


def _shown_topic(topic: bytes) -> bytes:
    """`topic` (encode_text bytes) as results show it, UTF-8 encoded: remembered per process, since a
    segment's lookups name the same few topics every time (a store of thousands starts anew)."""
    shown = _SHOWN_TOPICS.get(topic)
    if shown is None:
        if len(_SHOWN_TOPICS) >= _SHOWN_TOPICS_KEPT:
            _SHOWN_TOPICS.clear()
        shown = _SHOWN_TOPICS[topic] = arrow_text(decode_text(topic)).encode("utf-8")
    return shown


_TOPIC_TABLES: dict[tuple[bytes, ...], tuple[dict[bytes, int], np.ndarray, bytes]] = {}


def _topic_table(topics: tuple[bytes, ...]) -> tuple[dict[bytes, int], np.ndarray, bytes]:
    """({topic: its number}, the ends of each topic as results show it (``_shown_topic``) and
    those shown topics back to back) of a log's table of `topics`: what ``_result_rows`` takes,
    remembered per process like the shown topics (a lookup's records name the same few tables)."""
    table = _TOPIC_TABLES.get(topics)
    if table is None:
        if len(_TOPIC_TABLES) >= _SHOWN_TOPICS_KEPT:
            _TOPIC_TABLES.clear()
        shown = [_shown_topic(topic) for topic in topics]
        table = _TOPIC_TABLES[topics] = ({topic: number for number, topic in enumerate(topics)},
                                          np.array(list(accumulate(map(len, shown))), np.int64), b"".join(shown))
    return table


class RecordPairs(NamedTuple):
    """A lookup's candidates grouped by record (``pairs_by_record``): the distinct records'
    seqs, ascending, and the numbers of the wanted pairs whose entries point at each, ascending,
    back to back: record i's end at ends[i], where record i + 1's begin (record 0's at 0). int64
    arrays."""

    seqs: np.ndarray
    ends: np.ndarray
    numbers: np.ndarray

    def as_dict(self) -> dict[int, list[int]]:
        """{seq: its pairs' numbers}."""
        numbers, starts = self.numbers.tolist(), [0, *self.ends.tolist()]
        return {seq: numbers[starts[i] : starts[i + 1]] for i, seq in enumerate(self.seqs.tolist())}


# Candidates from which numpy groups them by record: below, a Python dict costs less than
# numpy's calls (~15 us), above less than Python's steps (~0.8 us a candidate).
_VECTOR_PAIRS = 24


def pairs_by_record(seqs: np.ndarray, who: np.ndarray) -> tuple[RecordPairs, np.ndarray, np.ndarray]:
    """The candidates (entry targets `seqs`, wanted pair numbers `who`) grouped by record, each
    (record, pair) once, and the repeats of a (record, pair) beyond its first: (seqs, numbers) of
    each repeat, for ``_check_repeated_entries`` (a record found twice under one pair is damage
    unless it carries as many keys of that hash). ``pairs_by_record_scalar`` is its oracle."""
    if len(seqs) < _VECTOR_PAIRS:
        return pairs_by_record_scalar(seqs, who)
    seqs, who = np.asarray(seqs, dtype=np.int64), np.asarray(who, dtype=np.int64)
    order = np.lexsort((who, seqs))
    seqs, who = seqs[order], who[order]
    repeat = np.zeros(len(seqs), dtype=bool)
    np.logical_and(seqs[1:] == seqs[:-1], who[1:] == who[:-1], out=repeat[1:])
    repeated_seqs, repeated_numbers = seqs[repeat], who[repeat]
    if len(repeated_seqs):
        seqs, who = seqs[~repeat], who[~repeat]
    firsts = np.flatnonzero(run_starts(seqs))
    ends = np.empty(len(firsts), dtype=np.int64)
    ends[:-1], ends[-1:] = firsts[1:], len(seqs)
    return RecordPairs(seqs[firsts], ends, who), repeated_seqs, repeated_numbers


def pairs_by_record_scalar(seqs: np.ndarray | Sequence[int], who: np.ndarray | Sequence[int]
                           ) -> tuple[RecordPairs, np.ndarray, np.ndarray]:
    """``pairs_by_record`` a candidate at a time, in Python (its oracle; what answers a few)."""
    pairs: dict[int, list[int]] = {}
    repeated = []
    for seq, key_number in zip(np.asarray(seqs).tolist(), np.asarray(who).tolist()):
        numbers = pairs.setdefault(seq, [])
        if key_number in numbers:
            repeated.append((seq, key_number))
        else:
            numbers.append(key_number)
    records = sorted(pairs)
    numbers = [number for seq in records for number in sorted(pairs[seq])]
    return (RecordPairs(np.array(records, dtype=np.int64), np.array(list(accumulate(len(pairs[seq]) for seq in records)),
                                                                    dtype=np.int64), np.array(numbers, dtype=np.int64)),
            np.array([seq for seq, _ in repeated], dtype=np.int64), np.array([k for _, k in repeated], dtype=np.int64))


@dataclass(frozen=True)
class WantedKeys:
    """The (topic, term) pairs of a lookup: their RocketMQ hashes, and their texts as given and as
    the log stores them (encode_text bytes of a key, ``message.field_term`` of a field value), in
    one order. A term is a key (str) or a field's (name, value): each topic's keys come first."""

    hashes: np.ndarray
    texts: tuple[tuple[str, str | tuple[str, str]], ...]
    topics: tuple[bytes, ...]  # each topic once, in pair order: pair p's topic is topics[p // keys_per_topic]
    keys_per_topic: int  # terms per topic, keys and field values
    given_keys: tuple[str, ...]
    given_fields: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, topics: Sequence[str], keys: Sequence[str], fields: Sequence[tuple[str, str]] = ()) -> WantedKeys:
        terms = (*keys, *fields)
        pairs = tuple((t, term) for t in topics for term in terms)
        strings = [text for t in topics for text in
                   (*index_keys(t, keys), *(field_hash_string(t, name, value) for name, value in fields))]
        return cls(_hashes(strings), pairs, tuple(encode_text(t) for t in topics), len(terms), tuple(keys),
                   tuple(fields))

    # The terms as the log stores them are made when first asked, not with the hashes: a lookup of
    # a few candidates compares them in C from `term_bytes`, and only the hot-key copies and the
    # vectorized verification take Arrow's `keys` (its two Arrow calls were ~10% of a one-key
    # lookup, more with the caches cold).
    @cached_property
    def term_bytes(self) -> tuple[bytes, ...]:
        """Each term (keys, then field values) as the log stores it (encode_text bytes, or a
        field's ``field_term``): pair p's is term_bytes[p % keys_per_topic]."""
        return (*(encode_text(key) for key in self.given_keys), *(field_term(*f) for f in self.given_fields))

    @cached_property
    def keys(self) -> pa.Array:
        """Each pair's term as the log stores it, in pair order (large_binary)."""
        if len(self.given_keys) <= SCALAR_MAX_KEYS:
            encoded = pa.array(self.term_bytes, bf.TEXT)
        else:
            encoded = _encoded(self.given_keys)
            if self.given_fields:
                encoded = pa.concat_arrays([encoded, pa.array([field_term(*f) for f in self.given_fields], bf.TEXT)])
        return pa.concat_arrays([encoded] * len(self.topics)) if self.topics else encoded.slice(0, 0)

    def carried_by(self, pair: int, record: MessageRecord) -> bool:
        """Whether `record` is in pair `pair`'s topic and carries its key or field value."""
        topic, term = self.texts[pair]
        return record.topic == topic and (term in record.fields if isinstance(term, tuple) else term in record.keys)

    def topic_numbers(self, numbers: dict[bytes, int]) -> np.ndarray:
        """Each wanted topic as its number in `numbers` (-1: not there)."""
        return np.array([numbers.get(t, -1) for t in self.topics], dtype=np.int64)

    def pair_topics(self, numbers: dict[bytes, int]) -> np.ndarray:
        """Each pair's topic as its number in `numbers` (-1: not there)."""
        return np.repeat(self.topic_numbers(numbers), self.keys_per_topic)


# Up to this many keys are encoded and hashed one by one: Arrow and numpy set-up costs more.
SCALAR_MAX_KEYS = 16


def _encoded(keys: Sequence[str]) -> pa.Array:
    """``encode_text`` of each of many keys as bf.TEXT: Arrow's UTF-8 where every key is valid
    UTF-8 (the same bytes, without a Python call per key: a bulk lookup asks 50,000 at once)."""
    try:
        return pa.array(keys, pa.large_string()).cast(bf.TEXT)
    except (pa.ArrowException, UnicodeError):  # a lone surrogate: encode_text passes it through
        return pa.array([encode_text(k) for k in keys], bf.TEXT)


def _hashes(keys: list[str]) -> np.ndarray:
    if len(keys) <= SCALAR_MAX_KEYS:  # the vectorized hash's set-up costs more than a few scalar hashes
        return np.array([index_hash(key) for key in keys], dtype=np.int64)
    return index_hashes(keys)



class VerifiedReads(ABC):
    """Verification of hash candidates against ``_log`` (see the module docstring)."""

    broker: str
    _log: LogReads | None

    @property
    @abstractmethod
    def field_coverage(self) -> FieldCoverage:
        """The fields the shard indexes and what each covers (storage/fields.py)."""

    def _rendered_fields(self, query: Query) -> tuple[tuple[str, str, str], ...]:
        """The query's field columns as ``batch_format.field_columns`` takes them: (column, name
        as this shard indexed it, shape)."""
        coverage = self.field_coverage if query.field_columns else None
        return tuple((name, coverage.spelled(name), shape) for name, shape in query.field_columns)

    def _with_field_columns(self, table: pa.Table, query: Query) -> pa.Table:
        """`table` (rows this shard found, any order) with the query's field columns."""
        if not query.field_columns:
            return table
        fields = self._rendered_fields(query)
        if table.num_rows and self._log is not None:
            columns = self._log.field_columns(table["seq"].to_numpy(), fields)
        else:
            columns = [pa.nulls(table.num_rows, bf.FIELD_VALUE_TYPES[shape]) for _, _, shape in fields]
        return pa.Table.from_arrays([*table.columns, *columns], schema=bf.field_schema(fields))

    @abstractmethod
    def _file_pointing_at(self, key_hash: int, seq: int) -> Path | str:
        """The committed index file (or object) holding an entry of `key_hash` that points at
        `seq`, to name in an error."""

    def _check_unmatched(self, records: bf.SelectedRecords, rows: np.ndarray, key_numbers: np.ndarray,
                         hits: np.ndarray, wanted: WantedKeys) -> None:
        """``_check_entry_target`` for the candidate records in the window (their (row, wanted
        key) pairs: `rows`, `key_numbers`) with fewer matching pairs (`hits`, per row) than pairs:
        rare (hash collisions), so a record at a time."""
        short = np.bincount(rows, minlength=len(records)) > hits
        unmatched = short[rows]
        if not unmatched.any():
            return
        rows, key_numbers = rows[unmatched], key_numbers[unmatched]
        distinct = np.unique(rows)
        decoded = records.rows(distinct)
        terms_of, topics = decoded.keys.to_pylist(), decoded.topic.to_pylist()
        for at, record_row in enumerate(distinct.tolist()):
            hashes = [int(wanted.hashes[k]) for k in key_numbers[rows == record_row].tolist()]
            topic = decode_text(topics[at])
            self._check_entry_target(int(records.seqs[record_row]),
                                     {term_hash_string(topic, term) for term in terms_of[at]}, hashes)

    def _check_repeated_entries(self, seqs: np.ndarray, key_numbers: np.ndarray, wanted: WantedKeys) -> None:
        """Several committed entries of one keyHash that point at one record: the writer puts
        one entry per distinct key of a record, so that record must carry as many keys of that
        hash (in its topic; two keys whose hashes collide, rare). Fewer means an entry was moved
        there from the record it belongs to, which a lookup would then miss: an error naming the
        file, never a silently short answer. (`seqs`, `key_numbers`: each repeat beyond the first.)"""
        extra: dict[tuple[int, int], int] = {}  # (seq, keyHash): entries beyond the first
        for (seq, key_number), repeats in Counter(zip(seqs.tolist(), key_numbers.tolist())).items():
            # every wanted key of a hash sees every entry of that hash: count them once
            at = (seq, int(wanted.hashes[key_number]))
            extra[at] = max(extra.get(at, 0), repeats)
        seqs_read = sorted({seq for seq, _ in extra})
        records = dict(zip(seqs_read, self._log.read_few(seqs_read)))
        for (seq, key_hash), repeats in extra.items():
            record = records[seq]
            carried = sum(1 for string in record.index_strings() if index_hash(string) == key_hash)
            if carried < repeats + 1:
                raise CorruptFileError(
                    f"{self._file_pointing_at(key_hash, seq)}: {repeats + 1} committed hash entries of keyHash "
                    f"{key_hash} point at record seq {seq}, which carries {carried} key(s) of that hash: an entry was "
                    f"moved there from the record it indexes, so a lookup would miss that record; the file is damaged "
                    f"(`msgindex inspect` lists every bad entry)")

    def _check_entry_target(self, seq: int, index_strings: Iterable[str], entry_hashes: list[int]) -> None:
        """A committed entry of keyHash h points at record `seq` only if the writer indexed one
        of its keys or field values under h (its `index_strings`, ``MessageRecord.index_strings``).
        A candidate whose record carries no key of its entry's hash is a damaged entry, not a
        collision: an error naming the file, never a silently missed message (the record the
        entry should point at is not found)."""
        carried = {index_hash(string) for string in index_strings}
        for key_hash in entry_hashes:
            if key_hash in carried:
                continue
            raise CorruptFileError(
                f"{self._file_pointing_at(key_hash, seq)}: a committed hash entry of keyHash {key_hash} points at "
                f"record seq {seq}, which carries no key of that hash: the file is damaged (`msgindex inspect` lists "
                f"every bad entry)")

    def _verified_few(self, seqs: np.ndarray, who: np.ndarray, wanted: WantedKeys, begin_ms: int | None,
                      end_ms: int | None, partitions: Iterable[int] | None, max_results: int | None) -> pa.Table:
        """``_verified`` and ordering for a few candidates, record by record in Python: below
        FEW_CANDIDATES the numpy and Arrow kernels' per-call cost is most of a lookup."""
        if not len(seqs):  # an absent key: no record to read (the general path took ~30 us to say so)
            return empty_rows()
        grouped, repeated_seqs, repeated_numbers = pairs_by_record(seqs, who)
        if len(repeated_seqs):
            self._check_repeated_entries(repeated_seqs, repeated_numbers, wanted)
        wanted_partitions = None if partitions is None else set(partitions)
        packed = self._log.read_few_packed(grouped.seqs) if compiled_rows is not None else None
        if packed is not None:
            rows = self._compiled_few(grouped, packed, wanted, begin_ms, end_ms, wanted_partitions, max_results)
            if rows is not None:
                return rows
            raw = packed.raw()
        else:
            raw = self._log.read_few_raw(grouped.seqs.tolist())
        seqs_read, pairs = grouped.seqs.tolist(), grouped.as_dict()
        if raw.texts_are_keys and not raw.backslash:
            plain = self._plain_few(seqs_read, pairs, raw, wanted, begin_ms, end_ms, wanted_partitions, max_results)
            if plain is not None:
                return plain
        matched = []
        for seq, record in zip(seqs_read, raw.messages()):
            if (begin_ms is not None and record.timestamp_ms < begin_ms) or (
                    end_ms is not None and record.timestamp_ms > end_ms) or (
                    wanted_partitions is not None and record.partition not in wanted_partitions):
                continue
            # every pair is checked, as _verified's are: a record found under one wanted key may
            # also be the target of another key's moved entry (the record that entry belongs to
            # would then be missed silently)
            unmatched = [k for k in pairs[seq] if not wanted.carried_by(k, record)]
            if unmatched:  # a hash collision, or an entry that points at the wrong record
                self._check_entry_target(seq, record.index_strings(), [int(wanted.hashes[k]) for k in unmatched])
            if len(unmatched) < len(pairs[seq]):
                matched.append((seq, record))
        if not matched:
            return empty_rows()
        shown = {topic: arrow_text(topic).encode("utf-8") for topic in {record.topic for _, record in matched}}
        matched.sort(key=lambda m: (m[1].timestamp_ms, shown[m[1].topic], m[1].partition, m[1].offset, m[0]))
        matched = matched[:max_results] if max_results is not None else matched
        return rows_from_records(self.broker, [seq for seq, _ in matched], [record for _, record in matched])

    def _compiled_few(self, grouped: RecordPairs, packed: bf.PackedRecords, wanted: WantedKeys, begin_ms: int | None,
                      end_ms: int | None, wanted_partitions: set[int] | None, max_results: int | None) -> pa.Table | None:
        """``_plain_few``'s answer from `packed`, the records of `grouped`, verified, ordered and
        built in C (``_result_rows.plain_rows``, one pyarrow import): None wherever _plain_few
        would not answer."""
        if wanted.given_fields:  # a field value's term: never among keys
            return None
        topic_numbers, shown_ends, shown = _topic_table(packed.topics)
        term_bytes = wanted.term_bytes
        # (values past int64 select what none past it would: no limit, no partition)
        limit = -1 if max_results is None or max_results > _INT64_MAX else max_results
        answer = compiled_rows.plain_rows(
            packed.ints, packed.text_counts, packed.heap, packed.text_lengths, grouped.seqs, packed.topic_ids,
            grouped.ends, grouped.numbers, wanted.topic_numbers(topic_numbers),
            np.array(list(accumulate(map(len, term_bytes))), np.int64), b"".join(term_bytes), shown_ends, shown,
            arrow_text(self.broker).encode("utf-8"),
            (_INT64_MIN if begin_ms is None else begin_ms, _INT64_MAX if end_ms is None else end_ms),
            None if wanted_partitions is None else
            np.array(sorted(p for p in wanted_partitions if _INT64_MIN <= p <= _INT64_MAX), dtype=np.int64),
            limit, (MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS), NO_VALUE)
        if answer is None:
            return None
        capsule, address, rows = answer
        if not rows:
            return empty_rows()
        batch = pa.RecordBatch._import_from_c(address, ROW_SCHEMA)  # (the Arrow C Data Interface)
        del capsule  # (frees what the import did not take: nothing, once it succeeded)
        return pa.Table.from_batches([batch], schema=ROW_SCHEMA)

    def _plain_few(self, seqs: list[int], pairs: dict[int, list[int]], raw: bf.RawRecords, wanted: WantedKeys,
                   begin_ms: int | None, end_ms: int | None, wanted_partitions: set[int] | None,
                   max_results: int | None) -> pa.Table | None:
        """``_verified_few``'s answer from `raw`, the records at `seqs`, whose texts are keys shown
        as they are (ASCII, no backslash): no MessageRecord and no ``arrow_text`` per record (a
        third of what a lookup of a hundred records spent per record). None as soon as a record in
        the window does not carry a pair's key in its topic (a hash collision, or damage): the
        general path answers then, and checks it. The oracle of ``_compiled_few``, and what
        answers where the compiled modules are not (an executor's zip, an object store's log)."""
        topic_of_pair = [wanted.topics[pair // wanted.keys_per_topic] for pair in range(len(wanted.texts))]
        term_of_pair = [term for _, term in wanted.texts]  # (a field's is a tuple: never among keys)
        shown_topics: dict[bytes, tuple[bytes, str]] = {}  # (as results order it, as they show it)
        matched = []
        for seq, (flags, topic, partition, offset, timestamp_ms, commit_log_offset, size), texts, table in zip(
                seqs, raw.ints, raw.texts, raw.topic_tables):
            if (begin_ms is not None and timestamp_ms < begin_ms) or (end_ms is not None and timestamp_ms > end_ms) or (
                    wanted_partitions is not None and partition not in wanted_partitions):
                continue
            topic_text = table[topic]
            has_key = flags & bf.FLAG_KEY
            keys = texts[1:] if has_key and not flags & bf.FLAG_LEAD else texts
            for pair in pairs[seq]:
                if topic_of_pair[pair] != topic_text or term_of_pair[pair] not in keys:
                    return None
            shown = shown_topics.get(topic_text)
            if shown is None:
                name = arrow_text(decode_text(topic_text))
                shown = shown_topics[topic_text] = (name.encode("utf-8"), name)
            matched.append((timestamp_ms, shown[0], partition, offset, seq, shown[1], texts[0] if has_key else None, keys,
                            commit_log_offset, size))
        if not matched:
            return empty_rows()
        matched.sort()  # RESULT_ORDER: timestamp, topic as shown, partition, offset, seq
        shown_broker = arrow_text(self.broker)
        return rows_table([(shown_broker, topic, partition, offset, key, keys, shown_timestamp(timestamp_ms) * 1000,
                            None if commit_log_offset == NO_VALUE else commit_log_offset,
                            None if size == NO_VALUE else size, seq)
                           for timestamp_ms, _, partition, offset, seq, topic, key, keys, commit_log_offset, size
                           in matched[:max_results]])

    def _verified(self, seqs: np.ndarray, who: np.ndarray, wanted: WantedKeys, begin_ms: int | None,
                  end_ms: int | None, partitions: Iterable[int] | None) -> list[Part]:
        """The log records of the candidates that really are in the topic, carry the key and lie
        in the window, in seq order, rendered: hash collisions and second-granularity times end
        here. Each touched block is read once; the checks are numpy/Arrow kernels over a chunk of
        blocks' candidates at once, run by the log's reading threads (``MetadataLog.chunks``)."""
        if not len(seqs):
            return []
        # the (candidate, wanted key) pairs by seq, sorted as one int64 (each key's candidates
        # come in long runs: timsort merges them); `record` numbers the distinct seqs
        keys = len(wanted.hashes)
        if int(seqs.max()) < np.iinfo(np.int64).max // keys:
            pairs = seqs * keys + who
            pairs.sort(kind="stable")
            seqs, who = np.divmod(pairs, keys)
        else:
            by_seq = np.lexsort((who, seqs))
            seqs, who = seqs[by_seq], who[by_seq]
        repeated = np.flatnonzero((seqs[1:] == seqs[:-1]) & (who[1:] == who[:-1])) + 1
        if len(repeated):
            self._check_repeated_entries(seqs[repeated], who[repeated], wanted)
            kept = np.ones(len(seqs), dtype=bool)
            kept[repeated] = False
            seqs, who = seqs[kept], who[kept]
        new = run_starts(seqs)
        unique = seqs[new]
        record = np.cumsum(new) - 1
        bounds = np.append(np.flatnonzero(new), len(seqs))  # record r's pairs: bounds[r]:bounds[r + 1]
        wanted_partitions = None if partitions is None else np.array(sorted(set(partitions)), dtype=np.int64)

        def verify(first: int, records: bf.SelectedRecords) -> Part | None:
            end = first + len(records)
            row, key_number = record[bounds[first] : bounds[end]] - first, who[bounds[first] : bounds[end]]
            keep = np.ones(len(records), dtype=bool)
            if begin_ms is not None:
                keep &= records.timestamp_ms >= begin_ms
            if end_ms is not None:
                keep &= records.timestamp_ms <= end_ms
            if wanted_partitions is not None:
                keep &= np.isin(records.partition, wanted_partitions)
            topic_numbers = {topic: i for i, topic in enumerate(records.topics)}
            wanted_topic = wanted.pair_topics(topic_numbers)
            # the pairs whose record is in the window and in the wanted key's topic
            in_window = keep[row]
            pair = np.flatnonzero(in_window & (records.topic_ids[row] == wanted_topic[key_number]))
            unmatched_pairs = (row[in_window], key_number[in_window])  # checked below unless matched
            row, key_number = row[pair], key_number[pair]
            pairs_of = np.bincount(row, minlength=len(records))
            candidates = np.flatnonzero(pairs_of)
            if not len(candidates):
                self._check_unmatched(records, *unmatched_pairs, np.zeros(len(records), dtype=np.int64), wanted)
                return None
            # decode the candidates' texts once, straight into RESULT_ORDER (orders on integers)
            ranks = topic_ranks(records.topics)
            order = result_order(
                records.timestamp_ms[candidates], ranks[records.topic_ids[candidates]],
                records.partition[candidates], records.offset[candidates], records.seqs[candidates])
            found = records.rows(candidates, order)
            ordered = candidates[order]
            place = np.empty(len(records), dtype=np.int64)
            place[ordered] = np.arange(len(ordered))  # where each candidate record is in `found`
            if (pairs_of[candidates] == 1).all():  # one wanted key per record (the usual case): no copy
                lists, pair_of_list = found.keys, np.empty(len(ordered), dtype=np.int64)
                pair_of_list[place[row]] = key_number
                owner = None
            else:
                lists, pair_of_list, owner = found.keys.take(pa.array(place[row])), key_number, place[row]
            parents = pc.list_parent_indices(lists).to_numpy()
            key_hit = pc.equal(pc.list_flatten(lists), wanted.keys.take(pa.array(pair_of_list[parents])))
            has_key = np.bincount(parents[key_hit.to_numpy(zero_copy_only=False)], minlength=len(lists)) > 0
            # once per record (found under two wanted keys, it is still one result)
            matched = has_key if owner is None else np.bincount(owner[has_key], minlength=len(ordered)) > 0
            hits = np.zeros(len(records), dtype=np.int64)  # the pairs of each record that matched
            hits[ordered] = has_key if owner is None else np.bincount(owner[has_key], minlength=len(ordered))
            self._check_unmatched(records, *unmatched_pairs, hits, wanted)
            if not matched.any():
                return None
            if not matched.all():
                found = found.take(np.flatnonzero(matched))
            return Part(pa.Table.from_batches([bf.rows(found, self.broker)]), OrderColumns.of(found))

        return [matched for matched in self._log.chunks(unique, verify) if matched is not None]
