"""A group-local estimator gives a prompt group, computed alone, the very advantages the batch
gives it: what lets the Ray executor learn a group ahead and the update count it."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.algo.config import AlgorithmConfig
from rlhfless.config import load_config
from rlhfless.runtime.returns import advantages, group_local
from rlhfless.runtime.samples import Sample


def batch(rewards: list[list[float]]) -> list[Sample]:
    out = []
    for u, group in enumerate(rewards):
        for k, r in enumerate(group):
            s = Sample(f"u{u}", k, [1, 2], [3] * (1 + (u + k) % 5), "stop")
            s.reward = r
            out.append(s)
    return out


rewards_st = st.lists(
    st.lists(st.floats(-3, 3, allow_nan=False, width=32), min_size=4, max_size=4), min_size=1, max_size=6
)


@pytest.mark.parametrize("name,norm", [("grpo", True), ("grpo", False), ("rloo", True)])
@settings(max_examples=30, deadline=None)
@given(rewards=rewards_st)
def test_a_groups_advantages_alone_are_the_batchs_bit_for_bit(name, norm, rewards):
    cfg = load_config(
        preset="tiny", overrides=(f"algorithm.name={name}", f"algorithm.norm_adv_by_std={str(norm).lower()}")
    )
    samples = batch(rewards)
    whole = advantages(cfg, samples)
    for u in range(len(rewards)):
        rows = [i for i, s in enumerate(samples) if s.uid == f"u{u}"]
        alone = advantages(cfg, [samples[i] for i in rows])
        assert all(torch.equal(a, whole[i]) for a, i in zip(alone, rows, strict=True))


def test_only_group_local_estimators_with_one_update_learn_ahead():
    assert group_local(AlgorithmConfig(name="grpo")) and group_local(AlgorithmConfig(name="rloo"))
    assert not group_local(AlgorithmConfig(name="reinforce_pp"))  # whitened over the batch
    assert not group_local(AlgorithmConfig(name="grpo", epochs=2))
    assert not group_local(AlgorithmConfig(name="grpo", mini_batches=2))
