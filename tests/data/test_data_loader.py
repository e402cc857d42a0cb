"""Per-step batches: deterministic per (seed, epoch), exact resume."""

import pytest

from rlhfless.data import Prompt, PromptLoader


def prompts(n):
    return [
        Prompt(
            uid=f"u{i}",
            messages=[{"role": "user", "content": str(i)}],
            ground_truth=None,
            data_source="t",
            extra_info={},
        )
        for i in range(n)
    ]


def uids(batch):
    return [p.uid for p in batch]


def take(loader, k):
    return [uids(next(loader)) for _ in range(k)]


def test_each_epoch_is_a_permutation_without_repeats_in_a_batch():
    loader = PromptLoader(prompts(10), batch_size=3, seed=0)
    epoch0 = take(loader, 3)
    assert loader.epoch == 0
    seen = [u for b in epoch0 for u in b]
    assert len(set(seen)) == 9  # one prompt dropped: 10 % 3
    epoch1 = take(loader, 3)
    assert loader.epoch == 1
    assert epoch1 != epoch0


def test_same_seed_same_batches_other_seed_differs():
    a = take(PromptLoader(prompts(8), 2, seed=5), 8)
    assert a == take(PromptLoader(prompts(8), 2, seed=5), 8)
    assert a != take(PromptLoader(prompts(8), 2, seed=6), 8)


def test_no_shuffle_keeps_file_order_every_epoch():
    loader = PromptLoader(prompts(4), 2, seed=0, shuffle=False)
    assert take(loader, 4) == [["u0", "u1"], ["u2", "u3"]] * 2


def test_resume_from_state_continues_exactly():
    full = PromptLoader(prompts(7), 3, seed=1)
    expected = take(full, 6)
    first = PromptLoader(prompts(7), 3, seed=1)
    head = take(first, 3)
    resumed = PromptLoader(prompts(7), 3, seed=1)
    resumed.load_state_dict(first.state_dict())
    assert head + take(resumed, 3) == expected
    assert resumed.epoch == full.epoch


def test_state_from_a_different_dataset_is_refused():
    state = PromptLoader(prompts(6), 2, seed=0).state_dict()
    with pytest.raises(ValueError, match="num_prompts=6"):
        PromptLoader(prompts(8), 2, seed=0).load_state_dict(state)


def test_batch_larger_than_dataset_is_refused():
    with pytest.raises(ValueError, match="batch_size: got 5, expected 1..4"):
        PromptLoader(prompts(4), 5, seed=0)
