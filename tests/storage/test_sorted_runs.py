"""run_starts and distinct_sorted against numpy's own answers, on any int64 arrays."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from msgindex.storage.sorted_runs import distinct_sorted, run_starts

int64_arrays = arrays(np.int64, st.integers(0, 60), elements=st.integers(-5, 5) | st.integers(-(2**63), 2**63 - 1))


@given(int64_arrays)
def test_run_starts_mark_where_a_sorted_arrays_value_changes(values):
    ordered = np.sort(values)
    starts = run_starts(ordered)
    _, first_positions = np.unique(ordered, return_index=True)
    assert starts.dtype == bool and np.array_equal(np.flatnonzero(starts), first_positions)


@given(int64_arrays)
def test_distinct_sorted_is_np_unique(values):
    assert np.array_equal(distinct_sorted(values), np.unique(values))
