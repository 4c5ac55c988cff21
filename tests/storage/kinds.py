"""What tests that run on both kinds of store (the ``stores`` fixture, tests/object_store.py) read
differently from each: a shard's committed state, its bytes, its objects or files. Everything a
user sees through the Store API is read the same way and asserted the same way."""

from __future__ import annotations

from pathlib import Path

from msgindex.storage.objects.shard import ObjectShardReader
from msgindex.storage.objects.store import ObjectStore
from msgindex.storage.store import Store
from tests.storage.shard_model import shard_files


def is_object_store(store: Store | ObjectStore) -> bool:
    return isinstance(store, ObjectStore)


def committed_state(store: Store | ObjectStore, broker: str) -> tuple[int, int]:
    """(log_start_seq, record_count) of `broker`'s newest commit."""
    with store.reader(broker) as reader:
        head = reader.version if isinstance(reader, ObjectShardReader) else reader.checkpoint
        return head.log_start_seq, head.record_count


def shard_bytes(store: Store | ObjectStore, broker: str) -> int:
    """What retention's max_bytes counts: a local shard's index and log files, an object-store
    shard's chunks (as its newest version lists them)."""
    if is_object_store(store):
        with store.reader(broker) as reader:
            return sum(chunk.info.size for chunk in reader.version.chunks)
    shard = Path(store.root) / f"broker={broker}"
    return sum(p.stat().st_size for d in ("index", "log") for p in (shard / d).iterdir())


def shard_contents(store: Store | ObjectStore, broker: str) -> dict[str, object]:
    """Every file of a local shard (bytes), every object of an object-store shard (its size):
    what 'nothing was deleted or written' compares."""
    if is_object_store(store):
        prefix = store.shard_prefix(broker)
        return {info.key: info.size for info in store.client.list(f"{prefix}/")}
    return shard_files(Path(store.root) / f"broker={broker}")


def patch_few_candidates(monkeypatch, value: int) -> None:
    """Set the candidate count below which lookups verify record by record, for both kinds."""
    from msgindex.storage import shard as shard_module
    from msgindex.storage.objects import shard as object_shard_module

    monkeypatch.setattr(shard_module, "FEW_CANDIDATES", value)
    monkeypatch.setattr(object_shard_module, "FEW_CANDIDATES", value)


def accept_any_timestamp(monkeypatch) -> None:
    """Writers of both kinds as they were before the timestamp rule (storage/message.py)."""
    from msgindex.storage import shard as shard_module
    from msgindex.storage.objects import shard as object_shard_module

    monkeypatch.setattr(shard_module, "refuse_out_of_range_timestamps", lambda columns: None)
    monkeypatch.setattr(object_shard_module, "refuse_out_of_range_timestamps", lambda columns: None)
