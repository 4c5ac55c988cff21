"""What is in a msgindex file, shard or store, and what is wrong with it: the operator's tool (like
Kafka's DumpLogSegments).

`inspect_path(path)` recognises every file and directory of a store (``FILE_KINDS`` says what
each is): the store root (has msgindex.json), its manifest and lock, a shard (a ``broker=<name>``
directory or one holding a checkpoint), a shard's checkpoint, lock and interrupted-commit
leftovers, its ``log/`` and ``index/`` directories, a metadata-log segment (``.log``; its
``.index`` / ``.timeindex`` / ``.summary`` lead to it), a hash index file and its hash runs, and
the indexing job's own files; any other file outside a store is read as a RocketMQ index file. It
returns a JSON-able dict; `format_report` renders it for people. An object-store URL (s3://, gs://,
az://) is inspected by ``storage/objects/inspect.py`` (store, shard, version and chunk objects).

Stores and shards (and files inside them) are verified as deeply as ``verify.verify_shard``
goes, unless ``verify=False``: every problem found is listed under ``"problems"`` (the CLI prints
one line per problem and exits 2). A shard that cannot even be opened is one problem, and the
other shards are still inspected.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from msgindex.errors import CorruptFileError, InvalidOptionError, MsgIndexError
from msgindex.storage import fields, hot_keys
from msgindex.storage.checkpoint import CHECKPOINT_FILE
from msgindex.storage.durable import is_temporary
from msgindex.storage.hash_index import entry_sums, hash_run
from msgindex.storage.hash_index.index_file import (
    DEFAULT_HASH_SLOT_NUM,
    DEFAULT_INDEX_NUM,
    FIRST_INDEX,
    TIME_DIFF_UNIT_MS,
    IndexFile,
    check_sizing,
    parse_index_file_name,
)
from msgindex.storage.location import is_object_store_url, parse_location
from msgindex.storage.log.batch_format import LOG_FORMAT
from msgindex.storage.log.metadata_log import LogPosition, MetadataLog, SegmentInfo
from msgindex.storage.log.segment import INDEX_SUFFIX, LOG_SUFFIX, SUMMARY_SUFFIX, TIME_INDEX_SUFFIX, parse_segment_name
from msgindex.storage.log.segment_summary import SegmentSummary
from msgindex.storage.maintenance.disk_usage import DiskUsage, disk_usage
from msgindex.storage.manifest import MANIFEST_LOCK, load_manifest, shard_directories
from msgindex.storage.message import arrow_text, decode_text
from msgindex.storage.objects.inspect import inspect_url
from msgindex.storage.partition_brokers import FILE_NAME as PARTITION_BROKERS_FILE
from msgindex.storage.partition_brokers import read_partition_brokers
from msgindex.storage.reporting import first_line as _first_line
from msgindex.storage.reporting import time_range as _time_range
from msgindex.storage.settings import StoreSettings
from msgindex.storage.shard import (
    INDEX_DIR,
    LOCK_FILE,
    LOG_DIR,
    SHARD_DIR_PREFIX,
    ShardReader,
    open_log,
    read_committed,
)
from msgindex.storage.store import MANIFEST_FILE, open_store
from msgindex.storage.verify import Problem, verify_shard

SPARSE_INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
# Every file and directory a store holds, by name, with what it is and whether it may be deleted
# (README "How it stores" says the same for operators). The indexing job's own files are named
# here without importing the job's code (storage imports nothing above it).
FILE_KINDS = {
    MANIFEST_FILE: "store manifest: format version, settings and the list of shards (never delete)",
    MANIFEST_LOCK: "lock file: held while a writer adds its shard to the manifest (holds no data)",
    CHECKPOINT_FILE: "shard checkpoint: the commit point; what is committed and which source offsets the shard "
                     "holds (never delete; `msgindex repair` rebuilds a lost one from the shard's files)",
    LOCK_FILE: "shard writer lock file: flock'ed by the shard's one writer (holds no data)",
    "pipeline.lock": "indexing job's lock: held by the driver of the job writing this index (holds no data)",
    "pipeline-owner.json": "indexing job's owner note: host, pid and query of the job holding pipeline.lock "
                           "(informational)",
    PARTITION_BROKERS_FILE: "indexing job's partition-to-shard map: which shard each Kafka partition goes to "
                              "(never delete while the job runs: a replay must write the same shard)",
    "_batches.jsonl": "indexing job's per-batch counts, one JSON line per micro-batch (informational)",
    "_quarantine": "indexing job's quarantine: input records set aside with their reasons (JSON lines)",
}
# What each kind of report is about, for people (the "is" line of every report).
KIND_DESCRIPTIONS = {
    "store": "msgindex store: a manifest and one shard directory per broker (never delete anything in it by hand)",
    "shard": "shard of one broker: its checkpoint, metadata log (log/) and hash index files (index/)",
    "log_segment": "metadata-log segment: checksummed batches of message metadata, the data every answer is read "
                   "from (never delete a committed one; retention drops the oldest)",
    "offset_index": "sparse offset index of a log segment (Kafka's rule): a derived hint that finds batches by seq; "
                    "readers rebuild it in memory when it is wrong, writers rewrite it",
    "time_index": "sparse time index of a log segment (Kafka's rule): a derived hint for time windows; a scan never "
                  "trusts it alone (batch headers decide), writers rewrite it",
    "segment_summary": "summary of a sealed log segment (seq range, size, time range): derived, recomputed from the "
                       "segment when missing or wrong",
    "hot_key_copy": "hot-key copy of a stretch of the log: the rows of its hottest keys, sorted for fast reading; "
                    "derived (lookups ignore a damaged one and read the log), deleting it changes no answer",
    "index_file": "hash index file (RocketMQ IndexFile format): the key -> seq index of the shard; never delete a "
                  "committed one (`msgindex repair` rebuilds a damaged or lost one from the log while the log still "
                  "holds every record it indexes)",
    "entry_sums": "entry checksums of a hash index file: a CRC-32 per chunk of its committed entries, checked by "
                  "lookups the first time they touch a chunk; derived (without it lookups check the shape of hash "
                  "chains only; `msgindex repair` writes it again)",
}
SEGMENT_FILE_KINDS = {INDEX_SUFFIX: "offset_index", TIME_INDEX_SUFFIX: "time_index", SUMMARY_SUFFIX: "segment_summary"}
DIRECTORY_KINDS = {"_quarantine"}  # the names of FILE_KINDS that are directories (the others are files)
# chain-length histogram buckets (upper bounds, inclusive); the last bucket is open-ended
CHAIN_BUCKETS = (1, 2, 3, 4, 8, 16, 64)
LISTED_ENTRIES = 40  # sparse index entries shown per index of a segment


def inspect_path(path: str | os.PathLike, *, hash_slot_num: int | None = None, index_num: int | None = None,
                 verify: bool = True, storage_options: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A summary of whatever `path` is (see the module docstring), with its problems; an
    object-store URL (with its `storage_options`) is inspected by ``storage/objects/inspect.py``."""
    if is_object_store_url(path):
        return inspect_url(str(path), storage_options, verify=verify)
    path = parse_location(path, storage_options).local_path
    if not path.exists() and not path.is_symlink():
        raise InvalidOptionError(f"{path}: no such file or directory")
    name = path.name
    if path.is_dir():
        if (path / MANIFEST_FILE).exists():
            return inspect_store(path, verify=verify)
        if name.startswith(SHARD_DIR_PREFIX) or (path / CHECKPOINT_FILE).exists():
            return inspect_shard(path, _settings_near(path), verify=verify)
        if name in (LOG_DIR, INDEX_DIR) and _is_shard(path.parent):
            return _inspect_shard_part(path, verify)
        if name == hot_keys.DIRECTORY and _is_shard(path.parent):
            return {"kind": "hot_keys_directory", "path": str(path), "is": KIND_DESCRIPTIONS["hot_key_copy"],
                    "copies": [entry.name for _, _, entry in hot_keys.stretches(path)]}
        if name in FILE_KINDS:
            report = {"kind": "directory", "path": str(path), "is": FILE_KINDS[name]}
            if name not in DIRECTORY_KINDS:
                report["problems"] = [f"{path}: is a directory, but a store keeps a file of this name here"]
            return report
        if shard_directories(path):
            open_store(path)  # raises: names the missing manifest
        raise InvalidOptionError(f"{path}: a directory that is neither a msgindex store nor a shard")
    in_shard = _shard_of(path)
    if name in FILE_KINDS and not (name == CHECKPOINT_FILE and in_shard is None):
        return _inspect_named_file(path, verify)
    if is_temporary(name):
        return {"kind": "temporary", "path": str(path),
                "is": "an interrupted atomic write (temporary file): never real; the next writer removes it"}
    if path.suffix == LOG_SUFFIX or path.suffix in SPARSE_INDEX_SUFFIXES or path.suffix == SUMMARY_SUFFIX:
        if parse_segment_name(name) is not None:
            return inspect_segment(path.with_suffix(LOG_SUFFIX), _settings_near(path), verify=verify, asked=path)
    if name.endswith(hash_run.SUFFIX) and in_shard is not None:
        return _inspect_hash_run(path, in_shard, verify)
    if name.endswith(entry_sums.SUFFIX) and in_shard is not None:
        covered, chunk_entries = entry_sums.claimed_by(path.with_name(name[: -len(entry_sums.SUFFIX)]))
        report = {"kind": "entry_sums", "path": str(path), "is": KIND_DESCRIPTIONS["entry_sums"],
                  "covers_entries": covered or None, "chunk_entries": chunk_entries or None}
        if verify:
            report["problems"] = [p for p in _shard_problems(in_shard, _settings_near(in_shard))
                                  if p.startswith(str(path))]
        return report
    if hot_keys.parse_copy_name(name) is not None and in_shard is not None:
        return _inspect_hot_key_copy(path, in_shard, verify)
    settings = _settings_near(path)
    if in_shard is not None and path.parent.name == INDEX_DIR and parse_index_file_name(name) is not None:
        return _inspect_index_file_in_shard(path, in_shard, settings, verify)
    if settings is not None:
        raise InvalidOptionError(f"{path}: not a file msgindex writes (inside the store {_store_root(path)})")
    if hash_slot_num is None:
        hash_slot_num = DEFAULT_HASH_SLOT_NUM
    if index_num is None:
        index_num = DEFAULT_INDEX_NUM
    return inspect_index_file(path, hash_slot_num=hash_slot_num, index_num=index_num)


def _is_shard(directory: Path) -> bool:
    return directory.name.startswith(SHARD_DIR_PREFIX) or (directory / CHECKPOINT_FILE).exists()


def _shard_of(path: Path) -> Path | None:
    """The shard directory a file of a shard lies in (checkpoint, log/..., index/...), if any."""
    for parent in (path.parent, path.parent.parent):
        if _is_shard(parent) and (parent.parent / MANIFEST_FILE).exists():
            return parent
    return None


def _store_root(path: Path) -> Path | None:
    for parent in [path, *path.parents][:4]:
        if (parent / MANIFEST_FILE).is_file():
            return parent
    return None


def _inspect_named_file(path: Path, verify: bool) -> dict[str, Any]:
    """A store file known by its name: the manifest and checkpoints are read and validated."""
    report: dict[str, Any] = {"kind": "file", "path": str(path), "is": FILE_KINDS[path.name]}
    if path.name == MANIFEST_FILE:
        manifest = load_manifest(path)
        report.update(kind="manifest", version=manifest.version, settings=manifest.settings.to_dict(),
                      shards=None if manifest.shards is None else list(manifest.shards))
        if verify:  # the shards it lists must be there
            report["problems"] = [f"{path.parent / (SHARD_DIR_PREFIX + name)}: shard directory missing, but the "
                                  f"store manifest {path} lists it" for name in open_store(path.parent).missing_shards()]
    elif path.name == PARTITION_BROKERS_FILE:
        report["problems"] = _partition_brokers_problems(path, report)
    elif path.name == CHECKPOINT_FILE:
        shard = path.parent
        checkpoint = read_committed(shard, _broker_of(shard))
        report.update(kind="checkpoint", broker=_broker_of(shard), **_checkpoint_summary(checkpoint))
        if verify:
            report["problems"] = _shard_problems(shard, _settings_near(shard))
    return report


def _partition_brokers_problems(path: Path, report: dict[str, Any]) -> list[str]:
    """Read the indexing job's partition -> shard map into `report`; its problems (the job refuses
    a damaged one: a replay could otherwise put a partition's records into another shard)."""
    try:
        brokers = read_partition_brokers(path)
    except CorruptFileError as error:
        return [f"{_first_line(error)} (the indexing job refuses to start: restore it from a backup)"]
    report.update(kind="partition_brokers", partitions=len(brokers), shards=sorted(set(brokers.values())))
    return []


def _checkpoint_summary(checkpoint) -> dict[str, Any]:
    return {
        "records": checkpoint.record_count - checkpoint.log_start_seq,
        "log_start_seq": checkpoint.log_start_seq,
        "next_seq": checkpoint.record_count,
        "log_position": None if checkpoint.log_position is None else checkpoint.log_position.to_dict(),
        "topics": list(checkpoint.topics),
        "source_ranges": None if checkpoint.source_ranges is None else checkpoint.source_ranges.to_json(),
        "fields": checkpoint.extra.get(fields.EXTRA_MEMBER, {}),  # definitions and coverage (fields.py)
        "index_files": [{"name": state.name, "entries": state.index_count - FIRST_INDEX,
                         "time_range": _time_range(state.min_timestamp_ms, state.max_timestamp_ms),
                         "header": dataclasses.asdict(state.header)} for state in checkpoint.index_files],
    }


def _broker_of(shard: Path) -> str:
    return shard.name[len(SHARD_DIR_PREFIX):] if shard.name.startswith(SHARD_DIR_PREFIX) else shard.name


def _inspect_shard_part(directory: Path, verify: bool) -> dict[str, Any]:
    """A shard's log/ or index/ directory: what the shard says about it."""
    shard = inspect_shard(directory.parent, _settings_near(directory), verify=verify)
    part = {"kind": f"{directory.name}_directory", "path": str(directory), "shard": shard["path"]}
    part["is"] = ("the shard's metadata log: segments and their sparse indexes" if directory.name == LOG_DIR
                  else "the shard's hash index files (RocketMQ IndexFile format) and their hash runs")
    part.update({key: shard[key] for key in ("segments" if directory.name == LOG_DIR else "index_files",)
                 if key in shard})
    if shard.get("problems"):
        part["problems"] = shard["problems"]
    return part


def _inspect_index_file_in_shard(path: Path, shard: Path, settings: StoreSettings | None,
                                 verify: bool) -> dict[str, Any]:
    """A hash index file of a shard: its summary, what the checkpoint committed of it, and its
    problems (the shard verified, this file's problems kept)."""
    settings = settings or StoreSettings()
    report = inspect_index_file(path, hash_slot_num=settings.hash_slot_num, index_num=settings.index_num)
    checkpoint = read_committed(shard, _broker_of(shard))
    states = {state.name: state for state in (checkpoint.index_files if checkpoint else ())}
    state = states.get(path.name)
    report["committed"] = None if state is None else {"entries": state.index_count - FIRST_INDEX,
                                                      "header": dataclasses.asdict(state.header)}
    if state is None:
        report["note"] = "not listed by the shard checkpoint: left by a batch that never committed (the next writer removes it)"
    if verify:
        report["problems"] = [p for p in _shard_problems(shard, settings) if p.startswith(str(path))]
    return report


def _inspect_hot_key_copy(path: Path, shard: Path, verify: bool) -> dict[str, Any]:
    """A hot-key copy: its stretch and groups, and (verify) whether lookups may use it."""
    report: dict[str, Any] = {"kind": "hot_key_copy", "path": str(path), "is": KIND_DESCRIPTIONS["hot_key_copy"]}
    try:
        copy = hot_keys.HotKeyCopy.open(path)
    except CorruptFileError as error:
        report["problems"] = [f"{error} (lookups ignore it)"]
        return report
    report.update(start_seq=copy.start_seq, end_seq=copy.end_seq,
                  groups=[{"key": arrow_text(decode_text(key)), "rows": group.rows, "bytes": group.length}
                          for key, group in copy.groups.items()])
    if verify:
        report["problems"] = [p for p in _shard_problems(shard, _settings_near(shard)) if p.startswith(str(path))]
    return report


def _inspect_hash_run(path: Path, shard: Path, verify: bool) -> dict[str, Any]:
    """A hash run (derived sidecar of a hash index file)."""
    report: dict[str, Any] = {"kind": "hash_run", "path": str(path),
                              "is": "hash run: a derived sidecar of a hash index file that lets lookups of hot keys "
                                    "skip their chains (safe to delete: lookups then walk or scan)"}
    try:
        raw = path.read_bytes()[: hash_run.HEADER_SIZE]
        fields = hash_run.HEADER_STRUCT.unpack(raw) if len(raw) == hash_run.HEADER_SIZE else None
    except OSError as error:
        raise CorruptFileError(f"{path}: cannot read ({error.strerror})") from None
    if fields is None or fields[0] != hash_run.MAGIC:
        report["problems"] = [str(Problem(str(path), "not a hash run (bad magic or too short): lookups ignore it",
                                          harmless=True))]
        return report
    report.update(hash_slot_num=fields[2], index_num=fields[3], entries=[fields[4], fields[5]], rows=fields[8])
    if verify:
        report["problems"] = [p for p in _shard_problems(shard, _settings_near(shard)) if p.startswith(str(path))]
    return report


def _shard_problems(shard: Path, settings: StoreSettings | None) -> list[str]:
    """Every problem of the shard (an unopenable shard: that one problem)."""
    try:
        with ShardReader(shard, _broker_of(shard), settings or StoreSettings(),
                         registered=_registered(shard)) as reader:
            return [str(problem) for problem in verify_shard(reader.checkpoint, reader.log, reader.index_files())]
    except MsgIndexError as error:
        return [_first_line(error)]


def _registered(shard: Path) -> bool:
    manifest = shard.parent / MANIFEST_FILE
    try:
        shards = load_manifest(manifest).shards if manifest.is_file() else None
    except MsgIndexError:
        return False
    return shards is not None and _broker_of(shard) in shards


# --- one RocketMQ index file ---------------------------------------------------------------------
def inspect_index_file(path: Path, *, hash_slot_num: int = DEFAULT_HASH_SLOT_NUM,
                       index_num: int = DEFAULT_INDEX_NUM) -> dict[str, Any]:
    """Header, fill and hash-chain statistics of one index file."""
    path = Path(path)
    check_sizing(path, hash_slot_num, index_num)
    full = IndexFile.file_size(hash_slot_num, index_num)
    info = path.stat()
    try:
        IndexFile.capacity_of(info.st_size, hash_slot_num, index_num, path)
    except CorruptFileError as bad:
        raise CorruptFileError(f"{bad}; pass the file's real sizing (--hash-slots, --index-num) or the file is "
                               f"damaged") from None
    with IndexFile.open(path, hash_slot_num, index_num, read_only=True) as index_file:
        index_file.follow_growth()  # a writer may be ahead of the length just read
        if index_file.index_count > index_file.capacity:
            raise CorruptFileError(
                f"{path}: header counts {index_file.entry_count} entries, but the file ({info.st_size} bytes) has room "
                f"for {max(index_file.capacity - FIRST_INDEX, 0)}: truncated, or opened with the wrong sizing (pass "
                f"the file's real sizing: --hash-slots, --index-num)")
        header = index_file.header
        slots = index_file.slot_array()
        entries = index_file.entry_array()[FIRST_INDEX:]
        used_slots = int(np.count_nonzero((slots > 0) & (slots < header.index_count)))
        chain_lengths = np.bincount(entries["key_hash"].astype(np.int64) % hash_slot_num, minlength=0)
        chain_lengths = chain_lengths[chain_lengths > 0]
        entry_times = header.begin_timestamp + entries["time_diff"].astype(np.int64) * TIME_DIFF_UNIT_MS
        report = {
            "kind": "index_file",
            "path": str(path),
            "is": KIND_DESCRIPTIONS["index_file"],
            "hash_slot_num": hash_slot_num,
            "index_num": index_num,
            "file_bytes": info.st_size,
            "allocated_bytes": info.st_blocks * 512,
            # msgindex grows a file ahead of its entries (RocketMQ's is full size, sparse)
            "full_size_bytes": full,
            "room_for_entries": max(index_file.capacity - FIRST_INDEX, 0),
            "header": {name: getattr(header, name) for name in header.__dataclass_fields__},
            "entries": int(entries.size),
            "capacity": index_num - FIRST_INDEX,
            "full": index_file.is_full,
            "fill_ratio": entries.size / (index_num - FIRST_INDEX),
            # entries keep whole seconds since beginTimestamp: this range is second-granular
            "approx_time_range": _time_range(
                int(entry_times.min()) if entries.size else None, int(entry_times.max()) if entries.size else None
            ),
            "phy_offset_range": [int(entries["phy_offset"].min()), int(entries["phy_offset"].max())]
            if entries.size
            else None,
            "slots_used": used_slots,
            "slot_fill_ratio": used_slots / hash_slot_num,
            "chain_length": _chain_stats(chain_lengths),
        }
        del slots, entries
    return report


def _chain_stats(lengths: np.ndarray) -> dict[str, Any]:
    if lengths.size == 0:
        return {"chains": 0}
    histogram: dict[str, int] = {}
    low = 1
    for high in CHAIN_BUCKETS:
        label = str(high) if low == high else f"{low}-{high}"
        histogram[label] = int(np.count_nonzero((lengths >= low) & (lengths <= high)))
        low = high + 1
    histogram[f">{CHAIN_BUCKETS[-1]}"] = int(np.count_nonzero(lengths > CHAIN_BUCKETS[-1]))
    return {
        "chains": int(lengths.size),
        "min": int(lengths.min()),
        "mean": float(lengths.mean()),
        "p50": float(np.percentile(lengths, 50)),
        "p99": float(np.percentile(lengths, 99)),
        "max": int(lengths.max()),
        "histogram": histogram,
    }


# --- one metadata-log segment --------------------------------------------------------------------
def inspect_segment(path: Path, settings: StoreSettings | None, *, verify: bool = True,
                    asked: Path | None = None) -> dict[str, Any]:
    """Records, time range and sparse index entries of one metadata-log segment (`asked`: the
    file of it the user named, e.g. its .timeindex, whose problems are the ones kept)."""
    path = Path(path)
    asked = path if asked is None else Path(asked)
    if not path.exists():
        raise CorruptFileError(f"{asked}: its log segment {path.name} does not exist" if asked != path
                               else f"{path}: no such log segment")
    if not path.is_file():
        raise CorruptFileError(f"{path}: is a directory, not a log segment")
    if path.parent.name != LOG_DIR:
        raise InvalidOptionError(f"{path}: a log segment must sit in a shard's {LOG_DIR}/ directory")
    shard = path.parent.parent
    log = open_log(shard, settings or StoreSettings(), writable=False, committed=_committed(path))
    try:
        for info in log.segments():
            if info.path.name == path.name:
                report = {"kind": "log_segment", "path": str(path), **_segment_summary(log, info, entries=True)}
                break
        else:
            raise InvalidOptionError(f"{path}: not a committed segment of the log in {path.parent}")
    finally:
        log.close()
    report["is"] = KIND_DESCRIPTIONS["log_segment"]
    if asked != path:
        report = {"kind": SEGMENT_FILE_KINDS[asked.suffix], "path": str(asked),
                  "is": KIND_DESCRIPTIONS[SEGMENT_FILE_KINDS[asked.suffix]], "segment": report}
    if asked.suffix == SUMMARY_SUFFIX:
        summary = SegmentSummary.read(asked)
        report["summary"] = None if summary is None else {
            "base_seq": summary.base_seq, "next_seq": summary.next_seq, "size_bytes": summary.size_bytes,
            "time_range": _time_range(summary.min_timestamp, summary.max_timestamp)}
    if verify and (shard / CHECKPOINT_FILE).exists():
        stem = str(path.with_suffix(""))
        # the segment's own problems, and those of other files that its damage causes (named in them)
        report["problems"] = [p for p in _shard_problems(shard, settings)
                              if p.startswith(stem + ".") or str(path.parent) + ":" in p or str(path) in p]
    return report


def _committed(segment_path: Path) -> LogPosition | None:
    """The committed log position of the shard a segment belongs to (None: recover from files)."""
    shard = segment_path.parent.parent
    checkpoint = read_committed(shard, _broker_of(shard))
    if checkpoint is None or checkpoint.log_position is None:
        return None
    return checkpoint.log_position


def _segment_summary(log: MetadataLog, info: SegmentInfo, *, entries: bool = False) -> dict[str, Any]:
    # MetadataLog lists segments but does not expose their sparse indexes: reach for its segments
    segment = log.segment(info.base_seq)
    batches = segment.batches()
    records = info.next_seq - info.base_seq
    summary = {
        "file": info.path.name,
        "log_format": LOG_FORMAT,
        "base_seq": info.base_seq,
        "next_seq": info.next_seq,
        "records": records,
        "batches": len(batches),
        "log_bytes": info.size_bytes,
        "bytes_per_record": round(info.size_bytes / records, 2) if records else None,
        "active": info.active,
        "time_range": _time_range(info.min_timestamp, info.max_timestamp),
        "offset_index_entries": segment.offset_index.entries,
        "time_index_entries": segment.time_index.entries,
    }
    if entries:
        # one line per batch: position, base seq, records, bytes, min and max timestamp (ms)
        summary["batch_list"] = _listed([
            [int(batches.positions[i]), int(batches.base_seqs[i]), int(batches.counts[i]), int(batches.lengths[i]),
             int(batches.min_timestamps[i]), int(batches.max_timestamps[i])] for i in range(len(batches))])
        annotation = log.last_annotation() if info.active else b""
        if annotation:
            summary["last_annotation"] = annotation.decode("utf-8", "backslashreplace")
        summary["offset_index"] = _listed([list(segment.offset_index.entry(n)) for n in range(segment.offset_index.entries)])
        summary["time_index"] = _listed([list(segment.time_index.entry(n)) for n in range(segment.time_index.entries)])
    return summary


def _listed(items: list[Any]) -> list[Any]:
    """All entries when few, else the first and last LISTED_ENTRIES // 2 around a marker."""
    if len(items) <= LISTED_ENTRIES:
        return items
    half = LISTED_ENTRIES // 2
    return [*items[:half], f"... {len(items) - 2 * half} more ...", *items[-half:]]


# --- a shard and a store -------------------------------------------------------------------------
def inspect_shard(directory: Path, settings: StoreSettings | None, *, verify: bool = True) -> dict[str, Any]:
    """The committed state of one shard: checkpoint, log segments, index files, problems."""
    directory = Path(directory)
    settings = settings or StoreSettings()
    broker = _broker_of(directory)
    checkpoint = read_committed(directory, broker)
    if checkpoint is None:
        # a reader says whether that is an empty shard or a lost checkpoint (data or manifest)
        ShardReader(directory, broker, settings, registered=_registered(directory)).close()
        return {"kind": "shard", "path": str(directory), "broker": broker, "source_ranges": None,
                "note": "no checkpoint: nothing committed"}
    with ShardReader(directory, broker, settings, registered=_registered(directory)) as reader:
        log = reader.log
        segments = [_segment_summary(log, info) for info in log.segments()] if log else []
        problems = [str(p) for p in verify_shard(reader.checkpoint, reader.log, reader.index_files())] if verify else []
    summary = _checkpoint_summary(checkpoint)
    index_files = [{key: item[key] for key in ("name", "entries", "time_range", "header")}
                   for item in summary["index_files"]]
    report = {
        "kind": "shard",
        "path": str(directory),
        "is": KIND_DESCRIPTIONS["shard"],
        "broker": broker,
        "source_ranges": summary["source_ranges"],
        "fields": summary["fields"],
        "records": summary["records"],
        "log_start_seq": checkpoint.log_start_seq,
        "next_seq": checkpoint.record_count,
        "topics": list(checkpoint.topics),
        "segments": segments,
        "index_files": index_files,
        **_usage(disk_usage(directory), summary["records"]),
    }
    if verify:
        report["problems"] = problems
    return report


def inspect_store(root: Path, *, verify: bool = True) -> dict[str, Any]:
    """The store's settings and a summary of every shard; a shard that cannot be read (or one
    the manifest lists that is gone) is a problem, and the others are still inspected."""
    with open_store(root) as store:
        problems = [f"{root / (SHARD_DIR_PREFIX + name)}: shard directory missing, but the store manifest lists it"
                    for name in store.missing_shards()]
        problems += _partition_brokers_problems(root / PARTITION_BROKERS_FILE, {})
        shards = []
        for broker in shard_directories(root):
            try:
                shard = inspect_shard(root / f"{SHARD_DIR_PREFIX}{broker}", store.settings, verify=verify)
            except MsgIndexError as error:
                shard = {"kind": "shard", "path": str(root / f"{SHARD_DIR_PREFIX}{broker}"), "broker": broker,
                         "problems": [_first_line(error)]}
            problems += shard.get("problems", [])
            shards.append(shard)
        return {
            "kind": "store",
            "path": str(root),
            "is": KIND_DESCRIPTIONS["store"],
            "settings": store.settings.to_dict(),
            "brokers": [shard["broker"] for shard in shards],
            "records": sum(shard.get("records", 0) for shard in shards),
            **_usage(disk_usage(root), sum(shard.get("records", 0) for shard in shards)),
            "shards": shards,
            **({"problems": problems} if verify or problems else {}),
        }


def problems_of(report: dict[str, Any]) -> list[str]:
    """Every problem a report found (a store's are collected from its shards)."""
    return list(report.get("problems") or ())


def _settings_near(path: Path) -> StoreSettings | None:
    """The settings of the store `path` lies in (file, log/, index/, shard dir), if any."""
    for parent in [path, *path.parents][:4]:
        if (parent / MANIFEST_FILE).is_file():
            return open_store(parent).settings
    return None


def _usage(usage: DiskUsage, records: int) -> dict[str, Any]:
    """What the files take on disk: in all (the larger of their lengths and their allocated
    blocks), and per kind and per record (``disk_usage``)."""
    by_kind = usage.report(records)
    return {
        "bytes": max(usage.apparent, usage.allocated),
        "bytes_per_record": {kind: row["bytes_per_record"] for kind, row in by_kind.items()},
        "disk_usage": {kind: {"files": row["files"], "bytes": row["apparent_bytes"],
                              "allocated_bytes": row["allocated_bytes"]} for kind, row in by_kind.items()},
    }


# --- rendering -----------------------------------------------------------------------------------
def format_report(report: dict[str, Any]) -> str:
    """`report` as indented `key: value` lines for people (nested dicts and lists indented)."""
    lines: list[str] = []
    _render(report, lines, 0)
    return "\n".join(lines)


def format_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=False, default=str)


def _render(value: Any, lines: list[str], depth: int) -> None:
    pad = "  " * depth
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, list) and item and not _nested(item):
                lines.append(f"{pad}{key}: {', '.join(map(_scalar, item))}")
            elif isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:")
                _render(item, lines, depth + 1)
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
    elif isinstance(value, list):
        for number, item in enumerate(value):
            if isinstance(item, list) and not _nested(item):  # e.g. a sparse index entry
                lines.append(f"{pad}- {', '.join(map(_scalar, item))}")
            elif isinstance(item, (dict, list)):
                lines.append(f"{pad}- [{number}]")
                _render(item, lines, depth + 1)
            else:
                lines.append(f"{pad}- {_scalar(item)}")


def _nested(items: list[Any]) -> bool:
    return any(isinstance(item, (dict, list)) for item in items)


def _scalar(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if value == [] or value == {}:
        return "(none)"
    return str(value)
