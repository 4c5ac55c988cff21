"""`msgindex repair PATH [--broker B]`: rebuild a shard's lost or unreadable checkpoint from its files,
and clear damaged derived files.

A checkpoint is the one file a shard cannot be read without, and the only one that holds facts
the data files do not obviously hold: which records are committed and which Kafka offsets the
shard has. Both can be recovered from the files themselves:

* **the log**: its segments, validated batch by batch (checksums, contiguous sequence numbers
  from the oldest segment present, which is where retention left the log's start);
* **the source offsets**: every append writes the shard's cumulative committed source ranges
  into the annotation of its last log batch (``ShardWriter._append_to_log``), so the last
  annotated batch ends the last append and carries the ranges committed with it (commits that
  append no record, which only close offset gaps holding no record of the shard, are lost; a
  replay of those offsets then appends nothing and commits them again);
* **the hash index files**: their entries are what the log says they must be (``verify``); the
  committed count of each file follows from the number of entries the kept records call for.

A writer that died mid-append can leave one append whose log batches or hash entries are
incomplete; it was never committed, so the rebuilt checkpoint ends before it (and the next writer
rolls it back, as it would have). Before anything is written the candidate checkpoint is
verified exactly as ``msgindex inspect`` verifies a shard; a shard where that fails, whose last
append carries no annotation (written before annotations existed), or whose writer lock is held
is refused with a message, and nothing is changed.

With a readable checkpoint, repair rebuilds every committed hash index file whose bytes differ
from what the log calls for (damaged, truncated, zeroed, missing): the log holds every record's keys
and timestamps in put order, and a file's name and header come from the data (``shard``'s module
docstring), so the rebuilt file is byte for byte the one the writer wrote (``_rebuilt_index_file``);
it is built beside the damaged one and renamed over it. Files whose committed entries match the
log get their entry checksums (``entry_sums``) written where they are missing or damaged. Then it
removes derived files that are damaged (segment summaries, sparse indexes, hash runs: readers
recompute or ignore them, writers rebuild them) and adds the shard to the store manifest if it is
missing there. A shard the manifest lists whose
directory is gone is only forgotten when asked (``forget_missing``).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from msgindex.errors import CorruptFileError, ForeignCheckpointError, MsgIndexError, StoreNotFoundError
from msgindex.storage import verify
from msgindex.storage.checkpoint import Checkpoint, IndexFileState, write_checkpoint
from msgindex.storage.durable import fsync_directory, temporary_path, write_atomically
from msgindex.storage.file_lock import try_lock, unlock
from msgindex.storage.hash_index import entry_sums
from msgindex.storage.hash_index.index_file import FIRST_INDEX, IndexFile, IndexHeader, parse_index_file_name
from msgindex.storage.log.metadata_log import LogPosition, MetadataLog
from msgindex.storage.manifest import (
    MANIFEST_FILE,
    SHARD_DIR_PREFIX,
    forget_shards,
    load_manifest,
    register_shard,
    shard_directories,
)
from msgindex.storage.message import decode_text
from msgindex.storage.reporting import first_line as _first_line
from msgindex.storage.settings import StoreSettings
from msgindex.storage.shard import (
    BACKFILL_MARKER,
    INDEX_DIR,
    LOCK_FILE,
    LOG_DIR,
    ShardReader,
    checkpoint_path,
    finish_interrupted_swap,
    has_data,
    open_log,
    read_committed,
)
from msgindex.storage.source_ranges import SourceRanges


@dataclass(frozen=True)
class ShardRepair:
    """What repair did (or would do, or refused to do) to one shard."""

    broker: str
    action: str
    details: tuple[str, ...] = ()
    refused: bool = False


@dataclass(frozen=True)
class RepairReport:
    """What `repair_store` did, shard by shard."""

    path: str
    shards: tuple[ShardRepair, ...] = field(default_factory=tuple)

    @property
    def refused(self) -> tuple[ShardRepair, ...]:
        return tuple(shard for shard in self.shards if shard.refused)

    def lines(self) -> list[str]:
        out = [f"{self.path}:"]
        for shard in self.shards:
            out.append(f"  broker={shard.broker}: {shard.action}")
            out += [f"    {detail}" for detail in shard.details]
        return out


def repair_store(root: str | os.PathLike, *, brokers: list[str] | None = None, forget_missing: bool = False,
                 dry_run: bool = False) -> RepairReport:
    """Repair the shards of the store at `root` (all, or `brokers`); see the module docstring."""
    root = Path(root)
    manifest_path = root / MANIFEST_FILE
    if not manifest_path.is_file():
        raise StoreNotFoundError(f"{root}: not a msgindex store (no {MANIFEST_FILE} in it)")
    manifest = load_manifest(manifest_path)
    present = shard_directories(root)
    listed = set(manifest.shards or ())
    wanted = sorted(set(present) | listed) if brokers is None else sorted(set(brokers))
    results = []
    for broker in wanted:
        directory = root / f"{SHARD_DIR_PREFIX}{broker}"
        if broker not in present:
            if broker not in listed:
                results.append(ShardRepair(broker, f"refused: no shard {broker!r} in the store", refused=True))
            elif forget_missing:
                if not dry_run:
                    forget_shards(root, {broker})
                results.append(ShardRepair(broker, "directory missing: removed from the store manifest (its "
                                                   "records are lost; a replay from Kafka indexes them again)"))
            else:
                results.append(ShardRepair(broker, "refused: directory missing but the store manifest lists it: "
                                                   "restore it from a backup, or pass --forget-missing to accept "
                                                   "the loss", refused=True))
            continue
        result = repair_shard(directory, broker, manifest.settings, dry_run=dry_run)
        if not result.refused and not dry_run and broker not in listed and (directory / "checkpoint").is_file():
            register_shard(root, broker)
            result = ShardRepair(result.broker, result.action, result.details + ("added to the store manifest",))
        results.append(result)
    return RepairReport(str(root), tuple(results))


def repair_shard(directory: Path, broker: str, settings: StoreSettings, *, dry_run: bool = False) -> ShardRepair:
    """Repair one shard under its writer lock (refused while a writer holds it)."""
    directory = Path(directory)
    fd = try_lock(directory / LOCK_FILE)
    if fd is None:
        return ShardRepair(broker, f"refused: {directory / LOCK_FILE} is held by a writer (stop the indexing job "
                                   f"first)", refused=True)
    try:
        if (directory / BACKFILL_MARKER).is_file():
            if dry_run:
                return ShardRepair(broker, "would finish swapping in the shard a backfill had rebuilt (it stopped midway)")
            finish_interrupted_swap(directory)
            return ShardRepair(broker, "finished swapping in the shard a backfill had rebuilt (it stopped midway)")
        if checkpoint_path(directory).is_dir() and not checkpoint_path(directory).is_symlink():
            return ShardRepair(broker, f"refused: {checkpoint_path(directory)} is a directory where the shard's "
                                       f"checkpoint belongs (not msgindex's: it is left alone); move it elsewhere and "
                                       f"repair again, which rebuilds the checkpoint from the shard's files",
                               refused=True)
        try:
            checkpoint = read_committed(directory, broker)
        except CorruptFileError as bad:
            return _rebuild(directory, broker, settings, dry_run, why=str(bad).split(";")[0])
        if checkpoint is None:
            if not has_data(directory):
                return ShardRepair(broker, "nothing committed (no checkpoint, no data): nothing to repair")
            return _rebuild(directory, broker, settings, dry_run, why=f"{checkpoint_path(directory)}: missing")
        try:
            rebuilt = _rebuild_index_files(directory, settings, checkpoint, dry_run)
        except ForeignCheckpointError as foreign:
            return _rebuild(directory, broker, settings, dry_run, why=_first_line(foreign).split(";")[0])
        if rebuilt and dry_run:
            return ShardRepair(broker, f"would rebuild {len(rebuilt)} hash index file(s) from the log", tuple(rebuilt))
        cleared = _clear_derived(directory, broker, settings, dry_run)
        if not rebuilt:
            return cleared
        action = f"rebuilt {len(rebuilt)} hash index file(s) from the log"
        if cleared.refused:
            return ShardRepair(broker, f"{action}, then {cleared.action}", tuple(rebuilt) + cleared.details, refused=True)
        return ShardRepair(broker, action, tuple(rebuilt) + (cleared.action,) + cleared.details)
    except MsgIndexError as error:
        return ShardRepair(broker, f"refused: {_first_line(error)}", refused=True)
    finally:
        unlock(fd)


def _clear_derived(directory: Path, broker: str, settings: StoreSettings, dry_run: bool) -> ShardRepair:
    with ShardReader(directory, broker, settings) as reader:
        problems = verify.verify_shard(reader.checkpoint, reader.log, reader.index_files())
    damage = [problem for problem in problems if not problem.harmless]
    if damage:
        return ShardRepair(broker, f"refused: committed files are damaged: {damage[0]}",
                           tuple(str(problem) for problem in damage[1:]), refused=True)
    if not problems:
        return ShardRepair(broker, "intact: nothing to repair")
    paths = sorted({problem.path for problem in problems})
    if not dry_run:
        for path in map(Path, paths):
            if path.is_dir() and not path.is_symlink():  # a directory where a derived file belongs
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    verb = "would remove" if dry_run else "removed"
    return ShardRepair(broker, f"{verb} {len(paths)} damaged derived file(s); readers and writers rebuild them",
                       tuple(paths))


# --- rebuilding hash index files -------------------------------------------------------------
def _rebuild_index_files(directory: Path, settings: StoreSettings, checkpoint: Checkpoint, dry_run: bool) -> list[str]:
    """Rebuild each committed hash index file that differs from what the log calls for (module
    docstring); write entry checksums for the others where theirs are not usable. Returns a line
    per file rebuilt. CorruptFileError when the log itself cannot say (damaged, or a file indexes
    records retention deleted)."""
    if checkpoint.log_position is None:
        return []
    index_dir = directory / INDEX_DIR
    if not index_dir.is_dir() and (index_dir.exists() or index_dir.is_symlink()):
        raise CorruptFileError(f"{index_dir}: is not a directory: the shard's hash index files belong there; move it "
                               f"elsewhere, then repair rebuilds them from the log")
    if not index_dir.exists() and not dry_run and checkpoint.index_files:
        index_dir.mkdir()  # every hash index file is lost: each is rebuilt below
    log = open_log(directory, settings, writable=False, committed=checkpoint.log_position,
                   retained_from=checkpoint.log_start_seq)
    rebuilt: list[str] = []
    try:
        verify.check_log_covers(log, checkpoint)
        stream = verify.ExpectedEntries(log, checkpoint)
        previous: IndexFileState | None = None
        for state in checkpoint.index_files:
            path = directory / INDEX_DIR / state.name
            why = _rebuild_one(path, state, previous, checkpoint, settings, stream, dry_run)
            if why is not None:
                rebuilt.append(f"{path}: {why}")
            previous = state
    except BaseException:
        for state in checkpoint.index_files:
            temporary_path(directory / INDEX_DIR / state.name).unlink(missing_ok=True)
        raise
    finally:
        log.close()
    return rebuilt


def _rebuild_one(path: Path, state: IndexFileState, previous: IndexFileState | None, checkpoint: Checkpoint,
                 settings: StoreSettings, stream: verify.ExpectedEntries, dry_run: bool) -> str | None:
    """Rebuild one file if it needs it: why it did (None: it did not)."""
    entries = state.index_count - FIRST_INDEX
    on_disk = _open_if_sized(path, settings)
    staging = None
    try:
        below = 0
        if state.header.begin_phy_offset < checkpoint.log_start_seq and entries:
            # retention deleted records this file indexes: it cannot be made again, only checked
            if on_disk is None:
                raise CorruptFileError(f"{path}: hash index file is missing or unreadable and indexes records "
                                       f"retention deleted: it cannot be rebuilt from the log; restore it")
            phys = on_disk.entry_array()[FIRST_INDEX : state.index_count]["phy_offset"].astype(np.int64)
            below = int(np.count_nonzero(phys < checkpoint.log_start_seq))
        expected = stream.take(entries - below)
        if expected.hashes.size != entries - below:
            raise CorruptFileError(f"{path}: the committed log calls for {expected.hashes.size} more hash index "
                                   f"entries, the checkpoint commits {entries - below} in this file")
        if below:
            return None  # only checkable (verify_shard reports what differs)
        staging = _build_beside(path, settings, _inherited_end(previous, checkpoint, path), expected, state)
        if on_disk is not None and _same_committed_bytes(on_disk, staging, state):
            staging.close()
            temporary_path(path).unlink()
            right = entry_sums.build(on_disk, state.index_count, entry_sums.chunk_crcs(on_disk, 0, state.index_count))
            sums = entry_sums.sums_path(path)
            if not dry_run and (not sums.is_file() or sums.read_bytes() != right):
                _remove_derived_directory(sums)
                write_atomically(sums, right)  # its entries are the log's: vouched for
            return None
        why = "missing or of the wrong size" if on_disk is None else "its committed bytes differ from the log's"
    finally:
        if on_disk is not None:
            on_disk.close()
        if staging is not None:
            staging.close()
    if dry_run:
        temporary_path(path).unlink(missing_ok=True)
        return f"would be rebuilt ({why})"
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    os.replace(temporary_path(path), path)
    fsync_directory(path.parent)
    _remove_derived_directory(entry_sums.sums_path(path))
    with IndexFile.open(path, settings.hash_slot_num, settings.index_num, read_only=True) as rebuilt:
        entry_sums.write_all(rebuilt, state.index_count)
    return f"rebuilt ({why}): byte for byte what its writer wrote"


def _remove_derived_directory(path: Path) -> None:
    """A directory where a derived file belongs goes (as ``_clear_derived`` removes it)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)


def _open_if_sized(path: Path, settings: StoreSettings) -> IndexFile | None:
    try:
        return IndexFile.open(path, settings.hash_slot_num, settings.index_num, read_only=True)
    except (OSError, CorruptFileError):
        return None


def _inherited_end(previous: IndexFileState | None, checkpoint: Checkpoint, path: Path) -> tuple[int, int]:
    """(endPhyOffset, endTimestamp) the file inherited from the full file before it when it was
    created (RocketMQ's constructor; its first put's timeDiff is taken against that time)."""
    if previous is not None:
        return previous.header.end_phy_offset, previous.header.end_timestamp
    if checkpoint.log_start_seq == 0:
        return 0, 0
    raise CorruptFileError(f"{path}: the hash index file before it was deleted by retention, and with it the begin "
                           f"time this file's first entry is relative to: it cannot be rebuilt; restore it")


def _build_beside(path: Path, settings: StoreSettings, inherited: tuple[int, int], expected,
                  state: IndexFileState) -> IndexFile:
    """The file as its writer wrote it, from the log's `expected` entries, at
    ``temporary_path(path)`` (its header checked against the commit)."""
    staging = temporary_path(path)
    staging.unlink(missing_ok=True)
    index_file = IndexFile.create(staging, settings.hash_slot_num, settings.index_num, end_phy_offset=inherited[0],
                                  end_timestamp=inherited[1])
    try:
        index_file.put_hashes(expected.hashes, expected.phys, expected.stamps)
        if index_file.header != state.header:
            raise CorruptFileError(f"{path}: rebuilt from the log, its header would be {index_file.header}, not the "
                                   f"committed {state.header}: the checkpoint and the log disagree; nothing was replaced")
        index_file.flush()
    except BaseException:
        index_file.close()
        staging.unlink(missing_ok=True)
        raise
    return index_file


def _same_committed_bytes(on_disk: IndexFile, rebuilt: IndexFile, state: IndexFileState) -> bool:
    """Whether `on_disk` holds the committed bytes `rebuilt` holds: everything, or (a writer died
    past the commit: its next lock holder rolls that back) the committed entries."""
    count = state.index_count
    if len(on_disk.entry_array()) < count:
        return False
    same_entries = np.array_equal(on_disk.entry_array()[:count], rebuilt.entry_array()[:count])
    if on_disk.header == state.header:
        return same_entries and np.array_equal(on_disk.slot_array(), rebuilt.slot_array())
    return same_entries and on_disk.index_count > count


# --- rebuilding a checkpoint -----------------------------------------------------------------
@dataclass(frozen=True)
class _Batch:
    """One batch of the log as found on disk."""

    base_seq: int
    next_seq: int
    segment_base: int
    end_position: int  # byte offset in its segment just past the batch
    min_timestamp: int
    max_timestamp: int
    annotation: bytes


def _rebuild(directory: Path, broker: str, settings: StoreSettings, dry_run: bool, *, why: str) -> ShardRepair:
    log = _recovered_log(directory, settings)
    files: list[tuple[Path, IndexFile]] = []
    try:
        batches = _batches(log)
        for path in sorted(p for p in (directory / INDEX_DIR).iterdir() if parse_index_file_name(p.name) is not None):
            if not path.is_file():
                raise CorruptFileError(f"{path}: is not a file")
            files.append((path, IndexFile.open(path, settings.hash_slot_num, settings.index_num, read_only=True)))
        log_start = log.start_seq
        plan = _plan(directory, batches, log_start, files, log)
    finally:
        log.close()
        for _, index_file in files:
            index_file.close()
    candidate = plan.checkpoint
    _verify_candidate(directory, broker, settings, candidate)
    if not dry_run:
        write_checkpoint(checkpoint_path(directory), candidate)
    details = [
        f"because {why}",
        f"records {candidate.log_start_seq}..{candidate.record_count - 1} committed "
        f"({candidate.record_count - candidate.log_start_seq:,} records, topics {', '.join(candidate.topics) or '-'})"
        if candidate.record_count > candidate.log_start_seq else "no records committed",
        f"{len(candidate.index_files)} hash index file(s): "
        + (", ".join(f"{s.name} ({s.index_count - FIRST_INDEX} entries)" for s in candidate.index_files) or "-"),
        f"source offsets: {ranges_text(candidate.source_ranges)}",
        *plan.notes,
    ]
    action = "checkpoint would be rebuilt (dry run)" if dry_run else "checkpoint rebuilt from the shard's files"
    return ShardRepair(broker, action, tuple(details))


def _recovered_log(directory: Path, settings: StoreSettings) -> MetadataLog:
    """The log as its files hold it (read-only): every valid batch, a torn tail left out."""
    return open_log(directory, settings, writable=False, committed=None)


def _batches(log: MetadataLog) -> list[_Batch]:
    """Every batch of the log in order, each one's checksum and body verified."""
    found = []
    for info in log.segments():
        segment = log.segment(info.base_seq)
        directory = segment.batches()
        for i in range(len(directory)):
            segment.decode(i, directory)  # checksum and body
            found.append(_Batch(int(directory.base_seqs[i]), int(directory.base_seqs[i] + directory.counts[i]),
                                info.base_seq, int(directory.positions[i] + directory.lengths[i]),
                                int(directory.min_timestamps[i]), int(directory.max_timestamps[i]),
                                segment.annotation(i)))
    return found


@dataclass(frozen=True)
class _Plan:
    checkpoint: Checkpoint
    notes: tuple[str, ...]


def _plan(directory: Path, batches: list[_Batch], log_start: int, files: list[tuple[Path, IndexFile]],
          log: MetadataLog) -> _Plan:
    """The checkpoint the files support (module docstring)."""
    notes: list[str] = []
    if not batches:
        position = LogPosition(log_start, log_start, 0) if log.segments() else LogPosition.initial()
        if any(index_file.entry_count for _, index_file in files):
            raise CorruptFileError(f"{directory / INDEX_DIR}: hash index entries but no records in the log: cannot "
                                   f"rebuild safely")
        return _Plan(Checkpoint(log_position=position, log_start_seq=log_start, record_count=log_start),
                     ("the log holds no records",))
    ends = [n for n, batch in enumerate(batches) if batch.annotation]
    if not ends:
        raise CorruptFileError(f"{directory / LOG_DIR}: no log batch carries a commit note (the log was written before "
                               f"msgindex recorded source offsets in it): the checkpoint cannot be rebuilt safely; "
                               f"re-index into a new path")
    # the entries each annotated append calls for, cumulated from the log's start
    stream = verify.ExpectedEntries(log, Checkpoint(log_start_seq=log_start, record_count=batches[-1].next_seq))
    wanted_at: list[int] = []
    for n in ends:
        wanted_at.append((wanted_at[-1] if wanted_at else 0) + stream.count_before(batches[n].next_seq))
    on_disk = _entries_pointing_from(files, log_start)
    kept = max((k for k, want in enumerate(wanted_at) if want <= on_disk), default=-1)
    # A writer dies in at most one append (the next one rolls it back before appending): only the
    # last append may lack entries. Anything more is damage, and rebuilding would drop committed data.
    if kept < len(ends) - 2:
        missing = wanted_at[kept + 1] - on_disk if kept + 1 < len(wanted_at) else 0
        raise CorruptFileError(
            f"{directory / INDEX_DIR}: the hash index files hold {on_disk} entries; the committed records need "
            f"{wanted_at[-1]} ({missing} missing before the last append): they are damaged, so the checkpoint "
            f"cannot be rebuilt safely")
    last = batches[ends[kept]]
    if last.next_seq < batches[-1].next_seq:
        notes.append(f"records {last.next_seq}..{batches[-1].next_seq - 1} follow the last complete append (a writer "
                     f"died writing them: never committed); the next writer removes them and the indexing job "
                     f"indexes their source offsets again")
    try:
        ranges = SourceRanges.from_json(json.loads(last.annotation.decode("ascii")),
                                        source=f"{directory / LOG_DIR} annotation of the batch at seq {last.base_seq}")
    except (UnicodeDecodeError, ValueError) as bad:
        raise CorruptFileError(f"{directory / LOG_DIR}: the commit note of the batch at seq {last.base_seq} is not "
                               f"source offsets ({bad}): cannot rebuild safely") from None
    states = _index_states(files, log_start, wanted_at[kept], log, last.next_seq)
    listed = {state.name for state in states}
    for path, _ in files:
        if path.name not in listed:
            notes.append(f"{path.name}: holds nothing the kept records need: the next writer removes it")
    segment_batches = [b for b in batches[: ends[kept] + 1] if b.segment_base == last.segment_base]
    position = _position(log, last, segment_batches)
    return _Plan(Checkpoint(
        log_position=position,
        log_start_seq=log_start,
        index_files=tuple(states),
        topics=_topics(log, log_start, last.next_seq),
        record_count=last.next_seq,
        source_ranges=ranges,
    ), tuple(notes))


def _entries_pointing_from(files: list[tuple[Path, IndexFile]], log_start: int) -> int:
    """Entries of the files (by their headers) that point at log_start or later."""
    total = 0
    for _, index_file in files:
        phys = index_file.entry_array()[FIRST_INDEX:]["phy_offset"].astype(np.int64)
        total += int(np.count_nonzero(phys >= log_start))
    return total


def _index_states(files: list[tuple[Path, IndexFile]], log_start: int, entries: int, log: MetadataLog,
                  end_seq: int) -> list[IndexFileState]:
    """The committed state of each file holding some of the first `entries` entries at or past
    log_start (headers as a writer had them after that many puts)."""
    stream = verify.ExpectedEntries(log, Checkpoint(log_start_seq=log_start, record_count=end_seq))
    states = []
    left = entries
    for path, index_file in files:
        if left <= 0:
            break
        rows = index_file.entry_array()[FIRST_INDEX:]
        phys = rows["phy_offset"].astype(np.int64)
        below = int(np.count_nonzero(phys < log_start))
        if below == phys.size:
            continue  # stranded by retention: the next writer deletes it
        mine = min(phys.size - below, left)
        left -= mine
        count = FIRST_INDEX + below + mine
        expected = stream.take(mine)
        header = index_file.header
        hashes = rows["key_hash"][: count - FIRST_INDEX].astype(np.int64)
        begin_ts, begin_phy = header.begin_timestamp, header.begin_phy_offset
        if below == 0:
            begin_ts, begin_phy = int(expected.stamps[0]), int(expected.phys[0])
        committed = IndexHeader(begin_ts, int(expected.stamps[-1]), begin_phy, int(expected.phys[-1]),
                                int(np.unique(hashes % index_file.hash_slot_num).size), count)
        states.append(IndexFileState(path.name, committed, int(expected.stamps.min()), int(expected.stamps.max())))
    return states


def _position(log: MetadataLog, last: _Batch, segment_batches: list[_Batch]) -> LogPosition:
    """The committed log position ending with `last` (its segment the active one then), with
    the sparse index entry counts the index rule gives those batches."""
    low = min(b.min_timestamp for b in segment_batches)
    high = max(b.max_timestamp for b in segment_batches)
    probe = LogPosition(last.next_seq, last.segment_base, last.end_position, 0, 0, low, high)
    view = MetadataLog.open(log.directory, segment_bytes=log.segment_bytes, index_interval_bytes=log.index_interval_bytes,
                            max_index_bytes=log.max_index_bytes, writable=False, committed=probe)
    try:
        offsets, times = view.segment(last.segment_base).rule_indexes()
        return LogPosition(last.next_seq, last.segment_base, last.end_position, offsets.entries, times.entries,
                           low, high)
    finally:
        view.close()


def _topics(log: MetadataLog, start: int, end: int) -> tuple[str, ...]:
    topics: set[bytes] = set()
    for batch in verify.decoded_batches(log, start, end):
        topics.update(pc.unique(batch.topic).to_pylist())
    return tuple(sorted(decode_text(topic) for topic in topics))


def _verify_candidate(directory: Path, broker: str, settings: StoreSettings, candidate: Checkpoint) -> None:
    """CorruptFileError unless the shard, read at `candidate`, passes every check inspect makes."""
    files: list[tuple[IndexFileState, IndexFile]] = []
    log = None
    try:
        log = open_log(directory, settings, writable=False, committed=candidate.log_position)
        verify.check_log_covers(log, candidate)
        for n, state in enumerate(candidate.index_files):
            index_file = IndexFile.open(directory / INDEX_DIR / state.name, settings.hash_slot_num, settings.index_num,
                                        read_only=True)
            files.append((state, index_file))
            verify.check_index_file(index_file, state, active=n == len(candidate.index_files) - 1)
        damage = [str(p) for p in verify.verify_shard(candidate, log, files) if not p.harmless]
    except CorruptFileError as error:
        damage = [_first_line(error)]
    finally:
        if log is not None:
            log.close()
        for _, index_file in files:
            index_file.close()
    if damage:
        raise CorruptFileError(f"the shard's files disagree with each other, so the checkpoint cannot be rebuilt "
                               f"safely (nothing was written): {damage[0]}")


def ranges_text(ranges: SourceRanges | None) -> str:
    """Source offset ranges for people: ``topic-partition [[first, end), ...]`` per partition."""
    if ranges is None or not ranges.ranges:
        return "none"
    parts = [f"{topic}-{partition} {list(map(list, intervals))}" for (topic, partition), intervals in
             sorted(ranges.ranges.items())]
    return "; ".join(parts[:6]) + (f"; ... ({len(parts) - 6} more partitions)" if len(parts) > 6 else "")
