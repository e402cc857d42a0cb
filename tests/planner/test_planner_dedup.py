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


def common_prefix(a, b):
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


token_ids = st.integers(0, 2) | st.sampled_from([2**31, 2**32 - 2])  # big ones fill a packed key


@settings(max_examples=80, deadline=None)
@given(
    system=st.lists(token_ids, max_size=9),
    tails=st.lists(st.lists(token_ids, max_size=9), min_size=1, max_size=12),
    shared=st.lists(st.booleans(), min_size=12, max_size=12),
    first_chunk=st.integers(1, 12),
    as_array=st.booleans(),
)
def test_pack_sorts_and_measures_prefixes_as_python_does(system, tails, shared, first_chunk, as_array):
    """Chunked reading (any first chunk, lists or arrays; few varying columns sorted as keys
    packed by bit width, many as byte strings) gives Python's stable sort and the brute-force common prefixes
    of sorted neighbours (longest + 1 for identical prompts)."""
    prompts = [(system if s else []) + t for t, s in zip(tails, shared, strict=False)]
    tokens = [np.array(p, dtype=np.int64) for p in prompts] if as_array else prompts
    packed = PackedPrompts.pack(tokens, first_chunk=first_chunk)
    order = sorted(range(len(prompts)), key=prompts.__getitem__)
    longest = max(map(len, prompts))
    lcp = [
        longest + 1 if prompts[a] == prompts[b] else common_prefix(prompts[a], prompts[b])
        for a, b in zip(order, order[1:], strict=False)
    ]
    assert packed.order.tolist() == order
    assert packed.lcp.tolist() == lcp
    assert packed.lengths.tolist() == list(map(len, prompts))


def test_numpy_and_list_tokens_pack_the_same():
    prompts = [[5, 1, 2, 3], [5, 1], [4], [5, 1, 2, 3], []]
    packs = [PackedPrompts.pack(prompts, first_chunk=1)] + [
        PackedPrompts.pack([np.array(p, dtype=dtype) for p in prompts], first_chunk=1)
        for dtype in (np.int32, np.int64, np.uint32)
    ]
    for p in packs:
        assert p.order.tolist() == [4, 2, 1, 0, 3]
        assert p.lcp.tolist() == [0, 0, 2, 5]
        assert p.lengths.tolist() == [4, 2, 1, 4, 0]


@pytest.mark.parametrize("bad", [2.5, 2.0, "3", None, np.float64(2.0), 2**70])
def test_non_integer_token_ids_are_refused(bad):
    with pytest.raises(ValueError, match="prompt_tokens"):
        PackedPrompts.pack([[1, 2], [1, bad]])


def test_token_zero_is_not_padding():
    d = deduplicate(PackedPrompts.pack([[5, 0], [5], [5, 0]]), capacity=1)
    assert d.d_curve.tolist() == [1, 1, 2]


@pytest.mark.parametrize("as_array", [False, True])
def test_negative_token_ids_are_refused(as_array):
    prompts = [[1, -3], [1, 2]]
    with pytest.raises(ValueError, match="token id -3"):
        PackedPrompts.pack([np.array(p) for p in prompts] if as_array else prompts)


@pytest.mark.parametrize("as_array", [False, True])
@pytest.mark.parametrize("bad", [2**32 - 1, 2**32])
def test_token_ids_past_the_range_are_refused_and_the_last_one_in_it_is_kept(as_array, bad):
    def pack(ids):
        return PackedPrompts.pack([np.array(p, dtype=np.int64) for p in ids] if as_array else ids)

    with pytest.raises(ValueError, match=f"token id {bad}"):
        pack([[1, bad], [1, 2]])
    assert pack([[1, 2**32 - 2], [1, 2]]).order.tolist() == [1, 0]


def test_tokens_past_where_a_prompt_differs_are_not_read():
    """They cannot change the plan, so they are neither converted nor checked."""
    packed = PackedPrompts.pack([[1, 2, "x"], [1, 3, None]], first_chunk=2)
    assert packed.lcp.tolist() == [1]
