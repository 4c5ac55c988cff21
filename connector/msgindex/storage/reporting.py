"""Pieces every ``msgindex inspect`` report is made of, local or on an object store: time ranges
as both epoch milliseconds and ISO-8601, and an error as the one line a problem list shows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def time_range(low_ms: int | None, high_ms: int | None) -> dict[str, Any] | None:
    """{min_ms, max_ms, min, max} of a range of epoch milliseconds (None: no records)."""
    if low_ms is None or high_ms is None:
        return None
    return {"min_ms": low_ms, "max_ms": high_ms, "min": iso_time(low_ms), "max": iso_time(high_ms)}


def iso_time(ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC (millisecond precision); out-of-calendar values say so."""
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms (out of calendar range)"


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type's name when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
