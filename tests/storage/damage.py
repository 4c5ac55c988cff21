"""Small stores written by the real append path, and the ways a file of one gets damaged: for the
damaged-store tests and the adversarial module."""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from msgindex.storage.message import MessageRecord
from msgindex.storage.settings import StoreSettings
from msgindex.storage.store import open_store
from tests.storage.shard_model import ShardModel

BASE_MS = 1_700_000_000_000
# Small files: several hash index files, log segments and sparse index entries per shard, but
# batches of a few records each so that a store takes milliseconds to write.
SMALL = StoreSettings(hash_slot_num=16, index_num=40, segment_bytes=1500, index_interval_bytes=200)


@dataclass
class SmallStore:
    """A store (on disk, or an object-store URL) and the model of what it committed (per broker)."""

    root: Path | str
    models: dict[str, ShardModel] = field(default_factory=dict)

    def keys(self) -> list[str]:
        return sorted({k for model in self.models.values() for r in model.records for k in r.keys})

    def record_count(self) -> int:
        return sum(len(model.rows()) for model in self.models.values())


def record(broker_number: int, offset: int) -> MessageRecord:
    """Record `offset` of partition `broker_number`: a key of its own, a shared one, a window of
    timestamps that is not monotonic."""
    own = f"k{broker_number}-{offset}"
    return MessageRecord("orders" if offset % 3 else "payments", broker_number, offset,
                         BASE_MS + ((offset * 7919) % 5000) * 10, own, (own, f"shared{offset % 4}"),
                         commit_log_offset=offset * 100, size=50 + offset % 7)


def build(root: Path | str, *, brokers: tuple[str, ...] = ("b1", "b2"), appends: int = 6, per_append: int = 12,
          settings: StoreSettings = SMALL, stores=None) -> SmallStore:
    """A store written the way the pipeline writes it: ShardWriter.append of consecutive offset
    slices (each append's log annotation carries the cumulative committed source ranges).
    `stores` (tests/object_store.py): open `root` as that kind of store (default: local)."""
    store = SmallStore(root if stores is not None and not stores.is_local else Path(root))
    handle = stores.open(root, create=True, settings=settings) if stores is not None else \
        open_store(root, create=True, settings=settings)
    with handle:
        for number, broker in enumerate(brokers):
            model = store.models[broker] = ShardModel(broker)
            with handle.writer(broker) as writer:
                for n in range(appends):
                    batch = [record(number, n * per_append + i) for i in range(per_append)]
                    writer.append(batch)
                    model.append(batch)
    return store


def copy_of(store: SmallStore, root: Path) -> SmallStore:
    shutil.copytree(store.root, root, symlinks=True)
    return SmallStore(Path(root), store.models)


# --- damage ---------------------------------------------------------------------------------
def zero(path: Path, start: int = 0, length: int | None = None) -> None:
    """Overwrite bytes [start, start + length) (to the end when None) with zeros, size kept."""
    size = path.stat().st_size
    length = size - start if length is None else min(length, size - start)
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(b"\0" * max(length, 0))


def scribble(path: Path, start: int, length: int, seed: int = 7) -> None:
    """Overwrite bytes [start, start + length) with random bytes (each one different from before)."""
    data = bytearray(path.read_bytes())
    rng = random.Random(seed)
    for i in range(start, min(start + length, len(data))):
        data[i] = (data[i] + rng.randint(1, 255)) % 256
    path.write_bytes(bytes(data))


def truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def replace_by_directory(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    path.mkdir()
    (path / "stray").write_bytes(b"x")


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def shard(store: SmallStore, broker: str) -> Path:
    return store.root / f"broker={broker}"


def index_files(store: SmallStore, broker: str) -> list[Path]:
    """The shard's hash index files, oldest first (sidecars left out)."""
    return sorted(p for p in (shard(store, broker) / "index").iterdir() if p.name.isdigit())


def segments(store: SmallStore, broker: str, suffix: str = ".log") -> list[Path]:
    return sorted((shard(store, broker) / "log").glob("*" + suffix))


def listing(root: Path) -> dict[str, int]:
    """Every file under `root` with its size (lock files left out): what 'nothing was deleted'
    compares."""
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith("lock")}
