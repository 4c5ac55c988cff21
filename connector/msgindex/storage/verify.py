"""Is what a shard's files hold what its checkpoint committed? The cheap checks every reader and
writer makes when it opens a shard, and the deep verification behind ``msgindex inspect``.

A shard's checkpoint names everything that is real (``checkpoint.py``). Files can still be
damaged under it (a disk error, an operator's ``rm``, a restore gone wrong), and most damage would
otherwise show as a *silent* wrong answer: a hash index file whose slot table was zeroed makes
lookups miss, a missing oldest log segment makes scans short. So:

* **At open (readers and writers), cheap.** The log's segments must cover the committed range
  ``[log_start_seq, record_count)`` from its first seq (the segment holding ``log_start_seq`` has
  exactly that base: retention cuts at segment bases). Each listed hash index file's header must
  be the committed header (a file the checkpoint calls full never changes again; only the active
  file may be ahead, with a writer appending: then its begin fields and counts may only have
  grown), and its non-zero slots must number the committed ``hash_slot_count``: a slot becomes
  non-zero exactly once, on the put that counts it, and never goes back (a rollback restores the
  values it had), so a zeroed or partly zeroed slot table shows (the active file: at least that
  many). Counting a slot table costs ~3 ms warm and ~15 ms cold for RocketMQ's default 5M slots
  (bench/bench_open_checks.py), so it runs once per file per process: the result is cached by
  the file's identity (device, inode, size, mtime) and the committed header.
* **On demand (``verify_shard``), everything.** The committed hash index entries are what the
  log says they must be: the writer puts, in record order, one entry per distinct key of each
  record (``AppendColumns.index_entries``), so the log alone gives every entry's keyHash,
  phyOffset and timeDiff, every prevIndex, every slot and every committed header; they are
  regenerated from the (checksummed) log batches and compared. Entries that point below the
  retained log (retention deleted their records) can only be checked for shape (prevIndex points
  to an older entry, phyOffsets never decrease). Sealed segments' summaries, the sparse indexes
  (against the index rule applied to the batches), the hash runs (rebuilt and compared byte for
  byte) and the hot-key copies (each group made again from the log) are checked too: those are
  derived files, which readers recompute or ignore when damaged, so their problems are reported
  as harmless.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from msgindex.errors import CorruptFileError
from msgindex.storage import hot_keys
from msgindex.storage.append_columns import RAW_TEXT, TEXT, AppendColumns
from msgindex.storage.checkpoint import Checkpoint, IndexFileState
from msgindex.storage.hash_index import entry_sums, hash_run
from msgindex.storage.hash_index.index_file import FIRST_INDEX, IndexFile, IndexHeader, time_diffs_seconds
from msgindex.storage.hash_index.java_hash import index_hash, index_hashes
from msgindex.storage.log import batch_format as bf
from msgindex.storage.log.metadata_log import MetadataLog
from msgindex.storage.log.segment import LOG_SUFFIX, segment_name
from msgindex.storage.log.segment_summary import SegmentSummary
from msgindex.storage.log.sparse_index import OffsetIndex, TimeIndex

_CHECKED_FILES = 4096  # (file identity, committed header) pairs a process remembers as checked
NEWEST_CHECKED = 4  # newest committed entries of a hash index file checked against the log at open
_checked: OrderedDict[tuple, None] = OrderedDict()
LISTED_PROBLEMS = 5  # differences reported per kind and file (the rest are counted)


# --- at open ---------------------------------------------------------------------------------
def check_log_covers(log: MetadataLog, checkpoint: Checkpoint) -> None:
    """CorruptFileError unless the open `log` holds every committed record from the checkpoint's
    ``log_start_seq`` on (a deleted oldest segment would otherwise make scans silently short)."""
    if checkpoint.log_position is None or checkpoint.record_count <= checkpoint.log_start_seq:
        return
    if log.start_seq > checkpoint.log_start_seq:
        missing = log.directory / (segment_name(checkpoint.log_start_seq) + LOG_SUFFIX)
        raise CorruptFileError(
            f"{missing}: log segment is missing (the checkpoint committed records {checkpoint.log_start_seq}.."
            f"{checkpoint.record_count - 1}; the oldest segment present starts at {log.start_seq}): restore it "
            f"from a backup; records it held cannot be found otherwise"
        )


def check_index_file(index_file: IndexFile, state: IndexFileState, *, active: bool, exclusive: bool = False,
                     log: MetadataLog | None = None, log_start_seq: int = 0) -> None:
    """CorruptFileError naming `index_file` unless its header and slot table agree with the
    committed `state` (module docstring). `active`: the last file of the checkpoint, which a
    writer in another process may be ahead in; `exclusive`: the caller holds the shard's lock
    and rolled the file back, so it must equal the commit exactly; with the shard's committed
    `log`, its newest committed entries must also index keys their records carry
    (``_check_newest_entries``)."""
    committed = state.header
    if committed.index_count > index_file.capacity:
        room = max(index_file.capacity - FIRST_INDEX, 0)
        raise CorruptFileError(
            f"{index_file.path}: hash index file has room for {room} entries, but the checkpoint committed "
            f"{committed.index_count - FIRST_INDEX} (the file was truncated: committed entries are lost)")
    on_disk = index_file.header
    ahead = on_disk.index_count > committed.index_count
    if not ahead or exclusive or not active:
        if on_disk != committed:
            raise CorruptFileError(f"{index_file.path}: hash index file header {_header_difference(on_disk, committed)}")
    elif committed.index_count > FIRST_INDEX and (
        (on_disk.begin_timestamp, on_disk.begin_phy_offset) != (committed.begin_timestamp, committed.begin_phy_offset)
        or on_disk.hash_slot_count < committed.hash_slot_count
    ):
        raise CorruptFileError(f"{index_file.path}: hash index file header {_header_difference(on_disk, committed)}")
    key = _identity(index_file, committed, active and not exclusive)
    if key is not None and key in _checked:
        _checked.move_to_end(key)
        return
    used = int(np.count_nonzero(index_file.slot_array().view(np.uint32)))
    expected = committed.hash_slot_count
    if used < expected or (used != expected and not (active and not exclusive)):
        raise CorruptFileError(
            f"{index_file.path}: hash index file has {used} slots in use where the checkpoint committed {expected} "
            f"(its slot table was zeroed or overwritten: lookups would miss)"
        )
    if log is not None:
        _check_newest_entries(index_file, state, log, log_start_seq)
    if key is not None:
        _checked[key] = None
        if len(_checked) > _CHECKED_FILES:
            _checked.popitem(last=False)


def _check_newest_entries(index_file: IndexFile, state: IndexFileState, log: MetadataLog, log_start_seq: int) -> None:
    """The newest NEWEST_CHECKED committed entries must point into the committed log at records
    that carry a key of their keyHash. Another shard's file (same sizing, and the same header and
    slot count when both shards hold as many records at the same times) passes every other check
    at open and makes lookups miss silently; so do entries overwritten with plausible values. A
    few point reads (one block, usually) per file and identity, cached with the slot count."""
    count = state.index_count
    check_entries_point_at_keys(index_file, max(FIRST_INDEX, count - NEWEST_CHECKED), count, log, log_start_seq)


def check_entries_point_at_keys(index_file: IndexFile, first: int, end: int, log: MetadataLog,
                                log_start_seq: int) -> None:
    """CorruptFileError naming `index_file` unless its entries [first, end) point into the
    committed log at records that carry a key of their keyHash (entries pointing below
    `log_start_seq`, into segments retention deleted, cannot be checked)."""
    if first >= end:
        return
    rows = index_file.entry_array()[first:end]
    phys, hashes = rows["phy_offset"].astype(np.int64), rows["key_hash"].astype(np.int64)
    beyond = np.flatnonzero((phys >= log.next_seq) | (phys < 0))
    if beyond.size:
        at = int(beyond[0])
        raise CorruptFileError(f"{index_file.path}: committed entry {first + at} points at seq {int(phys[at])}, outside "
                               f"the {log.next_seq} records the shard committed: the file is damaged")
    inside = np.flatnonzero(phys >= log_start_seq)  # entries below point into segments retention dropped
    seqs = sorted(set(phys[inside].tolist()))
    records = dict(zip(seqs, log.read_few(seqs)))
    for at in inside.tolist():
        record = records[int(phys[at])]
        if int(hashes[at]) not in {index_hash(string) for string in record.index_strings()}:
            raise CorruptFileError(
                f"{index_file.path}: committed entry {first + at} has keyHash {int(hashes[at])}, but its record (seq "
                f"{int(phys[at])}) carries no key of that hash: the file is damaged or another shard's (`msgindex "
                f"inspect` checks every entry)")


def check_rollback_bounds(index_file: IndexFile, state: IndexFileState) -> None:
    """Before a writer rolls `index_file` back to `state`: a header ahead of the commit must be
    one a writer that died mid-put can leave (its count at most one past the last written entry
    or slot pointer); a damaged count would make the rollback undo entries nobody wrote."""
    on_disk = index_file.header.index_count
    if on_disk <= state.index_count:
        return
    slots = index_file.slot_array()
    entries = index_file.entry_array()  # [0, on_disk)
    written = np.flatnonzero(entries[state.index_count:].view(np.uint8).reshape(-1, 20).any(axis=1))
    reach = max(state.index_count + (int(written[-1]) + 1 if written.size else 0), int(slots.max()) + 1)
    if on_disk > reach:
        raise CorruptFileError(
            f"{index_file.path}: hash index file header counts {on_disk - FIRST_INDEX} entries but only "
            f"{reach - FIRST_INDEX} were written (a damaged header); the checkpoint committed "
            f"{state.index_count - FIRST_INDEX}"
        )


def _identity(index_file: IndexFile, committed: IndexHeader, ahead_allowed: bool) -> tuple | None:
    try:
        info = os.stat(index_file.path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, committed, ahead_allowed)


def _header_difference(on_disk: IndexHeader, committed: IndexHeader) -> str:
    if on_disk.index_count < committed.index_count:
        return (f"counts {on_disk.index_count - FIRST_INDEX} entries, behind the {committed.index_count - FIRST_INDEX} "
                f"the checkpoint committed (the file was zeroed, truncated, replaced or lost committed entries)")
    fields = [name for name in committed.__dataclass_fields__ if getattr(on_disk, name) != getattr(committed, name)]
    shown = ", ".join(f"{name} {getattr(on_disk, name)} (committed {getattr(committed, name)})" for name in fields)
    return f"differs from the commit: {shown} (the file was altered)"


def forget_checked() -> None:
    """Forget which files were checked (tests; a process that wants to check again)."""
    _checked.clear()


# --- deep verification -----------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """One thing wrong in a shard: the file, what is wrong, and whether readers work around it
    (a derived file they recompute or ignore) or answers depend on it."""

    path: str
    what: str
    harmless: bool = False

    def __str__(self) -> str:
        note = " [derived file: readers recompute or ignore it; `msgindex repair` rewrites it]" if self.harmless else ""
        return f"{self.path}: {self.what}{note}"


def verify_shard(checkpoint: Checkpoint, log: MetadataLog | None,
                 index_files: list[tuple[IndexFileState, IndexFile]]) -> list[Problem]:
    """Everything wrong with a shard's committed files (empty: nothing), given a reader's view
    of it: its checkpoint, open log and open hash index files (module docstring)."""
    problems: list[Problem] = []
    if log is not None:
        problems += _verify_log_files(log)
    stream = ExpectedEntries(log, checkpoint) if log is not None else None
    previous: tuple[IndexFileState, IndexFile] | None = None
    last_phy = -1
    for state, index_file in index_files:
        try:
            last_phy = _verify_index_file(state, index_file, previous, checkpoint, stream, last_phy, problems)
        except CorruptFileError as error:  # the log could not be read: what the stream needed
            problems.append(Problem(str(index_file.path), f"cannot be checked against the log ({error})"))
            stream = None
        problems += _verify_runs(index_file, state)
        problems += _verify_entry_sums(index_file, state)
        previous = (state, index_file)
    if log is not None:
        problems += [Problem(str(path), what, harmless=True) for path, what in hot_keys.check_copies(
            log.directory.parent / hot_keys.DIRECTORY, log, checkpoint.log_start_seq, checkpoint.record_count)]
    if stream is not None:
        try:
            left = stream.remaining()
        except CorruptFileError as error:
            problems.append(Problem(str(log.directory), str(error)))
        else:
            if left:
                problems.append(Problem(
                    str(log.directory.parent / "index"),
                    f"{left} keys of committed records (from seq {stream.next_phy()}) have no hash index entry: "
                    f"lookups of them miss"))
    return problems


def _verify_log_files(log: MetadataLog) -> list[Problem]:
    """Sealed segments' summaries and every segment's sparse indexes against the log itself
    (the batches are checked when the expected index entries are read from them)."""
    problems = []
    for info in log.segments():
        segment = log.segment(info.base_seq)
        try:
            directory = segment.batches()
            offset_rule, time_rule = segment.rule_indexes()
        except CorruptFileError as error:
            problems.append(Problem(str(info.path), str(error).removeprefix(f"{info.path}: ")))
            continue
        if not info.active:
            summary = SegmentSummary.read(segment.summary_path)
            right = SegmentSummary(info.base_seq, info.next_seq, info.size_bytes,
                                   int(directory.min_timestamps.min()), int(directory.max_timestamps.max()))
            if summary != right:
                what = "is missing" if not segment.summary_path.exists() else "does not match its segment"
                problems.append(Problem(str(segment.summary_path), f"segment summary {what}", harmless=True))
        for cls, path, rule, committed in (
            (OffsetIndex, segment.index_path, offset_rule, segment.offset_index.entries if info.active else None),
            (TimeIndex, segment.time_index_path, time_rule, segment.time_index.entries if info.active else None),
        ):
            try:
                on_disk = cls.load(path, info.base_seq, log.max_index_bytes, entries=committed)
                same = np.array_equal(on_disk.entries_array(), rule.entries_array())
            except CorruptFileError as error:
                problems.append(Problem(str(path), f"{error}".removeprefix(f"{path}: "), harmless=True))
                continue
            if not same:
                problems.append(Problem(str(path), f"{cls.KIND} entries differ from the ones its segment's batches "
                                                   f"give (Kafka's index rule)", harmless=True))
    return problems


def _verify_index_file(state: IndexFileState, index_file: IndexFile, previous: tuple | None,
                       checkpoint: Checkpoint, stream: ExpectedEntries | None, last_phy: int,
                       problems: list[Problem]) -> int:
    """Append what is wrong with one hash index file; returns the phyOffset of its last entry."""
    path = str(index_file.path)
    count = state.index_count
    n_slots = index_file.hash_slot_num
    on_disk = index_file.header
    if on_disk.index_count < count:
        problems.append(Problem(path, f"header {_header_difference(on_disk, state.header)}"))
        return last_phy
    rows = index_file.entry_array()[FIRST_INDEX:count]
    index = np.arange(FIRST_INDEX, count, dtype=np.int64)
    hashes = rows["key_hash"].astype(np.int64)
    phys = rows["phy_offset"].astype(np.int64)
    diffs = rows["time_diff"].astype(np.int64)
    prevs = rows["prev_index"].astype(np.int64)

    def report(mask: np.ndarray, say) -> None:
        bad = np.flatnonzero(mask)
        for at in bad[:LISTED_PROBLEMS].tolist():
            problems.append(Problem(path, f"entry {int(index[at])}: {say(at)}"))
        if bad.size > LISTED_PROBLEMS:
            problems.append(Problem(path, f"... and {bad.size - LISTED_PROBLEMS} more such entries"))

    report(hashes < 0, lambda at: f"keyHash {hashes[at]} is negative (RocketMQ hashes are abs values)")
    report((prevs < 0) | (prevs >= index), lambda at: f"prevIndex {prevs[at]} does not point to an older entry")
    report((phys < 0) | (phys >= checkpoint.record_count),
           lambda at: f"phyOffset {phys[at]} is outside the committed log [0, {checkpoint.record_count})")
    going_back = np.zeros(phys.size, dtype=bool)
    if phys.size:
        going_back[1:] = phys[1:] < phys[:-1]
        going_back[0] = phys[0] < last_phy
    report(going_back, lambda at: f"phyOffset {phys[at]} is below the entry before it (puts follow the log)")
    if stream is None or not phys.size:
        return int(phys[-1]) if phys.size else last_phy
    # the entries pointing into the retained log are regenerated from it; those below are not
    first = int(np.searchsorted(phys, checkpoint.log_start_seq, side="left")) if phys[0] < checkpoint.log_start_seq else 0
    expected = stream.take(phys.size - first)
    n = expected.hashes.size
    mine = slice(first, first + n)
    structure = hashes.copy()  # the hashes that decide slots and chains: the log's where it has them
    structure[mine] = expected.hashes
    if n < phys.size - first:
        problems.append(Problem(path, f"entries from {int(index[first + n])} on have no record key in the log "
                                      f"(more entries than the committed records have keys)"))

    def regenerated(differs: np.ndarray) -> np.ndarray:
        mask = np.zeros(phys.size, dtype=bool)
        mask[mine] = differs
        return mask

    report(regenerated(hashes[mine] != expected.hashes),
           lambda at: f"keyHash {hashes[at]}, but the key it indexes (record seq {expected.phys[at - first]} in "
                      f"{stream.record_file(int(expected.phys[at - first]))}) hashes to {expected.hashes[at - first]}")
    report(regenerated(phys[mine] != expected.phys),
           lambda at: f"phyOffset {phys[at]}, but the log puts this entry's key at seq {expected.phys[at - first]}")
    if n:
        begin_ts = on_disk.begin_timestamp if first else int(expected.stamps[0])
        want = time_diffs_seconds(expected.stamps, begin_ts).astype(np.int64)
        if first == 0:  # the first put's diff is taken against the begin the file inherited
            inherited = _inherited_begin(previous, checkpoint)
            want[0] = diffs[0] if inherited is None else time_diffs_seconds(expected.stamps[:1], inherited)[0]
        report(regenerated(diffs[mine] != want),
               lambda at: f"timeDiff {diffs[at]} s, but its record's timestamp gives {want[at - first]} s")
    if first == 0 and n == phys.size:
        committed = state.header
        right = IndexHeader(int(expected.stamps[0]), int(expected.stamps[-1]), int(expected.phys[0]),
                            int(expected.phys[-1]), int(np.unique(structure % n_slots).size), count)
        if committed != right:
            fields = [f"{name} {getattr(committed, name)} (the log gives {getattr(right, name)})"
                      for name in committed.__dataclass_fields__ if getattr(committed, name) != getattr(right, name)]
            problems.append(Problem(path, f"the checkpoint's committed header disagrees with the log: {', '.join(fields)}"))
        low, high = int(expected.stamps.min()), int(expected.stamps.max())
        if (state.min_timestamp_ms, state.max_timestamp_ms) != (low, high):
            problems.append(Problem(path, f"the checkpoint gives its records' time range as "
                                          f"[{state.min_timestamp_ms}, {state.max_timestamp_ms}], the log "
                                          f"[{low}, {high}]: time-window lookups would skip it wrongly"))
    slot_of = structure % n_slots
    by_slot = np.lexsort((index, slot_of))
    same_slot = np.zeros(by_slot.size, dtype=bool)
    same_slot[1:] = slot_of[by_slot][1:] == slot_of[by_slot][:-1]
    want_prev = np.zeros(by_slot.size, dtype=np.int64)
    want_prev[by_slot[1:][same_slot[1:]]] = index[by_slot[:-1][same_slot[1:]]]
    report(prevs != want_prev, lambda at: f"prevIndex {prevs[at]}, but the chain of its slot gives {want_prev[at]}")
    if on_disk.index_count == count:  # no writer ahead: the slot table is exactly the chains' heads
        heads = np.zeros(n_slots, dtype=np.int64)
        last_of_slot = np.append(~same_slot[1:], True)
        heads[slot_of[by_slot][last_of_slot]] = index[by_slot][last_of_slot]
        slots = index_file.slot_array().astype(np.int64)
        bad = np.flatnonzero(slots != heads)
        for slot in bad[:LISTED_PROBLEMS].tolist():
            problems.append(Problem(path, f"slot {slot} holds {slots[slot]}, but the newest entry of its chain is "
                                          f"{heads[slot]}"))
        if bad.size > LISTED_PROBLEMS:
            problems.append(Problem(path, f"... and {bad.size - LISTED_PROBLEMS} more such slots"))
    return int(phys[-1])


def _inherited_begin(previous: tuple | None, checkpoint: Checkpoint) -> int | None:
    """The beginTimestamp a new file inherited (RocketMQ's constructor: the full file's end
    time): None when its predecessor was deleted by retention."""
    if previous is not None:
        end = previous[0].header.end_timestamp
        return end if end > 0 else 0
    return 0 if checkpoint.log_start_seq == 0 else None


def _verify_runs(index_file: IndexFile, state: IndexFileState) -> list[Problem]:
    """Each hash run of the file must be exactly the run its committed entries give."""
    problems = []
    directory = Path(index_file.path).parent
    for path in sorted(directory.glob(f"{Path(index_file.path).name}*{hash_run.SUFFIX}")):
        if not hash_run.is_sidecar_of(path.name, [Path(index_file.path).name]):
            continue
        run = None
        try:
            stem = path.name[: -len(hash_run.SUFFIX)]
            start = int(stem.rpartition(".")[2]) if stem != Path(index_file.path).name else FIRST_INDEX
            run = hash_run.HashRun.load(path, index_file, start)
            if run is None:
                problems.append(Problem(str(path), "hash run is damaged or stale: lookups ignore it", harmless=True))
                continue
            if run.end_count > state.index_count:
                problems.append(Problem(str(path), f"hash run covers entries up to {run.end_count}, past the "
                                                   f"{state.index_count} committed", harmless=True))
                continue
            right = hash_run.build(index_file, run.start_count, run.end_count, min_chain=run.min_chain,
                                   block_rows=run.block_rows, version=run.version)
            if right != path.read_bytes():
                problems.append(Problem(str(path), "hash run differs from the run its index file's entries give "
                                                   "(lookups may use it while its checksums hold)", harmless=True))
        except (OSError, ValueError) as error:
            problems.append(Problem(str(path), f"hash run cannot be read ({error})", harmless=True))
        finally:
            if run is not None:
                run.close()
    return problems


def _verify_entry_sums(index_file: IndexFile, state: IndexFileState) -> list[Problem]:
    """The file's entry checksums must cover its committed entries with their CRCs now (a
    difference with entries that match the log means the sidecar is wrong: harmless, rewritten by
    `msgindex repair`; with entries that do not, the entries' own problems say so)."""
    if state.index_count <= FIRST_INDEX:
        return []  # no entry to cover
    path = str(entry_sums.sums_path(index_file.path))
    sums, why = entry_sums.EntrySums.load(index_file)
    degraded = "lookups check the entries they touch for the shape of hash chains only"
    if sums is None:
        return [Problem(path, f"entry checksums {why}: {degraded}", harmless=True)]
    if sums.covered_count < state.index_count:
        return [Problem(path, f"entry checksums cover {sums.covered_count - FIRST_INDEX} of the "
                              f"{state.index_count - FIRST_INDEX} committed entries: {degraded} past them", harmless=True)]
    right = entry_sums.chunk_crcs(index_file, 0, sums.covered_count, chunk_entries=sums.chunk_entries)
    differ = np.flatnonzero(np.asarray(right, dtype=np.uint32) != sums.crcs)
    if differ.size:
        low = int(differ[0]) * sums.chunk_entries
        return [Problem(path, f"entry checksums of {differ.size} chunk(s) differ from the file's entries (first: "
                              f"entries {low}..{low + sums.chunk_entries - 1}): lookups touching them fail",
                        harmless=True)]
    return []


@dataclass(frozen=True)
class _Entries:
    hashes: np.ndarray  # int64
    phys: np.ndarray  # int64
    stamps: np.ndarray  # int64


class ExpectedEntries:
    """The hash index entries the committed log (from ``log_start_seq`` to ``record_count``)
    calls for, in put order, read batch by batch (checksums verified) and handed out in any
    amounts."""

    def __init__(self, log: MetadataLog, checkpoint: Checkpoint) -> None:
        self._chunks = self._generate(log, checkpoint.log_start_seq, checkpoint.record_count)
        self._pending: list[_Entries] = []
        self._pending_size = 0
        self._log = log

    def record_file(self, seq: int) -> str:
        """Where the log keeps record `seq`: its segment file (the directory for a log that lists
        no segments). An entry and its record that disagree name both files: either may be the
        one damaged or copied in from elsewhere."""
        listed = getattr(self._log, "segments", None)
        for segment in listed() if listed is not None else ():
            if segment.base_seq <= seq < segment.next_seq:
                return str(segment.path)
        return str(self._log.directory)

    @staticmethod
    def _generate(log: MetadataLog, start: int, end: int) -> Iterator[_Entries]:
        for batch in decoded_batches(log, start, end):
            yield index_entries_of(batch)

    def _fill(self, size: int) -> None:
        while self._pending_size < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                return
            if chunk.hashes.size:  # records without keys call for no entry
                self._pending.append(chunk)
                self._pending_size += chunk.hashes.size

    def take(self, size: int) -> _Entries:
        """The next `size` entries (fewer when the log has no more)."""
        self._fill(size)
        if not self._pending:
            return _Entries(*(np.zeros(0, np.int64) for _ in range(3)))
        joined = _Entries(*(np.concatenate([getattr(c, f) for c in self._pending]) for f in ("hashes", "phys", "stamps")))
        taken = _Entries(joined.hashes[:size], joined.phys[:size], joined.stamps[:size])
        rest = _Entries(joined.hashes[size:], joined.phys[size:], joined.stamps[size:])
        self._pending = [rest] if rest.hashes.size else []
        self._pending_size = rest.hashes.size
        return taken

    def count_before(self, end_seq: int) -> int:
        """Take (and drop) the next entries of records before `end_seq`; returns how many."""
        while True:
            last = self._pending[-1].phys[-1] if self._pending else None
            if last is not None and last >= end_seq:
                break
            before = self._pending_size
            self._fill(before + 1)
            if self._pending_size == before:
                break
        count = sum(int(np.count_nonzero(chunk.phys < end_seq)) for chunk in self._pending)
        self.take(count)
        return count

    def remaining(self) -> int:
        self._fill(1 << 62)
        return self._pending_size

    def next_phy(self) -> int:
        self._fill(1)
        return int(self._pending[0].phys[0]) if self._pending else -1


def decoded_batches(log: MetadataLog, start: int, end: int) -> Iterator[bf.DecodedRows]:
    """The records with start <= seq < end, a decoded batch (checksum verified) at a time."""
    for info in log.segments():
        if info.next_seq <= start or info.base_seq >= end:
            continue
        segment = log.segment(info.base_seq)
        directory = segment.batches()
        first, last = segment.batch_range(max(start, info.base_seq), min(end, info.next_seq))
        for i in range(first, last):
            stored = segment.decode(i, directory)
            keep = np.flatnonzero((stored.seqs >= start) & (stored.seqs < end))
            batch = stored if keep.size == len(stored) else stored.take(keep)
            if len(batch):
                yield batch


def index_entries_of(batch: bf.DecodedRows) -> _Entries:
    """(key hashes, phyOffsets, timestamps) of the hash index entries the writer put for the
    decoded records of `batch` (consecutive seqs), in put order."""
    counts = np.diff(batch.keys.offsets.to_numpy().astype(np.int64))
    items = batch.keys.values.slice(int(batch.keys.offsets[0].as_py()), int(counts.sum()))
    topic, items = batch.topic.cast(RAW_TEXT), items.cast(RAW_TEXT)
    try:
        topic, items = topic.cast(TEXT), items.cast(TEXT)
    except pa.ArrowInvalid:
        pass
    columns = AppendColumns(topic, batch.timestamp_ms, items, np.repeat(np.arange(len(batch), dtype=np.int64), counts))
    keys, phys, stamps = columns.index_entries(int(batch.seqs[0]))
    return _Entries(index_hashes(keys).astype(np.int64), np.asarray(phys, np.int64), np.asarray(stamps, np.int64))
