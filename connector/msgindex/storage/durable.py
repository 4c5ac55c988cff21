"""Durable file replacement and msgindex's one versioned-JSON convention.

Every small file msgindex rewrites (shard checkpoints, the store manifest, segment summaries, the
pipeline's bookkeeping, quarantine files) is replaced the same way, so that a crash at any
instant leaves either the old content or the new, never a torn mix:

1. write the new bytes to a temporary file beside the target (same directory, so the rename
   cannot cross filesystems) whose name is unique per process, so that two processes replacing
   the same file (speculative copies of one Spark task) never write into each other's temporary
   file, and hidden (a leading dot), so that directory readers such as Spark's file sources
   never pick up a half-written file;
2. fsync it: the data is on disk before any name points at it;
3. rename it over the target (atomic on POSIX);
4. fsync the directory: the rename itself survives a power loss.

Every JSON file msgindex writes starts with the same two members, ``"format"`` (what the file
is) and ``"version"`` (of that format); readers check both before trusting anything else.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from msgindex.errors import CorruptFileError
from msgindex.storage.mapped_file import raise_if_storage_full

TMP_SUFFIX = ".tmp"
FORMAT_FIELD = "format"
VERSION_FIELD = "version"


def temporary_path(path: Path) -> Path:
    """Where `write_atomically` puts the next content of `path` while it is written (unique per
    process). Recovery code finds leftovers with ``is_temporary``."""
    return path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")


def is_temporary(name: str, target_name: str | None = None) -> bool:
    """True when `name` is a leftover temporary file of `write_atomically` (a writer died
    mid-write): of `target_name`, or of any file when it is None."""
    prefix = "." if target_name is None else f".{target_name}."
    return name.startswith(prefix) and name.endswith(TMP_SUFFIX)


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace `path` with `data` durably: after this returns the new content survives a crash;
    if it does not return, the old content (or no file) is intact. Steps: module docstring."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)  # e.g. disk full: leave no half-written temporary behind
        raise_if_storage_full(error, path, "replacing it (its previous version is intact)")
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Make creations, renames and deletions inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def versioned_json(format_name: str, version: int, body: dict[str, Any], *, indent: int | None = 1) -> bytes:
    """The bytes of a msgindex JSON file: ``format`` and ``version`` first, then `body`."""
    document = {FORMAT_FIELD: format_name, VERSION_FIELD: version, **body}
    return (json.dumps(document, indent=indent, ensure_ascii=False) + "\n").encode("utf-8")


def parse_versioned_json(
    raw: bytes,
    *,
    source: str | os.PathLike[str],
    what: str,
    format_name: str,
    versions: tuple[int, ...],
    legacy_version_field: str | None = None,
) -> tuple[int, dict[str, Any]]:
    """(version, body) of a msgindex JSON file that must be `format_name` at one of `versions`;
    `body` is the document without its ``format``/``version`` members. Anything else is a
    CorruptFileError naming `source` and `what` it should have been.

    `legacy_version_field`: files written before the one convention carried their version under
    another name (and possibly no ``format``); they are still read."""
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise CorruptFileError(f"{source}: {what} is not valid JSON (torn or overwritten?)") from None
    if not isinstance(document, dict):
        raise CorruptFileError(f"{source}: not a msgindex {what} (a JSON object was expected)")
    if legacy_version_field is not None and VERSION_FIELD not in document and legacy_version_field in document:
        document.setdefault(FORMAT_FIELD, format_name)
        document[VERSION_FIELD] = document.pop(legacy_version_field)
    if document.get(FORMAT_FIELD) != format_name:
        raise CorruptFileError(f"{source}: not a msgindex {what} (format must be {format_name!r})")
    version = document.get(VERSION_FIELD)
    if isinstance(version, bool) or version not in versions:
        supported = ", ".join(map(str, versions))
        raise CorruptFileError(
            f"{source}: {what} version {version!r} is not supported (this msgindex reads version {supported})"
        )
    del document[FORMAT_FIELD], document[VERSION_FIELD]
    return version, document
