"""RESULT_ORDER: the order of a lookup's rows (timestamp, then topic as shown, partition, offset,
seq), and how the pieces of one answer are put in it without sorting them all again.

A lookup's rows come in *parts*, each already in RESULT_ORDER among itself: a chunk of log blocks'
verified records (``ShardReader._verified``) or one hot key's rows of a stretch read from its
hot-key copy (``hot_keys``). The log is nearly in time order, so parts overlap only where they
meet; ``in_result_order`` orders only those overlaps again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from msgindex.storage.log import batch_format as bf
from msgindex.storage.message import arrow_text, decode_text


@dataclass(frozen=True)
class OrderColumns:
    """What RESULT_ORDER compares, per row, as numpy columns (topics as ``encode_text`` bytes,
    each row's topic a position in `topics`)."""

    seqs: np.ndarray  # int64
    topics: tuple[bytes, ...]
    topic_ids: np.ndarray  # int64
    partition: np.ndarray  # int32
    offset: np.ndarray  # int64
    timestamp_ms: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.seqs)

    @classmethod
    def of(cls, rows: bf.DecodedRows) -> OrderColumns:
        return cls(rows.seqs, rows.topics, rows.topic_ids, rows.partition, rows.offset, rows.timestamp_ms)


@dataclass(frozen=True)
class Part:
    """Rows of one answer, in RESULT_ORDER among themselves: rendered (ROW_SCHEMA) and the
    columns that order them."""

    rows: pa.Table
    order: OrderColumns


def topic_ranks(topics: Sequence[bytes]) -> np.ndarray:
    """Each topic's rank in RESULT_ORDER (which compares topics as rendered)."""
    rendered = [arrow_text(decode_text(t)).encode("utf-8") for t in topics]
    return np.argsort(np.array(sorted(range(len(rendered)), key=rendered.__getitem__), dtype=np.int64)).astype(np.int64)


def result_order(stamps: np.ndarray, ranks: np.ndarray, partitions: np.ndarray, offsets: np.ndarray,
                 seqs: np.ndarray) -> np.ndarray:
    """The permutation that puts rows (of one shard) in RESULT_ORDER: by timestamp, then topic
    rank, partition, offset, seq. A stable sort by timestamp, then only the runs of equal
    timestamps sorted by the rest: far cheaper than a sort on all keys for a hot key's rows."""
    order = by_timestamp(stamps)
    stamps = stamps[order]
    tie = stamps[1:] == stamps[:-1]
    if tie.any():
        in_run = np.zeros(len(order), dtype=bool)
        in_run[1:] |= tie
        in_run[:-1] |= tie
        runs = np.flatnonzero(in_run)
        run = np.cumsum(np.concatenate(([True], ~tie)))[runs]
        picked = order[runs]
        order[runs] = picked[np.lexsort((seqs[picked], offsets[picked], partitions[picked], ranks[picked], run))]
    return order


def order_of(columns: OrderColumns) -> np.ndarray:
    """``result_order`` of every row of `columns`."""
    return result_order(columns.timestamp_ms, topic_ranks(columns.topics)[columns.topic_ids], columns.partition,
                        columns.offset, columns.seqs)


def by_timestamp(stamps: np.ndarray) -> np.ndarray:
    """np.argsort(stamps, kind="stable"), as two stable 16-bit passes when the stamps span less
    than 2**32 ms (49 days): numpy sorts 16-bit keys by radix, ~4x faster than its int64 timsort."""
    low = int(stamps.min()) if len(stamps) else 0
    span = int(stamps.max()) - low if len(stamps) else 0
    if span >= 1 << 32:
        return np.argsort(stamps, kind="stable")
    relative = stamps - low
    order = np.argsort((relative & 0xFFFF).astype(np.uint16), kind="stable")
    if span >= 1 << 16:
        order = order[np.argsort((relative >> 16).astype(np.uint16)[order], kind="stable")]
    return order


def in_result_order(parts: list[Part], max_results: int | None) -> pa.Table:
    """The rows of `parts` (each in RESULT_ORDER, nearly in time order one after the other) in
    RESULT_ORDER, at most `max_results`. Only the rows of the windows where parts overlap are
    ordered again (and taken), the others keep their place (zero-copy slices); the columns that
    order them are gathered for those windows only."""
    bounds = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(part.order) for part in parts], out=bounds[1:])
    stamps = np.concatenate([part.order.timestamp_ms for part in parts])
    windows = overlaps(stamps, bounds[1:-1])
    table = pa.concat_tables([part.rows for part in parts])
    if windows:
        topics: dict[bytes, int] = {}
        part_topics = [np.array([topics.setdefault(t, len(topics)) for t in part.order.topics], dtype=np.int64)
                       for part in parts]
        ranks = topic_ranks(list(topics))
        part_ranks = [ranks[ids] if len(ids) else ids for ids in part_topics]
    pieces, at = [], 0
    for low, high in windows:
        pieces.append(table.slice(at, low - at))
        columns: dict[str, list[np.ndarray]] = {"ranks": [], "partition": [], "offset": [], "seqs": []}
        first = int(np.searchsorted(bounds, low, side="right")) - 1
        for n in range(first, len(parts)):
            if bounds[n] >= high:
                break
            inside = slice(max(low, bounds[n]) - bounds[n], min(high, bounds[n + 1]) - bounds[n])
            order = parts[n].order
            columns["ranks"].append(part_ranks[n][order.topic_ids[inside]])
            for name in ("partition", "offset", "seqs"):
                columns[name].append(getattr(order, name)[inside])
        joined = {name: np.concatenate(values) for name, values in columns.items()}
        order = result_order(stamps[low:high], joined["ranks"], joined["partition"], joined["offset"], joined["seqs"])
        pieces.append(table.slice(low, high - low).take(pa.array(order)))
        at = high
    pieces.append(table.slice(at))
    result = pa.concat_tables(pieces)  # several record batches: one copy of a hot key's rows is enough
    return result.slice(0, max_results) if max_results is not None else result


def overlaps(stamps: np.ndarray, cuts: np.ndarray) -> list[tuple[int, int]]:
    """The [low, high) windows of rows that may be out of place, for runs of `stamps` each in
    order (a run starts at each of `cuts`). A row is in its final place when its stamp is above
    every stamp of the runs before it and below every stamp of the runs after it: exactly the
    rows before it rank before it. So the rows between two such rows are exactly the ones whose
    places lie there, and each window is ordered on its own."""
    bounds = np.array([0, *cuts.tolist(), len(stamps)], dtype=np.int64)
    firsts, lasts = stamps[bounds[:-1]], stamps[bounds[1:] - 1]
    highest_before = np.maximum.accumulate(np.concatenate(([np.iinfo(np.int64).min], lasts[:-1])))
    lowest_after = np.minimum.accumulate(np.concatenate((firsts[1:], [np.iinfo(np.int64).max]))[::-1])[::-1]
    windows: list[tuple[int, int]] = []
    for start, end, high, low in zip(bounds[:-1].tolist(), bounds[1:].tolist(), highest_before.tolist(),
                                     lowest_after.tolist()):
        run = stamps[start:end]
        for low_at, high_at in ((start, start + int(np.searchsorted(run, high, side="right"))),
                                (start + int(np.searchsorted(run, low, side="left")), end)):
            if low_at < high_at:
                if windows and windows[-1][1] >= low_at:
                    low_at, high_at = windows[-1][0], max(windows.pop()[1], high_at)
                windows.append((low_at, high_at))
    return windows
