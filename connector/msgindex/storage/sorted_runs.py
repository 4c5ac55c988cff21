"""Runs of equal values in a sorted (or grouped) array: where the lookups, the block reads and the
hash runs group what they hold, in one numpy kernel. ``np.unique`` answers the same but sorts
again and costs ~6 us of set-up a call, which a one-key lookup pays several times."""

from __future__ import annotations

import numpy as np


def run_starts(ordered: np.ndarray) -> np.ndarray:
    """A boolean mask, True at the first element of each run of equal values in `ordered`
    (equal values must lie together: sorted, or grouped)."""
    first = np.empty(len(ordered), dtype=bool)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return first


def distinct_sorted(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-d array: its distinct values, ascending."""
    ordered = np.sort(values)
    return ordered[run_starts(ordered)]
