"""Backfill: index fields over the records a shard committed before the fields existed.

``msgindex index --backfill-fields`` re-reads from Kafka what a shard holds and a field does not
cover, evaluates the fields, and hands each shard the values (``FieldBackfill``: values keyed by
source offsets, and the offsets every field was evaluated over). A hit on a field value is
verified against the record's own term list (fields.py), so a field can only cover a record whose
terms hold its values: backfill gives the old records those terms. Each record's terms become its
old terms followed by its new values, and each field's coverage grows by the offsets it was
evaluated over, committed together. After it the shard is exactly what it would be had the
fields been indexed from the start: no read path, nor retention, repair or inspect, knows that a
backfill happened.

**Exactly once by offsets**, as appends: a field gets values only over offsets the shard holds
and the field does not cover yet (``growth``), so a backfill repeated, retried or run by two jobs
adds nothing twice; values of records the shard does not hold are ignored. Offsets Kafka no longer
retains are not evaluated and stay uncovered (lookups keep warning about them).

**Local shards** are rebuilt, under the shard's writer lock; crash-safe and resumable like
maintenance/upgrade.py:

1. build a complete shard in ``backfill.new/`` by appending the committed records, with their new
   terms, in log order, through a ``ShardWriter`` that starts at the old log's first retained
   sequence number: every record keeps its seq (a Spark query's pieces planned before the swap
   read the same records after it), and the hash index files, sparse indexes and hot-key copies
   are what the writer always writes for these records;
2. check it: the same first and next seq, and as many terms as the old records had plus the values
   added;
3. write the marker ``backfill`` holding the new checkpoint;
4. swap ``log/``, ``index/`` and ``hotkeys/`` for the new ones, write the checkpoint, remove the
   marker, delete the old directories.

A crash before 3 leaves the shard as it was (``backfill.new/`` is deleted by the next run); from 3
on, whoever next takes the shard's lock (a writer, or the next backfill) finishes the swap from the
marker. Readers open at the old checkpoint or the new one; one racing the swap retries, as it does
against retention. The rebuild costs a rewrite of the whole shard (log and hash index files): a
backfill is a rare, deliberate operation, and the RocketMQ IndexFiles cannot take entries for old
records in place (an entry's chain and time order follow the put order).

**Object-store shards** rewrite only the chunks that hold records getting values, and commit the
new chunks in their place with the grown coverage in one version (``ObjectShardWriter.backfill``:
compaction's protocol).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import CorruptFileError, InvalidAppendError, ShardLockedError, SourceMismatchError
from msgindex.storage import fields, verify
from msgindex.storage.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from msgindex.storage.durable import fsync_directory, versioned_json, write_atomically
from msgindex.storage.fields import FieldDefinition
from msgindex.storage.file_lock import unlock, wait_for_lock
from msgindex.storage.log import batch_format as bf
from msgindex.storage.log.columns import LogColumns, with_field_terms
from msgindex.storage.log.metadata_log import LogPosition
from msgindex.storage.message import FIELD_PAIR, decode_text, encode_text
from msgindex.storage.settings import StoreSettings
from msgindex.storage.shard import (
    BACKFILL_MARKER,
    BACKFILL_MARKER_FORMAT,
    BACKFILL_NEW_DIR,
    CHECKPOINT_FILE,
    LOCK_FILE,
    ShardWriter,
    checkpoint_path,
    finish_interrupted_swap,
    missing_checkpoint_error,
    open_log,
    swapped_in_directories,
)
from msgindex.storage.source_ranges import SourceRanges, SourceRows

REWRITE_RECORDS = 262_144  # records rewritten per append of the rebuild: bounds memory, not correctness
VALUES_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp_ms", pa.int64(), nullable=False),
    pa.field("fields", pa.list_(pa.field("item", FIELD_PAIR, nullable=False)), nullable=True),
])


@dataclass(frozen=True)
class FieldBackfill:
    """Field values re-read for records a shard may hold: `values` (``VALUES_SCHEMA``: a record's
    source topic, partition, offset and timestamp, and its (name, value) pairs of `definitions`:
    a stored record at those offsets with another timestamp is another record, and the backfill
    a SourceMismatchError), and the
    source offsets every definition was evaluated over (`evaluated`: a record there without a
    value of a field has none)."""

    values: pa.Table
    definitions: tuple[FieldDefinition, ...]
    evaluated: SourceRanges

    def __post_init__(self) -> None:
        missing = {f.name for f in VALUES_SCHEMA} - set(self.values.column_names)
        if missing:
            raise InvalidAppendError(f"backfill values lack the columns {sorted(missing)}")


@dataclass(frozen=True)
class BackfillResult:
    """What a shard's backfill did: per field the offsets its coverage grew by (none: nothing to
    do), how many records got values and how many values they got, and how many records the
    rewrite wrote (local: the whole shard; object store: the chunks holding records that got
    values)."""

    broker: str
    grown: dict[str, SourceRanges] = field(default_factory=dict)
    records_with_values: int = 0
    values_added: int = 0
    records_rewritten: int = 0

    @property
    def changed(self) -> bool:
        """Whether a field's coverage grew (else nothing was written)."""
        return any(ranges.ranges for ranges in self.grown.values())

    def line(self) -> str:
        """What the backfill did, in one line for the job's output."""
        if not self.changed:
            return f"shard {self.broker}: the fields already cover every offset it holds that Kafka retains"
        grown = "; ".join(f"{name} now covers {fields.describe_ranges(ranges)} more"
                          for name, ranges in sorted(self.grown.items()) if ranges.ranges)
        return (f"shard {self.broker}: {self.values_added:,} values added to {self.records_with_values:,} "
                f"records ({self.records_rewritten:,} records rewritten); {grown}")


def growth(coverage: fields.FieldCoverage, held: SourceRanges, backfill: FieldBackfill) -> dict[str, SourceRanges]:
    """Per field of the backfill, the offsets its coverage grows by: evaluated, held by the shard,
    not covered yet (the exactly-once rule of the module docstring)."""
    evaluated = backfill.evaluated.minus(backfill.evaluated.minus(held))  # ... within what the shard holds
    grown = {}
    for definition in backfill.definitions:
        indexed = coverage.get(definition.name)
        grown[definition.name] = evaluated if indexed is None else evaluated.minus(indexed.ranges)
    return grown


def extra_after(extra: Mapping, grown: Mapping[str, SourceRanges], definitions: Sequence[FieldDefinition], *,
                source: object) -> dict:
    """A committed state's `extra` with each field's coverage grown by `grown` (a field the shard
    did not index yet joins with its definition)."""
    coverage = fields.coverage_in(extra, source=source)
    for definition in definitions:
        ranges = grown.get(definition.name)
        if ranges is not None and ranges.ranges:
            coverage = coverage.extended([definition], ranges)
    return {**extra, fields.EXTRA_MEMBER: coverage.to_json()}


class RecordValues:
    """The values a backfill adds, findable by a record's own (topic, partition, offset): only the
    pairs of fields whose coverage grows over that offset (``growth``). For records input a
    record's own coordinates are its source offsets."""

    def __init__(self, backfill: FieldBackfill, grown: Mapping[str, SourceRanges]) -> None:
        values = backfill.values.combine_chunks()
        rows = SourceRows.of(values.column("topic"), values.column("partition"), values.column("offset"))
        pairs = values.column("fields").combine_chunks() if values.num_rows else pa.array([], VALUES_SCHEMA.field("fields").type)
        counts = pc.list_value_length(pairs).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        flat = pc.list_flatten(pairs)
        names = flat.field("name") if len(flat) else pa.array([], pa.string())
        keep = np.zeros(len(flat), dtype=bool)
        for name, ranges in grown.items():
            if not ranges.ranges:
                continue
            named = np.flatnonzero(pc.equal(names, name).fill_null(False).to_numpy(zero_copy_only=False))
            keep[named] = ranges.covered(rows.take(owner[named]))
        owner, flat = owner[keep], flat.filter(pa.array(keep))
        self.values_added = len(flat)
        # one row per record that gets values, its pairs together (values of one record, at most once each)
        order = np.argsort(owner, kind="stable")
        owner, flat = owner[order], flat.take(pa.array(order))
        records, starts = np.unique(owner, return_index=True)
        offsets = np.append(starts, len(owner)).astype(np.int32)
        self._pairs = pa.ListArray.from_arrays(pa.array(offsets), flat) if len(flat) else pa.array([], pairs.type)
        # every re-read record is found (its timestamp checked against the stored one), values or not
        self._stamps = values.column("timestamp_ms").to_numpy()
        self._pair_row = np.full(values.num_rows, -1, dtype=np.int64)
        self._pair_row[records] = np.arange(len(records))
        # one sorted array of every row's place: its offset moved into its partition's own span
        # (partition g's offsets [low, high] become base[g] + offset - low), so that a batch of
        # records is found with one searchsorted, whichever partitions it mixes
        self._spans: dict[tuple[bytes, int], tuple[int, int, int]] = {}  # (topic, partition) -> (low, high, base)
        places, owners, base = [], [], 0
        for (topic, partition), at in rows.groups():
            offsets_of = rows.offset[at]
            low, high = int(offsets_of.min()), int(offsets_of.max())
            self._spans[(encode_text(topic), int(partition))] = (low, high, base)
            places.append(offsets_of - low + base)
            owners.append(at)
            base += high - low + 1
        if base >= 1 << 62:
            raise InvalidAppendError(f"backfill values span {base:,} offsets: more than an int64 place can hold")
        place = np.concatenate(places) if places else np.zeros(0, np.int64)
        order = np.argsort(place, kind="stable")
        self._places, self._rows = place[order], (np.concatenate(owners) if owners else place)[order]
        self.records = len(records)

    def __bool__(self) -> bool:
        return self.values_added > 0

    def rows_of(self, topics: Sequence[bytes], topic_ids: np.ndarray, partition: np.ndarray,
                offset: np.ndarray, timestamp_ms: np.ndarray) -> np.ndarray:
        """Per record (given as a DecodedRows' topics, topic ids, partitions, offsets and
        timestamps) the row of its values, -1 for none; SourceMismatchError naming the first
        record Kafka returned with another timestamp."""
        found = np.full(len(offset), -1, dtype=np.int64)
        if not self._spans or not len(offset):
            return found
        low = np.full(len(offset), 1, dtype=np.int64)  # (low > high: no values in that partition)
        high = np.zeros(len(offset), dtype=np.int64)
        base = np.zeros(len(offset), dtype=np.int64)
        keys = topic_ids.astype(np.int64) * (1 << 32) + partition.astype(np.int64)
        distinct, which = np.unique(keys, return_inverse=True)
        for n, key in enumerate(distinct.tolist()):  # a batch's partitions: a few
            span = self._spans.get((topics[key >> 32], key & 0xFFFFFFFF))
            if span is not None:
                at = which == n
                low[at], high[at], base[at] = span
        inside = (offset >= low) & (offset <= high)
        place = np.where(inside, offset - low + base, -1)
        i = np.minimum(np.searchsorted(self._places, place), len(self._places) - 1)
        hit = inside & (self._places[i] == place)
        found[hit] = self._rows[i[hit]]
        matched = np.flatnonzero(found >= 0)
        other = matched[self._stamps[found[matched]] != timestamp_ms[matched]]
        if len(other):
            n = int(other[0])
            raise SourceMismatchError(
                f"{decode_text(topics[int(topic_ids[n])])}-{int(partition[n])} offset {int(offset[n])}: Kafka holds a "
                f"record of {int(self._stamps[found[n]])} ms there, the index one of {int(timestamp_ms[n])} ms (the "
                f"topic was deleted and created again?); nothing of the backfill is committed")
        return np.where(found >= 0, self._pair_row[np.maximum(found, 0)], -1)

    def pairs_for(self, rows: np.ndarray) -> pa.Array:
        """The values of `rows` (``rows_of``; -1: a null list) as an append's ``fields`` column."""
        return self._pairs.take(pa.array(rows, mask=rows < 0))


def rewritten_columns(decoded: bf.DecodedRows, values: RecordValues) -> tuple[LogColumns, int, int]:
    """`decoded` as append columns, each record's terms followed by its new values; how many of
    its records got values, and how many values."""
    rows = values.rows_of(decoded.topics, decoded.topic_ids, decoded.partition, decoded.offset, decoded.timestamp_ms)
    keys = decoded.keys
    list_offsets = keys.offsets.to_numpy().astype(np.int64)
    items = keys.values
    with_values = int((rows >= 0).sum())
    added = 0
    if with_values:
        pairs = values.pairs_for(rows)
        added = int(pc.sum(pc.list_value_length(pairs)).as_py() or 0)
        list_offsets, items = with_field_terms(list_offsets, items, pairs)
    ints = {"partition": decoded.partition, "offset": decoded.offset, "timestamp_ms": decoded.timestamp_ms,
            "commit_log_offset": decoded.commit_log_offset, "size": decoded.size}
    return LogColumns(decoded.topic, decoded.key.cast(pa.large_binary()), list_offsets, items.cast(pa.large_binary()),
                      ints), with_values, added


def concat_columns(parts: Sequence[LogColumns]) -> LogColumns:
    """One LogColumns of `parts`, in order."""
    if len(parts) == 1:
        return parts[0]
    offsets, items, at = [np.zeros(1, np.int64)], [], 0
    for part in parts:
        first, last = int(part.list_offsets[0]), int(part.list_offsets[-1])
        items.append(part.items.slice(first, last - first))
        offsets.append(part.list_offsets[1:] - first + at)
        at += last - first
    return LogColumns(pa.concat_arrays([p.topic for p in parts]), pa.concat_arrays([p.key for p in parts]),
                      np.concatenate(offsets), pa.concat_arrays(items),
                      {name: np.concatenate([p.ints[name] for p in parts]) for name in parts[0].ints})


# ---- local shards ------------------------------------------------------------------------------

def backfill_shard(directory: Path, broker: str, settings: StoreSettings, backfill: FieldBackfill, *,
                   lock_timeout_s: float = 120.0) -> BackfillResult:
    """Backfill one local shard (the module docstring), under its writer lock (waiting up to
    `lock_timeout_s` for another holder)."""
    directory = Path(directory)
    fd = wait_for_lock(directory / LOCK_FILE, lock_timeout_s)
    if fd is None:
        raise ShardLockedError(f"{directory / LOCK_FILE}: shard {broker!r} lock still held after waiting "
                               f"{lock_timeout_s:g} s; stop its writer first")
    try:
        finish_interrupted_swap(directory)
        checkpoint = read_checkpoint(checkpoint_path(directory))
        if checkpoint is None:
            raise missing_checkpoint_error(directory, broker, True)
        held = checkpoint.source_ranges if checkpoint.source_ranges is not None else SourceRanges()
        coverage = fields.coverage_in(checkpoint.extra, source=checkpoint_path(directory))
        fields.check_compatible(coverage.definitions(), backfill.definitions, f"shard {broker!r}", spelling=True)
        grown = growth(coverage, held, backfill)
        if not any(ranges.ranges for ranges in grown.values()):
            return BackfillResult(broker, grown)
        values = RecordValues(backfill, grown)
        extra = extra_after(checkpoint.extra, grown, backfill.definitions, source=checkpoint_path(directory))
        if not values:  # evaluated, and no record there has a value: the coverage grows alone
            write_checkpoint(checkpoint_path(directory), dataclasses.replace(checkpoint, extra=extra))
            return BackfillResult(broker, grown)
        rebuilt, with_values, added = _rebuild(directory, broker, settings, checkpoint, values, extra)
        present = [name for name in swapped_in_directories() if (directory / BACKFILL_NEW_DIR / name).exists()]
        write_atomically(directory / BACKFILL_MARKER, versioned_json(BACKFILL_MARKER_FORMAT, 1, {
            "checkpoint": rebuilt.to_dict(), "present": present}))
        fsync_directory(directory)
        finish_interrupted_swap(directory)
        return BackfillResult(broker, grown, with_values, added, rebuilt.record_count - rebuilt.log_start_seq)
    finally:
        unlock(fd)


def _rebuild(directory: Path, broker: str, settings: StoreSettings, checkpoint: Checkpoint, values: RecordValues,
             extra: dict) -> tuple[Checkpoint, int, int]:
    """Steps 1 and 2 of the module docstring: the new shard in backfill.new/; its checkpoint, the
    records that got values and the values they got."""
    new = directory / BACKFILL_NEW_DIR
    shutil.rmtree(new, ignore_errors=True)  # a build a crash interrupted
    new.mkdir()
    start = checkpoint.log_start_seq
    with open_log(new, settings, writable=True, committed=LogPosition(start, start, 0)) as log:
        position = log.position()
    write_checkpoint(new / CHECKPOINT_FILE, Checkpoint(log_position=position, log_start_seq=start, record_count=start,
                                                       source_ranges=SourceRanges()))
    ranges = checkpoint.source_ranges if checkpoint.source_ranges is not None else SourceRanges()
    with_values = terms = old_terms = added = 0
    writer = ShardWriter(new, broker, settings)
    try:
        for columns, got_values, got, had_terms in _rewritten_records(directory, settings, checkpoint, values):
            with_values += got_values
            added += got
            old_terms += had_terms
            terms += int(columns.list_offsets[-1] - columns.list_offsets[0])
            writer.append_rewritten(columns, ranges, extra)
        if checkpoint.record_count == start:  # nothing retained: commit the grown coverage alone
            writer.append_rewritten(None, ranges, extra)
        rebuilt = writer.checkpoint
    except BaseException:
        writer.close()
        shutil.rmtree(new, ignore_errors=True)  # (a copy of the whole shard: not left for the next writer)
        raise
    writer.close()
    if (rebuilt.log_start_seq, rebuilt.record_count) != (start, checkpoint.record_count) \
            or terms != old_terms + added:
        shutil.rmtree(new, ignore_errors=True)
        raise CorruptFileError(f"{directory}: the rebuilt shard does not hold what the old one and the backfill "
                               f"do (seqs {rebuilt.log_start_seq}..{rebuilt.record_count} against {start}.."
                               f"{checkpoint.record_count}, {terms} terms against {old_terms} + {added}); "
                               f"nothing was changed")
    return dataclasses.replace(rebuilt, topics=checkpoint.topics), with_values, added


def _rewritten_records(directory: Path, settings: StoreSettings, checkpoint: Checkpoint, values: RecordValues
                       ) -> Iterator[tuple[LogColumns, int, int, int]]:
    """The committed records (checksums verified), about REWRITE_RECORDS at a time, as rewritten
    columns; with how many of them got values, how many values, and how many terms they had."""
    with open_log(directory, settings, writable=False, committed=checkpoint.log_position,
                  retained_from=checkpoint.log_start_seq) as log:
        parts, held, got, added, had = [], 0, 0, 0, 0
        for decoded in verify.decoded_batches(log, checkpoint.log_start_seq, checkpoint.record_count):
            columns, with_values, values_added = rewritten_columns(decoded, values)
            parts.append(columns)
            held, got, added = held + len(columns), got + with_values, added + values_added
            had += int(pc.sum(pc.list_value_length(decoded.keys)).as_py() or 0)
            if held >= REWRITE_RECORDS:
                yield concat_columns(parts), got, added, had
                parts, held, got, added, had = [], 0, 0, 0, 0
        if parts:
            yield concat_columns(parts), got, added, had
