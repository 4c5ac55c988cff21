"""`msgindex upgrade PATH`: convert a store from format 1 (row-per-record metadata logs) to format 2
(compressed columnar record batches), in place, without ever losing committed data.

Only the metadata logs change: a record keeps its sequence number, so the hash index files (whose
entries point at seqs) and everything else in the checkpoint stay as they are. Per shard, under
the shard's writer lock:

1. build the new log beside the old one (``log.v2/``) from the old log's committed records
   (exact bytes of every text: lone surrogates survive);
2. verify it: every record read back from the new log equals the old one;
3. write ``upgrade`` (durable JSON): the checkpoint that names the new log;
4. swap: ``log/`` -> ``log.v1/``, ``log.v2/`` -> ``log/``, write that checkpoint, remove the
   marker, delete ``log.v1/``.

A crash before step 3 leaves the old shard intact (the partial ``log.v2/`` is deleted by the next
run); from step 3 on, the next run finishes the swap from the marker. The store manifest moves to
version 2 only when every shard is done, so until then this msgindex refuses the store (pointing
here) and the old one fails on the new segments' checksums: neither can misread it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgindex.errors import CorruptFileError, ShardLockedError, StoreNotFoundError
from msgindex.storage.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from msgindex.storage.durable import fsync_directory, parse_versioned_json, versioned_json, write_atomically
from msgindex.storage.file_lock import try_lock, unlock
from msgindex.storage.log import v1_records
from msgindex.storage.log.batch_format import LOG_FORMAT, DecodedRows
from msgindex.storage.log.columns import LogColumns
from msgindex.storage.log.metadata_log import LEGACY_LOG_FORMAT, LogPosition
from msgindex.storage.log.segment import LOG_SUFFIX, parse_segment_name
from msgindex.storage.manifest import load_manifest
from msgindex.storage.settings import StoreSettings
from msgindex.storage.shard import (
    LOCK_FILE,
    LOG_DIR,
    SHARD_DIR_PREFIX,
    checkpoint_path,
    has_data,
    missing_checkpoint_error,
    open_log,
)
from msgindex.storage.store import MANIFEST_FILE, STORE_FORMAT_VERSION, read_manifest, write_manifest

NEW_LOG_DIR = "log.v2"
OLD_LOG_DIR = "log.v1"
MARKER_FILE = "upgrade"
MARKER_FORMAT = "msgindex-shard-upgrade"
CHUNK_RECORDS = 262_144  # records converted (and verified) at a time: bounds memory


@dataclass(frozen=True)
class ShardUpgrade:
    """What the upgrade did to one shard."""

    broker: str
    action: str  # "converted", "finished an interrupted upgrade", "already format 2", "nothing committed"
    records: int = 0
    old_log_bytes: int = 0
    new_log_bytes: int = 0


@dataclass(frozen=True)
class UpgradeReport:
    """What `upgrade_store` did."""

    path: str
    from_version: int
    to_version: int
    shards: tuple[ShardUpgrade, ...]

    def lines(self) -> list[str]:
        out = [f"{self.path}: store format {self.from_version} -> {self.to_version}"]
        for shard in self.shards:
            detail = ""
            if shard.records:
                detail = (f": {shard.records:,} records, metadata log {shard.old_log_bytes:,} -> "
                          f"{shard.new_log_bytes:,} bytes")
            out.append(f"  broker={shard.broker}: {shard.action}{detail}")
        return out


def upgrade_store(root: str | os.PathLike) -> UpgradeReport:
    """Convert every shard of the store at `root` to the current format (see the module doc)."""
    root = Path(root)
    manifest = root / MANIFEST_FILE
    if not manifest.is_file():
        raise StoreNotFoundError(f"{root}: not a msgindex store (no {MANIFEST_FILE} in it)")
    version, settings = read_manifest(manifest)
    listed = set(load_manifest(manifest).shards or ())
    shards = sorted(p for p in root.iterdir() if p.name.startswith(SHARD_DIR_PREFIX) and p.is_dir())
    results = tuple(upgrade_shard(directory, settings, registered=directory.name[len(SHARD_DIR_PREFIX):] in listed)
                    for directory in shards)
    if version != STORE_FORMAT_VERSION:
        write_manifest(manifest, settings)  # last: every shard is converted
    return UpgradeReport(str(root), version, STORE_FORMAT_VERSION, results)


def upgrade_shard(directory: Path, settings: StoreSettings, *, registered: bool = False) -> ShardUpgrade:
    """Convert one shard (crash-safe, resumable; see the module docstring). `registered`: the
    store manifest lists it (so it committed: no checkpoint is then damage, not an empty shard)."""
    broker = directory.name[len(SHARD_DIR_PREFIX) :]
    fd = try_lock(directory / LOCK_FILE)
    if fd is None:
        raise ShardLockedError(f"{directory}: shard {broker!r} has a writer (lock held); stop it first")
    try:
        if (directory / MARKER_FILE).is_file():
            _finish(directory)
            return ShardUpgrade(broker, "finished an interrupted upgrade")
        checkpoint = read_checkpoint(checkpoint_path(directory))
        if checkpoint is None and (registered or has_data(directory)):
            raise missing_checkpoint_error(directory, broker, registered)
        if checkpoint is None or checkpoint.log_position is None:
            return ShardUpgrade(broker, "nothing committed")
        position = checkpoint.log_position
        if position.log_format == LOG_FORMAT:
            shutil.rmtree(directory / OLD_LOG_DIR, ignore_errors=True)
            shutil.rmtree(directory / NEW_LOG_DIR, ignore_errors=True)
            return ShardUpgrade(broker, f"already format {LOG_FORMAT}")
        if position.log_format != LEGACY_LOG_FORMAT:
            raise CorruptFileError(f"{checkpoint_path(directory)}: unknown log format {position.log_format}")
        return _convert(directory, broker, settings, checkpoint, position)
    finally:
        unlock(fd)


def _convert(directory: Path, broker: str, settings: StoreSettings, checkpoint: Checkpoint,
             old: LogPosition) -> ShardUpgrade:
    shutil.rmtree(directory / NEW_LOG_DIR, ignore_errors=True)  # a build a crash interrupted
    segments = _old_segments(directory / LOG_DIR, old)
    first_seq = segments[0][0] if segments else old.next_seq
    start = LogPosition(first_seq, first_seq, 0)
    records = 0
    new_log = open_log(directory, settings, writable=True, committed=start, log_dir=NEW_LOG_DIR)
    try:
        for _, columns in _old_records(segments, old):
            new_log.append(columns)
            records += len(columns)
        new_log.flush()
        new_position = new_log.position()
    finally:
        new_log.close()
    if new_position.next_seq != old.next_seq:
        raise CorruptFileError(f"{directory}: the converted log ends at {new_position.next_seq}, not {old.next_seq}")
    _verify(directory, settings, segments, old, new_position)
    upgraded = dataclasses.replace(checkpoint, log_position=new_position)
    write_atomically(directory / MARKER_FILE, versioned_json(MARKER_FORMAT, 1, {"checkpoint": upgraded.to_dict()}))
    old_bytes = _tree_bytes(directory / LOG_DIR)
    new_bytes = _tree_bytes(directory / NEW_LOG_DIR)
    _finish(directory)
    return ShardUpgrade(broker, "converted", records, old_bytes, new_bytes)


def _finish(directory: Path) -> None:
    """Steps 4 of the module docstring, each safe to repeat after a crash."""
    _, body = parse_versioned_json((directory / MARKER_FILE).read_bytes(), source=directory / MARKER_FILE,
                                   what="upgrade marker", format_name=MARKER_FORMAT, versions=(1,))
    checkpoint = Checkpoint.from_dict(body["checkpoint"], source=directory / MARKER_FILE)
    if (directory / NEW_LOG_DIR).is_dir():
        if (directory / LOG_DIR).exists():
            os.rename(directory / LOG_DIR, directory / OLD_LOG_DIR)
        os.rename(directory / NEW_LOG_DIR, directory / LOG_DIR)
        fsync_directory(directory)
    write_checkpoint(checkpoint_path(directory), checkpoint)
    (directory / MARKER_FILE).unlink()
    fsync_directory(directory)
    shutil.rmtree(directory / OLD_LOG_DIR, ignore_errors=True)


def _old_segments(log_dir: Path, position: LogPosition) -> list[tuple[int, Path, int]]:
    """(base seq, path, committed bytes) of the old log's committed segments, oldest first."""
    bases = sorted(b for b in (parse_segment_name(p.name) for p in log_dir.glob("*" + LOG_SUFFIX)) if b is not None)
    bases = [b for b in bases if b <= position.segment_base]
    segments = []
    for base in bases:
        path = log_dir / f"{base:020d}{LOG_SUFFIX}"
        size = position.segment_bytes if base == position.segment_base else path.stat().st_size
        segments.append((base, path, size))
    return segments


def _old_records(segments: list[tuple[int, Path, int]], position: LogPosition):
    """(first seq, LogColumns) of the old log's committed records, CHUNK_RECORDS at a time; every
    record's checksum and sequence number are verified."""
    for i, (base, path, size) in enumerate(segments):
        if not size:
            continue
        data = path.read_bytes()[:size]
        if len(data) != size:
            raise CorruptFileError(f"{path}: {len(data)} bytes, but {size} were committed (committed data lost)")
        positions = np.asarray(v1_records.walk_records(data, 0, size, verify=True, name=path, first_seq=base),
                               dtype=np.int64)
        following = segments[i + 1][0] if i + 1 < len(segments) else position.next_seq
        if base + len(positions) != following:
            raise CorruptFileError(f"{path}: holds records {base}..{base + len(positions) - 1}, "
                                   f"but the next starts at {following}")
        for start in range(0, len(positions), CHUNK_RECORDS):
            chunk = positions[start : start + CHUNK_RECORDS]
            yield base + start, v1_records.log_columns(data, chunk, v1_records.header_columns(data, chunk))


def _verify(directory: Path, settings: StoreSettings, segments, old: LogPosition, new: LogPosition) -> None:
    """Every record of the new log equals the old one, field by field, texts byte for byte."""
    with open_log(directory, settings, writable=False, committed=new, log_dir=NEW_LOG_DIR) as log:
        for first, columns in _old_records(segments, old):
            decoded = log.gather(np.arange(first, first + len(columns), dtype=np.int64))
            if not _same(columns, decoded):
                raise CorruptFileError(f"{directory}: the converted log differs from the old one near record "
                                       f"{first}; nothing was changed")


def _same(columns: LogColumns, decoded: DecodedRows) -> bool:
    ints = columns.ints
    if not all(np.array_equal(ints[name], getattr(decoded, attr)) for name, attr in (
            ("partition", "partition"), ("offset", "offset"), ("timestamp_ms", "timestamp_ms"),
            ("commit_log_offset", "commit_log_offset"), ("size", "size"))):
        return False
    old_keys = columns.keys_array().cast(pa.large_list(pa.large_binary()))
    return (columns.topic.cast(pa.large_binary()).equals(decoded.topic)
            and columns.key.cast(pa.large_binary()).equals(decoded.key)
            and pc.all(pc.equal(pc.list_value_length(old_keys), pc.list_value_length(decoded.keys))).as_py() is not False
            and pc.list_flatten(old_keys).equals(pc.list_flatten(decoded.keys)))


def _tree_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file()) if directory.is_dir() else 0
