"""KL estimators and KL coefficient controllers."""

import math

import pytest
import torch

from rlhfless.algo import AdaptiveKLController, FixedKLController, UnknownNameError, kl_penalty

D = torch.float64


def test_kl_estimators_hand_worked():
    logp = torch.tensor([math.log(0.5)], dtype=D)
    ref = torch.tensor([math.log(0.25)], dtype=D)
    log2 = math.log(2)
    assert float(kl_penalty(logp, ref, "k1")) == pytest.approx(log2)
    assert float(kl_penalty(logp, ref, "k2")) == pytest.approx(0.5 * log2**2)
    assert float(kl_penalty(logp, ref, "k3")) == pytest.approx(0.5 + log2 - 1)
    assert float(kl_penalty(logp, ref, "low_var_kl")) == pytest.approx(0.5 + log2 - 1)


@pytest.mark.parametrize("seed", range(3))
def test_k1_and_k3_are_unbiased_for_the_exact_kl_of_categoricals(seed):
    # E_{x ~ p}[k(log p(x), log q(x))] = KL(p || q) for k1 and k3; k2 is biased but never negative
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(9, generator=g, dtype=D), 0)
    q = torch.softmax(torch.randn(9, generator=g, dtype=D), 0)
    exact = sum(pi * math.log(pi / qi) for pi, qi in zip(p.tolist(), q.tolist(), strict=True))
    for kind in ("k1", "k3"):
        assert float((p * kl_penalty(p.log(), q.log(), kind)).sum()) == pytest.approx(exact)
    assert torch.all(kl_penalty(p.log(), q.log(), "k2") >= 0)
    assert torch.all(kl_penalty(p.log(), q.log(), "k3") >= 0)


def test_low_var_kl_clamps_where_k3_explodes():
    logp = torch.tensor([-50.0, 0.0, -1.0], dtype=D)
    ref = torch.tensor([0.0, -50.0, -1.5], dtype=D)
    k3 = kl_penalty(logp, ref, "k3")
    low = kl_penalty(logp, ref, "low_var_kl")
    assert float(k3[0]) > 1e20 and float(low[0]) == 10.0
    assert float(k3[1]) == pytest.approx(49.0) and float(low[1]) == 10.0
    assert float(low[2]) == pytest.approx(float(k3[2]))


def test_unknown_kl_kind_lists_the_known_ones():
    with pytest.raises(UnknownNameError, match="k1, k2, k3, low_var_kl"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_adaptive_kl_controller_moves_towards_target_with_clipped_error():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10_000)
    ctl.update(current_kl=12.0, n_steps=256)  # error 1.0 clipped to 0.2
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 256 / 10_000))
    before = ctl.value
    ctl.update(current_kl=6.6, n_steps=256)  # error 0.1, not clipped
    assert ctl.value == pytest.approx(before * (1 + 0.1 * 256 / 10_000))
    before = ctl.value
    ctl.update(current_kl=0.0, n_steps=100)  # error -1 clipped to -0.2
    assert ctl.value == pytest.approx(before * (1 - 0.2 * 100 / 10_000))
    before = ctl.value
    ctl.update(current_kl=6.0, n_steps=100)
    assert ctl.value == pytest.approx(before)


def test_fixed_kl_controller_keeps_its_value():
    ctl = FixedKLController(0.05)
    ctl.update(current_kl=100.0, n_steps=1000)
    assert ctl.value == 0.05


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"init_kl_coef": 0.0, "target_kl": 6.0, "horizon": 10}, "init_kl_coef"),
        ({"init_kl_coef": 0.1, "target_kl": -1.0, "horizon": 10}, "target_kl"),
        ({"init_kl_coef": 0.1, "target_kl": 6.0, "horizon": 0}, "horizon"),
    ],
)
def test_adaptive_kl_controller_rejects_out_of_range_settings(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}: got"):
        AdaptiveKLController(**kwargs)


def test_fixed_kl_controller_rejects_negative_coefficient():
    with pytest.raises(ValueError, match="^kl_coef: got -0.1"):
        FixedKLController(-0.1)
