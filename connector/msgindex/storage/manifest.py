"""The store manifest, ``<root>/msgindex.json``: the store's format version, its settings, and the
shards it has.

```
{"format": "msgindex-store", "version": 2, "settings": {...}, "shards": ["broker-a", "broker-b"]}
```

The settings are fixed for the life of the store (an existing store is always opened with the
settings it was created with). The version is the store's on-disk format: 2 = metadata logs of
compressed columnar record batches; a version-1 store (row-per-record logs) is refused with an
UpgradeRequiredError naming `msgindex upgrade PATH`, never misread.

``shards`` lists every shard the store ever committed to. Without it a shard directory deleted
by mistake would simply look like a shard that never existed: every read would answer without
its records and say nothing. A shard is added right after its first checkpoint is written (a
crash in between leaves a shard with a checkpoint and no entry, which its next writer adds), by
a read-modify-write of the manifest under ``manifest.lock`` (flock: writers of different shards
run in different processes and hosts). Readers then treat a listed shard whose directory is
missing, or holds no checkpoint, as damage and say so. Stores written before shards were
recorded have no ``shards`` member (``None``): their shards are listed the first time a writer
opens one (every shard directory holding a checkpoint, then).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from msgindex.errors import CorruptFileError, ShardLockedError
from msgindex.storage.checkpoint import CHECKPOINT_FILE
from msgindex.storage.durable import parse_versioned_json, versioned_json, write_atomically
from msgindex.storage.file_lock import unlock, wait_for_lock
from msgindex.storage.settings import StoreSettings

MANIFEST_FILE = "msgindex.json"
MANIFEST_LOCK = "manifest.lock"  # held while a writer adds its shard to the manifest
STORE_FORMAT = "msgindex-store"
STORE_FORMAT_VERSION = 2
LEGACY_STORE_VERSIONS = (1,)  # read only by `msgindex upgrade` (storage/maintenance/upgrade.py)
SHARD_DIR_PREFIX = "broker="
REGISTER_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Manifest:
    """A store manifest's content (see the module docstring)."""

    version: int
    settings: StoreSettings
    shards: tuple[str, ...] | None  # None: written before shards were recorded


def load_manifest(path: Path) -> Manifest:
    """The manifest at `path` (current or legacy); CorruptFileError naming it when it is not one."""
    try:
        raw = Path(path).read_bytes()
    except IsADirectoryError:
        raise CorruptFileError(f"{path}: store manifest is a directory, not a file") from None
    return decode_manifest(raw, source=path)


def decode_manifest(raw: bytes, *, source: object) -> Manifest:
    """A manifest's bytes (from a file or an object) checked and parsed."""
    version, body = parse_versioned_json(
        raw, source=source, what="store manifest", format_name=STORE_FORMAT,
        versions=(*LEGACY_STORE_VERSIONS, STORE_FORMAT_VERSION), legacy_version_field="format_version",
    )
    if not isinstance(body.get("settings"), dict):
        raise CorruptFileError(f"{source}: store manifest has no settings object")
    shards = body.get("shards")
    if shards is not None and (not isinstance(shards, list) or not all(isinstance(s, str) and s for s in shards)):
        raise CorruptFileError(f"{source}: store manifest's shards must be a list of shard names")
    return Manifest(version, StoreSettings.from_dict(body["settings"], source=source),
                    None if shards is None else tuple(sorted(set(shards))))


def read_manifest(path: Path) -> tuple[int, StoreSettings]:
    """(format version, settings) of a store manifest, current or legacy."""
    manifest = load_manifest(path)
    return manifest.version, manifest.settings


def write_manifest(path: Path, settings: StoreSettings, shards: tuple[str, ...] | list[str] | None = ()) -> None:
    """Write a current-format manifest (atomically); `shards` None leaves the member out (a
    store whose shards were never recorded)."""
    write_atomically(path, encode_manifest(settings, shards))


def encode_manifest(settings: StoreSettings, shards: tuple[str, ...] | list[str] | None = ()) -> bytes:
    """The bytes of a current-format manifest (see ``write_manifest``)."""
    body: dict = {"settings": settings.to_dict()}
    if shards is not None:
        body["shards"] = sorted(set(shards))
    return versioned_json(STORE_FORMAT, STORE_FORMAT_VERSION, body, indent=2)


def shard_directories(root: Path) -> list[str]:
    """Names of the shards whose directories are present under `root`, sorted."""
    # scandir: every lookup lists the shards, and its entries know their type without a stat
    with os.scandir(root) as entries:
        return sorted(entry.name[len(SHARD_DIR_PREFIX):] for entry in entries
                      if entry.name.startswith(SHARD_DIR_PREFIX) and entry.is_dir())


def register_shard(root: Path, broker: str) -> None:
    """Record `broker` in the manifest of the store at `root` (a no-op when it is there)."""
    path = Path(root) / MANIFEST_FILE
    if _listed(load_manifest(path), broker):
        return
    _update_shards(Path(root), lambda shards: shards | {broker})


def forget_shards(root: Path, brokers: set[str]) -> None:
    """Remove `brokers` from the manifest's shards (an operator accepting their loss)."""
    _update_shards(Path(root), lambda shards: shards - brokers)


def _listed(manifest: Manifest, broker: str) -> bool:
    return manifest.shards is not None and broker in manifest.shards


def _update_shards(root: Path, change) -> None:
    path = root / MANIFEST_FILE
    fd = wait_for_lock(root / MANIFEST_LOCK, REGISTER_TIMEOUT_S)
    if fd is None:
        raise ShardLockedError(f"{root / MANIFEST_LOCK}: still held after {REGISTER_TIMEOUT_S:g} s (another "
                               f"writer adding its shard to the store manifest is stuck?)")
    try:
        manifest = load_manifest(path)
        if manifest.shards is not None:
            current = set(manifest.shards)
        else:  # a store from before shards were recorded: what it has now
            current = {name for name in shard_directories(root)
                       if (root / f"{SHARD_DIR_PREFIX}{name}" / CHECKPOINT_FILE).is_file()}
        wanted = change(current)
        if manifest.shards is None or wanted != current:
            write_manifest(path, manifest.settings, sorted(wanted))
    finally:
        unlock(fd)
