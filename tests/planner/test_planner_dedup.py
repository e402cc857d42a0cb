"""Prefix dedup: D(L) against brute force, the chosen L, the groups and token counts."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.planner.dedup import PackedPrompts, deduplicate

prompts_st = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=12)


def distinct_prefixes(prompts, length):
    return len({tuple(p[:length]) for p in prompts})


@settings(max_examples=60, deadline=None)
@given(prompts=prompts_st, capacity=st.integers(1, 8))
def test_chosen_length_is_the_largest_that_fits(prompts, capacity):
    d = deduplicate(PackedPrompts.pack(prompts), capacity)
    longest = max(map(len, prompts))
    for length in range(1, longest + 1):
        assert d.d_curve[length] == distinct_prefixes(prompts, length)
    fitting = [length for length in range(1, longest + 1) if distinct_prefixes(prompts, length) <= capacity]
    assert d.prefix_length == (max(fitting) if fitting else 0)


@settings(max_examples=60, deadline=None)
@given(prompts=prompts_st, capacity=st.integers(1, 8))
def test_groups_share_their_prefix_and_cover_every_prompt(prompts, capacity):
    d = deduplicate(PackedPrompts.pack(prompts), capacity)
    uids = [f"u{i}" for i in range(len(prompts))]
    groups = d.groups(uids)
    assert sorted(u for g in groups for u in g) == sorted(uids)
    for group in groups:
        prefixes = {tuple(prompts[int(u[1:])][: d.prefix_length]) for u in group}
        assert len(prefixes) == 1
    if d.prefix_length:
        assert len(groups) == d.d_curve[d.prefix_length] <= capacity


def test_shared_system_prompt_is_computed_once():
    system = list(range(100, 150))
    prompts = [system + [i, i + 1, i + 2] for i in range(10)]
    d = deduplicate(PackedPrompts.pack(prompts), capacity=1)
    assert d.prefix_length == 50
    assert d.tokens(group_size=4) == {"naive": 4 * 530, "per_prompt": 530, "dedup": 50 + 30}


def test_numpy_and_list_tokens_pack_the_same():
    a = PackedPrompts.pack([[1, 2, 3], [4]])
    b = PackedPrompts.pack([np.array([1, 2, 3]), np.array([4])])
    assert a.keys.tolist() == b.keys.tolist() == [[2, 3, 4], [5, 0, 0]]
    assert list(a.lengths) == [3, 1]


def test_token_zero_is_not_padding():
    d = deduplicate(PackedPrompts.pack([[5, 0], [5], [5, 0]]), capacity=1)
    assert d.d_curve.tolist() == [1, 1, 2]


def test_negative_token_ids_are_refused():
    with pytest.raises(ValueError, match="token id -3"):
        PackedPrompts.pack([[1, -3]])
