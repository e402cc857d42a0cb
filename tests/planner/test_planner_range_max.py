"""Range maxima: each range's longest predicted group, in any prompt order."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.planner.range_max import RangeMax


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), min_size=1, max_size=40),
    spread=st.integers(0, 40),
    seed=st.integers(0, 2**16),
)
def test_a_range_s_largest_value_is_found_in_any_order(lengths, spread, seed):
    """Ascending, a range's largest is its last; a backfilled order (its first values shuffled,
    the rest ascending) or any other looks the rest up: every range, empty ones 0."""
    x = np.sort(np.array(lengths, dtype=float))
    rng = np.random.default_rng(seed)
    k = min(spread, x.size)
    order = np.r_[rng.permutation(k), np.arange(k, x.size)] if seed % 3 else rng.permutation(x.size)
    x = x[order]
    starts, ends = np.triu_indices(x.size + 1)
    expected = [x[a:b].max(initial=0.0) for a, b in zip(starts, ends, strict=True)]
    np.testing.assert_array_equal(RangeMax(x)(starts, ends), expected)


def test_only_the_unsorted_head_needs_a_table():
    """A backfilled order: short values shuffled ahead of an ascending rest that exceeds them."""
    maxima = RangeMax(np.array([3.0, 1.0, 2.0, 5.0, 6.0, 9.0]))
    assert maxima.rising == 3 and maxima.table.shape == (2, 3)
    assert RangeMax(np.array([1.0, 2.0, 2.0, 7.0])).table is None
