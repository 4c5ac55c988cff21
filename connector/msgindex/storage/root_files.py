"""The small files an index keeps beside its shards (the pipeline's partition -> shard map, batch
log, quarantine, job records), wherever the index lives: a local directory or an object store.

Both kinds give the three operations those files need, with the same guarantees:

* ``read(name)``: the whole file, or None when there is none;
* ``create(name, data)``: write it only if it does not exist (local: ``O_EXCL`` after a durable
  temporary write, then a rename that does not replace — ``link``; objects: put-if-absent),
  True when this call created it. Files written this way are never rewritten: their names carry
  what makes them unique (a version number, a source range, a batch id);
* ``replace(name, data)``: atomic replacement (local: ``durable.write_atomically``; objects: a
  PUT, atomic by the store's contract);
* ``names(directory)``: the files directly in a directory, sorted;
* ``delete_directory(directory)``: the directory and its files (for scratch directories only:
  never a committed file).

Names are "/"-separated paths relative to the index root.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path

from msgindex.storage.durable import fsync_directory, is_temporary, temporary_path, write_atomically
from msgindex.storage.location import StoreLocation


class RootFiles(ABC):
    """Files beside the shards of one index (see the module docstring)."""

    location: StoreLocation

    @abstractmethod
    def read(self, name: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""

    @abstractmethod
    def create(self, name: str, data: bytes) -> bool:
        """Write the file unless it exists: True when this call created it."""

    @abstractmethod
    def replace(self, name: str, data: bytes) -> None:
        """Write the file, atomically replacing what was there."""

    @abstractmethod
    def names(self, directory: str) -> list[str]:
        """The names of the files directly in `directory` (sorted; [] when there is none)."""

    @abstractmethod
    def delete_directory(self, directory: str) -> None:
        """Delete the files directly in `directory` and the directory (nothing when it is gone)."""

    def url(self, name: str) -> str:
        """The file as messages show it."""
        return f"{self.location.url.rstrip('/')}/{name}"


class LocalRootFiles(RootFiles):
    """The files of a local index root."""

    def __init__(self, location: StoreLocation) -> None:
        self.location = location
        self.root = Path(location.local_path)

    def path(self, name: str) -> Path:
        return self.root / name

    def read(self, name: str) -> bytes | None:
        try:
            return self.path(name).read_bytes()
        except FileNotFoundError:
            return None

    def create(self, name: str, data: bytes) -> bool:
        target = self.path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            return False
        temporary = temporary_path(target)
        write_atomically(temporary, data)  # durable content first
        try:
            os.link(temporary, target)  # fails, never replaces, when the target appeared meanwhile
        except FileExistsError:
            return False
        finally:
            temporary.unlink(missing_ok=True)
        fsync_directory(target.parent)
        return True

    def replace(self, name: str, data: bytes) -> None:
        target = self.path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, data)

    def names(self, directory: str) -> list[str]:
        folder = self.path(directory)
        try:
            return sorted(entry.name for entry in os.scandir(folder) if entry.is_file() and not is_temporary(entry.name))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def delete_directory(self, directory: str) -> None:
        for name in self.names(directory):
            self.path(f"{directory}/{name}").unlink(missing_ok=True)
        try:
            self.path(directory).rmdir()
        except (FileNotFoundError, OSError):  # gone, or a straggler wrote again: left for the next clear
            pass

    def url(self, name: str) -> str:
        return str(self.path(name))


class ObjectRootFiles(RootFiles):
    """The files of an index on an object store (objects under its prefix)."""

    def __init__(self, location: StoreLocation, client=None) -> None:
        from msgindex.storage.objects.client import ObjectClient

        self.location = location
        self.client = client or ObjectClient(location)

    def read(self, name: str) -> bytes | None:
        return self.client.get(name)

    def create(self, name: str, data: bytes) -> bool:
        return self.client.put_if_absent(name, data)

    def replace(self, name: str, data: bytes) -> None:
        self.client.put(name, data)

    def names(self, directory: str) -> list[str]:
        prefix = directory.rstrip("/") + "/"
        return sorted(info.key[len(prefix):] for info in self.client.list(prefix) if "/" not in info.key[len(prefix):])

    def delete_directory(self, directory: str) -> None:
        names = self.names(directory)
        if names:
            self.client.delete([f"{directory.rstrip('/')}/{name}" for name in names])


def root_files(location: StoreLocation) -> RootFiles:
    """The files beside the shards of the index at `location`."""
    return LocalRootFiles(location) if location.is_local else ObjectRootFiles(location)
