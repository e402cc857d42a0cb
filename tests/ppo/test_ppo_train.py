"""`algorithm.name=ppo`, `rloo` and `reinforce_pp` train end to end on the tiny preset; a killed
PPO run resumes (critic included) to the same numbers."""

import json
import math

import pytest
import torch

from rlhfless.cli import main
from rlhfless.config import load_config
from rlhfless.runtime.trainer import train

PPO_KEYS = ("loss/value", "value/mean", "value/explained_variance", "loss/policy", "kl/mean", "grad_norm")
# Deterministic training quantities (timings are not).
COMPARED = ("reward/mean", "loss/policy", "grad_norm", "loss/value", "value/mean", "critic/grad_norm")


def tiny(tmp_path, *overrides):
    return load_config(
        preset="tiny",
        overrides=(
            f"output_dir={tmp_path / 'run'}",
            "trainer.progress=false",
            "trainer.tensorboard=false",
            "trainer.threads=1",
            "reward.function=ppo_reward_fns:odd_share",  # varied rewards from a random model
            *overrides,
        ),
    )


def test_ppo_cli_run_logs_value_metrics_and_checkpoints_the_critic(tmp_path):
    run = tmp_path / "run"
    code = main(
        [
            "train",
            "--preset",
            "tiny",
            "algorithm.name=ppo",
            "algorithm.critic_lr=1e-3",
            "trainer.steps=2",
            f"output_dir={run}",
            "trainer.progress=false",
            "trainer.tensorboard=false",
            "trainer.threads=1",
            "reward.function=ppo_reward_fns:odd_share",
        ]
    )
    assert code == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in PPO_KEYS:
            assert isinstance(row[key], float) and math.isfinite(row[key]), key
        assert row["loss/value"] > 0
    # The head starts at zero: step 1's values are 0; the critic has learned by step 2.
    assert rows[0]["value/mean"] == 0.0 and rows[1]["value/mean"] != 0.0
    state = torch.load(run / "checkpoints" / "step_000002" / "optimizer.pt", weights_only=False)
    assert {"learner", "critic"} <= set(state)
    assert "value_head.weight" in state["critic"]["model"]


@pytest.mark.parametrize("name", ["rloo", "reinforce_pp"])
def test_critic_free_estimators_train(tmp_path, name):
    result = train(tiny(tmp_path, f"algorithm.name={name}", "trainer.save_every=0"))
    assert [h["step"] for h in result.history] == [1, 2]
    for h in result.history:
        assert math.isfinite(h["loss/policy"]) and h["grad_norm"] > 0
        assert "loss/value" not in h


def test_kl_in_the_reward_replaces_the_kl_loss_and_adapts_beta(tmp_path):
    result = train(
        tiny(
            tmp_path,
            "algorithm.name=reinforce_pp",
            "algorithm.kl_in_reward=true",
            "algorithm.kl_ctrl=adaptive",
            "algorithm.kl_coef=0.05",
            "algorithm.target_kl=1e-6",  # far below any measured KL: beta must grow
            "algorithm.kl_horizon=16",
            "trainer.steps=3",
            "trainer.save_every=0",
        )
    )
    betas = [h["kl/coef"] for h in result.history]
    kls = [h["kl/mean"] for h in result.history]
    # Step 1 samples from the reference itself: KL 0, under the target, so beta shrinks by the
    # most a horizon's worth of samples (16) allows, 20%; then the policy has moved and it grows.
    assert kls[0] == 0.0 and kls[1] > 0
    assert betas == pytest.approx([0.05, 0.05 * 0.8, 0.05 * 0.8 * 1.2])


def test_critic_warmup_holds_the_policy(tmp_path):
    result = train(tiny(tmp_path, "algorithm.name=ppo", "algorithm.critic_warmup=1", "trainer.save_every=0"))
    first, second = result.history
    assert "loss/policy" not in first and "loss/value" in first
    assert "loss/policy" in second


def test_normalized_rewards_make_ppo_blind_to_the_reward_scale(tmp_path):
    """With `normalize_reward` the critic's targets are in units of the step's reward spread, so an
    affine change of the reward leaves every value and every update as it was."""
    args = ("algorithm.name=ppo", "algorithm.normalize_reward=true", "trainer.save_every=0")
    plain = train(tiny(tmp_path / "a", *args)).history
    rescaled = train(tiny(tmp_path / "b", *args, "reward.function=ppo_reward_fns:odd_share_rescaled")).history
    assert rescaled[0]["reward/mean"] == pytest.approx(10 * plain[0]["reward/mean"] - 3)
    for a, b in zip(plain, rescaled, strict=True):
        assert a["loss/value"] == pytest.approx(b["loss/value"], rel=1e-4)
        assert a["loss/policy"] == pytest.approx(b["loss/policy"], rel=1e-3, abs=1e-7)
        # Values are in units of the reward's std; Adam amplifies float noise in near-zero gradients.
        assert a["value/mean"] == pytest.approx(b["value/mean"], abs=1e-3)


class Killed(Exception):
    pass


def test_killed_ppo_run_resumes_to_the_same_step_3_metrics(tmp_path):
    args = ("algorithm.name=ppo", "algorithm.critic_lr=1e-3", "trainer.steps=3", "trainer.save_every=1")
    want = train(tiny(tmp_path / "a", *args)).history[2]

    def die_in_step_3(kind, info):
        if kind == "phase" and info["step"] == 3 and info["phase"] == "learn":
            raise Killed

    with pytest.raises(Killed):
        train(tiny(tmp_path / "b", *args), die_in_step_3)
    got = train(tiny(tmp_path / "b", *args, "resume=true")).history
    assert [h["step"] for h in got] == [3]
    assert want["value/mean"] != 0.0  # the critic has learned, so its state matters here
    for key in COMPARED:
        assert got[0][key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key
