"""A store's settings: the sizing of its files, fixed when the store is created and persisted in
its manifest (``store.py``). Its own module because shards, retention and the store all take it,
and none of them may import another just for it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msgindex.errors import CorruptFileError, InvalidOptionError
from msgindex.storage.hash_index.rocketmq_sizing import DEFAULT_INDEX_NUM, STORE_HASH_SLOT_NUM
from msgindex.storage.int_limits import INT32_MAX


@dataclass(frozen=True)
class StoreSettings:
    """Sizing of a store's files, fixed when the store is created (persisted in its manifest).

    hash_slot_num / index_num: RocketMQ IndexFile sizing (defaults: RocketMQ's entries per file,
    a fifth of its slots: rocketmq_sizing says why);
    segment_bytes: metadata-log segment roll size; index_interval_bytes: log bytes between two
    sparse offset/time index entries (Kafka's index.interval.bytes)."""

    hash_slot_num: int = STORE_HASH_SLOT_NUM
    index_num: int = DEFAULT_INDEX_NUM
    segment_bytes: int = 1 << 30
    index_interval_bytes: int = 4096

    def __post_init__(self) -> None:
        limits = {  # (minimum, maximum): an IndexFile's offsets are Java ints
            "hash_slot_num": (1, INT32_MAX),
            "index_num": (2, INT32_MAX),  # entry 0 is never written: 2 holds one entry
            "segment_bytes": (1, INT32_MAX),  # sparse offset index positions are 4-byte ints
            "index_interval_bytes": (0, INT32_MAX),
        }
        for name, (low, high) in limits.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InvalidOptionError(f"StoreSettings.{name} must be an int in [{low}, {high}], got {value!r}")

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: Path | str = "settings") -> StoreSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise CorruptFileError(f"{source}: unknown settings {sorted(unknown)}")
        try:
            return cls(**values)
        except InvalidOptionError as bad:
            raise CorruptFileError(f"{source}: {bad}") from None
