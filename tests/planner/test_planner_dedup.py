"""Prefix dedup: the paper's D(L) and the prefix tree against brute force, the chosen cut, the
levels and groups, and token counts (a tree never computes more than the paper's rule)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.planner.dedup import PackedPrompts, deduplicate
from rlhfless.planner.prefix_tree import _shared

prompts_st = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=12)


def distinct_prefixes(prompts, length):
    return len({tuple(p[:length]) for p in prompts})


@settings(max_examples=60, deadline=None)
@given(prompts=prompts_st, capacity=st.integers(1, 8))
def test_paper_rule_chooses_the_largest_length_that_fits(prompts, capacity):
    d = deduplicate(PackedPrompts.pack(prompts), capacity, "paper")
    longest = max(map(len, prompts))
    for length in range(1, longest + 1):
        assert d.d_curve[length] == distinct_prefixes(prompts, length)
    fitting = [length for length in range(1, longest + 1) if distinct_prefixes(prompts, length) <= capacity]
    assert d.prefix_length == (max(fitting) if fitting else 0)


@settings(max_examples=60, deadline=None)
@given(prompts=prompts_st, capacity=st.integers(1, 8))
def test_paper_groups_share_their_length_l_prefix(prompts, capacity):
    d = deduplicate(PackedPrompts.pack(prompts), capacity, "paper")
    uids = [f"u{i}" for i in range(len(prompts))]
    groups, levels = d.layout(uids)
    for group in groups:
        assert len({tuple(prompts[int(u[1:])][: d.prefix_length]) for u in group}) == 1
    assert len(levels) <= capacity and all(node["parent"] == -1 for node in levels)
    assert len(levels) <= d.d_curve[d.prefix_length]
    for group in groups:  # one short of its longest prompt, which computes its own last token
        end = min(d.prefix_length, max(len(prompts[int(u[1:])]) for u in group) - 1)
        assert [n["end"] for n in levels if n["group"] == groups.index(group)] == [end]
    assert all(k == min(d.prefix_length, len(p) - 1) for k, p in zip(d.prefix_tokens, prompts, strict=True))


def test_paper_rule_computes_a_shared_system_prompt_once():
    system = list(range(100, 150))
    prompts = [system + [i, i + 1, i + 2] for i in range(10)]
    d = deduplicate(PackedPrompts.pack(prompts), capacity=1, rule="paper")
    assert d.prefix_length == 50
    assert d.tokens(group_size=4) == {"naive": 4 * 530, "per_prompt": 530, "dedup": 50 + 30}


def test_paper_rule_computes_the_system_prompt_once_per_group_and_the_tree_once():
    """The issue's case: few prompts and capacity 256 make the paper pick whole prompts."""
    system = list(range(100, 150))
    prompts = [system + [7, 8, i] for i in range(4)] + [system + [9, i] for i in range(4)]
    paper = deduplicate(PackedPrompts.pack(prompts), 256, "paper")
    tree = deduplicate(PackedPrompts.pack(prompts), 256, "tree")
    assert paper.prefix_length == 53 and paper.levels.tokens == 4 * 52 + 4 * 51
    assert paper.tokens(1)["dedup"] == 4 * 53 + 4 * 52 == paper.tokens(1)["per_prompt"]
    # the tree: the system prompt, then [7, 8] and [9] once, then each prompt's last token
    assert tree.levels.tokens == 50 + 2 + 1 and tree.tokens(1)["dedup"] == 53 + 8 == tree.unique_tokens
    levels = deduplicate(PackedPrompts.pack(prompts), 256, "tree").layout([f"u{i}" for i in range(8)])[1]
    assert [(n["parent"], n["start"], n["end"]) for n in levels] == [(-1, 0, 50), (0, 50, 51), (0, 50, 52)]
    assert sorted(n["group"] for n in levels) == [-1, 0, 1]


def brute_unique(rows) -> int:
    return len({tuple(r[:k]) for r in rows for k in range(1, len(r) + 1)})


tree_prompts = (
    st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6), min_size=1, max_size=10)
    .flatmap(
        lambda tails: st.tuples(
            st.lists(st.integers(0, 2), max_size=4),
            st.just(tails),
            st.lists(st.booleans(), min_size=len(tails), max_size=len(tails)),
        )
    )
    .map(lambda t: [(t[0] if shared else []) + tail for tail, shared in zip(t[1], t[2], strict=True)])
)


@settings(max_examples=150, deadline=None)
@given(prompts=tree_prompts, capacity=st.integers(1, 8))
def test_tree_levels_build_on_their_parents_and_cover_each_prompts_shared_prefix(prompts, capacity):
    """Parents come first; a node starts where its parent ends; every node is on some prompt's
    path, its tokens the same for every prompt below it; no two nodes are the same prefix; each
    prompt's KV is its node's path less at most its own last token; no level is wider than
    the capacity (the trie's leaves)."""
    d = deduplicate(PackedPrompts.pack(prompts), capacity, "tree")
    lv = d.levels
    seen: dict[int, tuple[int, ...]] = {}
    for i, prompt in enumerate(prompts):
        node, k = int(d.node_of[i]), int(d.prefix_tokens[i])
        assert (node >= 0) == (k > 0) and k <= len(prompt) - 1
        if node >= 0:
            assert k == min(lv.end[node], len(prompt) - 1)
        while node >= 0:
            assert seen.setdefault(node, tuple(prompt[: lv.end[node]])) == tuple(prompt[: lv.end[node]])
            node = int(lv.parent[node])
    for j in range(lv.end.size):
        parent = int(lv.parent[j])
        assert parent < j and lv.start[j] == (lv.end[parent] if parent >= 0 else 0) < lv.end[j]
    assert sorted(seen) == list(range(lv.end.size)) and len(set(seen.values())) == len(seen)
    assert lv.end.size - np.unique(lv.parent[lv.parent >= 0]).size <= capacity
    assert lv.tokens == brute_unique(list(seen.values()))


def shared_by_brute_force(prompts, m):
    """Per prompt, its longest prefix that m prompts (itself among them) share: the (m-1)-th
    largest common prefix with another prompt, capped by its length."""
    out = []
    for i, p in enumerate(prompts):
        others = sorted((common_prefix(p, q) for j, q in enumerate(prompts) if j != i), reverse=True)
        out.append(min(others[m - 2], len(p)) if len(others) >= m - 1 else 0)
    return out


@settings(max_examples=150, deadline=None)
@given(prompts=tree_prompts, m=st.integers(2, 12))
def test_a_prompts_prefix_shared_by_m_prompts_is_found_in_its_sorted_windows(prompts, m):
    packed = PackedPrompts.pack(prompts)
    lengths = packed.lengths[packed.order]
    got = _shared(lengths, np.minimum(packed.lcp, lengths.max()), m)
    expected = shared_by_brute_force(prompts, m)
    assert got.tolist() == [expected[i] for i in packed.order.tolist()]


@settings(max_examples=150, deadline=None)
@given(prompts=tree_prompts, capacity=st.integers(1, 8))
def test_tree_keeps_every_shared_prefix_when_they_fit(prompts, capacity):
    """Runs of equal prefixes P_i[:s_i] in sorted order (s_i: the longest prefix P_i shares
    with another prompt) within the capacity: each prompt receives all of s_i but its last
    token (past the capacity, the levels test bounds the trie's leaves)."""
    d = deduplicate(PackedPrompts.pack(prompts), capacity, "tree")
    shared = shared_by_brute_force(prompts, 2)
    order = sorted(range(len(prompts)), key=prompts.__getitem__)
    cuts = [tuple(prompts[i][: shared[i]]) for i in order]
    runs = sum(1 for a, c in enumerate(cuts) if c and (a == 0 or c != cuts[a - 1]))
    if runs <= capacity:
        assert d.prefix_tokens.tolist() == [min(s, len(p) - 1) for s, p in zip(shared, prompts, strict=True)]


def test_over_capacity_a_widely_shared_long_template_stays_whole_beside_a_short_one():
    """Task A's 30-token template under the system prompt, task B's 2-token one whose prompts
    pair up after it: more pairs than the capacity, so a common depth would cut A's template at
    B's branching depth; the tree drops B's pairs (shared by 2) and keeps A's template (by 6)."""
    system, long_template, short_template = [1] * 5, list(range(100, 130)), [7, 8]
    a = [system + long_template + [200 + i] for i in range(6)]
    b = [system + short_template + [300 + i, 9, 9, 9, 400 + j] for i in range(6) for j in range(2)]
    prompts = a + b
    tree = deduplicate(PackedPrompts.pack(prompts), 4, "tree")
    assert tree.prefix_tokens.tolist() == [35] * 6 + [7] * 12
    assert tree.levels.tokens == 5 + 30 + 2
    paper = deduplicate(PackedPrompts.pack(prompts), 4, "paper")
    assert paper.prefix_length == 7 and paper.tokens(1)["dedup"] > tree.tokens(1)["dedup"]


@settings(max_examples=150, deadline=None)
@given(prompts=tree_prompts, capacity=st.integers(1, 8))
def test_tree_computes_no_more_than_the_paper_and_unique_tokens_plus_prefix_prompts(prompts, capacity):
    """At any capacity the tree computes at most the paper rule's tokens; with room for every
    shared prefix it computes the unique tokens, plus one last token again for each prompt that
    is a prefix of another (its logits start its response)."""
    packed = PackedPrompts.pack(prompts)
    tree, paper = deduplicate(packed, capacity, "tree"), deduplicate(packed, capacity, "paper")
    assert tree.tokens(3)["dedup"] <= paper.tokens(3)["dedup"] <= sum(map(len, prompts))
    full = deduplicate(packed, len(prompts), "tree")
    assert full.unique_tokens == brute_unique(prompts)
    again = sum(
        any(j != i and q[: len(p)] == p for j, q in enumerate(prompts)) for i, p in enumerate(prompts)
    )
    assert full.unique_tokens <= full.tokens(1)["dedup"] <= full.unique_tokens + again


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


def test_a_later_window_over_a_whole_list_reads_past_the_last_prompt_s_start():
    """Lists read whole in the first round: a tied prompt's later window is cut where the data
    ends, never short of its own tokens, though a shorter prompt comes last."""
    prompts = [[7] * 64, [7] * 128, [7] * 128 + [0], [7] * 64]
    for tokens in (prompts, [np.array(p, dtype=np.int32) for p in prompts]):
        packed = PackedPrompts.pack(tokens)
        assert packed.order.tolist() == [0, 3, 1, 2]
        assert packed.lcp.tolist() == [130, 64, 128]


@pytest.mark.parametrize("bad", [2.5, 2.0, "3", None, np.float64(2.0), 2**70])
def test_non_integer_token_ids_are_refused(bad):
    with pytest.raises(ValueError, match="prompt_tokens"):
        PackedPrompts.pack([[1, 2], [1, bad]])


def test_token_zero_is_not_padding():
    d = deduplicate(PackedPrompts.pack([[5, 0], [5], [5, 0]]), capacity=1, rule="paper")
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
