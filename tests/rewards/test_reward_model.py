"""`reward.model`: a local sequence-classification checkpoint scores (prompt, response) pairs in
batches, and its score combines with the rule reward by weights."""

import pickle

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from rlhfless.config import load_config
from rlhfless.data import Prompt
from rlhfless.models import byte_tokenizer
from rlhfless.rewards import RewardConfig, RewardError, build_reward_fn
from rlhfless.rewards.model import RewardModel
from rlhfless.runtime.trainer import train


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    """A random tiny Llama classifier (one logit) with the byte tokenizer, saved like any checkpoint."""
    tokenizer = byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config)
    path = tmp_path_factory.mktemp("rm")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def prompt(i, truth="7"):
    return Prompt(
        uid=f"u{i}",
        messages=[{"role": "user", "content": "q" * (i + 1)}],
        ground_truth=truth,
        data_source="f",
        extra_info={},
    )


PAIRS = [
    (prompt(i), r) for i, r in enumerate(["<answer>7</answer>", "no", "a much longer reply " * 3, "", "8"])
]


def test_batched_scores_equal_one_full_forward_per_pair(reward_model_dir):
    rm = RewardModel(str(reward_model_dir), batch_size=2)
    got = rm([p for p, _ in PAIRS], [r for _, r in PAIRS])
    reference = LlamaForSequenceClassification.from_pretrained(reward_model_dir).eval()
    for (p, r), score in zip(PAIRS, got, strict=True):
        text = rm.tokenizer.apply_chat_template(
            [*p.messages, {"role": "assistant", "content": r}], tokenize=False
        )
        assert text.endswith(f"<|im_start|>assistant\n{r}<|im_end|>\n")
        ids = rm.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            want = float(reference(input_ids=ids).logits[0, 0])
        assert score == pytest.approx(want, abs=1e-5)
    assert len(set(got)) == len(got)  # the pairs are told apart


def test_model_and_rule_rewards_combine_by_weights(reward_model_dir):
    cfg = RewardConfig(model=str(reward_model_dir), model_weight=2.0, rule_weight=0.5, format_weight=0.2)
    fn = build_reward_fn(cfg)
    outs = fn.score_batch([p for p, _ in PAIRS], [r for _, r in PAIRS])
    model_scores = RewardModel(str(reward_model_dir))([p for p, _ in PAIRS], [r for _, r in PAIRS])
    assert outs[0].components["correct"] == 1.0 and outs[0].components["format"] == 1.0
    for out, m in zip(outs, model_scores, strict=True):
        c = out.components
        assert c["model"] == pytest.approx(m, abs=1e-6)
        assert out.score == pytest.approx(0.5 * (c["correct"] + 0.2 * c["format"]) + 2.0 * m, abs=1e-6)
    assert fn(*PAIRS[1]).score == pytest.approx(outs[1].score, abs=1e-6)  # one pair, same score


def test_model_only_reward_needs_no_ground_truth_and_survives_pickling(reward_model_dir):
    fn = build_reward_fn(RewardConfig(model=str(reward_model_dir), rule_weight=0.0))
    p = prompt(0, truth=None)
    out = fn(p, "anything")
    assert set(out.components) == {"format", "model"}
    assert out.score == out.components["model"]
    clone = pickle.loads(pickle.dumps(fn))
    assert clone(p, "anything").score == pytest.approx(out.score, abs=1e-6)


def test_a_missing_reward_model_is_a_clear_error_before_any_scoring(tmp_path):
    with pytest.raises(RewardError, match="reward.model: .* config.json"):
        build_reward_fn(RewardConfig(model=str(tmp_path / "nowhere")))


def test_tiny_run_trains_on_the_reward_model(reward_model_dir, tmp_path):
    cfg = load_config(
        preset="tiny",
        overrides=(
            f"output_dir={tmp_path / 'run'}",
            "trainer.progress=false",
            "trainer.tensorboard=false",
            "trainer.threads=1",
            "trainer.steps=1",
            f"reward.model={reward_model_dir}",
            "reward.rule_weight=0",
        ),
    )
    (step,) = train(cfg).history
    assert step["reward/model"] == step["reward/mean"] != 0.0
    assert step["reward/std"] > 0
