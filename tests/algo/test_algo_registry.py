"""Selecting the algorithm math by name."""

import pytest
import torch

from rlhfless.algo import (
    ADVANTAGE_ESTIMATORS,
    ALGORITHMS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    UnknownNameError,
    gae,
    get_advantage_estimator,
    get_kl_estimator,
    get_loss_aggregation,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rlhfless.algo.registry import Registry


def test_registries_hold_the_documented_names():
    assert get_advantage_estimator("grpo") is grpo_advantages
    assert get_advantage_estimator("rloo") is rloo_advantages
    assert get_advantage_estimator("gae") is gae
    assert get_advantage_estimator("reinforce_pp") is reinforce_pp_advantages
    assert set(ADVANTAGE_ESTIMATORS) == {"grpo", "rloo", "reinforce_pp", "gae"}
    assert ALGORITHMS == {
        "grpo": grpo_advantages,
        "rloo": rloo_advantages,
        "ppo": gae,
        "reinforce_pp": reinforce_pp_advantages,
    }
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3", "low_var_kl"}
    assert set(LOSS_AGGREGATIONS) == {
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
    }
    logp, ref = torch.tensor([0.0]), torch.tensor([-1.0])
    assert float(get_kl_estimator("k1")(logp, ref)) == pytest.approx(1.0)
    assert float(get_loss_aggregation("token-mean")(torch.ones(1, 2), torch.ones(1, 2), 2)) == 1.0


@pytest.mark.parametrize(
    ("lookup", "name", "listed"),
    [
        (get_advantage_estimator, "ppo", "gae, grpo, reinforce_pp, rloo"),
        (get_kl_estimator, "kl", "k1, k2, k3, low_var_kl"),
        (get_loss_aggregation, "mean", "seq-mean-token-mean, seq-mean-token-sum"),
    ],
)
def test_unknown_names_raise_a_key_error_listing_the_known_ones(lookup, name, listed):
    with pytest.raises(KeyError) as info:
        lookup(name)
    assert isinstance(info.value, UnknownNameError)
    assert repr(name) in str(info.value) and listed in str(info.value)


def test_adding_a_variant_is_one_decorated_function():
    table = Registry("thing")

    @table.register("double")
    def double(x):
        return 2 * x

    assert table.lookup("double")(3) == 6
    with pytest.raises(ValueError, match="already registered"):

        @table.register("double")
        def other(x):
            return x
