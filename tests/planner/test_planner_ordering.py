"""lex_order: the order a stable lexicographic sort gives, from unstable sorts."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.planner.ordering import lex_order

few_values = st.sampled_from([0.0, -0.0, 1.0, 2.5, -3.0, np.inf, -np.inf, np.nan])


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(0, 60),
    kinds=st.lists(st.sampled_from(["float", "int", "uint64"]), min_size=1, max_size=4),
    data=st.data(),
)
def test_lex_order_is_lexsort(rows, kinds, data):
    """Ties (signed zeros and NaNs included) keep the earlier key's, then the rows', order."""
    keys = []
    for kind in kinds:
        if kind == "float":
            keys.append(np.array(data.draw(st.lists(few_values, min_size=rows, max_size=rows)), dtype=float))
        elif kind == "int":
            keys.append(np.array(data.draw(st.lists(st.integers(-3, 3), min_size=rows, max_size=rows))))
        else:
            values = st.integers(2**64 - 3, 2**64 - 1) | st.integers(0, 2)
            keys.append(np.array(data.draw(st.lists(values, min_size=rows, max_size=rows)), dtype=np.uint64))
    assert lex_order(keys).tolist() == np.lexsort(keys).tolist()


def test_keys_whose_ranks_overflow_64_bits_are_still_ordered():
    rng = np.random.default_rng(0)
    keys = [rng.permutation(4096) for _ in range(5)]  # 12 bits of position + 5 x 12 of ranks
    assert lex_order(keys).tolist() == np.lexsort(keys).tolist()
